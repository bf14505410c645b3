"""Builders for a waypoint (a router Envoy serving the services that use it), istiod's shape:

    ztunnel --HBONE (HTTP/2 CONNECT, mTLS)--> connect_terminate (0.0.0.0:15008)
        CONNECT authority "VIP:PORT" -> filter state original_dst.local_ip, peer identity
        --> main_internal (an internal listener), its original destination restored
            one filter chain per service VIP:port: HTTP (routes + L7 RBAC) or TCP
            --> inbound-vip|PORT|http|HOST (EDS): the service's endpoints

The CONNECT stream's payload is what the caller sent to the service VIP, so the inner HTTP
connection manager sees the caller's plain requests. The caller's identity comes from the outer
mTLS handshake: connect_terminate stores it in filter state (`io.istio.peer_principal`), shared
with the internal connection, and the waypoint's RBAC matches principals (and namespaces, which
istiod writes as principal patterns) against it instead of a TLS peer the inner connection does
not have. Source IP attributes cannot be seen through the tunnel: in DENY rules they match any
caller (the rule denies more), in ALLOW rules they never match (it allows less).
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, protocol_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.common.set_filter_state.v3 import value_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.http.set_filter_state.v3 import set_filter_state_pb2
from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as network_rbac_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.transport_sockets.internal_upstream.v3 import internal_upstream_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.type.matcher.v3 import filter_state_pb2
from google.protobuf import wrappers_pb2

from pilot.config.mesh import HttpRetryPolicy
from pilot.config.networking import DestinationRule, VirtualService
from pilot.model.gateway_api.internal import has_session
from pilot.model.mesh_settings import ClusterSettings
from pilot.model.security_policies import WorkloadPolicies
from pilot.model.services import MeshService, ServicePort
from pilot.model.store import Entry
from pilot.networking import tls
from pilot.networking.filters import cors_filter, fault_filter, router_filter, stateful_session_filter
from pilot.networking.http_routes import RouteInputs, virtual_service_routes
from pilot.networking.metadata import config_path, set_cluster_metadata
from pilot.networking.policy_filters import TrustDomains, inbound_http_filters, inbound_network_filters
from pilot.networking.protos import ads_config_source, duration, pack
from pilot.networking.traffic_policy import (
    DEFAULT_LB_POLICY,
    apply_default_circuit_breakers,
    apply_h2_upgrade,
    apply_policy,
    apply_proxy_protocol,
    effective_policy,
    should_h2_upgrade,
)

CONNECT_TERMINATE = "connect_terminate"
MAIN_INTERNAL = "main_internal"
ORIGINAL_DST_KEY = "envoy.filters.listener.original_dst.local_ip"
PEER_PRINCIPAL_KEY = "io.istio.peer_principal"
WAYPOINT_ALPN = ("h2",)


def inbound_vip_cluster_name(port: int, protocol: str, hostname: str) -> str:
    """istiod's `inbound-vip|PORT|http|HOST` (or `tcp`)."""
    return f"inbound-vip|{port}|{protocol}|{hostname}"


def parse_inbound_vip(name: str) -> tuple[int, str, str] | None:
    parts = name.split("|")
    if len(parts) != 4 or parts[0] != "inbound-vip" or not parts[1].isdigit():
        return None
    return int(parts[1]), parts[2], parts[3]


# --- listeners ----------------------------------------------------------------------------------
def _set_state(key: str, fmt: str, factory: str = "") -> value_pb2.FilterStateValue:
    v = value_pb2.FilterStateValue(object_key=key, factory_key=factory,
                                   shared_with_upstream=value_pb2.FilterStateValue.ONCE)
    v.format_string.text_format_source.inline_string = fmt
    return v


def connect_terminate_listener(port: int) -> listener_pb2.Listener:
    """Accepts HBONE: mTLS with the waypoint's workload certificate (callers must present one
    from the mesh root), then HTTP/2 CONNECT, each tunnel handed to main_internal."""
    route = route_components_pb2.Route(
        match=route_components_pb2.RouteMatch(connect_matcher=route_components_pb2.RouteMatch.ConnectMatcher()),
        route=route_components_pb2.RouteAction(
            cluster=MAIN_INTERNAL,
            upgrade_configs=[route_components_pb2.RouteAction.UpgradeConfig(
                upgrade_type="CONNECT",
                connect_config=route_components_pb2.RouteAction.UpgradeConfig.ConnectConfig())]))
    # Both objects are hashable: shared filter state that hashes is part of the upstream pool key,
    # so an internal connection made for one caller (or destination) is never reused for another.
    # A plain `envoy.string` principal let a refused caller's connection serve the next caller.
    state = set_filter_state_pb2.Config(on_request_headers=[
        _set_state(ORIGINAL_DST_KEY, "%REQ(:AUTHORITY)%"),
        _set_state(PEER_PRINCIPAL_KEY, "%DOWNSTREAM_PEER_URI_SAN%", "envoy.hashable_string")])
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix=CONNECT_TERMINATE,
        route_config=route_pb2.RouteConfiguration(name="default", virtual_hosts=[route_components_pb2.VirtualHost(
            name="default", domains=["*"], routes=[route])]),
        http2_protocol_options=protocol_pb2.Http2ProtocolOptions(
            allow_connect=True, max_concurrent_streams=wrappers_pb2.UInt32Value(value=100)),
        upgrade_configs=[hcm_pb2.HttpConnectionManager.UpgradeConfig(upgrade_type="CONNECT")],
        stream_idle_timeout=duration(0),
        use_remote_address=wrappers_pb2.BoolValue(value=False),
        http_filters=[
            hcm_pb2.HttpFilter(name="envoy.filters.http.set_filter_state", typed_config=pack(state)),
            hcm_pb2.HttpFilter(name="envoy.filters.http.router", typed_config=pack(router_pb2.Router())),
        ])
    downstream = tls.istio_downstream_tls(True, alpn=WAYPOINT_ALPN)
    return listener_pb2.Listener(
        name=CONNECT_TERMINATE,
        address=address_pb2.Address(socket_address=address_pb2.SocketAddress(address="0.0.0.0", port_value=port)),
        filter_chains=[listener_components_pb2.FilterChain(
            name="default",
            transport_socket=tls.tls_socket(downstream),
            filters=[listener_components_pb2.Filter(name="envoy.filters.network.http_connection_manager",
                                                    typed_config=pack(manager))])])


