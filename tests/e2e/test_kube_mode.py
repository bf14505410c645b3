"""The control plane in Kubernetes mode, against a fake apiserver that speaks the real protocol,
driven by the real kubernetes-asyncio client inside the real server process, serving a real Envoy.
"""

from __future__ import annotations

import asyncio
import json
import statistics

import pytest

from tests.e2e.mesh_config import fqdn, parse_counters
from tests.fakes.apiserver import FakeApiServer
from tests.support.backends import HttpBackend, http_get
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)
NODE = sidecar_node_id("kube-client")


def service(name: str, port: int, ns: str = "default") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"ports": [{"name": "http", "port": port}]}}


def endpoint_slice(service_name: str, backend_port: int, ns: str = "default") -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service_name}-1", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": service_name}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": backend_port}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}


@pytest.fixture
async def cluster(tmp_path):
    fake = await FakeApiServer(bookmark_interval=0.5).start()
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    backends = [await HttpBackend(n).start() for n in ("one", "two", "three")]
    port = free_port()
    fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
    fake.create(service("web", port))
    fake.create(endpoint_slice("web", backends[0].port))
    cp = ControlPlane(tmp_path, kubeconfig=kubeconfig, env={"ENABLE_LEADER_ELECTION": "false"})
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port), tmp_path)
        await envoy.wait_ready()
        yield fake, cp, envoy, backends, port
    finally:
        await envoy.stop()
        await cp.stop()
        for b in backends:
            await b.stop()
        await fake.stop()


async def routed(port: int, backend: str) -> bool:
    status, body = await http_get(f"http://127.0.0.1:{port}/", headers={"Host": fqdn("web")}, timeout=3)
    return status == 200 and json.loads(body)["name"] == backend


async def test_envoy_routes_to_endpoints_found_in_kubernetes(cluster):
    fake, cp, _envoy, backends, port = cluster
    await wait_for(lambda: routed(port, "one"), message="routing from kube EndpointSlices")
    assert (await cp.get("/ready"))[0] == 200
    fake.apply(endpoint_slice("web", backends[1].port))
    await wait_for(lambda: routed(port, "two"), message="EndpointSlice update reached Envoy")


async def test_a_forced_410_loses_no_update_and_pushes_no_cds_or_lds(cluster):
    fake, cp, _envoy, backends, port = cluster
    await wait_for(lambda: routed(port, "one"))
    await cp.wait_synced(NODE)
    before = parse_counters(await cp.metrics(), "pilot_xds_pushes")
    lists_before = fake.count("list", "endpointslices")
    # The watch breaks and its resourceVersion is gone; meanwhile the endpoints move.
    fake.expire_history()
    fake.drop_watches()
    fake.apply(endpoint_slice("web", backends[2].port))
    await wait_for(lambda: routed(port, "three"), timeout=20, message="update made while the watch was broken")
    assert fake.count("list", "endpointslices") > lists_before, "a 410 must be followed by a fresh LIST"
    after = parse_counters(await cp.metrics(), "pilot_xds_pushes")
    for t in ("cds", "lds", "rds"):
        assert after.get(t, 0) == before.get(t, 0), f"relist caused a {t} push: {before} -> {after}"


async def test_serves_the_last_config_while_the_apiserver_is_away_then_catches_up(cluster):
    fake, cp, _envoy, backends, port = cluster
    await wait_for(lambda: routed(port, "one"))
    await fake.go_away()
    try:
        # Still serving: Envoy keeps routing and a brand-new proxy gets full config.
        assert await routed(port, "one")
        late = Envoy()
        await late.start(Envoy.bootstrap(sidecar_node_id("late"), cp.xds_port), cp.workdir)
        try:
            await late.wait_ready()
        finally:
            await late.stop()
    finally:
        await fake.come_back()
    fake.apply(endpoint_slice("web", backends[1].port))
    await wait_for(lambda: routed(port, "two"), timeout=40, message="caught up after the apiserver came back")


