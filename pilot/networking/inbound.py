"""Inbound side of a sidecar: listeners and clusters that deliver mesh traffic to the local app.

Two shapes, as istiod builds them:
- iptables (REDIRECT/TPROXY): `virtualInbound` on 15006 takes every redirected connection and picks a
  filter chain by original destination port; unknown ports pass through to the app unchanged.
- NONE (no iptables): one listener per workload port, bound on the proxy's address, forwarding to the
  app on 127.0.0.1 (or the Sidecar ingress defaultEndpoint).

Each port's chains follow its PeerAuthentication mode: STRICT accepts only mesh mTLS; PERMISSIVE
tells mesh mTLS (TLS with an `istio*` ALPN) from everything else with the TLS inspector; DISABLE is
plaintext. The app sees the caller's identity in `x-forwarded-client-cert`.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, protocol_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import wrappers_pb2

from pilot.model.inbound import InboundPort
from pilot.model.mesh_settings import ClusterSettings, ListenerSettings
from pilot.model.security_policies import NO_POLICIES, WorkloadPolicies
from pilot.model.services import EndpointAddress, Locality
from pilot.networking import metadata, sniffing, telemetry, tls, wasm
from pilot.networking.clusters import use_downstream_protocol
from pilot.networking.endpoints import cluster_load_assignment
from pilot.networking.filters import access_logs, hcm_network_filter, router_filter, tcp_proxy_filter
from pilot.networking.listeners import add_ipv6_wildcard, wildcard
from pilot.networking.policy_filters import TrustDomains, inbound_http_filters, inbound_network_filters
from pilot.networking.protos import duration, pack
from pilot.networking.tcp_routes import tls_inspector
from pilot.networking.traffic_policy import apply_connection_pool, apply_default_circuit_breakers

VIRTUAL_INBOUND_LISTENER = "virtualInbound"
VIRTUAL_INBOUND_PORT = 15006
INBOUND_PASSTHROUGH_CLUSTER = "InboundPassthroughCluster"
# The source address Envoy uses toward the app, so iptables can tell proxy traffic from app traffic.
INBOUND_PASSTHROUGH_BIND = "127.0.0.6"
INBOUND_PASSTHROUGH_BIND_V6 = "::6"  # istiod's InboundPassthroughBindIpv6, for IPv6 connections
_HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def inbound_cluster_name(port: int) -> str:
    return f"inbound|{port}||"


def inbound_listener_name(bind: str, port: int) -> str:
    return f"inbound_{bind}_{port}"


def _socket_address(endpoint: str) -> address_pb2.Address:
    if endpoint.startswith("unix://"):
        return address_pb2.Address(pipe=address_pb2.Pipe(path=endpoint[len("unix://"):]))
    host, _, port = endpoint.rpartition(":")
    return address_pb2.Address(socket_address=address_pb2.SocketAddress(address=host.strip("[]"), port_value=int(port)))


def inbound_cluster(port: InboundPort, settings: ClusterSettings) -> cluster_pb2.Cluster:
    """`inbound|PORT||`: the app itself, at its endpoint."""
    name = inbound_cluster_name(port.port)
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.STATIC,
                            connect_timeout=duration(settings.connect_timeout_s))
    if port.endpoint.startswith("unix://"):
        cla = c.load_assignment
        cla.cluster_name = name
        cla.endpoints.add().lb_endpoints.add().endpoint.address.CopyFrom(_socket_address(port.endpoint))
    else:
        host, _, p = port.endpoint.rpartition(":")
        c.load_assignment.CopyFrom(cluster_load_assignment(
            name, (EndpointAddress(host.strip("[]"), int(p), Locality(), True),)))
    if port.protocol.is_http2:
        opts = http_protocol_options_pb2.HttpProtocolOptions()
        opts.explicit_http_config.http2_protocol_options.CopyFrom(protocol_pb2.Http2ProtocolOptions())
        c.typed_extension_protocol_options[_HTTP_OPTIONS_KEY].CopyFrom(pack(opts))
    elif port.protocol.is_unsupported:
        use_downstream_protocol(c)  # sniffed: the app gets the HTTP version the client spoke
    if port.pool is not None:
        # The Sidecar's (or DestinationRule's) inbound limits, as istiod applies them to the
        # inbound cluster (no h2 upgrade inbound: the app speaks what it speaks).
        apply_connection_pool(c, port.pool, port.protocol.is_http2)
    else:
        apply_default_circuit_breakers(c)  # istiod applies an empty pool: its default thresholds
    if port.services:
        metadata.set_services(c.metadata, port.services)
    return c


def inbound_passthrough_cluster(settings: ClusterSettings, families: tuple[bool, bool] = (True, False)
                                ) -> cluster_pb2.Cluster:
    """Connections to ports no service declares go to the app unchanged (original destination),
    from 127.0.0.6, the source iptables lets through; from ::6 for a proxy of (IPv4, IPv6)
    `families` without IPv4, and from both for one with both (as istiod, with or without
    ISTIO_DUAL_STACK)."""
    c = cluster_pb2.Cluster(name=INBOUND_PASSTHROUGH_CLUSTER, type=cluster_pb2.Cluster.ORIGINAL_DST,
                            lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
                            connect_timeout=duration(settings.connect_timeout_s))
    c.upstream_bind_config.source_address.address = INBOUND_PASSTHROUGH_BIND if families[0] \
        else INBOUND_PASSTHROUGH_BIND_V6
    c.upstream_bind_config.source_address.port_value = 0
    if families == (True, True):
        # Envoy picks the source of the upstream connection's family: IPv6 apps are reached from ::6.
        extra = c.upstream_bind_config.extra_source_addresses.add()
        extra.address.address = INBOUND_PASSTHROUGH_BIND_V6
        extra.address.port_value = 0
    apply_default_circuit_breakers(c)  # istiod: built from the default passthrough cluster
    return c


def _http_chain_filter(port: InboundPort, secure: bool, settings: ListenerSettings,
                       http_filters: list) -> listener_components_pb2.Filter:
    cluster = inbound_cluster_name(port.port)
    route = route_pb2.RouteConfiguration(name=cluster, validate_clusters=wrappers_pb2.BoolValue(value=False))
    vhost = route.virtual_hosts.add(name=f"inbound|http|{port.port}", domains=["*"])
    r = vhost.routes.add(name="default")
    r.match.prefix = "/"
    r.route.cluster = cluster
    r.route.timeout.CopyFrom(duration(0))  # the caller's sidecar enforces the route timeout
    r.route.max_stream_duration.grpc_timeout_header_max.CopyFrom(duration(0))
    F = hcm_pb2.HttpConnectionManager
    hcm = F(stat_prefix=f"inbound_0.0.0.0_{port.port}", codec_type=F.AUTO, route_config=route,
            http_filters=wasm.insert([*http_filters, router_filter()], settings.wasm, port.port),
            access_log=access_logs(settings))
    telemetry.apply_tracing(hcm, settings.telemetry)
    if settings.http10:
        hcm.http_protocol_options.accept_http_10 = True  # PILOT_HTTP10, as istiod's inbound
    if secure:
        # The app learns who called: the peer certificate's URI SAN (its SPIFFE identity).
        hcm.forward_client_cert_details = F.APPEND_FORWARD
        details = hcm.set_current_client_cert_details
        details.subject.value = True
        details.uri = True
        details.dns = True
    else:
        hcm.forward_client_cert_details = F.SANITIZE  # a plaintext caller cannot claim an identity
    return hcm_network_filter(hcm)


def _chain(port: InboundPort, secure: bool, settings: ListenerSettings, policies: WorkloadPolicies,
           trust_domain: TrustDomains, http: bool | None = None, suffix: str = ""
           ) -> listener_components_pb2.FilterChain:
    """`http`: serve HTTP (default: what the port declares); `suffix` tells the chains of a
    sniffed port apart."""
    # Authentication and authorization run in front of the app on every chain, TLS or not: a
    # plaintext caller simply has no peer identity to match.
    if http is None:
        http = port.protocol.is_http
    if http:
        filters = [_http_chain_filter(port, secure, settings, inbound_http_filters(policies, trust_domain))]
    else:
        cluster = inbound_cluster_name(port.port)
        filters = [*inbound_network_filters(policies, trust_domain), tcp_proxy_filter(cluster, cluster, settings)]
    chain = listener_components_pb2.FilterChain(
        name=f"{inbound_cluster_name(port.port)}{suffix}{'-mtls' if secure else ''}", filters=filters)
    if secure:
        chain.transport_socket.CopyFrom(tls.tls_socket(tls.istio_downstream_tls(http)))
        chain.filter_chain_match.transport_protocol = "tls"
    return chain


def _sniffed_chains(port: InboundPort, mode: str, settings: ListenerSettings, policies: WorkloadPolicies,
                    trust_domain: TrustDomains) -> list[listener_components_pb2.FilterChain]:
    """A port that names no protocol, as istiod's inbound*FilterChainMatchOptions for
    ListenerProtocolAuto: mesh mTLS tells HTTP from TCP by the client's ALPN, plaintext by the
    HTTP inspector. (A client sidecar built on upstream Envoy offers the TCP ALPNs for both, so
    its HTTP arrives on the TCP chain: it was routed at the client already.)"""
    def make(secure: bool, http: bool, alpns: tuple[str, ...] = (), transport: str = sniffing.RAW_BUFFER):
        chain = _chain(port, secure, settings, policies, trust_domain, http, "-http" if http else "-tcp")
        chain.filter_chain_match.application_protocols.extend(alpns)
        chain.filter_chain_match.transport_protocol = transport
        return chain

    plain_http = sniffing.plaintext_http_alpns(settings.http10)
    if mode == "STRICT":
        return [make(True, True, sniffing.MTLS_HTTP_ALPNS, sniffing.TLS), make(True, False, (), sniffing.TLS)]
    if mode == "PERMISSIVE":
        tls_passthrough = make(False, False, (), sniffing.TLS)  # the app's own TLS, not the mesh's
        tls_passthrough.name = f"{inbound_cluster_name(port.port)}-tls"
        return [make(True, True, sniffing.MTLS_HTTP_ALPNS, sniffing.TLS), make(False, True, plain_http),
                make(True, False, sniffing.MTLS_TCP_ALPNS, sniffing.TLS), make(False, False),
                tls_passthrough]
    return [make(False, True, plain_http), make(False, False)]


def port_chains(port: InboundPort, mesh_tls: bool, settings: ListenerSettings,
                policies: WorkloadPolicies = NO_POLICIES, trust_domain: TrustDomains = "cluster.local"
                ) -> list[listener_components_pb2.FilterChain]:
    """The chains serving one workload port. Without certificates only plaintext can be served."""
    mode = port.mtls if mesh_tls else "DISABLE"
    if port.protocol.is_unsupported:
        return _sniffed_chains(port, mode, settings, policies, trust_domain)
    if mode == "STRICT":
        return [_chain(port, True, settings, policies, trust_domain)]  # plaintext matches no chain: closed
    if mode == "PERMISSIVE":
        secure = _chain(port, True, settings, policies, trust_domain)
        secure.filter_chain_match.application_protocols.extend(tls.MESH_ALPNS)
        return [secure, _chain(port, False, settings, policies, trust_domain)]
    return [_chain(port, False, settings, policies, trust_domain)]


def _sniffs(chains) -> bool:
    return any(c.filter_chain_match.transport_protocol == sniffing.RAW_BUFFER
               and c.filter_chain_match.application_protocols for c in chains)


def bound_inbound_listener(port: InboundPort, mesh_tls: bool, settings: ListenerSettings,
                           policies: WorkloadPolicies = NO_POLICIES,
                           trust_domain: TrustDomains = "cluster.local") -> listener_pb2.Listener:
    """NONE mode: `inbound_IP_PORT` bound on the workload's address."""
    listener = listener_pb2.Listener(
        name=inbound_listener_name(port.bind, port.port),
        address=address_pb2.Address(socket_address=address_pb2.SocketAddress(address=port.bind, port_value=port.port)),
        traffic_direction=base_pb2.INBOUND,
        filter_chains=port_chains(port, mesh_tls, settings, policies, trust_domain))
    if any(c.filter_chain_match.transport_protocol for c in listener.filter_chains):
        listener.listener_filters.append(tls_inspector())
    if _sniffs(listener.filter_chains):
        listener.listener_filters.append(sniffing.http_inspector())
        sniffing.set_detection_timeout(listener, settings.inbound_detection_timeout_s)
    return listener


