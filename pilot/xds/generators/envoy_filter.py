"""EnvoyFilter patches as the last step of LDS, RDS and CDS generation, on cached bytes.

A generator's resources are shared by every proxy with the same inputs; a patch must not break
that. Per resource, only the patches whose context and top-level match (listener name and port,
route configuration name/port/gateway, cluster name) meet it are kept; a resource no patch meets
is returned as the very object the generator made (shared bytes, shared version). Otherwise the
patched resource is cached under (its unpatched bytes, the patches), so every proxy given the
same patches for the same resource shares the patched bytes, and a change of any EnvoyFilter
revision (a patch input) or of the resource makes a new entry. Patched resources name their
EnvoyFilters among their origins, which is how a NACK is traced back to them (discovery.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from pilot.model.envoy_filters import NO_PATCHES, PatchRef, PatchSet, patch_set
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.networking import envoy_filters as patching
from pilot.networking.inbound import INBOUND_PASSTHROUGH_CLUSTER, VIRTUAL_INBOUND_LISTENER
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import waypoint
from pilot.xds.typeurls import BOOTSTRAP, CLUSTER, EXTENSION_CONFIG, LISTENER, ROUTE

_MESSAGES: dict[str, type[Message]] = {LISTENER: listener_pb2.Listener, ROUTE: route_pb2.RouteConfiguration,
                                       CLUSTER: cluster_pb2.Cluster}
# Listeners take route patches too: an inbound HTTP listener's route configuration is inline.
_KINDS = {LISTENER: patching.LISTENER_KINDS | patching.ROUTE_KINDS, ROUTE: patching.ROUTE_KINDS,
          CLUSTER: patching.CLUSTER_KINDS, EXTENSION_CONFIG: frozenset({"EXTENSION_CONFIG"}),
          BOOTSTRAP: frozenset({"BOOTSTRAP"})}

Generate = Callable[[PushContext, Proxy, frozenset[str] | None, XdsCache], list[CachedResource]]


def patches_for(ctx: PushContext, proxy: Proxy, type_url: str) -> PatchSet:
    """The patches of this type's resources the proxy gets (in order): what its generated output
    depends on from EnvoyFilters, so part of the generation memo's key (pilot/xds/generated.py)."""
    kinds = _KINDS.get(type_url)
    if kinds is None or proxy.is_grpc:
        return NO_PATCHES  # istiod patches Envoy's config, not proxyless gRPC's
    patches = ctx.envoy_patches(proxy)
    if not patches:
        return NO_PATCHES
    if proxy.traits.gateway_name and waypoint.waypoint_of(ctx, proxy) is not None:
        # istiod patches waypoints through targetRefs (Gateway, GatewayClass istio-waypoint) with
        # the sidecar contexts; not done here: /debug/push_status lists EnvoyFilters naming one.
        return NO_PATCHES
    mine = patches.memo.get(type_url)
    if mine is None:  # once per patch set
        mine = patches.memo[type_url] = patch_set(tuple(r for r in patches if r.patch.apply_to in kinds))
    return mine


def patched(type_url: str) -> Callable[[Generate], Generate]:
    def wrap(generate: Generate) -> Generate:
        @wraps(generate)
        def run(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
                cache: XdsCache) -> list[CachedResource]:
            out = generate(ctx, proxy, requested, cache)
            mine = patches_for(ctx, proxy, type_url)
            return apply(type_url, proxy.type == "router", out, mine, requested, cache) if mine else out
        return run
    return wrap


def context_of(type_url: str, router: bool, name: str) -> str:
    if router:
        return "GATEWAY"
    if type_url == LISTENER:
        inbound = name == VIRTUAL_INBOUND_LISTENER or name.startswith("inbound_")
    elif type_url == CLUSTER:
        inbound = name.startswith("inbound|") or name == INBOUND_PASSTHROUGH_CLUSTER
    else:
        inbound = name.startswith("inbound|")
    return "SIDECAR_INBOUND" if inbound else "SIDECAR_OUTBOUND"


def _listener_port(any_bytes: bytes) -> int:
    listener = listener_pb2.Listener()
    listener.ParseFromString(any_pb2.Any.FromString(any_bytes).value)
    return listener.address.socket_address.port_value


