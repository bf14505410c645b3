"""LDS for sidecars (proxyless gRPC clients: pilot.networking.grpc).

Two sidecar shapes, chosen by the proxy's interception mode:
- NONE (no iptables): one listener per outbound service port, bound on 127.0.0.1:PORT, so a plain
  local Envoy works without root.
- REDIRECT/TPROXY (istiod's default shape): `virtualOutbound` on 15001 using the original
  destination, handing connections to per-port listeners that do not bind.
"""

from __future__ import annotations

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from google.protobuf import wrappers_pb2

from pilot.config.networking import VirtualService
from pilot.model.mesh_settings import ListenerSettings
from pilot.model.ports import PortPlan
from pilot.model.services import MeshService
from pilot.model.store import Entry
from pilot.networking import names, sniffing
from pilot.networking.filters import (
    hcm_network_filter,
    http_connection_manager,
    tcp_proxy_filter,
)
from pilot.networking.tcp_routes import (
    NO_CLIENT,
    Client,
    sni_chains,
    tcp_filter_for,
    tls_inspector,
    vs_metadata,
)

LOCALHOST = "127.0.0.1"
WILDCARD = "0.0.0.0"
WILDCARD_V6 = "::"


def add_ipv6_wildcard(listener: listener_pb2.Listener) -> None:
    """ISTIO_DUAL_STACK for a dual-stack proxy: the listener bound on 0.0.0.0 also takes IPv6
    connections, on [::] at the same port (istiod's extraBind, as `additional_addresses`)."""
    port = listener.address.socket_address.port_value
    extra = listener.additional_addresses.add()
    extra.address.socket_address.address = WILDCARD_V6
    extra.address.socket_address.port_value = port


def wildcard(settings: ListenerSettings) -> str:
    """The address wildcard listeners bind: `::` for an IPv6-only proxy, else 0.0.0.0."""
    return WILDCARD_V6 if settings.ipv6_only else WILDCARD