async def test_no_push_for_status_only_or_identical_updates(cluster):
    fake, cp, _envoy, backends, port = cluster
    await wait_for(lambda: routed(port, "one"))
    await cp.wait_synced(NODE)
    pushes = await cp.debug("/debug/push_status")
    svc = fake.get("services", "web", namespace="default")
    svc["metadata"].setdefault("annotations", {})["touched"] = "no"  # metadata noise we do not read
    svc = fake.update(svc)
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}
    fake.update_status(svc)
    # A real change afterwards proves the earlier events were processed (events are ordered).
    fake.apply(endpoint_slice("web", backends[1].port))
    await wait_for(lambda: routed(port, "two"))
    later = await cp.debug("/debug/push_status")
    new = [p for p in later["pushes"] if p["version"] not in {q["version"] for q in pushes["pushes"]}]
    assert new and all(not p["full"] for p in new), new


async def test_ready_waits_for_every_informer(tmp_path):
    fake = await FakeApiServer().start()
    gate = fake.hang_when(lambda r: r.verb == "list" and r.resource == "nodes")
    cp = ControlPlane(tmp_path, kubeconfig=fake.write_kubeconfig(tmp_path / "kc"),
                      env={"ENABLE_LEADER_ELECTION": "false"})
    try:
        await cp.start_process_only()
        status, text = await wait_for(_http_ready_answer(cp), message="/ready answers while syncing")
        assert status == 503 and "Node" in text
        gate.release()
        await wait_for(_ready(cp), timeout=20, message="ready after the Node list completes")
    finally:
        gate.release()
        await cp.stop()
        await fake.stop()


def _http_ready_answer(cp: ControlPlane):
    async def check():
        return await cp.get("/ready")
    return check


def _ready(cp: ControlPlane):
    async def check():
        return (await cp.get("/ready"))[0] == 200
    return check


async def test_empty_500s_are_backed_off_not_hammered(cluster):
    fake, _cp, _envoy, backends, port = cluster
    await wait_for(lambda: routed(port, "one"))
    fault = fake.fail_when(lambda r: r.verb in ("watch", "list") and r.resource == "endpointslices", status=500, body="")
    fake.drop_watches(resource="endpointslices")
    mark = fake.mark()
    started = asyncio.get_running_loop().time()
    await wait_for(lambda: fake.count(resource="endpointslices", since=mark) >= 3, timeout=20)
    # Without backoff an empty-bodied 500 spins at ~1,500 requests/s (ENVOY_NOTES).
    elapsed = asyncio.get_running_loop().time() - started
    rate = fake.count(resource="endpointslices", since=mark) / max(elapsed, 0.1)
    assert rate < 20, f"{rate:.0f} requests/s against a failing apiserver"
    fault.remove()
    fake.apply(endpoint_slice("web", backends[1].port))
    await wait_for(lambda: routed(port, "two"), timeout=40, message="recovered after the 500s stopped")


async def test_discovery_selectors_limit_namespaces_without_restart(cluster):
    fake, cp, _envoy, backends, _port = cluster
    other_port = free_port()
    fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    fake.create(service("api", other_port, ns="team-a"))
    fake.create(endpoint_slice("api", backends[2].port, ns="team-a"))
    api_host = "api.team-a.svc.cluster.local"

    async def registry() -> set[str]:
        return {s["hostname"] for s in await cp.debug("/debug/registryz")}

    await wait_for(lambda: _has(registry, api_host), message="api visible with no selectors")
    fake.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": "istio-system"},
                 "data": {"mesh": "discoverySelectors:\n- matchLabels: {mesh: 'on'}\n"}})
    await wait_for(lambda: _lacks(registry, api_host), message="unselected namespace dropped")
    assert fqdn("web") not in await registry()  # default is not labelled either
    ns = fake.get("namespaces", "team-a")
    ns["metadata"].setdefault("labels", {})["mesh"] = "on"
    fake.update(ns)
    await wait_for(lambda: _has(registry, api_host), message="labelled namespace selected")
    await wait_for(lambda: _routes(other_port, api_host, "three"), message="selected service routable")