def _top_match(type_url: str, ref: PatchRef, res: CachedResource, context: str, port: Callable[[], int]) -> bool:
    if type_url == LISTENER:
        if ref.patch.apply_to in patching.ROUTE_KINDS:  # matched on the inline route config inside
            return context == "SIDECAR_INBOUND"
        return patching.listener_matches(ref, res.name, port())
    if type_url == ROUTE:
        return patching.route_config_matches(ref, res.name, context)
    return patching.cluster_matches(ref, res.name)


_REMOVED = object()
_MAX_MEMO = 50_000  # resource decisions kept per patch set


def _decide(type_url: str, router: bool, res: CachedResource, patches: PatchSet):
    """None: no patch meets the resource; _REMOVED; else (the patches that do, origins)."""
    context = context_of(type_url, router, res.name)
    port_seen: list[int] = []

    def port() -> int:
        if not port_seen:
            port_seen.append(_listener_port(res.any_bytes))
        return port_seen[0]

    rel = tuple(r for r in patches if patching.context_matches(r, context) and _top_match(type_url, r, res, context, port))
    if any(r.patch.patch.operation == "REMOVE" and r.patch.apply_to in ("LISTENER", "CLUSTER") for r in rel):
        return _REMOVED
    rel = tuple(r for r in rel if not (r.patch.patch.operation == "ADD" and r.patch.apply_to in ("LISTENER", "CLUSTER")))
    if not rel:
        return None
    return patch_set(rel), tuple(dict.fromkeys((*res.origins, *(r.origin for r in rel))))


def apply(type_url: str, router: bool, resources: list[CachedResource], patches: PatchSet,
          requested: frozenset[str] | None, cache: XdsCache) -> list[CachedResource]:
    memo = patches.memo
    out: list[CachedResource] = []
    for res in resources:
        # Which patches meet a resource depends on its name and context only, and for a listener
        # on its port too (its content): a new cluster or route version reuses the decision.
        key = (type_url, router, res.name, res.version) if type_url == LISTENER else (type_url, router, res.name)
        found = memo.get(key, memo)
        if found is memo:
            if len(memo) >= _MAX_MEMO:
                memo.clear()
            found = memo[key] = _decide(type_url, router, res, patches)
            if found is not None and cache.on_patch is not None:
                cache.on_patch(found[0].refs if found is not _REMOVED else tuple(
                    r for r in patches if r.patch.patch.operation == "REMOVE" and r.patch.apply_to in ("LISTENER", "CLUSTER")))
        if found is None:
            out.append(res)
        elif found is not _REMOVED:
            rel, origins = found
            out.append(cache.resource(type_url, res.name, _patch, type_url, res.any_bytes, rel, origins=origins))
    if type_url in (LISTENER, CLUSTER):
        out.extend(_adds(type_url, router, patches, requested, cache))
    return out


def _adds(type_url: str, router: bool, patches: PatchSet, requested: frozenset[str] | None,
          cache: XdsCache) -> list[CachedResource]:
    key = ("adds", type_url, router)
    refs = patches.memo.get(key)
    if refs is None:
        kind = "LISTENER" if type_url == LISTENER else "CLUSTER"
        contexts = ("GATEWAY",) if router else ("SIDECAR_OUTBOUND", "SIDECAR_INBOUND")
        refs = patches.memo[key] = tuple(
            r for r in patches if r.patch.apply_to == kind and r.patch.patch.operation == "ADD"
            and any(patching.add_context_matches(r, c) for c in contexts))
        if refs and cache.on_patch is not None:
            cache.on_patch(refs)
    out = []
    for ref in refs:
        name = ref.patch.message.name
        if requested is None or name in requested:
            out.append(cache.resource(type_url, name, added, ref, origins=(ref.origin,)))
    return out


def _patch(type_url: str, any_bytes: bytes, refs: PatchSet) -> Message:
    msg = _MESSAGES[type_url]()
    msg.ParseFromString(any_pb2.Any.FromString(any_bytes).value)
    if type_url == LISTENER:
        return patching.patch_listener(msg, refs)
    if type_url == ROUTE:
        return patching.patch_route_config(msg, refs)
    return patching.patch_cluster(msg, refs)


def added(ref: PatchRef) -> Message:
    """The resource an ADD patch brings (LISTENER, CLUSTER, EXTENSION_CONFIG), as a copy: the
    patch's own message stays as parsed."""
    value = ref.patch.message
    assert value is not None
    out = type(value)()
    out.CopyFrom(value)
    return out
