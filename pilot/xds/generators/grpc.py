"""Proxyless gRPC generators (istiod's grpcgen): the client's API listeners and per-target route
configs, and the xDS-enabled server's inbound listeners (`xds.istio.io/grpc/lds/inbound/IP:PORT`).

grpc names every resource it wants; a name this control plane does not know is left out, which
grpc reads as "does not exist" (a client fails its RPCs, a server stops serving that port)."""

from __future__ import annotations

from pilot.model.gateways import config_origins
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.services import MeshService, endpoints_for_port
from pilot.model.traffic import resolve_host
from pilot.networking import grpc, names
from pilot.networking.traffic_policy import effective_policy
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import gateway
from pilot.xds.typeurls import CLUSTER, LISTENER, ROUTE


def listeners(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
              cache: XdsCache) -> list[CachedResource]:
    out: list[CachedResource] = []
    for name in sorted(requested or ()):
        server = grpc.server_address(name)
        if server is not None:
            res = _server_listener(ctx, proxy, name, *server, cache)
            if res is not None:
                out.append(res)
            continue
        found = resolve_host_port(ctx, name, proxy)
        if found is None:
            continue
        svc, port = found
        out.append(cache.resource(LISTENER, name, grpc.api_listener, name, svc.hostname, port,
                                  origins=(svc.origin,)))
    return out


def server_inputs(proxy: Proxy, requested: frozenset[str] | None) -> tuple | None:
    """What of a proxy its server listeners read beyond the generation memo's proxy key: its
    addresses (which service instances it is) and labels (its policies); None without any."""
    if not requested or not any(n.startswith(grpc.SERVER_LISTENER_PREFIX) for n in requested):
        return None
    return (proxy.ip_addresses, frozenset(proxy.labels.items()))


def route_config(ctx: PushContext, proxy: Proxy, name: str, svc: MeshService, port: int,
                 cache: XdsCache) -> CachedResource:
    """A client's route config for one target: the VirtualService for the service as the
    client's namespace sees it (istiod's grpcgen reuses the sidecar's virtual hosts)."""
    vs = ctx.virtual_service(svc.hostname, proxy.namespace)
    everything = ctx.all_services() if vs is not None else ()
    labels: tuple[tuple[str, str], ...] = ()
    if vs is not None:
        # Only the labels some sourceLabels match asks about: the rest must not split the cache.
        asked = {k for sel in ctx.traffic.source_selectors for k, _ in sel}
        labels = tuple(sorted((k, v) for k, v in proxy.labels.items() if k in asked))
    # Consistent hashing needs its key on the route: the DestinationRules of the hosts routed to.
    hosts = {svc.hostname}
    if vs is not None:
        hosts |= {resolve_host(d.destination.host, vs.key.namespace, ctx.domain)
                  for rule in vs.obj.spec.http for d in rule.route}
    hashes = tuple(sorted(gateway.hash_policies(ctx, proxy.namespace, hosts, proxy.labels)))
    origins = (svc.origin, *(config_origins(vs) if vs is not None else ()))
    return cache.resource(ROUTE, name, grpc.route_config, name, svc, port, ctx.settings.routes, vs, everything,
                          ctx.domain, proxy.namespace if vs is not None else "", labels, hashes, origins=origins)


def _serving_service(ctx: PushContext, proxy: Proxy, port: int) -> MeshService | None:
    """A Service of the proxy's namespace with an endpoint at one of the proxy's addresses on
    `port` (istiod sends a server listener only for a port some service instance targets)."""
    addresses = set(proxy.ip_addresses)
    for svc in ctx.services_in(proxy.namespace):
        if svc.kind != "Service":
            continue
        slices = ctx.service_slices(svc)
        for svc_port in svc.ports:
            if any(e.address in addresses and e.port == port for e in endpoints_for_port(slices, svc_port)):
                return svc
    return None