async def _has(registry, host: str) -> bool:
    return host in await registry()


async def _lacks(registry, host: str) -> bool:
    return host not in await registry()


async def _routes(port: int, host: str, backend: str) -> bool:
    try:
        status, body = await http_get(f"http://127.0.0.1:{port}/", headers={"Host": host}, timeout=3)
    except Exception:  # noqa: BLE001 - any failure here is retried or reported, never fatal
        return False
    return status == 200 and json.loads(body)["name"] == backend


async def test_figures_endpoint_event_to_envoy_ack(cluster, capsys):
    """Measured, not asserted: time from an EndpointSlice write at the apiserver to Envoy's EDS
    ACK as the server saw it."""
    fake, cp, _envoy, backends, port = cluster
    await wait_for(lambda: routed(port, "one"))
    samples = []
    for i in range(20):
        before = (await cp.sync_status(NODE))["endpoint_acked"]
        t0 = asyncio.get_running_loop().time()
        fake.apply(endpoint_slice("web", backends[(i + 1) % 3].port))

        async def acked(before=before):
            row = await cp.sync_status(NODE)
            return row["endpoint_acked"] != before and row["endpoint_sent"] == row["endpoint_acked"]

        await wait_for(acked, timeout=10, interval=0.005)
        samples.append((asyncio.get_running_loop().time() - t0) * 1000)
    samples.sort()
    with capsys.disabled():
        print("\nFIGURES " + json.dumps({"kube_endpoint_event_to_ack_ms": {
            "median": round(statistics.median(samples), 1), "p99": round(samples[-1], 1)}}))


async def test_a_crd_installed_later_is_picked_up_without_restart(cluster):
    """The networking.istio.io CRDs are missing at start (404): the server is ready anyway and
    serves their objects once they are installed."""
    fake, cp, _envoy, _backends, port = cluster
    assert (await cp.get("/ready"))[0] == 200
    fake.register_crd("networking.istio.io", "v1", "virtualservices", "VirtualService")
    fake.create({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                 "metadata": {"name": "web", "namespace": "default"},
                 "spec": {"hosts": ["web"], "http": [{"directResponse": {"status": 418}}]}})

    async def teapot() -> bool:
        status, _ = await http_get(f"http://127.0.0.1:{port}/", headers={"Host": fqdn("web")}, timeout=3)
        return status == 418

    await wait_for(teapot, timeout=40, message="VirtualService from a CRD installed after start")


async def test_a_telemetry_from_the_apiserver_turns_access_logs_on(cluster, tmp_path):
    """telemetry.istio.io is watched: a mesh-wide Telemetry naming the built-in `envoy` provider
    (here with a file provider from the mesh ConfigMap) reaches Envoy as an access log."""
    fake, _cp, _envoy, _backends, port = cluster
    await wait_for(lambda: routed(port, "one"), message="routing from kube EndpointSlices")
    log = tmp_path / "kube-access.log"
    fake.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": "istio-system"},
                "data": {"mesh": f"extensionProviders:\n- name: file\n  envoyFileAccessLog: {{path: {log}}}\n"}})
    fake.register_crd("telemetry.istio.io", "v1", "telemetries", "Telemetry")
    fake.create({"apiVersion": "telemetry.istio.io/v1", "kind": "Telemetry",
                 "metadata": {"name": "mesh-default", "namespace": "istio-system"},
                 "spec": {"accessLogging": [{"providers": [{"name": "file"}]}]}})

    async def logged() -> bool:
        await routed(port, "one")
        return log.exists() and f"outbound|{port}||{fqdn('web')}" in log.read_text()

    await wait_for(logged, timeout=40, message="an access log line from the Telemetry in Kubernetes")
