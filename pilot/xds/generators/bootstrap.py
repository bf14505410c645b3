"""BDS: the Envoy bootstrap with the proxy's EnvoyFilter `applyTo: BOOTSTRAP` patches merged, as
istiod's BootstrapGenerator served it (pilot/pkg/xds/bootstrapds.go, istio 1.11-1.20) to an
istio-agent started with BOOTSTRAP_XDS_AGENT=true, which asks for it once before starting Envoy.

istiod regenerated the bootstrap from the request's node with its own template (the agent's
code, linked into istiod). Here the agent sends the bootstrap it wrote, in the node metadata of
that one request (`AGENT_BOOTSTRAP`), and the patches are merged into exactly that: the control
plane never has to guess the agent's sockets, ports or flags. A request without it gets an empty
response (nothing to patch), which pilot-agent takes as "start with your own".

The result depends on the agent's bootstrap and the patch list only, so it is cached under those
(an unpatched one is the agent's own, re-encoded). Patched resources name their EnvoyFilters as
origins: when the agent finds the result invalid (`envoy --mode validate`) it NACKs, and the
EnvoyFilter is left out as for any other NACKed patch (pilot/xds/ack_nack.py).

A bootstrap is fetched once, at the agent's start: a patched one's node metadata names the
patches it holds (`BOOTSTRAP_ENVOY_FILTERS`), which Envoy then sends on its own ADS stream, so
/debug/push_status can list the Envoys whose BOOTSTRAP patches are not in their bootstrap
(`not_in_effect`).
"""

from __future__ import annotations

import hashlib
import json

from envoy.config.bootstrap.v3 import bootstrap_pb2
from google.protobuf import json_format

from pilot.config.networking.envoy_filter import load_types
from pilot.model.envoy_filters import NO_PATCHES, PatchSet, patch_set
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.networking import envoy_filters as patching
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import envoy_filter
from pilot.xds.typeurls import AGENT_BOOTSTRAP_METADATA, BOOTSTRAP

NAME = "bootstrap"  # istiod's resource had no name; a NACK names this one
# Set in a patched bootstrap's node metadata: which patches it holds (origins, digest).
IN_EFFECT_METADATA = "BOOTSTRAP_ENVOY_FILTERS"


def proxy_inputs(ctx: PushContext, proxy: Proxy) -> str | None:
    """The agent's bootstrap, canonical: part of the generation memo's key (it is the input)."""
    return base_text(proxy)


def base_text(proxy: Proxy) -> str | None:
    base = proxy.metadata.get(AGENT_BOOTSTRAP_METADATA)
    return json.dumps(base, sort_keys=True) if isinstance(base, dict) else None


def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    text = base_text(proxy)
    if text is None or proxy.is_grpc:
        return []
    rel = bootstrap_patches(ctx, proxy)
    if rel and cache.on_patch is not None:
        cache.on_patch(rel.refs)
    try:
        return [cache.resource(BOOTSTRAP, NAME, build, text, rel, origins=rel.origins)]
    except (json_format.Error, ValueError, TypeError, AttributeError, KeyError):
        return []  # not a bootstrap this control plane can read: the agent keeps its own


def bootstrap_patches(ctx: PushContext, proxy: Proxy) -> PatchSet:
    """The proxy's BOOTSTRAP patches whose context fits it. istiod took every BOOTSTRAP patch of
    the proxy whatever its `match.context`; a GATEWAY-only patch reaching sidecars would be wider
    than written, so the context is honoured as far as a bootstrap can tell (gateway or sidecar)."""
    patches = envoy_filter.patches_for(ctx, proxy, BOOTSTRAP)
    router = proxy.type == "router"
    key = ("bootstrap", router)
    rel: PatchSet | None = patches.memo.get(key)
    if rel is None:  # once per patch set
        contexts = ("ANY", "GATEWAY") if router else ("ANY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND")
        rel = patches.memo[key] = patch_set(tuple(r for r in patches if r.patch.match.context in contexts))
    return rel


def digest(refs: PatchSet) -> str:
    """What the patches are, independent of this replica's revisions: their origins and values."""
    h = hashlib.sha256()
    for r in refs:
        h.update(json.dumps([r.origin, r.index, r.patch.patch.value], sort_keys=True).encode())
    return h.hexdigest()[:16]


def build(text: str, refs: PatchSet) -> bootstrap_pb2.Bootstrap:
    base = json.loads(text)
    load_types(base)
    bs = bootstrap_pb2.Bootstrap()
    json_format.ParseDict(base, bs)
    bs = patching.patch_bootstrap(bs, refs)
    if refs:
        # Envoy's node then says which patches its bootstrap holds: /debug/push_status can tell
        # a proxy whose BOOTSTRAP patches are not (or no longer) the ones in force.
        bs.node.metadata.update({IN_EFFECT_METADATA: {"envoyFilters": list(refs.origins), "digest": digest(refs)}})
    return bs


def not_in_effect(ctx: PushContext, proxy: Proxy) -> dict | None:
    """For a connected Envoy: its BOOTSTRAP patches when they differ from those in its bootstrap
    (as its node metadata tells), else None. A bootstrap is fetched once, at the agent's start."""
    want = bootstrap_patches(ctx, proxy) if not proxy.is_grpc else NO_PATCHES
    held = proxy.metadata.get(IN_EFFECT_METADATA)
    held_digest = held.get("digest") if isinstance(held, dict) else None
    if (digest(want) if want else None) == held_digest:
        return None
    running = [str(o) for o in held.get("envoyFilters") or ()] if isinstance(held, dict) else []
    return {"proxy": proxy.id, "envoyFilters": list(want.origins), "inEnvoysBootstrap": running,
            "reason": "BOOTSTRAP patches reach Envoy when pilot-agent starts with BOOTSTRAP_XDS_AGENT=true; "
                      "this Envoy's bootstrap has other ones (or none)"}
