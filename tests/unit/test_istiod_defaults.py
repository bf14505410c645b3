"""Fields istiod applies in full where this project once applied them in part, and defaults it
applies where the user wrote nothing: the outbound load balancer, MeshConfig h2UpgradePolicy,
fault injection without a percentage, DestinationRule connection pools on inbound clusters, a
Sidecar egress listener's protocol.

Each is checked against istio/istio pilot/pkg/networking/core (cluster_traffic_policy.go:
applyLoadBalancer / defaultLBAlgorithm, shouldH2Upgrade, applyTrafficPolicy; cluster_builder.go:
buildInboundCluster; listener.go: buildSidecarOutboundListeners; route/route.go: TranslateFault) and,
for the fault percentages, against a real Envoy (an abort without a percentage aborts nothing).
"""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.type.v3 import percent_pb2

from pilot.config.mesh import MeshConfig

from .helpers import World, endpoint_slice, mesh_configmap, proxy, service
from .test_cache_inputs_traffic_fields import CLUSTER, dr, http_options

REVIEWS = "reviews.default.svc.cluster.local"
TCP_CLUSTER = "outbound|3306||db.default.svc.cluster.local"


@pytest.fixture
def world() -> World:
    w = World()
    w.apply(service("reviews"), endpoint_slice("reviews-1", "reviews", addresses=("10.1.0.1",), port=9080),
            service("db", cluster_ip="10.96.0.30", ports=[{"name": "tcp", "port": 3306, "targetPort": 3306}]))
    return w


def clusters(world: World, p=None) -> dict[str, cluster_pb2.Cluster]:
    return {n: r.message(cluster_pb2.Cluster) for n, r in world.cds(p or proxy()).items()}


# --- the load balancer and circuit breakers ------------------------------------------------------
MAX = 2**32 - 1


def test_every_cluster_starts_from_istiods_circuit_breaker_thresholds(world: World) -> None:
    """getDefaultCircuitBreakerThresholds: no limits of istiod's own (Envoy's 1024 connections
    and 3 parallel retries would turn pod churn into 503s), remaining capacity tracked; a
    connection pool overrides only what it sets, and a zero keeps the default (as istiod)."""
    p = _server(world)
    got = clusters(world, p)
    for name in (CLUSTER, TCP_CLUSTER, "PassthroughCluster", "InboundPassthroughCluster", "inbound|9080||"):
        (t,) = got[name].circuit_breakers.thresholds
        assert (t.max_connections.value, t.max_pending_requests.value, t.max_requests.value, t.max_retries.value,
                t.track_remaining) == (MAX, MAX, MAX, MAX, True), name
    assert not got["BlackHoleCluster"].HasField("circuit_breakers")
    world.apply(dr({"trafficPolicy": {"connectionPool": {"http": {"http2MaxRequests": 50, "maxRetries": 0}}}}))
    (t,) = clusters(world)[CLUSTER].circuit_breakers.thresholds
    assert (t.max_requests.value, t.max_retries.value, t.max_connections.value) == (50, MAX, MAX)


