"""Locality failover through a real Envoy: the sidecar runs in zone-a (its Node message's
locality), the service has one backend on a Node in zone-a and one on a Node in zone-b. With
outlier detection in the DestinationRule (istiod's trigger; MeshConfig's localityLbSetting is
enabled by default) Envoy gets the zone-a endpoint at priority 0 and the zone-b one at priority
1: traffic stays in zone-a until its backend fails, outlier detection ejects it, and traffic
moves to zone-b. Then `distribute` splits zone-a's traffic 30/70 by locality weight. A second sidecar in zone-b is given the opposite priorities (EDS is per client
locality), while both share one set of bytes without a locality setting."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.e2e.mesh_config import fqdn, service_yaml
from tests.support.backends import HttpBackend, http_get
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(120)

NODES = textwrap.dedent("""\
    apiVersion: v1
    kind: Node
    metadata:
      name: node-a
      labels: {topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: zone-a}
    ---
    apiVersion: v1
    kind: Node
    metadata:
      name: node-b
      labels: {topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: zone-b}
    """)

DR = textwrap.dedent("""\
    apiVersion: networking.istio.io/v1
    kind: DestinationRule
    metadata: {name: web, namespace: default}
    spec:
      host: web
      trafficPolicy:
        outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 60s, maxEjectionPercent: 100}
    """)


DISTRIBUTE = textwrap.dedent("""\
    apiVersion: networking.istio.io/v1
    kind: DestinationRule
    metadata: {name: web, namespace: default}
    spec:
      host: web
      trafficPolicy:
        loadBalancer:
          localityLbSetting:
            distribute:
            - from: r1/zone-a/*
              to: {"r1/zone-a/*": 30, "r1/zone-b/*": 70}
    """)


def slice_yaml(name: str, port: int, node: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: {name}
          namespace: default
          labels: {{kubernetes.io/service-name: web}}
        addressType: IPv4
        ports: [{{name: http, port: {port}}}]
        endpoints:
        - addresses: ["127.0.0.1"]
          conditions: {{ready: true}}
          nodeName: {node}
        """)


def sidecar(pod: str, zone: str, xds_port: int) -> dict:
    boot = Envoy.bootstrap(sidecar_node_id(pod), xds_port)
    boot["node"]["locality"] = {"region": "r1", "zone": zone}
    return boot


async def priorities(envoy: Envoy, cluster: str) -> dict[int, int]:
    """port -> priority of each host of `cluster`, as Envoy holds them."""
    out: dict[int, int] = {}
    for c in (await envoy.clusters()).get("cluster_statuses", []):
        if c.get("name") == cluster:
            for h in c.get("host_statuses", []):
                out[h["address"]["socket_address"]["port_value"]] = h.get("priority", 0)
    return out


async def test_traffic_stays_in_zone_and_fails_over_when_ejected(tmp_path):
    a, b = HttpBackend("zone-a"), HttpBackend("zone-b")
    await a.start()
    await b.start()
    port = free_port()
    cluster = f"outbound|{port}||{fqdn('web')}"
    cp = ControlPlane(tmp_path)
    cp.write("nodes.yaml", NODES)
    cp.write("svc.yaml", service_yaml("web", port))
    cp.write("eps-a.yaml", slice_yaml("web-a", a.port, "node-a"))
    cp.write("eps-b.yaml", slice_yaml("web-b", b.port, "node-b"))
    cp.write("dr.yaml", DR)
    envoy, other = Envoy(), Envoy()
    try:
        await cp.start()
        await envoy.start(sidecar("app-1", "zone-a", cp.xds_port), tmp_path / "a")
        await other.start(sidecar("app-2", "zone-b", cp.xds_port), tmp_path / "b")
        await envoy.wait_ready()
        await other.wait_ready()

        want_a = {a.port: 0, b.port: 1}
        await wait_for(lambda: _equals(priorities(envoy, cluster), want_a), 30,
                       message=f"zone-a sidecar priorities {want_a}\n{envoy.log_tail(15)}\n{cp.log_tail(15)}")
        want_b = {a.port: 1, b.port: 0}
        await wait_for(lambda: _equals(priorities(other, cluster), want_b), 30,
                       message=f"zone-b sidecar priorities {want_b}\n{other.log_tail(15)}")
        # Both sidecars bind 127.0.0.1:port (reuse_port): only zone-a's may take the traffic.
        await other.stop()

        async def call() -> tuple[int, str | None]:
            status, body = await http_get(f"http://127.0.0.1:{port}/", headers={"Host": fqdn("web")}, timeout=3)
            try:
                return status, json.loads(body).get("name")
            except ValueError:
                return status, None

        await wait_for(lambda: _answers(call, "zone-a"), 30, message="web answers through the sidecar")
        answers = [await call() for _ in range(20)]
        assert answers == [(200, "zone-a")] * 20, answers  # all local: priority 1 takes nothing

        a.status = 503  # zone-a's backend fails; one 5xx ejects it
        await wait_for(lambda: _answers(call, "zone-b"), 30, message="failover to zone-b after ejection")
        answers = [await call() for _ in range(10)]
        assert answers == [(200, "zone-b")] * 10, answers
        ejected = [h for c in (await envoy.clusters())["cluster_statuses"] if c["name"] == cluster
                   for h in c["host_statuses"]
                   if h["address"]["socket_address"]["port_value"] == a.port]
        assert ejected and ejected[0]["health_status"].get("failed_outlier_check"), ejected

        # distribute: zone-a clients send 30% to zone-a and 70% to zone-b (locality-weighted LB).
        a.status = 200
        cp.write("dr.yaml", DISTRIBUTE)

        async def weighted() -> bool:
            dump = await envoy.config_dump(resource="dynamic_active_clusters")
            return any(c.get("cluster", {}).get("name") == cluster
                       and "locality_weighted_lb_config" in c["cluster"].get("common_lb_config", {})
                       for c in dump.get("configs", []))

        await wait_for(weighted, 30, message=f"locality-weighted cluster\n{cp.log_tail(15)}")
        await wait_for(lambda: _answers(call, "zone-a"), 30, message="zone-a back in rotation")
        names = [(await call())[1] for _ in range(100)]
        share_b = names.count("zone-b")
        assert names.count("zone-a") + share_b == 100 and 50 <= share_b <= 90, share_b
    finally:
        await envoy.stop()
        await other.stop()
        await cp.stop()
        await a.stop()
        await b.stop()


async def _equals(got, want) -> bool:
    return (await got) == want


async def _answers(call, name: str) -> bool:
    status, who = await call()
    return status == 200 and who == name
