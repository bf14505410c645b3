"""RDS generator: per-port outbound route configs for Envoy, per-target ones for gRPC clients."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from pilot.model.gateways import config_origins
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.networking import routes
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import envoy_filter, gateway, grpc
from pilot.xds.generators.grpc import resolve_host_port
from pilot.xds.typeurls import ROUTE


@envoy_filter.patched(ROUTE)
def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    return [r for r in resources(ctx, proxy, requested, cache) if r is not None]


def sliced(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
           cache: XdsCache) -> Iterator[CachedResource | None]:
    """generate() as an iterator, EnvoyFilter patches included: None between two virtual hosts
    of a route configuration being built (GenerationMemo may yield to the event loop there),
    each route configuration once built; with patches for this proxy's routes, the patched list
    at once (patches see every route configuration)."""
    mine = envoy_filter.patches_for(ctx, proxy, ROUTE)
    if not mine:
        yield from resources(ctx, proxy, requested, cache)
        return
    made = [r for r in resources(ctx, proxy, requested, cache) if r is not None]
    yield from envoy_filter.apply(ROUTE, proxy.type == "router", made, mine, requested, cache)


def resources(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
              cache: XdsCache) -> Iterator[CachedResource | None]:
    """The route configurations requested, unpatched; None after each virtual host of an
    outbound route configuration built cold (a thousand of them take 15-30 ms)."""
    if gateway.is_gateway(proxy):
        yield from gateway.route_configs(ctx, proxy, requested, cache)
        return
    for name in sorted(requested or ()):
        if proxy.is_grpc or not name.isdigit():
            found = resolve_host_port(ctx, name, proxy)
            if found is None:
                continue
            svc, port = found
            yield grpc.route_config(ctx, proxy, name, svc, port, cache)
            continue
        port = int(name)
        sidecar = ctx.sidecar_for(proxy.namespace, proxy.labels)
        view = ctx.view(sidecar, proxy.dns_capture, proxy.ip_families)
        settings = ctx.settings.routes
        if view.registry_only is not None and view.registry_only != settings.registry_only:
            settings = replace(settings, registry_only=view.registry_only)  # the Sidecar's policy wins
        http = view.http_by_port.get(port, ())
        vss = tuple(ctx.virtual_service(s.hostname, proxy.namespace) for s in http)
        # Destination ports come from any service, so all of them are inputs when a VS applies.
        everything = ctx.all_services() if any(vss) else ()
        origins = tuple(s.origin for s in http) + tuple(
            o for v in dict.fromkeys(v for v in vss if v) for o in config_origins(v))
        hashes = _hash_policies(ctx, proxy.namespace, proxy.labels)
        # Only the labels some sourceLabels match asks about: proxies that agree on them share output.
        asked = {k for sel in ctx.traffic.source_selectors for k, _ in sel}
        labels = tuple(sorted((k, v) for k, v in proxy.labels.items() if k in asked))
        # The short-name domains depend on the proxy's namespace: it is part of both keys.
        yield (yield from cache.resource_steps(
            ROUTE, name, routes.outbound_route_config, routes.outbound_route_config_steps,
            port, http, proxy.namespace, settings, vss, everything, ctx.domain, hashes, labels,
            origins=origins or ("MeshConfig",)))


def _hash_policies(ctx: PushContext, namespace: str, labels) -> tuple:
    """Every host a DestinationRule names (a wildcard host's rule adds no hash policy yet)."""
    return tuple(sorted(gateway.hash_policies(ctx, namespace, ctx.destination_rules(), labels)))
