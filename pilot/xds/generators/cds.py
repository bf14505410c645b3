"""CDS generator: every outbound cluster a proxy can use, or just the named ones (gRPC)."""

from __future__ import annotations

from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.store import Entry
from pilot.networking import clusters, names
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.typeurls import CLUSTER


def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    out: list[CachedResource] = []
    def want(name: str) -> bool:
        return requested is None or name in requested

    view = ctx.view(None if proxy.type == "router" else ctx.sidecar_for(proxy.namespace, proxy.labels))
    for svc in view.services:
        dr = ctx.traffic.destination_rule(svc.hostname, proxy.namespace, svc.namespace)
        origins = (svc.origin,) + ((ref(dr),) if dr else ())
        subsets = [s.name for s in dr.obj.spec.subsets] if dr else []
        dns = svc.resolution in ("DNS", "DNS_ROUND_ROBIN")
        for port in svc.ports:
            targets = ctx.endpoints(svc, port.port) if dns else ()
            for subset in ("", *subsets):
                name = names.outbound_cluster_name(port.port, svc.hostname, subset)
                if want(name):
                    out.append(cache.resource(CLUSTER, name, clusters.outbound_cluster,
                                              svc, port, ctx.settings.clusters, dr, subset, targets,
                                              origins=origins))
    if not proxy.is_grpc:
        # ORIGINAL_DST/STATIC catch-alls are Envoy-only; grpcio NACKs cluster types it cannot use.
        for name, build in ((names.BLACKHOLE_CLUSTER, clusters.blackhole_cluster),
                            (names.PASSTHROUGH_CLUSTER, clusters.passthrough_cluster)):
            if want(name):
                out.append(cache.resource(CLUSTER, name, build, ctx.settings.clusters,
                                          origins=("MeshConfig",)))
    return out


def ref(e: Entry) -> str:
    return f"{e.key.kind}/{e.key.namespace}/{e.key.name}"