# (hostname, VIPs, ((port, "http" | "tcp"), ...), policies for this service, its VirtualService)
ServiceChains = tuple[str, tuple[str, ...], tuple[tuple[int, str], ...], WorkloadPolicies, Entry[VirtualService] | None]


@dataclass(frozen=True)
class RoutingInputs:
    """What VirtualService routes need: every service (destination ports), the mesh domain and
    the default retry policy."""

    services: tuple[MeshService, ...] = ()
    domain: str = "cluster.local"
    retry: HttpRetryPolicy | None = None


def main_internal_listener(services: tuple[ServiceChains, ...], trust_domain: TrustDomains,
                           routing: RoutingInputs = RoutingInputs()) -> listener_pb2.Listener:
    chains = []
    for hostname, vips, ports, policies, vs in services:
        for port, protocol in ports:
            cluster = inbound_vip_cluster_name(port, protocol, hostname)
            match = listener_components_pb2.FilterChainMatch(
                destination_port=wrappers_pb2.UInt32Value(value=port),
                prefix_ranges=[address_pb2.CidrRange(address_prefix=v, prefix_len=wrappers_pb2.UInt32Value(
                    value=128 if ":" in v else 32)) for v in vips])
            if protocol == "http":
                filters = [_http_chain(cluster, port, policies, trust_domain, vs, routing)]
            else:
                filters = [*tunnel_rbac(inbound_network_filters(policies, trust_domain)),
                           listener_components_pb2.Filter(
                               name="envoy.filters.network.tcp_proxy",
                               typed_config=pack(tcp_proxy_pb2.TcpProxy(stat_prefix=cluster, cluster=cluster)))]
            chains.append(listener_components_pb2.FilterChain(name=cluster, filter_chain_match=match, filters=filters))
    return listener_pb2.Listener(
        name=MAIN_INTERNAL,
        internal_listener=listener_pb2.Listener.InternalListenerConfig(),
        listener_filters=[listener_components_pb2.ListenerFilter(
            name="envoy.filters.listener.original_dst", typed_config=pack(original_dst_pb2.OriginalDst()))],
        traffic_direction=base_pb2.INBOUND,
        filter_chains=chains)


def _http_chain(cluster: str, port: int, policies: WorkloadPolicies, trust_domain: TrustDomains,
                vs: Entry[VirtualService] | None, routing: RoutingInputs) -> listener_components_pb2.Filter:
    """The service's own endpoints, or, when a VirtualService applies to the host, its HTTP rules
    (their destinations are the outbound clusters every router has), as istiod's waypoint does."""
    routes = []
    if vs is not None and vs.obj.spec.http:
        inputs = RouteInputs(vs.key.namespace, routing.domain, port, {s.hostname: s for s in routing.services},
                             routing.retry or HttpRetryPolicy(),
                             config=config_path(vs.key.kind, vs.key.namespace, vs.key.name))
        routes = virtual_service_routes(vs.obj.spec.http, inputs)
    if not routes:
        routes = [route_components_pb2.Route(
            match=route_components_pb2.RouteMatch(prefix="/"),
            route=route_components_pb2.RouteAction(cluster=cluster, timeout=duration(0)))]
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix=cluster,
        route_config=route_pb2.RouteConfiguration(
            name=cluster, validate_clusters=wrappers_pb2.BoolValue(value=False),
            virtual_hosts=[route_components_pb2.VirtualHost(name=f"inbound|http|{port}", domains=["*"],
                                                            routes=routes)]),
        use_remote_address=wrappers_pb2.BoolValue(value=False),
        http_filters=[*tunnel_rbac(inbound_http_filters(policies, trust_domain)), fault_filter(), cors_filter(),
                      *([stateful_session_filter()] if vs is not None and has_session(vs) else []), router_filter()])
    return listener_components_pb2.Filter(name="envoy.filters.network.http_connection_manager",
                                          typed_config=pack(manager))


