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
from functools import lru_cache, wraps

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from pilot.model.envoy_filters import PatchRef
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.networking import envoy_filters as patching
from pilot.networking.inbound import INBOUND_PASSTHROUGH_CLUSTER, VIRTUAL_INBOUND_LISTENER
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.typeurls import CLUSTER, LISTENER, ROUTE

_MESSAGES: dict[str, type[Message]] = {LISTENER: listener_pb2.Listener, ROUTE: route_pb2.RouteConfiguration,
                                       CLUSTER: cluster_pb2.Cluster}
# Listeners take route patches too: an inbound HTTP listener's route configuration is inline.
_KINDS = {LISTENER: patching.LISTENER_KINDS | patching.ROUTE_KINDS, ROUTE: patching.ROUTE_KINDS,
          CLUSTER: patching.CLUSTER_KINDS}

Generate = Callable[[PushContext, Proxy, frozenset[str] | None, XdsCache], list[CachedResource]]


def patched(type_url: str) -> Callable[[Generate], Generate]:
    def wrap(generate: Generate) -> Generate:
        @wraps(generate)
        def run(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
                cache: XdsCache) -> list[CachedResource]:
            out = generate(ctx, proxy, requested, cache)
            if proxy.is_grpc:
                return out  # istiod patches Envoy's config, not proxyless gRPC's
            refs = ctx.envoy_patches(proxy)
            if not refs:
                return out
            kinds = _KINDS[type_url]
            refs = tuple(r for r in refs if r.patch.apply_to in kinds)
            return apply(type_url, proxy, out, refs, requested, cache) if refs else out
        return run
    return wrap


def context_of(type_url: str, proxy: Proxy, name: str) -> str:
    if proxy.type == "router":
        return "GATEWAY"
    if type_url == LISTENER:
        inbound = name == VIRTUAL_INBOUND_LISTENER or name.startswith("inbound_")
    elif type_url == CLUSTER:
        inbound = name.startswith("inbound|") or name == INBOUND_PASSTHROUGH_CLUSTER
    else:
        inbound = name.startswith("inbound|")
    return "SIDECAR_INBOUND" if inbound else "SIDECAR_OUTBOUND"


@lru_cache(maxsize=8192)
def _listener_port(any_bytes: bytes) -> int:
    """A listener's port, read once per content (bytes hash once; CPython keeps it)."""
    listener = listener_pb2.Listener()
    listener.ParseFromString(any_pb2.Any.FromString(any_bytes).value)
    return listener.address.socket_address.port_value


def _top_match(type_url: str, ref: PatchRef, res: CachedResource, context: str) -> bool:
    if type_url == LISTENER:
        if ref.patch.apply_to in patching.ROUTE_KINDS:  # matched on the inline route config inside
            return context == "SIDECAR_INBOUND"
        return patching.listener_matches(ref, res.name, _listener_port(res.any_bytes))
    if type_url == ROUTE:
        return patching.route_config_matches(ref, res.name, context)
    return patching.cluster_matches(ref, res.name)


def _removes(type_url: str, ref: PatchRef) -> bool:
    return ref.patch.patch.operation == "REMOVE" and ref.patch.apply_to in ("LISTENER", "CLUSTER")


def apply(type_url: str, proxy: Proxy, resources: list[CachedResource], refs: tuple[PatchRef, ...],
          requested: frozenset[str] | None, cache: XdsCache) -> list[CachedResource]:
    out: list[CachedResource] = []
    for res in resources:
        context = context_of(type_url, proxy, res.name)
        rel = tuple(r for r in refs if patching.context_matches(r, context) and _top_match(type_url, r, res, context))
        if not rel:
            out.append(res)
            continue
        if any(_removes(type_url, r) for r in rel):
            continue
        rel = tuple(r for r in rel if not (r.patch.patch.operation == "ADD" and r.patch.apply_to in ("LISTENER", "CLUSTER")))
        if not rel:
            out.append(res)
            continue
        origins = tuple(dict.fromkeys((*res.origins, *(r.origin for r in rel))))
        out.append(cache.resource(type_url, res.name, _patch, type_url, res.any_bytes, rel, origins=origins))
    if type_url in (LISTENER, CLUSTER):
        kind = "LISTENER" if type_url == LISTENER else "CLUSTER"
        contexts = ("GATEWAY",) if proxy.type == "router" else ("SIDECAR_OUTBOUND", "SIDECAR_INBOUND")
        for ref in refs:
            if ref.patch.apply_to != kind or ref.patch.patch.operation != "ADD":
                continue
            if not any(patching.add_context_matches(ref, c) for c in contexts):
                continue
            name = ref.patch.message.name  # type: ignore[union-attr]
            if requested is None or name in requested:
                out.append(cache.resource(type_url, name, _added, ref, origins=(ref.origin,)))
    return out


def _patch(type_url: str, any_bytes: bytes, refs: tuple[PatchRef, ...]) -> Message:
    msg = _MESSAGES[type_url]()
    msg.ParseFromString(any_pb2.Any.FromString(any_bytes).value)
    if type_url == LISTENER:
        return patching.patch_listener(msg, refs)  # type: ignore[arg-type]
    if type_url == ROUTE:
        return patching.patch_route_config(msg, refs)  # type: ignore[arg-type]
    return patching.patch_cluster(msg, refs)  # type: ignore[arg-type]


def _added(ref: PatchRef) -> Message:
    value = ref.patch.message
    assert value is not None
    out = type(value)()
    out.CopyFrom(value)
    return out
