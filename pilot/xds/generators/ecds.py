"""ECDS generator: the TypedExtensionConfigs a proxy's HTTP filters name (istiod's
pilot/pkg/xds/ecds.go): EnvoyFilter `applyTo: EXTENSION_CONFIG` ADD patches (the proxy's, by the
added config's name; istiod's InsertedExtensionConfigurations) and the WasmPlugins selecting the
proxy (pilot/networking/wasm.py). Envoy asks by name; a name no source has is left out (in SotW
ECDS that means "not known yet"). An EnvoyFilter's config wins over a WasmPlugin of the same name,
as it comes first in istiod's list.

Each resource is cached under what it is built from (the patch, or the plugin), so proxies given
the same ones share bytes.

A plugin's imagePullSecret (a kubernetes.io/dockerconfigjson Secret of the plugin's namespace)
travels, as from istiod, in the VM environment for the agent, which strips it. As istiod, only to a
proxy that proved its identity on the secure port; stricter than istiod, only to proxies of the
plugin's (hence the Secret's) namespace, so a root-namespace plugin does not hand istio-system's
registry credentials to every proxy. Others get the variable empty: their agent fails the fetch
and applies the failStrategy. The Secret is read through the PushContext, so its change reaches
the proxies given it; its content is never logged.
"""

from __future__ import annotations

import base64
import binascii
from functools import lru_cache

from pilot import logging as plog
from pilot.config.core import DOCKER_CONFIG_KEY, DOCKER_CONFIG_TYPE
from pilot.model.envoy_filters import PatchRef
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.wasm import WasmFilter
from pilot.networking import wasm
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import envoy_filter, sds
from pilot.xds.typeurls import EXTENSION_CONFIG

log = plog.get("wasm")


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
        if plugin is None:
            continue
        if not plugin.pull_secret:
            out.append(cache.resource(EXTENSION_CONFIG, name, wasm.extension_config, plugin, origins=(plugin.origin,)))
            continue
        secret = pull_secret(ctx, proxy, plugin)
        out.append(cache.resource(EXTENSION_CONFIG, name, wasm.extension_config, plugin, secret,
                                  origins=(plugin.origin, f"Secret/{plugin.namespace}/{plugin.pull_secret}")))
    return out


def pull_secret(ctx: PushContext, proxy: Proxy, plugin: WasmFilter) -> str:
    """The docker config JSON of the plugin's pull secret for this proxy; "" when it may not have
    it, or the Secret is missing or not a docker config. Reads only the proxy's traits (namespace,
    proven identity), which the generation memo is keyed by."""
    if proxy.namespace != plugin.namespace or sds.refusal(proxy) is not None:
        return ""
    entry = ctx.wasm_pull_secret(plugin.namespace, plugin.pull_secret)
    if entry is None:
        _unusable(plugin.origin, plugin.namespace, plugin.pull_secret, 0, "not found")
        return ""
    if entry.obj.type != DOCKER_CONFIG_TYPE:
        _unusable(plugin.origin, plugin.namespace, plugin.pull_secret, entry.revision,
                  f"type is {entry.obj.type}, not {DOCKER_CONFIG_TYPE}")
        return ""
    raw = entry.obj.reveal().get(DOCKER_CONFIG_KEY, "")
    try:
        return base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        _unusable(plugin.origin, plugin.namespace, plugin.pull_secret, entry.revision,
                  f"{DOCKER_CONFIG_KEY} is not base64 text")
        return ""


@lru_cache(maxsize=1024)  # names and reasons only: one warning per Secret revision
def _unusable(origin: str, namespace: str, name: str, revision: int, reason: str) -> None:
    log.warning("WasmPlugin imagePullSecret not usable; the proxy's agent cannot pull the image", plugin=origin,
                secret=f"{namespace}/{name}", revision=revision, reason=reason)