def virtual_inbound_listener(ports: tuple[InboundPort, ...], mesh_tls: bool, settings: ListenerSettings,
                             policies: WorkloadPolicies = NO_POLICIES,
                             trust_domain: TrustDomains = "cluster.local") -> listener_pb2.Listener:
    """iptables mode: every inbound connection arrives on 15006; chains match its original port."""
    listener = listener_pb2.Listener(
        name=VIRTUAL_INBOUND_LISTENER,
        address=address_pb2.Address(socket_address=address_pb2.SocketAddress(
            address=wildcard(settings), port_value=VIRTUAL_INBOUND_PORT)),
        traffic_direction=base_pb2.INBOUND,
        use_original_dst=wrappers_pb2.BoolValue(value=True),
    )
    if settings.dual_stack:
        add_ipv6_wildcard(listener)
    listener.listener_filters.add(name="envoy.filters.listener.original_dst",
                                  typed_config=pack(original_dst_pb2.OriginalDst()))
    listener.listener_filters.append(tls_inspector())
    sniffed: list[int] = []
    for port in ports:
        chains = port_chains(port, mesh_tls, settings, policies, trust_domain)
        if _sniffs(chains):
            sniffed.append(port.port)
        for chain in chains:
            chain.filter_chain_match.destination_port.value = port.port
            listener.filter_chains.append(chain)
    if sniffed:
        # Only the sniffed ports wait for the client's first bytes: a declared TCP port may
        # carry a server-first protocol.
        listener.listener_filters.append(sniffing.http_inspector(sniffed))
        sniffing.set_detection_timeout(listener, settings.inbound_detection_timeout_s)
    listener.default_filter_chain.CopyFrom(listener_components_pb2.FilterChain(
        name=INBOUND_PASSTHROUGH_CLUSTER,
        filters=[tcp_proxy_filter(INBOUND_PASSTHROUGH_CLUSTER, INBOUND_PASSTHROUGH_CLUSTER, settings)]))
    return listener

