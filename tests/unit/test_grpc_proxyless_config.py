"""What a proxyless gRPC client is sent for a VirtualService, next to what a sidecar gets.

grpcio NACKs a whole RouteConfiguration for a per-route filter config it does not implement,
and reads a call deadline from `max_stream_duration`, not `timeout`; the e2e tests
(tests/e2e/test_grpc_proxyless_routing.py) prove the routing itself with grpcio's client.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from pilot.model.store import ConfigKey
from pilot.networking.http_routes import CORS_FILTER, FAULT_FILTER
from pilot.xds.generated import GenerationMemo
from pilot.xds.generators import lds
from pilot.xds.typeurls import LISTENER

from .helpers import World, endpoint_slice, proxy, service
from .oracle_mesh import destination_rule, virtual_service

REVIEWS = "reviews.default.svc.cluster.local"
TARGET = f"{REVIEWS}:9080"

VS = virtual_service("reviews", {"hosts": ["reviews"], "http": [
    {"match": [{"headers": {"x-track": {"exact": "beta"}}}],
     "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
     "timeout": "3s", "corsPolicy": {"allowOrigins": [{"exact": "https://example.com"}]},
     "fault": {"abort": {"grpcStatus": "UNAVAILABLE", "percentage": {"value": 10}}}},
    {"route": [{"destination": {"host": "reviews", "subset": "v1"}, "weight": 80},
               {"destination": {"host": "reviews", "subset": "v2"}, "weight": 20}],
     "retries": {"attempts": 3, "retryOn": "unavailable,5xx"}},
]})
DR = destination_rule("reviews", "reviews", {"subsets": [{"name": "v1", "labels": {"version": "v1"}},
                                                         {"name": "v2", "labels": {"version": "v2"}}]})


def _world() -> World:
    w = World()
    w.apply(service("reviews", cluster_ip="10.96.0.20"),
            endpoint_slice("reviews-1", "reviews", addresses=("10.1.0.1",), port=19081), VS, DR)
    return w


def _route(res) -> route_pb2.RouteConfiguration:
    return res.message(route_pb2.RouteConfiguration)


def test_grpc_route_config_carries_the_virtual_service_as_grpc_reads_it() -> None:
    w = _world()
    ctx = w.ctx()
    grpc_rc = _route(w.rds(proxy(generator="grpc", interception=None), {TARGET}, ctx)[TARGET])
    (vh,) = grpc_rc.virtual_hosts
    assert TARGET in vh.domains and REVIEWS in vh.domains
    beta, rest = vh.routes
    assert [h.name for h in beta.match.headers] == ["x-track"]
    assert beta.route.cluster == f"outbound|9080|v2|{REVIEWS}"
    assert beta.route.max_stream_duration.max_stream_duration.seconds == 3
    assert set(beta.typed_per_filter_config) == {FAULT_FILTER}  # CORS would make grpc NACK
    assert [(c.name, c.weight.value) for c in rest.route.weighted_clusters.clusters] == [
        (f"outbound|9080|v1|{REVIEWS}", 80), (f"outbound|9080|v2|{REVIEWS}", 20)]
    assert rest.route.retry_policy.num_retries.value == 3
    assert "unavailable" in rest.route.retry_policy.retry_on.split(",")

    # A sidecar's route for the same VirtualService keeps CORS: the two are cached apart.
    envoy_rc = _route(w.rds(proxy(), {"9080"}, ctx)["9080"])
    envoy_beta = next(vh for vh in envoy_rc.virtual_hosts if vh.name == TARGET).routes[0]
    assert CORS_FILTER in envoy_beta.typed_per_filter_config
    assert not envoy_beta.route.HasField("max_stream_duration")


def test_grpc_listener_has_the_fault_filter_and_subset_clusters_exist() -> None:
    w = _world()
    ctx = w.ctx()
    p = proxy(generator="grpc", interception=None)
    lis = w.lds(p, ctx, {TARGET})[TARGET].message(listener_pb2.Listener)
    hcm = hcm_pb2.HttpConnectionManager()
    assert lis.api_listener.api_listener.Unpack(hcm)
    assert [f.name for f in hcm.http_filters] == [FAULT_FILTER, "envoy.filters.http.router"]
    assert hcm.rds.route_config_name == TARGET
    subsets = {f"outbound|9080|v1|{REVIEWS}", f"outbound|9080|v2|{REVIEWS}"}
    assert set(w.cds(p, ctx, subsets)) == subsets


def test_virtual_service_change_reaches_the_grpc_route_and_removal_restores_default() -> None:
    w = _world()
    p = proxy(generator="grpc", interception=None)
    before = _route(w.rds(p, {TARGET})[TARGET])
    w.apply(virtual_service("reviews", {"hosts": ["reviews"], "http": [
        {"route": [{"destination": {"host": "reviews", "subset": "v1"}}]}]}))
    after = _route(w.rds(p, {TARGET})[TARGET])
    assert before != after
    assert [r.route.cluster for r in after.virtual_hosts[0].routes] == [f"outbound|9080|v1|{REVIEWS}"]
    w.store.delete(ConfigKey("VirtualService", "default", "reviews"))
    default = _route(w.rds(p, {TARGET})[TARGET])
    assert [r.route.cluster for r in default.virtual_hosts[0].routes] == [f"outbound|9080||{REVIEWS}"]


# --- server side ------------------------------------------------------------------------------
SERVER = "xds.istio.io/grpc/lds/inbound/0.0.0.0:19081"  # the reviews endpoint's port


def _policy(name: str, action: str, annotations: dict | None = None, **spec) -> dict:
    return {"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
            "spec": {"action": action, **spec}}


def _server_filters(w: World, p) -> list[str]:
    lis = w.lds(p, None, {SERVER})[SERVER].message(listener_pb2.Listener)
    hcm = hcm_pb2.HttpConnectionManager()
    assert lis.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    assert hcm.route_config.virtual_hosts[0].routes[0].HasField("non_forwarding_action")
    return [f.name for f in hcm.http_filters]


def test_server_listener_only_for_a_served_port_and_rbac_by_action() -> None:
    w = _world()
    server = proxy(generator="grpc", interception=None, ip="10.1.0.1")
    stranger = proxy(generator="grpc", interception=None, ip="10.9.9.9")
    assert SERVER not in w.lds(stranger, None, {SERVER})  # no service instance there: not sent
    assert _server_filters(w, server) == ["envoy.filters.http.router"]
    w.apply(_policy("deny", "DENY", rules=[{"to": [{"operation": {"paths": ["/a"]}}]}]),
            _policy("allow", "ALLOW", rules=[{"to": [{"operation": {"paths": ["/b"]}}]}]),
            _policy("dry", "DENY", {"istio.io/dry-run": "true"}, rules=[{}]),
            _policy("audit", "AUDIT", rules=[{}]))
    # grpc refuses two filters of one name and knows only ALLOW/DENY; dry-run and audit rules
    # are never enforced, so they are not sent.
    assert _server_filters(w, server) == ["envoy.filters.http.rbac.DENY", "envoy.filters.http.rbac",
                                          "envoy.filters.http.router"]
    lis = w.lds(server, None, {SERVER})[SERVER].message(listener_pb2.Listener)
    assert lis.address.socket_address.address == "0.0.0.0" and lis.address.socket_address.port_value == 19081
    assert not lis.filter_chains[0].HasField("transport_socket")  # PERMISSIVE, no auto-mTLS label: plaintext


def test_custom_policy_denies_everything_on_a_grpc_server() -> None:
    w = _world()
    w.apply(_policy("ext", "CUSTOM", provider={"name": "missing"}, rules=[{}]))
    server = proxy(generator="grpc", interception=None, ip="10.1.0.1")
    lis = w.lds(server, None, {SERVER})[SERVER].message(listener_pb2.Listener)
    hcm = hcm_pb2.HttpConnectionManager()
    assert lis.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    rbac = http_rbac_pb2.RBAC()
    assert hcm.http_filters[0].typed_config.Unpack(rbac)
    assert rbac.rules.action == rbac.rules.DENY and list(rbac.rules.policies) == [
        "default-deny-all-due-to-bad-CUSTOM-action"]


def test_generation_memo_keeps_two_servers_apart() -> None:
    """Two gRPC servers with equal traits but different addresses get their own listeners in one
    push (the memo's proxy key would otherwise hand the first one's to the second)."""
    w = _world()
    memo = GenerationMemo({LISTENER: lds.generate}, w.cache)
    ctx = w.ctx()
    names = frozenset({SERVER})
    served = memo.generate(ctx, LISTENER, proxy(generator="grpc", interception=None, ip="10.1.0.1"), names)
    unserved = memo.generate(ctx, LISTENER, proxy(generator="grpc", interception=None, ip="10.9.9.9",
                                                  pod_name="other"), names)
    assert [r.name for r in served.resources] == [SERVER]
    assert list(unserved.resources) == []


def test_consistent_hash_makes_ring_hash_with_the_header_on_the_route_and_maglev_stays_round_robin() -> None:
    w = _world()
    w.apply(destination_rule("reviews", "reviews", {
        "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user", "minimumRingSize": 64}}},
        "subsets": [{"name": "v1", "labels": {"version": "v1"},
                     "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user",
                                                                           "maglev": {"tableSize": 65537}}}}},
                    {"name": "v2", "labels": {"version": "v2"}}]}))
    p = proxy(generator="grpc", interception=None)
    ctx = w.ctx()
    v1, v2 = f"outbound|9080|v1|{REVIEWS}", f"outbound|9080|v2|{REVIEWS}"
    got = {n: r.message(cluster_pb2.Cluster) for n, r in w.cds(p, ctx, {v1, v2}).items()}
    assert got[v2].lb_policy == cluster_pb2.Cluster.RING_HASH
    assert got[v2].ring_hash_lb_config.minimum_ring_size.value == 64
    assert got[v1].lb_policy == cluster_pb2.Cluster.ROUND_ROBIN  # grpc has no Maglev
    rc = _route(w.rds(p, {TARGET}, ctx)[TARGET])
    beta, _rest = rc.virtual_hosts[0].routes
    assert [h.header.header_name for h in beta.route.hash_policy] == ["x-user"]  # routed to v2


def _peer_authentication(mode: str) -> dict:
    return {"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
            "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"mtls": {"mode": mode}}}


def test_server_mtls_follows_peer_authentication_as_istiod_grpcgen() -> None:
    """STRICT: one mTLS chain requiring a client certificate; PERMISSIVE: plaintext, except on a
    workload labelled for auto mTLS (its clients will send mTLS) where it is STRICT."""
    w = _world()
    plain = proxy(generator="grpc", interception=None, ip="10.1.0.1")
    labelled = proxy(generator="grpc", interception=None, ip="10.1.0.1", pod_name="labelled")
    labelled.metadata = {**labelled.metadata, "LABELS": {"security.istio.io/tlsMode": "istio"}}

    def chain(p) -> listener_pb2.FilterChain:
        return w.lds(p, None, {SERVER})[SERVER].message(listener_pb2.Listener).filter_chains[0]

    assert chain(plain).name == "inbound-plaintext" and chain(labelled).name == "inbound-mtls"
    w.apply(_peer_authentication("STRICT"))
    strict = chain(plain)
    assert strict.name == "inbound-mtls" and strict.transport_socket.name == "envoy.transport_sockets.tls"
    ctx = tls_pb2.DownstreamTlsContext()
    assert strict.transport_socket.typed_config.Unpack(ctx)
    assert ctx.require_client_certificate.value
    assert ctx.common_tls_context.tls_certificate_provider_instance.instance_name == "default"
    assert ctx.common_tls_context.validation_context.ca_certificate_provider_instance.certificate_name == "ROOTCA"
    w.apply(_peer_authentication("DISABLE"))
    assert chain(labelled).name == "inbound-plaintext"
