"""WDS generator: istio.workload.Address resources for ztunnel (delta only).

Wildcard subscribers get every workload and service. On-demand subscribers name what they want:
a workload uid, a service "namespace/hostname", or a "network/IP" alias; a service VIP brings the
service's workloads along (istiod's AdditionalPodSubscriptions). Names that match nothing are
reported back as removed, which is how the delta protocol says "does not exist". Every resource
carries its aliases, so an on-demand client can tie the answer to the address it asked for.
"""

from __future__ import annotations

from functools import lru_cache

from pilot.model.ambient.index import AmbientIndex, ambient_index
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.networking.ztunnel_wds import service_address, workload_address
from pilot.xds import wire
from pilot.xds.cache import CachedResource, XdsCache, delta_prefix
from pilot.xds.typeurls import ADDRESS

RESOURCE_ALIASES = 4  # envoy.service.discovery.v3.Resource.aliases


class Resolved(list):
    """Generator output plus the requested names that resolved to nothing."""

    absent: tuple[str, ...] = ()


def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    index = ambient_index(ctx)
    out = Resolved()
    if requested is None:
        names = [*sorted(index.workloads), *sorted(index.services)]
    else:
        found: dict[str, None] = {}
        absent = []
        for name in sorted(requested):
            targets = index.resolve(name)
            if not targets:
                absent.append(name)
            found.update(dict.fromkeys(targets))
        names = list(found)
        out.absent = tuple(absent)
    out.extend(_resource(index, name, cache) for name in names)
    return out


def _resource(index: AmbientIndex, name: str, cache: XdsCache) -> CachedResource:
    origins = index.origins.get(name, ())
    w = index.workloads.get(name)
    if w is not None:
        return with_aliases(cache.resource(ADDRESS, name, workload_address, w, origins=origins), w.aliases)
    s = index.services[name]
    return with_aliases(cache.resource(ADDRESS, name, service_address, s, origins=origins), s.aliases)


@lru_cache(maxsize=65536)
def with_aliases(res: CachedResource, aliases: tuple[str, ...]) -> CachedResource:
    """The same resource, framed for delta responses with its `aliases`. Keyed by the cached
    object itself (identity), so it is rebuilt only when the content is."""
    if not aliases:
        return res
    suffix = b"".join(wire.string_field(RESOURCE_ALIASES, a) for a in aliases)
    return CachedResource(res.name, res.version, res.any_bytes, res.sotw_prefix,
                          delta_prefix(res.name, res.version, len(res.any_bytes), len(suffix)), res.origins,
                          suffix)
