"""The operator's view of a running mesh: every debug endpoint, explain, the push timeline,
metrics, and pilotctl, all checked against a real Envoy's own state."""

from __future__ import annotations

import asyncio
import json
import re
import sys

import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, parse_counters, service_yaml
from tests.support.backends import HttpBackend, http_get
from tests.support.control_plane import REPO_ROOT, ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)
NODE = sidecar_node_id("ops-1")


@pytest.fixture
async def running(tmp_path):
    backends = [await HttpBackend(n).start() for n in ("one", "two")]
    port = free_port()
    cp = ControlPlane(tmp_path)
    cp.write("svc.yaml", service_yaml("web", port))
    cp.write("eps.yaml", endpoint_slice_yaml("web", backends[0].port))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port), tmp_path)
        await envoy.wait_ready()

        async def routed_to(name: str):
            status, body = await http_get(f"http://127.0.0.1:{port}/", headers={"Host": fqdn("web")})
            return status == 200 and json.loads(body)["name"] == name

        await wait_for(lambda: routed_to("one"), message="initial routing")
        await cp.wait_synced(NODE)
        yield cp, envoy, backends, port, routed_to
    finally:
        await envoy.stop()
        await cp.stop()
        for b in backends:
            await b.stop()


async def pilotctl(cp: ControlPlane, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pilot.pilotctl", "--addr", f"127.0.0.1:{cp.ports['monitoring']}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(REPO_ROOT))
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_every_debug_endpoint_answers_for_a_connected_envoy(running):
    cp, *_ = running
    index = await cp.debug("/debug")
    assert all(e["description"] for e in index["endpoints"]), "every debug endpoint says what it shows"
    for path in (e["path"] for e in index["endpoints"]):
        query = f"?proxyID={NODE}" if path in ("/debug/config_dump",) else ""
        if path == "/debug/explain":
            query = f"?proxyID={NODE}&type=cds&name=outbound|{_port(running)}||{fqdn('web')}"
        for port in ("http", "monitoring"):
            status, body = await cp.get(path + query, port)
            assert status == 200, f"{path} on {port}: {status} {body[:300]}"
    adsz = await cp.debug("/debug/adsz")
    assert adsz["totalClients"] == 1 and adsz["clients"][0]["metadata"]["NAMESPACE"] == "default"
    cachez = await cp.debug("/debug/cachez")
    assert cachez["size"] > 0 and cachez["misses"] > 0
    mesh = await cp.debug("/debug/mesh")
    assert mesh["mesh"]["trustDomain"] == "cluster.local"


def _port(running) -> int:
    return running[3]


async def test_explain_names_the_config_behind_a_cluster_its_endpoints_and_its_route(running):
    cp, _envoy, backends, port, routed_to = running
    cluster = f"outbound|{port}||{fqdn('web')}"
    ex = await cp.debug(f"/debug/explain?proxyID={NODE}&type=cds&name={cluster}")
    assert [(o["kind"], o["name"]) for o in ex["built_from"]] == [("Service", "web")]
    assert ex["proxy_holds"]["up_to_date"] and ex["proxy_holds"]["last_response_acked"]

    # Move the endpoints: explain of the CLA names the EndpointSlice and the push that changed it.
    cp.write("eps.yaml", endpoint_slice_yaml("web", backends[1].port))
    await wait_for(lambda: routed_to("two"), message="endpoint change routed")
    ex = await wait_for(_explained(cp, "eds", cluster), message="explain shows the EDS push")
    kinds = {(o["kind"], o["name"]) for o in ex["built_from"]}
    assert ("EndpointSlice", "web-1") in kinds and ("Service", "web") in kinds
    assert ex["last_changed"]["reasons"] == {"endpoint": 1}
    assert "EndpointSlice/default/web-1" in ex["last_changed"]["because_of"]
    slice_rev = next(o for o in ex["built_from"] if o["kind"] == "EndpointSlice")["revision"]
    configz = await cp.debug("/debug/configz")
    assert any(c["name"] == "web-1" and c["revision"] == slice_rev for c in configz["configs"])

    route = await cp.debug(f"/debug/explain?proxyID={NODE}&type=rds&name={port}")
    assert ("Service", "web") in {(o["kind"], o["name"]) for o in route["built_from"]}

    # The timeline of that push has every stage, and Envoy's ACK was counted.
    timeline = await cp.debug("/debug/push_timeline")
    eds_push = next(p for p in timeline if p["reasons"] == {"endpoint": 1})
    assert eds_push["full"] is False and eds_push["acks"] >= 1 and eds_push["responses"] >= 1
    assert set(eds_push["stages_ms"]["generate"]) == {"eds"}
    assert eds_push["stages_ms"]["first_event_to_last_ack"] > 0


