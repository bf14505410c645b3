"""CDS generator: every outbound cluster a proxy can use (gRPC clients: generators.grpc)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from pilot.config.networking import DestinationRule
from pilot.model.mesh_settings import ClusterSettings
from pilot.model.mtls import MeshTls, client_mesh_tls
from pilot.model.networks import NetworkView
from pilot.model.protocol import Protocol
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.services import MeshService
from pilot.model.store import Entry
from pilot.networking import clusters, inbound, names
from pilot.networking.traffic_policy import effective_policy
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import eds, envoy_filter, gateway, grpc, waypoint
from pilot.xds.typeurls import CLUSTER


@envoy_filter.patched(CLUSTER)
def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    return list(resources(ctx, proxy, requested, cache))


def sliced(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
           cache: XdsCache) -> Iterator[CachedResource]:
    """generate() as an iterator, EnvoyFilter patches included: a cluster at a time when no
    patch applies to this proxy's clusters (the usual case); otherwise the patched list, made at
    once (patches see every cluster)."""
    mine = envoy_filter.patches_for(ctx, proxy, CLUSTER)
    if not mine:
        yield from resources(ctx, proxy, requested, cache)
        return
    yield from envoy_filter.apply(CLUSTER, proxy.type == "router", list(resources(ctx, proxy, requested, cache)),
                                  mine, requested, cache)


def resources(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
              cache: XdsCache) -> Iterator[CachedResource]:
    """generate(), a service at a time: between two, the caller may yield to the event loop
    (GenerationMemo slices a cold generation of a thousand services)."""
    if proxy.is_grpc:
        yield from grpc.clusters(ctx, proxy, requested, cache)
        return

    def want(name: str) -> bool:
        return requested is None or name in requested

    view = ctx.view(None if proxy.type == "router" else ctx.sidecar_for(proxy.namespace, proxy.labels))
    has_identity = proxy.traits.mesh_tls
    settings = ctx.settings.clusters
    # The proxy's IP families decide how DNS clusters resolve (V4_ONLY, V6_ONLY, or ALL with
    # ISTIO_DUAL_STACK): in the settings of those clusters only, so the others keep one key.
    families = proxy.ip_families
    family = clusters.dns_lookup_family(families, ctx.settings.knobs.dual_stack)
    dns_settings = settings if family == settings.dns_lookup_family else replace(settings, dns_lookup_family=family)
    dns_local = ctx.dns_locality_in_use()
    # Split horizon over DNS clusters' own endpoints (istiod filters them as EDS ones).
    dns_view = ctx.network_view(proxy) if ctx.dns_networks_in_use() else None
    sniffing_sidecar = proxy.type == "sidecar" and ctx.settings.listeners.sniff_outbound
    only = gateway.cluster_hosts(ctx, proxy) if proxy.type == "router" else None
    for svc in view.services:
        if only is not None and svc.hostname not in only:
            continue  # PILOT_FILTER_GATEWAY_CLUSTER_CONFIG: no route of this gateway reaches it
        dr = ctx.destination_rule(svc.hostname, proxy.namespace, svc.namespace, proxy.labels)
        dns = svc.resolution in ("DNS", "DNS_ROUND_ROBIN")
        svc_settings = dns_settings if dns else settings
        if requested is None and not (dns and (dns_local or dns_view is not None)):
            # What follows reads nothing of the proxy but these: proxies of every namespace
            # (ten memo keys of a push) share one walk per service and rule. The memo keeps
            # the Deps of the first walk, so each later caller depends on what it read.
            # id(svc) is safe: the memo lives as long as this context, and so does every service
            # a view iterates (ctx.services, or a DNS-capturing view's copies kept in ctx._views).
            key = ("cds-outbound", id(svc), dr, has_identity, sniffing_sidecar, svc_settings.dns_lookup_family)
            yield from ctx.memoized(key,
                                    lambda svc=svc, dr=dr, dns=dns, s=svc_settings: tuple(_outbound(
                                        ctx, proxy, svc, dr, dns, s, has_identity, sniffing_sidecar, False, want,
                                        cache)))
        else:
            yield from _outbound(ctx, proxy, svc, dr, dns, svc_settings, has_identity, sniffing_sidecar,
                                 dns and dns_local, want, cache, dns_view if dns else None)
    if proxy.type == "router":
        for svc, port, subset in gateway.sni_dnat_targets(ctx, proxy):
            name = names.sni_dnat_cluster_name(port.port, svc.hostname, subset)
            if want(name):
                dr = ctx.destination_rule(svc.hostname, proxy.namespace, svc.namespace, proxy.labels)
                dns = svc.resolution in ("DNS", "DNS_ROUND_ROBIN")
                targets = ctx.endpoints(svc, port.port) if dns else ()
                yield cache.resource(CLUSTER, name, clusters.sni_dnat_cluster, svc, port,
                                     dns_settings if dns else settings, dr, subset,
                                     targets, origins=(svc.origin,) + ((ref(dr),) if dr else ()))
    if proxy.type == "sidecar":
        plan = ctx.inbound_plan(proxy)
        for port in plan.ports:
            name = inbound.inbound_cluster_name(port.port)
            if want(name):
                yield cache.resource(CLUSTER, name, inbound.inbound_cluster, port, ctx.settings.clusters,
                                     origins=(port.origin,))
        if proxy.interception_mode != "NONE" and (plan.mesh_tls or any(not p.bind for p in plan.ports)) \
                and want(inbound.INBOUND_PASSTHROUGH_CLUSTER):
            # (IPv4-only proxies leave the families out: their key, and bytes, stay the shared ones.)
            yield cache.resource(CLUSTER, inbound.INBOUND_PASSTHROUGH_CLUSTER,
                                 inbound.inbound_passthrough_cluster, settings,
                                 *(() if families == (True, False) else (families,)), origins=("MeshConfig",))
    for name, build in ((names.BLACKHOLE_CLUSTER, clusters.blackhole_cluster),
                        (names.PASSTHROUGH_CLUSTER, clusters.passthrough_cluster)):
        if want(name):
            yield cache.resource(CLUSTER, name, build, ctx.settings.clusters, origins=("MeshConfig",))
    wp = waypoint.waypoint_of(ctx, proxy)
    if wp is not None:
        yield from (r for r in waypoint.clusters(ctx, proxy, wp, cache) if want(r.name))


def _outbound(ctx: PushContext, proxy: Proxy, svc: MeshService, dr: Entry[DestinationRule] | None, dns: bool,
              settings: ClusterSettings, has_identity: bool, sniffing_sidecar: bool, dns_local: bool,
              want: Callable[[str], bool],
              cache: XdsCache, network: NetworkView | None = None) -> Iterator[CachedResource]:
    """The outbound clusters of one service (a port and subset each). `proxy` is read only for
    its locality, and only when `dns_local` (a DNS cluster's endpoints ordered for the client).
    `network`: the client's network, for a DNS cluster's endpoints (split horizon), else None."""
    origins = (svc.origin,) + ((ref(dr),) if dr else ())
    subsets = [s.name for s in dr.obj.spec.subsets] if dr else []
    sans = ctx.service_accounts(svc) if has_identity else ()
    # An ExternalName is outside the mesh (istiod's MeshExternal): never mesh mTLS.
    mesh_tls_possible = has_identity and not svc.external_name
    unsupported = Protocol.UNSUPPORTED
    for port in svc.ports:
        # A sniffed port carries HTTP/1.1 and h2c alike: keep the client's version upstream.
        # (Only then is the flag passed: other clusters keep their key, and this hot loop
        # its speed: no star-args call.)
        downstream = sniffing_sidecar and port.protocol is unsupported
        targets = ctx.endpoints(svc, port.port) if dns else ()
        for subset in ("", *subsets):
            name = names.outbound_cluster_name(port.port, svc.hostname, subset)
            if want(name):
                mesh_tls = _mesh_tls(ctx, svc, port.port, dr, subset, sans) if mesh_tls_possible else None
                # istiod reorders a DNS cluster's own endpoints by the client's locality
                # (failoverPriority aside: its TODO for STRICT_DNS).
                local = eds.locality_lb(ctx, proxy, dr, subset, port.port, labels=False) if dns_local else None
                if network is not None:
                    view = replace(network, mtls=eds.mode_of(mesh_tls))
                    yield cache.resource(CLUSTER, name, clusters.outbound_cluster,
                                         svc, port, settings, dr, subset, targets, mesh_tls,
                                         local, downstream, view, origins=origins)
                    continue
                if downstream:
                    yield cache.resource(CLUSTER, name, clusters.outbound_cluster,
                                         svc, port, settings, dr, subset, targets, mesh_tls,
                                         local, True, origins=origins)
                    continue
                yield cache.resource(CLUSTER, name, clusters.outbound_cluster,
                                     svc, port, settings, dr, subset, targets, mesh_tls,
                                     local, origins=origins)


def _mesh_tls(ctx: PushContext, svc: MeshService, port: int, dr: Entry[DestinationRule] | None, subset: str,
              sans: tuple[str, ...]) -> MeshTls | None:
    tls = effective_policy(dr.obj.spec, subset, port)["tls"] if dr else None
    if svc.kind == "ServiceEntry":
        entry = ctx.service_entry(svc)
        internal = entry is not None and entry.obj.spec.location == "MESH_INTERNAL"
        eds = svc.resolution == "STATIC" and internal
    else:
        eds = True
    return client_mesh_tls(
        dr_tls_mode=tls.mode if tls is not None else None,
        auto_mtls=ctx.mesh.enable_auto_mtls, eds_cluster=eds,
        destination_mtls_disabled=ctx.destination_mtls_disabled(svc, port),
        sans=sans, dr_sans=tuple(tls.subject_alt_names) if tls is not None else ())


def ref(e: Entry) -> str:
    return f"{e.key.kind}/{e.key.namespace}/{e.key.name}"
