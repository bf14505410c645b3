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
from pilot.networking import names
from pilot.networking.filters import (
    hcm_network_filter,
    http_connection_manager,
    tcp_proxy_filter,
)
from pilot.networking.tcp_routes import NO_CLIENT, Client, sni_chains, tcp_filter_for, tls_inspector

LOCALHOST = "127.0.0.1"
WILDCARD = "0.0.0.0"


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
    default = tcp_filter_for(svc, port, vs, domain, settings, client) or tcp_proxy_filter(cluster, cluster,
                                                                                           settings, limits)
    sni = sni_chains(svc, port, vs, domain, settings, client)
    return sni, listener_components_pb2.FilterChain(filters=[default])


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
    if plan.http:
        hcm = http_connection_manager(f"outbound_{bind}_{plan.port}",
                                      names.route_config_name(plan.port), settings)
        listener.filter_chains.add(filters=[hcm_network_filter(hcm)])
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
    """iptables mode: `0.0.0.0_PORT`, reached only through virtualOutbound's original destination."""
    listener = listener_pb2.Listener(
        name=names.listener_name(WILDCARD, plan.port), address=_address(WILDCARD, plan.port),
        bind_to_port=wrappers_pb2.BoolValue(value=False), traffic_direction=base_pb2.OUTBOUND)
    if plan.http:
        hcm = http_connection_manager(f"outbound_{WILDCARD}_{plan.port}",
                                      names.route_config_name(plan.port), settings)
        listener.filter_chains.add(filters=[hcm_network_filter(hcm)])
        return listener
    for i, svc in enumerate(plan.tcp_services):
        vs = virtual_services[i] if i < len(virtual_services) else None
        sni, default = _tcp_chains(svc, plan.port, vs, domain, settings,
                                   tcp_limits[i] if i < len(tcp_limits) else NO_LIMITS, client)
        for chain in sni + [default]:
            for address in svc.addresses:  # a ServiceEntry's every address and CIDR, as istiod
                ip, _, bits = address.partition("/")
                full = 128 if ":" in ip else 32
                chain.filter_chain_match.prefix_ranges.add(
                    address_prefix=ip, prefix_len=wrappers_pb2.UInt32Value(value=int(bits) if bits else full))
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
    return listener


def virtual_outbound_listener(settings: ListenerSettings) -> listener_pb2.Listener:
    fallback = (names.BLACKHOLE_CLUSTER if settings.registry_only
                else names.PASSTHROUGH_CLUSTER)
    listener = listener_pb2.Listener(
        name=names.VIRTUAL_OUTBOUND_LISTENER,
        address=_address(WILDCARD, names.VIRTUAL_OUTBOUND_PORT),
        use_original_dst=wrappers_pb2.BoolValue(value=True),
        traffic_direction=base_pb2.OUTBOUND,
    )
    listener.default_filter_chain.CopyFrom(listener_components_pb2.FilterChain(
        name=fallback, filters=[tcp_proxy_filter(fallback, fallback, settings)]))
    return listener

