"""pilotctl against two real control plane replicas and real Envoys: every column checked against
what the Envoy itself holds (its /config_dump and /clusters), several replicas with the ISTIOD
column, `ps PROXY` diffs, filters, -o json, and bad input answered with a message and status 1."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request

import pytest
import yaml

from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.fakes.apiserver import FakeApiServer
from tests.support.backends import HttpBackend
from tests.support.control_plane import REPO_ROOT, ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

# Each pilotctl call is a fresh Python process; a test making many of them took 91 s at load 15
# (a hang bound, not a speed check).
pytestmark = pytest.mark.timeout(180)
NODE_A, NODE_B = sidecar_node_id("front-1"), sidecar_node_id("back-1")
RULES = """\
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: web-dr, namespace: default}
spec:
  host: web.default.svc.cluster.local
  trafficPolicy: {outlierDetection: {consecutive5xxErrors: 3, interval: 1s, baseEjectionTime: 30s}}
  subsets: [{name: v1, labels: {version: v1}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web-vs, namespace: default}
spec:
  hosts: [web]
  http:
  - match: [{uri: {prefix: /v1}}]
    route: [{destination: {host: web, subset: v1}}]
  - route: [{destination: {host: web}}]
"""


async def pilotctl(*args: str, timeout: float = 30) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pilot.pilotctl", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(REPO_ROOT))
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, out.decode(), err.decode()


async def ok(*args: str) -> str:
    code, out, err = await pilotctl(*args)
    assert code == 0, f"pilotctl {' '.join(args)}: {err}"
    assert "Traceback" not in err
    return out


@pytest.fixture
async def mesh(tmp_path):
    backend = await HttpBackend("one").start()
    port = free_port()
    planes = [ControlPlane(tmp_path, name=f"cp-{n}", env={"POD_NAME": f"istiod-{n}"}) for n in ("a", "b")]
    envoys = [Envoy(), Envoy()]
    try:
        for cp in planes:
            cp.write("svc.yaml", service_yaml("web", port))
            cp.write("eps.yaml", endpoint_slice_yaml("web", backend.port))
            cp.write("rules.yaml", RULES)
            await cp.start()
        # Envoy A names a fixed admin port in its node metadata (as pilot-agent's PROXY_CONFIG
        # does), so pilotctl finds its admin itself; Envoy B's admin is given with --admin.
        admin_port = free_port()
        boot = Envoy.bootstrap(NODE_A, planes[0].xds_port, metadata={
            "NAMESPACE": "default", "INTERCEPTION_MODE": "NONE", "PROXY_CONFIG": {"proxyAdminPort": admin_port}})
        boot["admin"]["address"]["socket_address"]["port_value"] = admin_port
        await envoys[0].start(boot, tmp_path)
        await envoys[1].start(Envoy.bootstrap(NODE_B, planes[1].xds_port), tmp_path)
        for e in envoys:
            await e.wait_ready()
        await planes[0].wait_synced(NODE_A)
        await planes[1].wait_synced(NODE_B)
        addrs = [arg for cp in planes for arg in ("--addr", f"127.0.0.1:{cp.ports['monitoring']}")]
        yield planes, envoys, addrs, port
    finally:
        for e in envoys:
            await e.stop()
        for cp in planes:
            await cp.stop()
        await backend.stop()


async def test_columns_come_from_real_state(mesh):
    planes, (envoy_a, envoy_b), addrs, port = mesh
    # ps: both replicas' proxies, each with the replica it is connected to.
    rows = {line.split()[0]: line.split() for line in (await ok(*addrs, "ps")).splitlines()[1:]}
    header = (await ok(*addrs, "ps")).splitlines()[0].split()
    assert header == ["NAME", "CLUSTER", "CDS", "LDS", "EDS", "RDS", "ISTIOD", "VERSION"]
    assert rows["front-1.default"][2:7] == ["SYNCED"] * 4 + ["istiod-a"]
    assert rows["back-1.default"][2:7] == ["SYNCED"] * 4 + ["istiod-b"]
    as_json = json.loads(await ok(*addrs, "ps", "-o", "json"))
    assert {(r["name"], r["istiod"]) for r in as_json} == {("front-1.default", "istiod-a"),
                                                          ("back-1.default", "istiod-b")}
    assert yaml.safe_load(await ok(*addrs, "ps", "-o", "yaml")) == as_json

    # DESTINATION RULE: from the metadata Envoy itself holds for the cluster.
    web = fqdn("web")
    dump = await envoy_a.config_dump(resource="dynamic_active_clusters")
    held = {c["cluster"]["name"]: c["cluster"] for c in dump["configs"]}
    istio_md = held[f"outbound|{port}|v1|{web}"]["metadata"]["filter_metadata"]["istio"]
    assert istio_md["config"] == "/apis/networking.istio.io/v1/namespaces/default/destination-rule/web-dr"
    assert istio_md["subset"] == "v1"
    assert istio_md["services"] == [{"host": web, "name": "web", "namespace": "default"}]
    table = await ok(*addrs, "pc", "clusters", "front-1.default", "--fqdn", web)
    lines = [ln.split() for ln in table.splitlines()[1:]]
    assert [web, str(port), "v1", "outbound", "EDS", "web-dr.default"] in lines
    assert [web, str(port), "-", "outbound", "EDS", "web-dr.default"] in lines
    assert all(ln[0] == web for ln in lines)  # --fqdn filtered the rest out
    subset_only = await ok(*addrs, "pc", "clusters", "front-1.default", "--subset", "v1", "--port", str(port))
    assert [ln.split()[2] for ln in subset_only.splitlines()[1:]] == ["v1"]
    # The same table from the Envoy's own dump (--admin): the same columns.
    from_envoy = await ok(*addrs, "pc", "clusters", "back-1.default", "--admin", envoy_b.admin_address,
                          "--direction", "outbound", "--fqdn", web)
    assert [web, str(port), "v1", "outbound", "EDS", "web-dr.default"] in [ln.split() for ln in from_envoy.splitlines()]

    # VIRTUAL SERVICE: from the routes' metadata.
    routes = await ok(*addrs, "pc", "routes", "front-1.default", "--name", str(port))
    vs_rows = [ln.split() for ln in routes.splitlines()[1:] if "web-vs.default" in ln]
    assert [r[-2:] for r in vs_rows] == [["/v1*", "web-vs.default"], ["/*", "web-vs.default"]]
    assert all(ln.split()[0] == str(port) for ln in routes.splitlines()[1:])
    # ... which the Envoy holds as sent (its own dump, through --admin).
    held_routes = await ok(*addrs, "pc", "routes", "back-1.default", "--admin", envoy_b.admin_address)
    assert [ln.split()[-2:] for ln in held_routes.splitlines() if "web-vs.default" in ln] == \
        [["/v1*", "web-vs.default"], ["/*", "web-vs.default"]]

    # OUTLIER CHECK and STATUS: Envoy's /clusters health flags for each host.
    eps = await ok(*addrs, "pc", "endpoints", "front-1.default", "--cluster", f"outbound|{port}||{web}")
    assert eps.splitlines()[0].split() == ["ENDPOINT", "STATUS", "OUTLIER", "CHECK", "CLUSTER"]
    host = await envoy_a.clusters()
    [status] = [c for c in host["cluster_statuses"] if c["name"] == f"outbound|{port}||{web}"]
    [h] = status["host_statuses"]
    addr = f"{h['address']['socket_address']['address']}:{h['address']['socket_address']['port_value']}"
    assert eps.splitlines()[1].split() == [addr, h["health_status"]["eds_health_status"], "OK", f"outbound|{port}||{web}"]

    # ps PROXY: what the replica would send against what the Envoy holds.
    assert (await ok(*addrs, "ps", "front-1.default")).splitlines() == \
        ["Clusters Match", "Listeners Match", "Routes Match"]
    diff = json.loads(await ok(*addrs, "ps", "back-1.default", "--admin", envoy_b.admin_address, "-o", "json"))
    assert all(d["match"] for d in diff.values())
    # A change: the proxy converges on it again, and the new cluster is listed.
    planes[0].write("svc2.yaml", service_yaml("extra", free_port()))

    async def matched() -> bool:
        code, out, _ = await pilotctl(*addrs[:2], "ps", "front-1.default")
        return code == 0 and out.splitlines() == ["Clusters Match", "Listeners Match", "Routes Match"] \
            and fqdn("extra") in await ok(*addrs[:2], "pc", "clusters", "front-1.default", "--admin",
                                          envoy_a.admin_address)

    await wait_for(matched, 30, message="Envoy A converged on replica a's new cluster")

    # bootstrap and all: from the Envoy.
    boot = yaml.safe_load(await ok(*addrs, "pc", "bootstrap", "front-1.default"))
    assert boot["node"]["id"] == NODE_A
    everything = json.loads(await ok(*addrs, "pc", "all", "front-1.default", "-o", "json"))
    assert set(everything) == {"clusters", "listeners", "routes", "endpoints", "secrets"}
    assert f"outbound|{port}|v1|{web}" in {c["name"] for c in everything["clusters"]}
    assert everything["endpoints"] and all(e["outlier_check"] == "OK" for e in everything["endpoints"])


async def test_bad_input_is_a_message_and_status_1(mesh):
    _planes, (_envoy_a, envoy_b), addrs, _port = mesh
    dead = f"127.0.0.1:{free_port()}"
    cases = [
        ((*addrs, "pc", "clusters", "nobody.default"), "is not connected to the control plane at"),
        ((*addrs, "ps", "nobody.default"), "is not connected to the control plane at"),
        ((*addrs, "explain", "nobody.default", "cds", "x"), "is not connected"),
        ((*addrs, "explain", "front-1.default", "bogus", "x"), "unknown type 'bogus'"),
        ((*addrs, "pc", "clusters", ""), "a proxy is required"),
        (("--addr", "not-an-address", "ps"), "is not HOST:PORT"),
        (("--addr", "127.0.0.1:99999", "ps"), "port '99999' is not a number"),
        (("--addr", dead, "ps"), f"cannot reach the control plane at {dead}"),
        (("--addr", dead, "pc", "clusters", "front-1.default"), f"cannot reach the control plane at {dead}"),
        ((*addrs, "pc", "bootstrap", "back-1.default"), "is the proxy's own state"),
        ((*addrs, "pc", "clusters", "back-1.default", "--admin", f"127.0.0.1:{free_port()}"),
         "cannot reach the proxy's Envoy admin"),
        ((*addrs, "pc", "clusters", "front-1.default", "--admin", envoy_b.admin_address), f"is node '{NODE_B}'"),
        (("jwt", "token", "/nonexistent/dir", "--namespace", "a", "--sa", "b"), "run `pilotctl jwt init"),
        ((*addrs, "--token-file", "/nonexistent/token", "ps"), "cannot read --token-file /nonexistent/token"),
    ]
    for args, message in cases:
        code, out, err = await pilotctl(*args)
        assert code == 1, (args, code, out, err)
        assert message in err, (args, err)
        assert "Traceback" not in err, err
    # argparse refusals (exit 2), no traceback either.
    for args in ((*addrs, "pc", "clusters", "front-1.default", "--port", "http"), (*addrs, "pc", "nonsense", "x")):
        code, _, err = await pilotctl(*args)
        assert code == 2 and "Traceback" not in err, err
    # One replica down: the other's proxies are shown, the missing one is said, status 1.
    code, out, err = await pilotctl(addrs[0], addrs[1], "--addr", dead, "ps")
    assert code == 1 and "front-1.default" in out and f"control plane {dead} not read" in err, (out, err)
    # ... but a proxy on a live replica is still found.
    await ok(addrs[0], addrs[1], "--addr", dead, "pc", "clusters", "front-1.default")


async def test_replicas_found_through_the_kubeconfig(mesh, tmp_path):
    planes, *_ = mesh
    async with FakeApiServer() as fake:
        def istiod(name: str, port: int, phase: str = "Running") -> dict:
            return {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": "istio-system", "labels": {"app": "istiod"}},
                    "spec": {"containers": [{"name": "discovery", "image": "pilot", "ports": [
                        {"name": "grpc-xds", "containerPort": 15010},
                        {"name": "http-monitoring", "containerPort": port}]}]},
                    "status": {"phase": phase, "podIP": "127.0.0.1"}}
        fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
        for name, cp in zip(("istiod-a", "istiod-b"), planes):
            fake.create(istiod(name, cp.ports["monitoring"]))
        fake.create(istiod("istiod-starting", free_port(), phase="Pending"))  # not a replica yet
        kc = fake.write_kubeconfig(tmp_path / "kubeconfig")
        rows = json.loads(await ok("--kubeconfig", kc, "ps", "-o", "json"))
        assert {(r["name"], r["istiod"]) for r in rows} == {("front-1.default", "istiod-a"),
                                                           ("back-1.default", "istiod-b")}
        code, _, err = await pilotctl("--kubeconfig", kc, "-i", "elsewhere", "ps")
        assert code == 1 and "no running pod in elsewhere matches 'app=istiod'" in err, err
    code, _, err = await pilotctl("--kubeconfig", kc, "ps")  # the API server is gone
    assert code == 1 and "cannot reach the Kubernetes API" in err and "Traceback" not in err, err
    code, _, err = await pilotctl("--kubeconfig", str(tmp_path / "missing"), "ps")
    assert code == 1 and "does not exist" in err, err


async def test_debug_endpoints_pilotctl_uses_refuse_bad_queries_clearly(mesh):
    planes, *_ = mesh
    cp = planes[0]
    cases = [("/debug/config_dump", 400, "proxyID is required"),
             ("/debug/config_dump?proxyID=nobody.default", 404, "Proxy not connected to this Pilot instance"),
             ("/debug/explain", 400, "proxyID, type, name required"),
             ("/debug/explain?proxyID=front-1.default&type=cds", 400, "name required"),
             ("/debug/explain?proxyID=front-1.default&type=bogus&name=x", 400, "unknown type 'bogus'"),
             ("/debug/explain?proxyID=nobody.default&type=cds&name=x", 404, "is not connected")]
    for path, status, text in cases:
        code, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{cp.ports['monitoring']}{path}")
        assert (code, text in body) == (status, True), (path, code, body)
        assert "Traceback" not in body


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_completion_script_and_proxy_names(mesh):
    _planes, _envoys, addrs, _port = mesh
    script = await ok("completion", "bash")
    assert "complete " in script and "pilotctl" in script
    # argcomplete's protocol: the shell passes the line in COMP_LINE; candidates come back on fd 8.
    line = f"pilotctl {' '.join(addrs)} pc clusters fr"
    read, write = os.pipe()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pilot.pilotctl", cwd=str(REPO_ROOT), pass_fds=(write,),
        env={**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
             "_ARGCOMPLETE_STDOUT_FILENAME": f"/dev/fd/{write}", "_ARGCOMPLETE_IFS": "\n"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    await asyncio.wait_for(proc.communicate(), 30)
    os.close(write)
    with os.fdopen(read) as f:
        assert f.read().split() == ["front-1.default"]