def _server_listener(ctx: PushContext, proxy: Proxy, name: str, host: str, port: int,
                     cache: XdsCache) -> CachedResource | None:
    svc = _serving_service(ctx, proxy, port)
    if svc is None:
        return None
    labels = proxy.labels
    policies = ctx.workload_policies(proxy.namespace, labels)
    mtls = grpc.server_mtls(ctx.mtls_mode(proxy.namespace, labels, port), labels)
    return cache.resource(LISTENER, name, grpc.server_listener, name, host, port, policies,
                          tuple(ctx.mesh.trust_domains), mtls, origins=(svc.origin, *policies.origins))


def clusters(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    """The named `outbound|PORT|SUBSET|HOST` clusters among the services the client sees (its
    Sidecar's scope); a subset only while the DestinationRule in force defines it. grpc always
    names its clusters; a wildcard request (a client that does not) gets every one it could use."""
    view = ctx.view(ctx.sidecar_for(proxy.namespace, proxy.labels))
    visible = {s.hostname: s for s in view.services}
    wanted = requested if requested is not None else _all_cluster_names(ctx, proxy, view.services)
    out: list[CachedResource] = []
    for name in sorted(wanted):
        parsed = names.parse_cluster_name(name)
        if parsed is None or parsed[0] != "outbound":
            continue
        _, port_number, subset, host = parsed
        svc = visible.get(host)
        if svc is None or svc.port(port_number) is None:
            continue
        dr = ctx.destination_rule(svc.hostname, proxy.namespace, svc.namespace, proxy.labels)
        if subset and (dr is None or all(s.name != subset for s in dr.obj.spec.subsets)):
            continue
        tls = effective_policy(dr.obj.spec, subset, port_number)["tls"] if dr is not None else None
        mutual = tls is not None and tls.mode == "ISTIO_MUTUAL"
        sans: tuple[str, ...] = ()
        if mutual and tls is not None:
            sans = tuple(tls.subject_alt_names) or tuple(ctx.service_accounts(svc))
        origins = (svc.origin, *((f"DestinationRule/{dr.key.namespace}/{dr.key.name}",) if dr else ()))
        lb = effective_policy(dr.obj.spec, subset, port_number)["load_balancer"] if dr is not None else None
        ch = lb.consistent_hash if lb is not None else None
        ring: int | None = None
        if ch is not None and ch.maglev is None:  # grpc has no Maglev: that stays round robin
            ring = (ch.ring_hash.minimum_ring_size if ch.ring_hash is not None else None) or ch.minimum_ring_size or 0
        out.append(cache.resource(CLUSTER, name, grpc.cluster, name, mutual, sans, ring, origins=origins))
    return out


def _all_cluster_names(ctx: PushContext, proxy: Proxy, services) -> list[str]:
    out = []
    for svc in services:
        dr = ctx.destination_rule(svc.hostname, proxy.namespace, svc.namespace, proxy.labels)
        for port in svc.ports:
            for subset in ("", *(s.name for s in dr.obj.spec.subsets)) if dr is not None else ("",):
                out.append(names.outbound_cluster_name(port.port, svc.hostname, subset))
    return out


def resolve_host_port(ctx: PushContext, name: str, proxy: Proxy | None = None):
    """`host:port` as a gRPC target names it; host may be the FQDN or `name.namespace[.svc]`.
    With `proxy`, only a service its Sidecar's egress scope shows (istiod's grpcgen builds LDS
    and RDS from SidecarScope.Services()): a hidden target gets no listener or route."""
    host, sep, port_text = name.rpartition(":")
    if not sep or not port_text.isdigit():
        return None
    port = int(port_text)
    svc = ctx.service(host)
    if svc is None:
        parts = host.split(".")
        if len(parts) in (2, 3) and (len(parts) == 2 or parts[2] == "svc"):
            svc = ctx.service(f"{parts[0]}.{parts[1]}.svc.{ctx.domain}")
    if svc is None or svc.port(port) is None:
        return None
    if proxy is not None:
        view = ctx.view(ctx.sidecar_for(proxy.namespace, proxy.labels))
        if all(s.hostname != svc.hostname for s in view.services):
            return None
    return svc, port
