"""Authorization generator: istio.security.Authorization resources for ztunnel, every one to
every ztunnel (they are few, and scope decides where each applies)."""

from __future__ import annotations

from pilot.model.ambient.index import ambient_index
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.networking.ztunnel_authz import authorization
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.typeurls import AUTHORIZATION


def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    index = ambient_index(ctx)
    names = sorted(index.policies) if requested is None else sorted(n for n in requested if n in index.policies)
    return [cache.resource(AUTHORIZATION, n, authorization, index.policies[n], origins=index.origins.get(n, ()))
            for n in names]
