"""A waypoint's generated Envoy config: HBONE termination, one chain per service VIP:port with its
attached policies, inbound-vip clusters with endpoints; and Envoy accepts all of it."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from pilot.config.mesh import MeshConfig
from pilot.model.proxy import Proxy, parse_node_id
from pilot.xds.generators import cds, eds, lds
from tests.support.envoy import envoy_validate
from tests.support.policies import authz
from tests.support.static_config import static_bootstrap
from tests.unit.helpers import World, endpoint_slice

DOCS = [
    {"apiVersion": "v1", "kind": "Namespace",
     "metadata": {"name": "shop", "labels": {"istio.io/use-waypoint": "waypoint"}}},
    {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "waypoint", "namespace": "shop"},
     "spec": {"gatewayClassName": "istio-waypoint", "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "waypoint", "namespace": "shop",
                                                          "labels": {"gateway.istio.io/managed": "istio.io-mesh-controller"}},
     "spec": {"clusterIP": "10.96.0.99", "ports": [{"name": "mesh", "port": 15008}]}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cart", "namespace": "shop"},
     "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "cart"},
              "ports": [{"name": "http", "port": 80, "targetPort": 8080}, {"name": "tcp-db", "port": 5432}]}},
    endpoint_slice("cart-1", "cart", "shop", addresses=("10.1.0.11",), port=8080),
    authz("no-admin", "shop", action="DENY",
          targetRefs=[{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"}],
          rules=[{"to": [{"operation": {"paths": ["/admin"]}}]}]),
    authz("cart-callers", "shop", targetRefs=[{"kind": "Service", "group": "", "name": "cart"}],
          rules=[{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/front"]}}]}]),
]


def waypoint_proxy() -> Proxy:
    node_id = "router~10.1.0.50~waypoint-7c9.shop~shop.svc.cluster.local"
    t, ips, pod, ns, domain = parse_node_id(node_id)
    return Proxy(node_id, t, ips, pod, ns, domain, "waypoint.shop",
                 {"NAMESPACE": "shop", "LABELS": {"gateway.networking.k8s.io/gateway-name": "waypoint"}})


def hcm_of(chain) -> hcm_pb2.HttpConnectionManager:
    h = hcm_pb2.HttpConnectionManager()
    chain.filters[-1].typed_config.Unpack(h)
    return h


def test_listeners_clusters_and_endpoints():
    w = World()
    w.apply(*DOCS)
    ctx, p = w.ctx(), waypoint_proxy()
    listeners = {r.name: r.message(listener_pb2.Listener) for r in lds.generate(ctx, p, None, w.cache)}
    assert set(listeners) == {"connect_terminate", "main_internal"}
    term = listeners["connect_terminate"]
    assert term.address.socket_address.port_value == 15008
    assert term.filter_chains[0].transport_socket.name == "envoy.transport_sockets.tls"
    route = hcm_of(term.filter_chains[0]).route_config.virtual_hosts[0].routes[0]
    assert route.match.HasField("connect_matcher") and route.route.cluster == "main_internal"

    internal = listeners["main_internal"]
    assert internal.HasField("internal_listener")
    chains = {c.name: c for c in internal.filter_chains}
    assert set(chains) == {"inbound-vip|80|http|cart.shop.svc.cluster.local",
                           "inbound-vip|5432|tcp|cart.shop.svc.cluster.local"}
    http = chains["inbound-vip|80|http|cart.shop.svc.cluster.local"]
    assert http.filter_chain_match.destination_port.value == 80
    assert [r.address_prefix for r in http.filter_chain_match.prefix_ranges] == ["10.96.0.10"]
    filters = hcm_of(http).http_filters
    rbac = {}
    for f in filters:
        if f.name == "envoy.filters.http.rbac":
            cfg = http_rbac_pb2.RBAC()
            f.typed_config.Unpack(cfg)
            rbac[cfg.rules.action] = cfg.rules
    # The Gateway-attached DENY and the Service-attached ALLOW both apply to the cart chain.
    assert set(rbac) == {1, 0}  # DENY, ALLOW
    [allow] = rbac[0].policies.values()
    principal = allow.principals[0]
    # The caller's identity comes from the tunnel's filter state, not the (internal) peer.
    while principal.WhichOneof("identifier") in ("and_ids", "or_ids"):
        principal = getattr(principal, principal.WhichOneof("identifier")).ids[0]
    assert principal.filter_state.key == "io.istio.peer_principal"
    assert principal.filter_state.string_match.exact == "spiffe://cluster.local/ns/shop/sa/front"

    clusters = {r.name: r.message(cluster_pb2.Cluster) for r in cds.generate(ctx, p, None, w.cache)}
    assert {"main_internal", "inbound-vip|80|http|cart.shop.svc.cluster.local",
            "inbound-vip|5432|tcp|cart.shop.svc.cluster.local"} <= set(clusters)
    [cla] = eds.generate(ctx, p, frozenset({"inbound-vip|80|http|cart.shop.svc.cluster.local"}), w.cache)
    lb = cla.message(endpoint_pb2.ClusterLoadAssignment).endpoints[0].lb_endpoints[0]
    assert (lb.endpoint.address.socket_address.address, lb.endpoint.address.socket_address.port_value) == (
        "10.1.0.11", 8080)

    # A router that is not a waypoint gets none of this.
    other = waypoint_proxy()
    other.metadata = {"NAMESPACE": "shop", "LABELS": {"gateway.networking.k8s.io/gateway-name": "ingress"}}
    assert "connect_terminate" not in {r.name for r in lds.generate(ctx, other, None, w.cache)}


def test_envoy_accepts_the_waypoint_config(tmp_path):
    w = World()
    w.apply(*DOCS)
    config = static_bootstrap(w.ctx(), waypoint_proxy())
    config["bootstrap_extensions"] = [{"name": "envoy.bootstrap.internal_listener", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"}}]
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the waypoint config:\n{output}"


VS = {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "cart", "namespace": "shop"},
      "spec": {"hosts": ["cart.shop.svc.cluster.local"], "http": [
          {"match": [{"uri": {"prefix": "/old"}}], "fault": {"abort": {"httpStatus": 410, "percentage": {"value": 100}}},
           "route": [{"destination": {"host": "cart"}}]},
          {"route": [{"destination": {"host": "cart", "port": {"number": 80}}}]}]}}


def test_a_virtual_service_routes_at_the_waypoint(tmp_path):
    w = World()
    w.apply(*DOCS, VS)
    ctx, p = w.ctx(), waypoint_proxy()
    listeners = {r.name: r.message(listener_pb2.Listener) for r in lds.generate(ctx, p, None, w.cache)}
    chain = next(c for c in listeners["main_internal"].filter_chains if "|http|" in c.name)
    h = hcm_of(chain)
    routes = h.route_config.virtual_hosts[0].routes
    assert [(r.match.prefix, r.route.cluster) for r in routes] == [
        ("/old", "outbound|80||cart.shop.svc.cluster.local"), ("/", "outbound|80||cart.shop.svc.cluster.local")]
    assert routes[0].typed_per_filter_config["envoy.filters.http.fault"]
    # (no stateful session filter: no rule of the VirtualService sets a session)
    assert [f.name for f in h.http_filters][-3:] == ["envoy.filters.http.fault", "envoy.filters.http.cors",
                                                     "envoy.filters.http.router"]
    config = static_bootstrap(ctx, p)
    config["bootstrap_extensions"] = [{"name": "envoy.bootstrap.internal_listener", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"}}]
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the waypoint config:\n{output}"


CART_DR = {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
           "metadata": {"name": "cart", "namespace": "shop"},
           "spec": {"host": "cart.shop.svc.cluster.local", "trafficPolicy": {
               "connectionPool": {"tcp": {"maxConnections": 7, "connectTimeout": "2.5s"},
                                  "http": {"http1MaxPendingRequests": 3, "idleTimeout": "30s"}},
               "outlierDetection": {"consecutive5xxErrors": 4, "interval": "5s"},
               "loadBalancer": {"simple": "ROUND_ROBIN"},
               "portLevelSettings": [{"port": {"number": 5432}, "loadBalancer": {"simple": "RANDOM"},
                                      "tls": {"mode": "SIMPLE", "sni": "db.example"}}]}}}


def _waypoint_clusters(w: World) -> dict[str, cluster_pb2.Cluster]:
    return {r.name: r.message(cluster_pb2.Cluster) for r in cds.generate(w.ctx(), waypoint_proxy(), None, w.cache)
            if r.name.startswith("inbound-vip|")}


def test_the_destination_rule_of_the_service_applies_at_the_waypoint():
    """istiod's buildWaypointInboundVIPCluster: the mesh connectTimeout by default, and the host's
    DestinationRule (its port-level settings over the top level) on the VIP clusters."""
    w = World(MeshConfig.model_validate({"connectTimeout": "3s"}))
    w.apply(*DOCS)
    before = _waypoint_clusters(w)
    http, tcp = before["inbound-vip|80|http|cart.shop.svc.cluster.local"], before[
        "inbound-vip|5432|tcp|cart.shop.svc.cluster.local"]
    assert http.connect_timeout.ToMilliseconds() == 3000 and tcp.connect_timeout.ToMilliseconds() == 3000
    assert not http.HasField("outlier_detection") and http.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST

    w.apply(CART_DR)
    after = _waypoint_clusters(w)
    http, tcp = after["inbound-vip|80|http|cart.shop.svc.cluster.local"], after[
        "inbound-vip|5432|tcp|cart.shop.svc.cluster.local"]
    for c in (http, tcp):
        assert c.connect_timeout.ToMilliseconds() == 2500  # the pool's connectTimeout wins
        t = c.circuit_breakers.thresholds[0]
        assert (t.max_connections.value, t.max_pending_requests.value) == (7, 3)
        assert c.outlier_detection.consecutive_5xx.value == 4 and c.outlier_detection.interval.seconds == 5
        assert c.metadata.filter_metadata["istio"]["config"] == \
            "/apis/networking.istio.io/v1/namespaces/shop/destination-rule/cart"
    assert http.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN and not http.HasField("transport_socket")
    # Port 5432's own settings: its balancer, and TLS origination toward the database.
    assert tcp.lb_policy == cluster_pb2.Cluster.RANDOM
    assert tcp.transport_socket.name == "envoy.transport_sockets.tls"
    upstream = tls_pb2.UpstreamTlsContext()
    tcp.transport_socket.typed_config.Unpack(upstream)
    assert upstream.sni == "db.example"


def test_envoy_accepts_waypoint_clusters_with_a_destination_rule(tmp_path):
    w = World()
    w.apply(*DOCS, CART_DR)
    config = static_bootstrap(w.ctx(), waypoint_proxy())
    config["bootstrap_extensions"] = [{"name": "envoy.bootstrap.internal_listener", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"}}]
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the waypoint config:\n{output}"
