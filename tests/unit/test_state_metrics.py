"""istiod's state gauges are computed from the push context and the connected proxies."""

from __future__ import annotations

from pilot.features import Features
from pilot.xds.connection import Connection
from pilot.xds.discovery import DiscoveryServer
from pilot.xds.state_metrics import StateCollector
from tests.unit.helpers import World, endpoint_slice, proxy, service


def _server(world: World) -> tuple[DiscoveryServer, StateCollector]:
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))
    return server, StateCollector(server)


def test_services_clusters_without_endpoints_and_tcp_port_conflicts():
    world = World()
    tcp = [{"name": "tcp", "port": 9300, "targetPort": 9300}]
    world.apply(service("web"), endpoint_slice("web-1", "web"), service("db", cluster_ip=None, ports=tcp),
                service("cache", cluster_ip=None, ports=tcp),
                service("queue", cluster_ip="10.96.0.30", ports=tcp))
    _srv, collector = _server(world)
    v = collector.values()
    assert v["pilot_services"] == 4
    assert v["pilot_eds_no_instances"] == 3  # db, cache, queue
    # cache and db share 9300 without cluster IPs: one of them cannot be told apart; queue has its IP.
    assert v["pilot_conflict_outbound_listener_tcp_over_current_tcp"] == 1
    assert v["pilot_virt_services"] == 0
    assert {f.name for f in collector.describe()} == set(v)


def test_inbound_conflicts_count_connected_sidecars_with_unservable_ports():
    world = World()
    svc = service("web", ports=[{"name": "http", "port": 80, "targetPort": "http-web"}])
    svc["spec"]["selector"] = {"app": "web"}
    world.apply(svc, endpoint_slice("web-1", "web", addresses=("10.0.0.1",), port=8080, port_name="other"))
    server, collector = _server(world)
    assert collector.values()["pilot_conflict_inbound_listener"] == 0
    p = proxy(ip="10.0.0.1")
    p.metadata = {**p.metadata, "LABELS": {"app": "web"}}
    p.identity = "spiffe://cluster.local/ns/default/sa/web"
    server.register(Connection(p, "", False))
    assert collector.values()["pilot_conflict_inbound_listener"] == 1  # targetPort http-web is nowhere
    server.unregister(next(iter(server.connections.values())))
    assert collector.values()["pilot_conflict_inbound_listener"] == 0
