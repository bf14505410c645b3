"""ECDS generator: the TypedExtensionConfigs a proxy's HTTP filters name (istiod's
pilot/pkg/xds/ecds.go): EnvoyFilter `applyTo: EXTENSION_CONFIG` ADD patches (the proxy's, by the
added config's name; istiod's InsertedExtensionConfigurations) and the WasmPlugins selecting the
proxy (pilot/networking/wasm.py). Envoy asks by name; a name no source has is left out (in SotW
ECDS that means "not known yet"). An EnvoyFilter's config wins over a WasmPlugin of the same name,
as it comes first in istiod's list.

Each resource is cached under what it is built from (the patch, or the plugin), so proxies given
the same ones share bytes.
"""

from __future__ import annotations

from pilot.model.envoy_filters import PatchRef
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.networking import wasm
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import envoy_filter
from pilot.xds.typeurls import EXTENSION_CONFIG


def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    if not requested or proxy.is_grpc:
        return []  # only ever asked by name; proxyless gRPC has no HTTP filters of ours
    patches = envoy_filter.patches_for(ctx, proxy, EXTENSION_CONFIG)
    router = proxy.type == "router"
    added: dict[str, PatchRef] | None = patches.memo.get(("ecds_adds", router))
    if added is None:  # once per patch set, as envoy_filter's own ADDs
        # istiod ignores `match.context` here; it is honoured as far as an extension config can
        # tell (gateway or sidecar: one resource serves a sidecar's inbound and outbound filters),
        # so a GATEWAY-only config does not reach sidecars.
        contexts = ("ANY", "GATEWAY") if router else ("ANY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND")
        added = {}
        for ref in patches:
            if ref.patch.patch.operation == "ADD" and ref.patch.match.context in contexts:
                added.setdefault(ref.patch.message.name, ref)
        patches.memo[("ecds_adds", router)] = added
    plan = ctx.wasm_plan(proxy)
    out: list[CachedResource] = []
    for name in sorted(requested):
        ref = added.get(name)
        if ref is not None:
            out.append(cache.resource(EXTENSION_CONFIG, name, envoy_filter.added, ref, origins=(ref.origin,)))
            if cache.on_patch is not None:
                cache.on_patch((ref,))
            continue
        plugin = plan.by_name(name)
        if plugin is not None:
            out.append(cache.resource(EXTENSION_CONFIG, name, wasm.extension_config, plugin, origins=(plugin.origin,)))
    return out