def test_outbound_clusters_balance_by_least_request_unless_told_otherwise(world: World) -> None:
    got = clusters(world)
    assert got[CLUSTER].lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    assert got[TCP_CLUSTER].lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    assert got["PassthroughCluster"].lb_policy == cluster_pb2.Cluster.CLUSTER_PROVIDED
    # A rule that says nothing of balancing keeps the default; one that names a balancer wins.
    world.apply(dr({"trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 5}}}}))
    assert clusters(world)[CLUSTER].lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    world.apply(dr({"trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}))
    assert clusters(world)[CLUSTER].lb_policy == cluster_pb2.Cluster.ROUND_ROBIN
    world.apply(dr({"trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}))
    assert clusters(world)[CLUSTER].lb_policy == cluster_pb2.Cluster.RANDOM


def test_proxyless_grpc_clients_balance_by_round_robin_which_their_xds_client_accepts(world: World) -> None:
    """grpcio NACKs a LEAST_REQUEST cluster ("LB policy is not supported"): as istiod's grpcgen, a
    gRPC client keeps round robin for the default and any simple policy but ring hash, while a
    sidecar on the same mesh keeps least request (different bytes, not one cached cluster)."""
    grpc = proxy(pod_name="grpc-1", generator="grpc")
    assert clusters(world, grpc)[CLUSTER].lb_policy == cluster_pb2.Cluster.ROUND_ROBIN
    assert clusters(world)[CLUSTER].lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    world.apply(dr({"trafficPolicy": {"loadBalancer": {"simple": "LEAST_REQUEST", "warmup": {"duration": "30s"}}}}))
    c = clusters(world, grpc)[CLUSTER]
    assert c.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN and not c.HasField("least_request_lb_config")
    world.apply(dr({"trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}}}}))
    assert clusters(world, grpc)[CLUSTER].lb_policy == cluster_pb2.Cluster.RING_HASH


def test_warmup_without_a_balancer_warms_the_default_least_request_balancer(world: World) -> None:
    world.apply(dr({"trafficPolicy": {"loadBalancer": {"warmup": {"duration": "30s"}}}}))
    c = clusters(world)[CLUSTER]
    assert c.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    assert c.least_request_lb_config.slow_start_config.slow_start_window.seconds == 30
    assert not c.HasField("round_robin_lb_config")


# --- MeshConfig h2UpgradePolicy --------------------------------------------------------------------

def _speaks_h2(c: cluster_pb2.Cluster) -> bool:
    key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    return key in c.typed_extension_protocol_options and \
        http_options(c).explicit_http_config.HasField("http2_protocol_options")


def _upgrade_mesh(world: World, policy: str | None) -> None:
    world.apply(mesh_configmap({} if policy is None else {"h2UpgradePolicy": policy}))


def test_mesh_h2_upgrade_policy_upgrades_http_ports_only(world: World) -> None:
    assert not _speaks_h2(clusters(world)[CLUSTER])
    _upgrade_mesh(world, "UPGRADE")
    got = clusters(world)
    assert _speaks_h2(got[CLUSTER])
    assert not _speaks_h2(got[TCP_CLUSTER])  # istiod: never a non-HTTP (or sniffed) port
    _upgrade_mesh(world, "DO_NOT_UPGRADE")
    assert not _speaks_h2(clusters(world)[CLUSTER])


def test_a_destination_rule_overrides_the_mesh_h2_upgrade_policy(world: World) -> None:
    _upgrade_mesh(world, "UPGRADE")
    world.apply(dr({"trafficPolicy": {"connectionPool": {"http": {"h2UpgradePolicy": "DO_NOT_UPGRADE"}}}}))
    assert not _speaks_h2(clusters(world)[CLUSTER])
    world.apply(dr({"trafficPolicy": {"connectionPool": {"http": {"useClientProtocol": True}}}}))
    c = clusters(world)[CLUSTER]
    assert not _speaks_h2(c) and http_options(c).HasField("use_downstream_protocol_config")
    world.apply(dr({"trafficPolicy": {"connectionPool": {"http": {"h2UpgradePolicy": "DEFAULT",
                                                                    "maxConcurrentStreams": 7}}}}))
    c = clusters(world)[CLUSTER]  # DEFAULT defers to the mesh: upgraded, so the stream limit applies
    assert _speaks_h2(c)
    assert http_options(c).explicit_http_config.http2_protocol_options.max_concurrent_streams.value == 7
    # Without the mesh upgrade, a rule's UPGRADE still upgrades (even a TCP port, as istiod).
    _upgrade_mesh(world, None)
    world.apply(dr({"trafficPolicy": {"connectionPool": {"http": {"h2UpgradePolicy": "UPGRADE"}}}}))
    assert _speaks_h2(clusters(world)[CLUSTER])


def _alpn(world: World) -> list[str]:
    p = proxy(interception="REDIRECT")
    p.identity = "spiffe://cluster.local/ns/default/sa/app"
    c = clusters(world, p)[CLUSTER]
    (match,) = [m for m in c.transport_socket_matches if m.name == "tlsMode-istio"]
    ctx = tls_pb2.UpstreamTlsContext()
    match.transport_socket.typed_config.Unpack(ctx)
    return list(ctx.common_tls_context.alpn_protocols)


def test_an_upgraded_mtls_cluster_offers_h2_in_its_alpn(world: World) -> None:
    assert "h2" not in _alpn(world)
    _upgrade_mesh(world, "UPGRADE")
    assert _alpn(world)[-2:] == ["istio", "h2"]  # istiod's ALPNInMeshH2


def test_an_unknown_mesh_h2_upgrade_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="h2UpgradePolicy"):
        MeshConfig.model_validate({"h2UpgradePolicy": "SOMETIMES"})


# --- fault injection percentages ------------------------------------------------------------------

def _fault(world: World, fault: dict) -> fault_pb2.HTTPFault:
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                 "metadata": {"name": "reviews", "namespace": "default"},
                 "spec": {"hosts": ["reviews"],
                          "http": [{"fault": fault, "route": [{"destination": {"host": "reviews"}}]}]}})
    for r in world.rds(proxy(), {"9080"}).values():
        for vh in r.message(route_pb2.RouteConfiguration).virtual_hosts:
            for route in vh.routes:
                cfg = route.typed_per_filter_config.get("envoy.filters.http.fault")
                if cfg is not None:
                    out = fault_pb2.HTTPFault()
                    cfg.Unpack(out)
                    return out
    raise AssertionError("no fault filter config on the route")


def test_a_delay_without_percentage_delays_no_request_as_istiod_writes_it(world: World) -> None:
    f = _fault(world, {"delay": {"fixedDelay": "2s"}})
    assert (f.delay.percentage.numerator, f.delay.percentage.denominator) == (0, percent_pb2.FractionalPercent.HUNDRED)
    f = _fault(world, {"delay": {"fixedDelay": "2s", "percent": 30}})
    assert (f.delay.percentage.numerator, f.delay.percentage.denominator) == (30, percent_pb2.FractionalPercent.HUNDRED)
    f = _fault(world, {"delay": {"fixedDelay": "2s", "percentage": {"value": 12.5}}})
    assert (f.delay.percentage.numerator, f.delay.percentage.denominator) == \
        (125_000, percent_pb2.FractionalPercent.MILLION)


def test_an_abort_without_percentage_leaves_envoys_percentage_unset(world: World) -> None:
    f = _fault(world, {"abort": {"httpStatus": 418}})
    assert f.abort.http_status == 418 and not f.abort.HasField("percentage")
    f = _fault(world, {"abort": {"httpStatus": 418, "percentage": {"value": 100}}})
    assert f.abort.percentage.numerator == 1_000_000


# --- DestinationRule connection pools on inbound clusters ------------------------------------------

def _server(world: World, labels: dict | None = None):
    """A sidecar with a mesh identity, selected by Service reviews (inbound|9080||)."""
    svc = service("reviews")
    svc["spec"]["selector"] = {"app": "reviews"}
    world.apply(svc)
    p = proxy(interception="REDIRECT", pod_name="reviews-1", ip="10.1.0.1")
    p.identity = "spiffe://cluster.local/ns/default/sa/reviews"
    p.metadata["LABELS"] = labels or {"app": "reviews"}
    return p


def _inbound(world: World, p) -> cluster_pb2.Cluster:
    return clusters(world, p)["inbound|9080||"]


def test_a_destination_rules_connection_pool_shapes_the_servers_inbound_cluster(world: World) -> None:
    """istiod's buildInboundCluster: the server gets the same limits as its clients, so it has
    the capacity they are allowed to use (connection pool only; no balancer, no TLS inbound)."""
    p = _server(world)
    assert _inbound(world, p).circuit_breakers.thresholds[0].max_connections.value == MAX
    world.apply(dr({"trafficPolicy": {
        "connectionPool": {"tcp": {"maxConnections": 17}, "http": {"idleTimeout": "20s"}},
        "loadBalancer": {"simple": "RANDOM"}, "tls": {"mode": "ISTIO_MUTUAL"}}}))
    c = _inbound(world, p)
    assert c.circuit_breakers.thresholds[0].max_connections.value == 17
    assert http_options(c).common_http_protocol_options.idle_timeout.seconds == 20
    assert c.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN and not c.HasField("transport_socket")
    # Port-level settings for the service port win, as outbound.
    world.apply(dr({"trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 17}},
                                      "portLevelSettings": [{"port": {"number": 9080},
                                                             "connectionPool": {"tcp": {"maxConnections": 4}}}]}}))
    assert _inbound(world, p).circuit_breakers.thresholds[0].max_connections.value == 4


def test_a_sidecars_inbound_pool_wins_over_the_rules_and_selector_rules_stay_outbound(world: World) -> None:
    p = _server(world)
    world.apply(dr({"trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 17}}}}))
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                 "metadata": {"name": "reviews", "namespace": "default"},
                 "spec": {"workloadSelector": {"labels": {"app": "reviews"}},
                          "inboundConnectionPool": {"tcp": {"maxConnections": 3}}}})
    assert _inbound(world, p).circuit_breakers.thresholds[0].max_connections.value == 3
    # A rule with a workloadSelector is honoured outbound only (istiod's SidecarScope.DestinationRule).
    world.store.delete(next(e.key for e in world.store.list("Sidecar")))
    world.apply(dr({"workloadSelector": {"matchLabels": {"app": "reviews"}},
                    "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 9}}}}, name="selected"))
    assert _inbound(world, p).circuit_breakers.thresholds[0].max_connections.value == 17


# --- Sidecar egress listener protocol ----------------------------------------------------------------

def _egress_sidecar(world: World, port: int, protocol: str, host: str) -> None:
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                 "metadata": {"name": "default", "namespace": "default"},
                 "spec": {"egress": [{"port": {"number": port, "protocol": protocol, "name": "egress"},
                                      "hosts": [f"./{host}"]}, {"hosts": ["./*"]}]}})


def _network_filters(world: World, port: int) -> list[str]:
    for r in world.lds(proxy()).values():
        lis = r.message(listener_pb2.Listener)
        if lis.address.socket_address.port_value == port:
            return [f.name for fc in lis.filter_chains for f in fc.filters]
    raise AssertionError(f"no listener on port {port}")


def test_an_egress_listeners_protocol_decides_how_its_port_is_served(world: World) -> None:
    """istiod builds a port-specific egress listener with the protocol it declares."""
    assert _network_filters(world, 9080) == ["envoy.filters.network.http_connection_manager"]
    assert _network_filters(world, 3306) == ["envoy.filters.network.tcp_proxy"]
    _egress_sidecar(world, 9080, "TCP", "reviews.default.svc.cluster.local")
    assert _network_filters(world, 9080) == ["envoy.filters.network.tcp_proxy"]
    routes = world.rds(proxy(), {"9080"}).values()
    assert not any("reviews" in d for r in routes
                   for vh in r.message(route_pb2.RouteConfiguration).virtual_hosts for d in vh.domains)
    _egress_sidecar(world, 3306, "HTTP", "db.default.svc.cluster.local")
    assert _network_filters(world, 3306) == ["envoy.filters.network.http_connection_manager"]
    vhosts = world.rds(proxy(), {"3306"})["3306"].message(route_pb2.RouteConfiguration).virtual_hosts
    assert any("db.default.svc.cluster.local:3306" in vh.domains for vh in vhosts)
    # The service's own cluster keeps the service's protocol (istiod builds clusters from services).
    assert not _speaks_h2(clusters(world)[TCP_CLUSTER])


def _listener_ports(world: World, p=None) -> set[int]:
    return {r.message(listener_pb2.Listener).address.socket_address.port_value
            for r in world.lds(p or proxy()).values()}


def test_an_egress_port_no_named_service_has_gets_no_listener(world: World) -> None:
    """istio 1.30's SidecarScope (needsPortMatch / serviceMatchingListenerPort): a port-specific
    egress listener sees only the services that have its port. On a port that no named service
    has (TCP or HTTP, a VirtualService for the host or not) istiod builds no listener, and a
    service seen only through such a listener is not seen at all; the older single-port
    fallback is gone."""
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                 "metadata": {"name": "api", "namespace": "default"},
                 "spec": {"hosts": ["api.example.com"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}})
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                 "metadata": {"name": "default", "namespace": "default"},
                 "spec": {"egress": [{"port": {"number": 7777, "protocol": "TCP", "name": "tcp"},
                                      "hosts": ["./db.default.svc.cluster.local"]},
                                     {"port": {"number": 8088, "protocol": "HTTP", "name": "http"},
                                      "hosts": ["./*"]}]}})
    assert not {7777, 8088, 3306, 9080} & _listener_ports(world)
    assert not {n for n in clusters(world) if n.startswith("outbound|")}
    # With a catch-all, each service is reached on its own port as usual.
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                 "metadata": {"name": "default", "namespace": "default"},
                 "spec": {"egress": [{"port": {"number": 7777, "protocol": "TCP", "name": "tcp"},
                                      "hosts": ["./db.default.svc.cluster.local"]}, {"hosts": ["./*"]}]}})
    ports = _listener_ports(world)
    assert 7777 not in ports and {3306, 9080} <= ports


def test_a_catch_all_egress_listener_binds_its_ports_as_istiod(world: World) -> None:
    """istiod: `captureMode: NONE` (or a `bind` address) on the egress listener without a port
    binds every port it serves, on its `bind` or 127.0.0.1, for an iptables-mode proxy too."""
    p = proxy(interception="REDIRECT")
    assert not any(r.message(listener_pb2.Listener).address.socket_address.address == "127.0.0.1"
                   for r in world.lds(p).values())
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                 "metadata": {"name": "default", "namespace": "default"},
                 "spec": {"egress": [{"captureMode": "NONE", "hosts": ["./*"]}]}})
    bound = {(lis.address.socket_address.address, lis.address.socket_address.port_value)
             for lis in (r.message(listener_pb2.Listener) for r in world.lds(p).values())
             if not lis.HasField("bind_to_port") or lis.bind_to_port.value}
    assert {("127.0.0.1", 9080), ("127.0.0.1", 3306)} <= bound
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                 "metadata": {"name": "default", "namespace": "default"},
                 "spec": {"egress": [{"port": {"number": 3306, "protocol": "TCP", "name": "tcp"},
                                      "hosts": ["./*"]},
                                     {"bind": "127.0.0.2", "captureMode": "NONE", "hosts": ["./*"]}]}})
    names = set(world.lds(p))
    assert "127.0.0.2_9080" in names and "127.0.0.2_3306" not in names


# --- ServiceEntry addresses -----------------------------------------------------------------------

def _service_entry(protocol: str, number: int) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "legacy", "namespace": "default"},
            "spec": {"hosts": ["legacy.internal"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                     "addresses": ["10.20.0.1", "10.20.0.2", "192.168.0.0/16", "10.9.9.9/32", "2001:db8::5"],
                     "endpoints": [{"address": "10.30.0.1"}],
                     "ports": [{"number": number, "name": protocol.lower(), "protocol": protocol}]}}


