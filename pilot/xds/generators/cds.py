"""CDS generator: every outbound cluster a proxy can use, or just the named ones (gRPC)."""

from __future__ import annotations

from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.networking import clusters, names
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.typeurls import CLUSTER


def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    out: list[CachedResource] = []
    memo = proxy.is_grpc  # gRPC and Envoy get the same outbound clusters

    def want(name: str) -> bool:
        return requested is None or name in requested

    for svc in ctx.services:
        for port in svc.ports:
            name = names.outbound_cluster_name(port.port, svc.hostname)
            if want(name):
                out.append(cache.resource(ctx.version, memo, CLUSTER, name, clusters.outbound_cluster,
                                          svc, port, ctx.settings.clusters, origins=(f"Service/{svc.namespace}/{svc.name}",)))
    if not proxy.is_grpc:
        # ORIGINAL_DST/STATIC catch-alls are Envoy-only; grpcio NACKs cluster types it cannot use.
        for name, build in ((names.BLACKHOLE_CLUSTER, clusters.blackhole_cluster),
                            (names.PASSTHROUGH_CLUSTER, clusters.passthrough_cluster)):
            if want(name):
                out.append(cache.resource(ctx.version, memo, CLUSTER, name, build, ctx.settings.clusters,
                                          origins=("MeshConfig",)))
    return out