def tunnel_rbac(filters: list) -> list:
    """RBAC filters rewritten for connections that arrive through the tunnel (module docstring)."""
    out = []
    for f in filters:
        if f.name not in ("envoy.filters.http.rbac", "envoy.filters.network.rbac"):
            out.append(f)
            continue
        cls = http_rbac_pb2.RBAC if f.name == "envoy.filters.http.rbac" else network_rbac_pb2.RBAC
        cfg = cls()
        f.typed_config.Unpack(cfg)
        for rules in (cfg.rules, cfg.shadow_rules):
            deny = rules.action == rbac_pb2.RBAC.DENY
            for policy in rules.policies.values():
                for p in policy.principals:
                    _rewrite_principal(p, deny)
        copy = type(f)()
        copy.CopyFrom(f)
        copy.typed_config.CopyFrom(pack(cfg))
        out.append(copy)
    return out


def _rewrite_principal(p: rbac_pb2.Principal, deny: bool) -> None:
    kind = p.WhichOneof("identifier")
    if kind in ("and_ids", "or_ids"):
        for child in getattr(p, kind).ids:
            _rewrite_principal(child, deny)
    elif kind == "not_id":
        _rewrite_principal(p.not_id, not deny)
    elif kind == "authenticated":
        match = p.authenticated.principal_name
        p.filter_state.CopyFrom(filter_state_pb2.FilterStateMatcher(key=PEER_PRINCIPAL_KEY, string_match=match))
    elif kind in ("source_ip", "direct_remote_ip", "remote_ip") and deny:
        p.any = True


# --- clusters -----------------------------------------------------------------------------------
def main_internal_cluster() -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(
        name=MAIN_INTERNAL,
        type=cluster_pb2.Cluster.STATIC,
        connect_timeout=duration(10),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=MAIN_INTERNAL,
            endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[endpoint_components_pb2.LbEndpoint(
                endpoint=endpoint_components_pb2.Endpoint(address=address_pb2.Address(
                    envoy_internal_address=address_pb2.EnvoyInternalAddress(server_listener_name=MAIN_INTERNAL))))])]),
        # Filter state shared with upstream (the original destination, the peer) crosses into
        # the internal listener's connection through this socket.
        transport_socket=base_pb2.TransportSocket(
            name="envoy.transport_sockets.internal_upstream",
            typed_config=pack(internal_upstream_pb2.InternalUpstreamTransport(transport_socket=base_pb2.TransportSocket(
                name="envoy.transport_sockets.raw_buffer", typed_config=pack(raw_buffer_pb2.RawBuffer()))))))


def inbound_vip_cluster(name: str, svc: MeshService, port: ServicePort, protocol: str, settings: ClusterSettings,
                        destination_rule: Entry[DestinationRule] | None = None) -> cluster_pb2.Cluster:
    """The service's endpoints (EDS), reached directly: workloads that only speak HBONE through
    their ztunnel would need an encapsulating (connect_originate) hop, which is not built.

    As istiod's buildWaypointInboundVIPCluster: the mesh's connect timeout, and the traffic policy
    of the DestinationRule in force at the waypoint for this service (top level, with the port's
    settings over it): connection pool (its connectTimeout included), retry budget, HTTP/2
    upgrade, outlier detection, load balancer, SIMPLE/MUTUAL TLS origination and the PROXY
    protocol. ISTIO_MUTUAL is not originated (the hop to the workload is not HBONE; istiod
    ignores it here too). The builders are the sidecar clusters' (pilot.networking.traffic_policy)."""
    c = cluster_pb2.Cluster(
        name=name, type=cluster_pb2.Cluster.EDS, connect_timeout=duration(settings.connect_timeout_s),
        lb_policy=DEFAULT_LB_POLICY,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=ads_config_source()))
    http = protocol == "http"
    http2 = http and port.protocol.is_http2
    if http2:  # an HTTP/2 (gRPC) port speaks HTTP/2 to its endpoints, as its outbound cluster does
        apply_h2_upgrade(c)
    apply_default_circuit_breakers(c)  # istiod's, until a connection pool says otherwise
    policy = effective_policy(destination_rule.obj.spec, "", port.port) if destination_rule is not None else None
    pool = policy["connection_pool"] if policy is not None else None
    # The upgrade before the pool, as for sidecar clusters, so maxConcurrentStreams finds the
    # HTTP/2 options (istiod applies the pool first here and then loses that limit).
    if http and should_h2_upgrade(pool, settings.h2_upgrade, port.protocol.is_http):
        apply_h2_upgrade(c)
        http2 = True
    dr_path = ""
    if destination_rule is not None and policy is not None:
        apply_policy(c, policy, svc.hostname, http2)
        if policy["proxy_protocol"] is not None:
            apply_proxy_protocol(c, policy["proxy_protocol"])  # around the TLS, if any
        key = destination_rule.key
        dr_path = config_path(key.kind, key.namespace, key.name)
    short = svc.hostname if svc.kind == "ServiceEntry" else svc.name
    set_cluster_metadata(c.metadata, svc.hostname, short, svc.namespace, dr_path)
    return c