def _address(ip: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(socket_address=address_pb2.SocketAddress(address=ip, port_value=port))


TcpLimits = tuple[float | None, float | None]  # (idle timeout, max connection duration) seconds
NO_LIMITS: TcpLimits = (None, None)


def _tcp_chains(svc: MeshService, port: int, vs: Entry[VirtualService] | None, domain: str, settings: ListenerSettings,
                limits: TcpLimits = NO_LIMITS, client: Client = NO_CLIENT
                ) -> tuple[list[listener_components_pb2.FilterChain], listener_components_pb2.FilterChain]:
    """(SNI chains from `tls` rules, the default chain: a `tcp` rule or the service's cluster, the
    latter with the limits of the service's DestinationRule)."""
    cluster = names.outbound_cluster_name(port, svc.hostname)
    routed = tcp_filter_for(svc, port, vs, domain, settings, client)
    chain = listener_components_pb2.FilterChain(filters=[routed or tcp_proxy_filter(cluster, cluster, settings,
                                                                                    limits)])
    if routed is not None and vs is not None:  # istiod's BuildConfigInfoMetadata on the chain
        vs_metadata(chain.metadata, vs)
    sni = sni_chains(svc, port, vs, domain, settings, client)
    return sni, chain


def _hcm_chain(stat_prefix: str, port: int, settings: ListenerSettings) -> listener_components_pb2.FilterChain:
    hcm = http_connection_manager(stat_prefix, names.route_config_name(port), settings, port)
    if settings.http10:
        hcm.http_protocol_options.accept_http_10 = True  # PILOT_HTTP10, as istiod sets it
    return listener_components_pb2.FilterChain(filters=[hcm_network_filter(hcm)])


def _add_prefixes(chain: listener_components_pb2.FilterChain, addresses: tuple[str, ...]) -> None:
    for address in addresses:
        ip, _, bits = address.partition("/")
        full = 128 if ":" in ip else 32
        chain.filter_chain_match.prefix_ranges.add(
            address_prefix=ip, prefix_len=wrappers_pb2.UInt32Value(value=int(bits) if bits else full))


def _sniffed(svc: MeshService, port: int) -> bool:
    sp = svc.port(port)
    return sp is not None and sp.protocol.is_unsupported


def _sniffing(listener: listener_pb2.Listener, settings: ListenerSettings) -> None:
    """The HTTP inspector of a sniffed port, after the TLS inspector when SNI chains need one (it
    then reads only connections the TLS inspector did not find to be TLS)."""
    listener.listener_filters.append(sniffing.http_inspector())
    sniffing.set_detection_timeout(listener, settings.detection_timeout_s)


def bound_outbound_listener(plan: PortPlan, settings: ListenerSettings,
                            virtual_services: tuple[Entry[VirtualService] | None, ...] = (),
                            domain: str = "cluster.local", bind: str = LOCALHOST,
                            tcp_limits: tuple[TcpLimits, ...] = (),
                            client: Client = NO_CLIENT) -> listener_pb2.Listener:
    """NONE mode (or a Sidecar egress listener's `bind`): listen on BIND:PORT. A TCP port shared
    by several services cannot tell them apart without the original destination, so the first
    (by hostname) gets it. `virtual_services` hold the VirtualService (or None) of each of
    `plan.tcp_services`, `tcp_limits` the DestinationRule limits of each (empty: none)."""
    name = names.listener_name(bind, plan.port)
    listener = listener_pb2.Listener(name=name, address=_address(bind, plan.port),
                                     traffic_direction=base_pb2.OUTBOUND)
    if plan.sniff:
        # HTTP to the port's routes; anything else to the first service that names no protocol.
        http = sniffing.match_http(_hcm_chain(f"outbound_{bind}_{plan.port}", plan.port, settings),
                                   sniffing.plaintext_http_alpns(settings.http10))
        vs = virtual_services[0] if virtual_services else None
        sni, default = _tcp_chains(plan.tcp_services[0], plan.port, vs, domain, settings,
                                   tcp_limits[0] if tcp_limits else NO_LIMITS, client)
        # Envoy picks a chain level by level (address, SNI, transport, ALPN) without going back:
        # raw TCP reaches the raw_buffer level, misses the HTTP ALPNs and matches nothing there.
        # As the default chain (istiod's choice too) it takes every connection no chain matches.
        listener.filter_chains.extend([http, *sni])
        listener.default_filter_chain.CopyFrom(default)
        if sni:
            listener.listener_filters.append(tls_inspector())
        _sniffing(listener, settings)
    elif plan.http:
        listener.filter_chains.append(_hcm_chain(f"outbound_{bind}_{plan.port}", plan.port, settings))
    else:
        vs = virtual_services[0] if virtual_services else None
        sni, default = _tcp_chains(plan.tcp_services[0], plan.port, vs, domain, settings,
                                   tcp_limits[0] if tcp_limits else NO_LIMITS, client)
        listener.filter_chains.extend(sni + [default])
        if sni:
            listener.listener_filters.append(tls_inspector())
    return listener


def unbound_outbound_listener(plan: PortPlan, settings: ListenerSettings,
                              virtual_services: tuple[Entry[VirtualService] | None, ...] = (),
                              domain: str = "cluster.local",
                              tcp_limits: tuple[TcpLimits, ...] = (),
                              client: Client = NO_CLIENT) -> listener_pb2.Listener:
    """iptables mode: `0.0.0.0_PORT` (IPv6-only proxies: `::_PORT`), reached only through
    virtualOutbound's original destination."""
    any_ip = wildcard(settings)
    listener = listener_pb2.Listener(
        name=names.listener_name(any_ip, plan.port), address=_address(any_ip, plan.port),
        bind_to_port=wrappers_pb2.BoolValue(value=False), traffic_direction=base_pb2.OUTBOUND)
    if settings.dual_stack:
        add_ipv6_wildcard(listener)  # IPv6 original destinations [::]:PORT land here too
    if plan.http and not plan.sniff:
        listener.filter_chains.append(_hcm_chain(f"outbound_{any_ip}_{plan.port}", plan.port, settings))
        return listener
    if plan.sniff:
        # Envoy matches the destination address before the application protocol, so HTTP to a
        # sniffed service's cluster IP needs a chain listing that IP beside the service's TCP
        # chain: one HTTP chain holds every such IP (one connection manager, not one per
        # service). Services without a cluster IP, and HTTP services, share one without.
        alpns = sniffing.plaintext_http_alpns(settings.http10)
        stat = f"outbound_{any_ip}_{plan.port}"
        vips = sorted({a for s in plan.tcp_services if _sniffed(s, plan.port) for a in s.addresses})
        if vips:
            chain = sniffing.match_http(_hcm_chain(stat, plan.port, settings), alpns)
            _add_prefixes(chain, tuple(vips))
            listener.filter_chains.append(chain)
        listener.filter_chains.append(sniffing.match_http(_hcm_chain(stat, plan.port, settings), alpns))
    for i, svc in enumerate(plan.tcp_services):
        vs = virtual_services[i] if i < len(virtual_services) else None
        sni, default = _tcp_chains(svc, plan.port, vs, domain, settings,
                                   tcp_limits[i] if i < len(tcp_limits) else NO_LIMITS, client)
        defaults = [default]
        if plan.sniff:
            # Chains are picked level by level without going back (see bound_outbound_listener):
            # beside an HTTP chain of the same address, the TCP chain must match raw_buffer too,
            # or raw TCP would find no chain; TLS with no SNI chain of its own keeps a copy
            # without a transport match (there is a TLS inspector only when SNI chains exist).
            tcp_raw = listener_components_pb2.FilterChain()
            tcp_raw.CopyFrom(default)
            tcp_raw.filter_chain_match.transport_protocol = sniffing.RAW_BUFFER
            defaults = [tcp_raw, default] if sni else [tcp_raw]
        for chain in sni + defaults:
            _add_prefixes(chain, svc.addresses)  # a ServiceEntry's every address and CIDR, as istiod
            listener.filter_chains.append(chain)
        if sni and not listener.listener_filters:
            listener.listener_filters.append(tls_inspector())
    # Without cluster IPs the chains are indistinguishable: keep only the first.
    seen: set[bytes] = set()
    unique = []
    for chain in listener.filter_chains:
        k = chain.filter_chain_match.SerializeToString(deterministic=True)
        if k not in seen:
            seen.add(k)
            unique.append(chain)
    del listener.filter_chains[:]
    listener.filter_chains.extend(unique)
    if plan.sniff:
        _sniffing(listener, settings)
    return listener


def virtual_outbound_listener(settings: ListenerSettings) -> listener_pb2.Listener:
    fallback = (names.BLACKHOLE_CLUSTER if settings.registry_only
                else names.PASSTHROUGH_CLUSTER)
    listener = listener_pb2.Listener(
        name=names.VIRTUAL_OUTBOUND_LISTENER,
        address=_address(wildcard(settings), names.VIRTUAL_OUTBOUND_PORT),
        use_original_dst=wrappers_pb2.BoolValue(value=True),
        traffic_direction=base_pb2.OUTBOUND,
    )
    if settings.dual_stack:
        add_ipv6_wildcard(listener)
    listener.default_filter_chain.CopyFrom(listener_components_pb2.FilterChain(
        name=fallback, filters=[tcp_proxy_filter(fallback, fallback, settings)]))
    return listener