def test_every_service_entry_address_reaches_a_tcp_service(world: World) -> None:
    """istiod makes one service per (host, address): each address and CIDR matches the service's
    chain (a /32 is the address itself)."""
    world.apply(_service_entry("TCP", 5432))
    p = proxy(interception="REDIRECT")
    (lis,) = [r.message(listener_pb2.Listener) for r in world.lds(p).values()
              if r.message(listener_pb2.Listener).address.socket_address.port_value == 5432]
    ranges = {(pr.address_prefix, pr.prefix_len.value) for fc in lis.filter_chains
              for pr in fc.filter_chain_match.prefix_ranges}
    assert ranges == {("10.20.0.1", 32), ("10.20.0.2", 32), ("192.168.0.0", 16), ("10.9.9.9", 32),
                      ("2001:db8::5", 128)}


def test_every_service_entry_ip_is_a_domain_of_an_http_service(world: World) -> None:
    world.apply(_service_entry("HTTP", 8081))
    vhosts = world.rds(proxy(), {"8081"})["8081"].message(route_pb2.RouteConfiguration).virtual_hosts
    (vh,) = [v for v in vhosts if "legacy.internal" in v.domains]
    assert {"10.20.0.1", "10.20.0.2:8081", "10.9.9.9", "[2001:db8::5]", "[2001:db8::5]:8081"} <= set(vh.domains)
    assert not any("/" in d for d in vh.domains)  # a CIDR is no Host a client sends