def _explained(cp: ControlPlane, type_: str, name: str):
    async def check():
        ex = await cp.debug(f"/debug/explain?proxyID={NODE}&type={type_}&name={name}")
        return ex if ex.get("last_changed", {}).get("reasons") and ex["proxy_holds"]["up_to_date"] else None
    return check


async def test_metrics_have_istiod_names_and_move_after_a_push(running):
    cp, _envoy, backends, _port, routed_to = running
    before = await cp.metrics()
    for name in ("pilot_xds_pushes", "pilot_proxy_convergence_time", "pilot_xds_push_time", "pilot_debounce_time",
                 "pilot_pushcontext_init_seconds", "pilot_proxy_queue_time", "pilot_xds",
                 "pilot_k8s_cfg_events", "pilot_total_xds_rejects"):
        assert f"# TYPE {name} " in before, name
    # istiod's counters have no _total suffix (process_*/python_* are prometheus-client's standard ones).
    ours = before.replace("pilot_sds_certificate_errors_total", "")  # istiod registers that name with _total
    assert not re.search(r"^(pilot|citadel)_\w+_total[{ ]", ours, re.MULTILINE)
    assert 'pilot_xds{version="unknown"} 1.0' in before
    cp.write("eps.yaml", endpoint_slice_yaml("web", backends[1].port))
    await wait_for(lambda: routed_to("two"), message="endpoint change routed")
    after = await wait_for(_metrics_moved(cp, parse_counters(before, "pilot_xds_pushes").get("eds", 0)))
    events = parse_counters_labelled(after, "pilot_k8s_reg_events")  # istiod: a registry event, not config
    assert events.get(("EndpointSlice", "update"), 0) >= 1


def _metrics_moved(cp: ControlPlane, eds_before: float):
    async def check():
        text = await cp.metrics()
        return text if parse_counters(text, "pilot_xds_pushes").get("eds", 0) > eds_before else None
    return check


def parse_counters_labelled(text: str, family: str) -> dict[tuple[str, str], float]:
    return {(m.group(1), m.group(2)): float(m.group(3)) for m in re.finditer(
        rf'^{family}\{{type="([^"]+)",event="([^"]+)"\}} ([0-9.e+]+)$', text, re.MULTILINE)}


async def test_pilotctl_agrees_with_envoy(running):
    cp, envoy, _backends, port, _ = running
    status = await pilotctl(cp, "proxy-status")
    header, row = status.strip().splitlines()
    assert header.split()[:6] == ["NAME", "CLUSTER", "CDS", "LDS", "EDS", "RDS"]
    assert row.split()[0] == "ops-1.default" and row.split()[2:6] == ["SYNCED"] * 4

    clusters = await pilotctl(cp, "proxy-config", "clusters", "ops-1.default", "-o", "json")
    ours = {c["name"] for c in json.loads(clusters)}
    theirs = {c["name"] for c in (await envoy.clusters())["cluster_statuses"]} - {"xds-grpc"}
    assert ours == theirs

    table = await pilotctl(cp, "proxy-config", "clusters", "ops-1.default")
    assert [fqdn("web"), str(port), "-", "outbound", "EDS"] in [line.split()[:5] for line in table.splitlines()]

    endpoints = await pilotctl(cp, "proxy-config", "endpoints", "ops-1.default")
    envoy_hosts = {f"{h['address']['socket_address']['address']}:{h['address']['socket_address']['port_value']}"
                   for c in (await envoy.clusters())["cluster_statuses"] if c["name"].startswith("outbound|")
                   for h in c.get("host_statuses", [])}
    assert envoy_hosts and all(h in endpoints for h in envoy_hosts)

    listeners = await pilotctl(cp, "proxy-config", "listeners", "ops-1.default")
    assert str(port) in listeners and f"Route: {port}" in listeners
    assert port in (await envoy.listener_ports()).values()

    explained = await pilotctl(cp, "explain", "ops-1.default", "cds", f"outbound|{port}||{fqdn('web')}")
    assert "kind: Service" in explained and "name: web" in explained


async def test_pilotctl_reports_an_unknown_proxy_clearly(running):
    cp, *_ = running
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pilot.pilotctl", "--addr", f"127.0.0.1:{cp.ports['monitoring']}",
        "proxy-config", "clusters", "nobody.default", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=str(REPO_ROOT))
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 1 and "not connected" in err.decode()
