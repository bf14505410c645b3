"""VirtualService `tcp` and `tls` rules for sidecars: which cluster(s) a TCP connection to a
service port goes to (weighted), and SNI-based routing on TLS ports."""

from __future__ import annotations

from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from pilot.config.networking import VirtualService
from pilot.model.labels import selects
from pilot.model.mesh_settings import ListenerSettings
from pilot.model.services import MeshService
from pilot.model.store import Entry
from pilot.model.traffic import MESH_GATEWAY, resolve_host
from pilot.networking import names
from pilot.networking.filters import TCP_PROXY_FILTER, access_logs
from pilot.networking.metadata import config_path, set_config
from pilot.networking.protos import pack

TLS_INSPECTOR = "envoy.filters.listener.tls_inspector"


def _cluster(dest, port: int, vs: Entry[VirtualService], domain: str) -> str:
    host = resolve_host(dest.host, vs.key.namespace, domain)
    number = dest.port.number if dest.port is not None and dest.port.number else port
    return names.outbound_cluster_name(number, host, dest.subset or "")


def vs_metadata(md, vs: Entry[VirtualService]) -> None:
    """`filter_metadata.istio.config` naming the VirtualService a TCP/TLS filter chain comes from,
    as istiod sets it (istioctl proxy-config listener shows it)."""
    set_config(md, config_path("VirtualService", vs.key.namespace, vs.key.name))


def _tcp_proxy(stat_prefix: str, route, port: int, vs: Entry[VirtualService], domain: str,
               settings: ListenerSettings) -> listener_components_pb2.Filter:
    tp = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix, access_log=access_logs(settings))
    dests = [d for d in route.route if len(route.route) == 1 or d.weight > 0]
    if len(dests) == 1:
        tp.cluster = _cluster(dests[0].destination, port, vs, domain)
    else:
        for d in dests:
            tp.weighted_clusters.clusters.add(name=_cluster(d.destination, port, vs, domain), weight=d.weight)
    return listener_components_pb2.Filter(name=TCP_PROXY_FILTER, typed_config=pack(tp))


# The client, for matches on sourceNamespace / sourceLabels: its namespace and the labels those
# matches ask about (what the listener's cache key holds: nothing more, so clients share bytes).
Client = tuple[str, tuple[tuple[str, str], ...]]
NO_CLIENT: Client = ("", ())


def _applies(m, port: int, client: Client) -> bool:
    """A match for this port and this client on sidecars (a match naming gateways without
    `mesh` is for those gateways only)."""
    if m.port is not None and m.port != port:
        return False
    if m.gateways and MESH_GATEWAY not in m.gateways:
        return False
    namespace, labels = client
    if m.source_namespace and m.source_namespace != namespace:
        return False
    return not m.source_labels or selects(m.source_labels, dict(labels))


def _port_matches(matches, port: int, client: Client) -> bool:
    return not matches or any(_applies(m, port, client) for m in matches)


def source_conditions(vss) -> tuple[bool, frozenset[str]]:
    """Whether any tcp/tls match of these VirtualServices tests sourceNamespace, and the label keys
    their sourceLabels test: what of the client a listener depends on."""
    namespace, keys = False, set()
    for vs in vss:
        if vs is None:
            continue
        for rule in (*vs.obj.spec.tcp, *vs.obj.spec.tls):
            for m in rule.match:
                namespace = namespace or bool(m.source_namespace)
                keys.update(m.source_labels)
    return namespace, frozenset(keys)


def tcp_filter_for(svc: MeshService, port: int, vs: Entry[VirtualService] | None, domain: str,
                   settings: ListenerSettings,
                   client: Client = NO_CLIENT) -> listener_components_pb2.Filter | None:
    """The tcp_proxy of the first `tcp` rule of the service's VirtualService matching the port
    (and the client)."""
    if vs is None:
        return None
    for rule in vs.obj.spec.tcp:
        if _port_matches(rule.match, port, client) and rule.route:
            cluster = names.outbound_cluster_name(port, svc.hostname)
            return _tcp_proxy(cluster, rule, port, vs, domain, settings)
    return None


def sni_chains(svc: MeshService, port: int, vs: Entry[VirtualService] | None, domain: str,
               settings: ListenerSettings,
               client: Client = NO_CLIENT) -> list[listener_components_pb2.FilterChain]:
    """One filter chain per `tls` rule: SNI names -> its destination(s)."""
    if vs is None:
        return []
    chains = []
    for rule in vs.obj.spec.tls:
        matches = [m for m in rule.match if _applies(m, port, client)]
        if not matches or not rule.route:
            continue
        sni = sorted({h for m in matches for h in m.sni_hosts})
        chain = listener_components_pb2.FilterChain(
            filters=[_tcp_proxy(f"outbound|{port}||{svc.hostname}", rule, port, vs, domain, settings)])
        chain.filter_chain_match.server_names.extend(sni)
        chain.filter_chain_match.transport_protocol = "tls"
        vs_metadata(chain.metadata, vs)
        chains.append(chain)
    return chains


def tls_inspector() -> listener_components_pb2.ListenerFilter:
    return listener_components_pb2.ListenerFilter(name=TLS_INSPECTOR,
                                                  typed_config=pack(tls_inspector_pb2.TlsInspector()))
