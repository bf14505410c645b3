"""HTTP through a real Envoy configured by the real control plane, over SotW and delta ADS.

Every test starts `pilot-discovery` on a config directory of YAML files, a sidecar Envoy with
INTERCEPTION_MODE NONE (its outbound listeners bind 127.0.0.1:SERVICE_PORT) and a few HTTP
backends that answer with their own name. Config changes are file writes; every wait is a
deadline-bounded poll of something observable (an HTTP answer through Envoy, /debug/syncz).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field

import pytest

from pilot.pilotctl import resources_of
from tests.e2e.mesh_config import (
    NAMESPACE,
    endpoint_slice_yaml,
    fqdn,
    parse_counters,
    parse_histogram,
    service_yaml,
)
from tests.support.backends import HttpBackend, http_get
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)


# --- the mesh under test ----------------------------------------------------------------------

@dataclass
class Mesh:
    cp: ControlPlane
    envoy: Envoy
    node_id: str
    port: int  # the service port both services share; Envoy binds 127.0.0.1:port
    delta: bool
    backends: dict[str, HttpBackend] = field(default_factory=dict)

    def add_service(self, name: str, backend: str) -> None:
        self.cp.write(f"svc-{name}.yaml", service_yaml(name, self.port))
        self.set_endpoints(name, backend)

    def set_endpoints(self, service: str, backend: str) -> None:
        self.cp.write(f"eps-{service}.yaml", endpoint_slice_yaml(service, self.backends[backend].port))

    async def call(self, host: str) -> tuple[int, str | None]:
        """GET through Envoy with this Host; (status, name of the backend that answered or None)."""
        status, body = await http_get(f"http://127.0.0.1:{self.port}/", headers={"Host": host}, timeout=3)
        try:
            return status, json.loads(body).get("name")
        except ValueError:
            return status, None

    async def wait_routed(self, host: str, backend: str, timeout: float = 10.0) -> None:
        async def routed() -> bool:
            status, name = await self.call(host)
            return status == 200 and name == backend

        await wait_for(routed, timeout,
                       message=f"{host} -> {backend} through Envoy\n{self.envoy.log_tail(15)}\n"
                               f"{self.cp.log_tail(15)}")

    async def wait_synced(self) -> dict:
        return await self.cp.wait_synced(self.node_id)


@pytest.fixture(params=[False, True], ids=["sotw", "delta"])
async def mesh(request, tmp_path):
    """Control plane + Envoy + backends a, b, c; services alpha -> a and beta -> b on one port."""
    delta: bool = request.param
    backends = {n: await HttpBackend(n).start() for n in ("a", "b", "c")}
    cp = ControlPlane(tmp_path)
    node_id = sidecar_node_id("app-1")
    envoy = Envoy()
    m = Mesh(cp, envoy, node_id, free_port(), delta, backends)
    m.add_service("alpha", "a")
    m.add_service("beta", "b")
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(node_id, cp.xds_port, delta=delta), tmp_path)
        await envoy.wait_ready()
        await m.wait_routed(fqdn("alpha"), "a")
        await m.wait_synced()
        yield m
    finally:
        await envoy.stop()
        await cp.stop()
        for b in backends.values():
            await b.stop()


# --- tests --------------------------------------------------------------------------------------

async def test_services_sharing_a_port_are_routed_by_host(mesh: Mesh):
    for name, backend in (("alpha", "a"), ("beta", "b")):
        for host in (fqdn(name), name, f"{name}.{NAMESPACE}", f"{fqdn(name)}:{mesh.port}"):
            status, answered = await mesh.call(host)
            assert (status, answered) == (200, backend), f"Host {host}"

    # The server saw every type ACKed, and its config_dump holds the clusters Envoy uses.
    row = await mesh.wait_synced()
    for t in ("cluster", "listener", "route", "endpoint"):
        assert row[f"{t}_sent"] == row[f"{t}_acked"], row
        assert row[f"{t}_nack"] is None, row
    dump = await mesh.cp.debug(f"/debug/config_dump?proxyID={mesh.node_id}")
    names = {r["name"] for r in resources_of(dump, "clusters")}
    assert {f"outbound|{mesh.port}||{fqdn('alpha')}", f"outbound|{mesh.port}||{fqdn('beta')}",
            "PassthroughCluster", "BlackHoleCluster"} <= names
    # ...which are the clusters Envoy actually has.
    envoy_clusters = {c["name"] for c in (await mesh.envoy.clusters())["cluster_statuses"]}
    assert names <= envoy_clusters


async def test_endpoint_edit_moves_traffic_with_an_eds_only_push(mesh: Mesh):
    before_row = await mesh.wait_synced()
    before = parse_counters(await mesh.cp.metrics(), "pilot_xds_pushes")

    mesh.set_endpoints("alpha", "c")
    await mesh.wait_routed(fqdn("alpha"), "c")
    after_row = await wait_for(_endpoint_acked_after(mesh, before_row["endpoint_acked"]), 10,
                               message="EDS ACK after the edit")
    after = parse_counters(await mesh.cp.metrics(), "pilot_xds_pushes")

    assert after.get("eds", 0) > before.get("eds", 0), (before, after)
    for t in ("cds", "lds", "rds"):
        assert after.get(t, 0) == before.get(t, 0), f"{t} was pushed for an endpoint edit: {before} -> {after}"
    for t in ("cluster", "listener", "route"):
        assert after_row[f"{t}_acked"] == before_row[f"{t}_acked"], (before_row, after_row)
    assert (await mesh.call(fqdn("beta"))) == (200, "b")


async def test_deleting_a_service_removes_its_route_only(mesh: Mesh):
    mesh.cp.remove("svc-alpha.yaml")

    async def alpha_gone() -> bool:
        _status, answered = await mesh.call(fqdn("alpha"))
        return answered != "a"

    # Without a virtual host the request falls to the catch-all: never backend a again.
    await wait_for(alpha_gone, 10, message="alpha's route removed")
    row = await mesh.wait_synced()
    assert row["route_nack"] is None and row["cluster_nack"] is None
    status, answered = await mesh.call(fqdn("alpha"))
    assert answered != "a" and status != 200, (status, answered)
    assert (await mesh.call(fqdn("beta"))) == (200, "b")
    dump = await mesh.cp.debug(f"/debug/config_dump?proxyID={mesh.node_id}")
    clusters = {r["name"] for r in resources_of(dump, "clusters")}
    assert f"outbound|{mesh.port}||{fqdn('alpha')}" not in clusters


async def test_broken_files_are_rejected_and_leave_the_rest_routable(mesh: Mesh):
    mesh.cp.write("broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: [unclosed\n")
    mesh.cp.write("bad-port.yaml", service_yaml("gamma", 70000))
    # A good Service with a bad EndpointSlice: Envoy would NACK "not-an-ip" for the whole EDS
    # response, so the control plane must reject the slice itself and serve the Service empty.
    mesh.cp.write("bad-address.yaml", service_yaml("epsilon", mesh.port) + "---\n"
                  + endpoint_slice_yaml("epsilon", mesh.backends["a"].port, address="not-an-ip"))
    # A valid change made after the broken files proves they were read (and survived).
    mesh.add_service("delta", "c")
    await mesh.wait_routed(fqdn("delta"), "c")

    configz = await mesh.cp.debug("/debug/configz")

    def rejection(filename: str) -> dict:
        """The rejection whose source is `filename` (sources are `PATH#DOC-INDEX`)."""
        found = [r for r in configz["rejected"] if r["source"].split("/")[-1].split("#")[0] == filename]
        assert len(found) == 1, f"{filename}: {configz['rejected']}"
        return found[0]

    broken = rejection("broken.yaml")
    assert "invalid YAML" in broken["reason"], broken
    bad = rejection("bad-port.yaml")
    assert (bad["kind"], bad["name"]) == ("Service", "gamma"), bad
    assert "port" in bad["reason"] and "65535" in bad["reason"], bad
    assert not any(c["name"] == "gamma" for c in configz["configs"])
    bad_ip = rejection("bad-address.yaml")
    assert (bad_ip["kind"], bad_ip["name"]) == ("EndpointSlice", "epsilon-1"), bad_ip
    assert "not-an-ip" in bad_ip["reason"], bad_ip
    assert any(c["kind"] == "Service" and c["name"] == "epsilon" for c in configz["configs"])

    for name, backend in (("alpha", "a"), ("beta", "b"), ("delta", "c")):
        assert (await mesh.call(fqdn(name))) == (200, backend), name
    status, answered = await mesh.call(fqdn("epsilon"))
    assert (status, answered) == (503, None), "epsilon has no valid endpoints"
    row = await mesh.wait_synced()
    assert all(row[f"{t}_nack"] is None for t in ("cluster", "listener", "route", "endpoint")), row


def _endpoint_acked_after(mesh: Mesh, old_nonce: str):
    """A syncz predicate: the proxy ACKed an EDS response newer than `old_nonce`, and nothing
    sent after it is still unanswered."""

    async def check() -> dict | None:
        row = await mesh.cp.sync_status(mesh.node_id)
        if row and row["endpoint_acked"] != old_nonce and row["endpoint_acked"] == row["endpoint_sent"]:
            return row
        return None
    return check


async def test_endpoint_edit_to_ack_latency(mesh: Mesh):
    """Measured, not asserted: file write -> server-side EDS ACK, as seen by polling syncz."""
    edits = 40
    samples: list[float] = []
    count0, sum0 = parse_histogram(await mesh.cp.metrics(), "pilot_proxy_convergence_time")
    row = await mesh.wait_synced()
    backend = "a"
    for i in range(edits):
        backend = "c" if backend == "a" else "a"
        t0 = time.monotonic()
        mesh.set_endpoints("alpha", backend)
        row = await wait_for(_endpoint_acked_after(mesh, row["endpoint_acked"]), 10, interval=0.01,
                             message=f"EDS ACK for edit {i}")
        samples.append(time.monotonic() - t0)
    await mesh.wait_routed(fqdn("alpha"), backend)  # the last edit really routes
    count1, sum1 = parse_histogram(await mesh.cp.metrics(), "pilot_proxy_convergence_time")
    samples.sort()
    figures = {
        "test": "endpoint_edit_to_ack", "mode": "delta" if mesh.delta else "sotw", "edits": edits,
        "debounce_after": mesh.cp.env.get("PILOT_DEBOUNCE_AFTER"),
        "median_ms": round(statistics.median(samples) * 1000, 1),
        "p99_ms": round(statistics.quantiles(samples, n=100, method="inclusive")[98] * 1000, 1),
        "max_ms": round(samples[-1] * 1000, 1),
        "min_ms": round(samples[0] * 1000, 1),
        # Server-side, from the first event of a push to the ACK (excludes the file watcher).
        "server_convergence_mean_ms": round((sum1 - sum0) / (count1 - count0) * 1000, 1)
        if count1 > count0 else None,
    }
    print("FIGURES " + json.dumps(figures))


async def test_changed_clusters_warm_at_once(mesh: Mesh):
    """A CDS change re-creates clusters, and Envoy keeps them warming (and its CDS ACK back)
    until their endpoints arrive again: without re-sending EDS for exactly those clusters the
    ACK takes initial_fetch_timeout (15 s). It must come within a couple of seconds."""
    before = (await mesh.cp.sync_status(mesh.node_id))["cluster_acked"]
    mesh.cp.write("mesh.yaml", """
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: istio, namespace: istio-system}
        data:
          mesh: |
            connectTimeout: 3s
        """)

    async def cds_acked() -> bool:
        row = await mesh.cp.sync_status(mesh.node_id)
        return row["cluster_acked"] != before and row["cluster_sent"] == row["cluster_acked"]

    await wait_for(cds_acked, timeout=5, message="CDS ACK after a cluster change (warming stuck?)")
    dump = await mesh.envoy.config_dump(resource="dynamic_active_clusters")
    timeouts = {c["cluster"]["name"]: c["cluster"]["connect_timeout"] for c in dump["configs"]}
    assert timeouts[f"outbound|{mesh.port}||{fqdn('alpha')}"] == "3s"
    await mesh.wait_routed(fqdn("alpha"), "a")
