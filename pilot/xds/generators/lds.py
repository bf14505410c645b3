"""LDS generator: bound per-port listeners (NONE), istiod's virtualOutbound shape; gRPC clients' and servers' listeners come from generators.grpc."""

from __future__ import annotations

from dataclasses import replace

from pilot.durations import parse_duration
from pilot.model.ports import PortPlan
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.networking import inbound, listeners, names, tcp_routes
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import envoy_filter, gateway, grpc, waypoint
from pilot.xds.typeurls import LISTENER


def _origins(plan: PortPlan, by_port) -> tuple[str, ...]:
    svcs = by_port.get(plan.port, ()) if plan.http else plan.tcp_services
    return tuple(s.origin for s in svcs)


def _tcp_virtual_services(ctx: PushContext, plan: PortPlan, namespace: str) -> tuple:
    """The VirtualService of each TCP service on the port (as a client in `namespace` sees it), if
    it has tcp or tls rules."""
    out = []
    for svc in plan.tcp_services:
        vs = ctx.virtual_service(svc.hostname, namespace)
        out.append(vs if vs is not None and (vs.obj.spec.tcp or vs.obj.spec.tls) else None)
    return tuple(out) if any(out) else ()


def _tcp_limits(ctx: PushContext, plan: PortPlan, proxy: Proxy) -> tuple[tuple, tuple[str, ...]]:
    """Per TCP service, istiod's tcp_proxy limits from its DestinationRule's top-level
    connectionPool.tcp (idleTimeout, maxConnectionDuration), and the rules read."""
    out: list[tuple[float | None, float | None]] = []
    origins: list[str] = []
    for svc in plan.tcp_services:
        dr = ctx.destination_rule(svc.hostname, proxy.namespace, svc.namespace, proxy.labels)
        policy = dr.obj.spec.traffic_policy if dr is not None else None
        pool = policy.connection_pool if policy is not None else None
        tcp = pool.tcp if pool is not None else None
        if tcp is None or dr is None:
            out.append((None, None))
            continue
        origins.append(f"DestinationRule/{dr.key.namespace}/{dr.key.name}")
        out.append((parse_duration(tcp.idle_timeout) if tcp.idle_timeout is not None else None,
                    parse_duration(tcp.max_connection_duration) if tcp.max_connection_duration else None))
    return (tuple(out) if any(v != (None, None) for v in out) else ()), tuple(origins)


def _client(proxy: Proxy, vss: tuple) -> tcp_routes.Client:
    """What of the proxy the tcp/tls matches of these VirtualServices test (nothing, usually:
    then proxies of every namespace share the listener)."""
    namespace, keys = tcp_routes.source_conditions(vss)
    return (proxy.namespace if namespace else "",
            tuple(sorted((k, v) for k, v in proxy.labels.items() if k in keys)))


def _vs_origins(vss: tuple) -> tuple[str, ...]:
    return tuple(f"VirtualService/{v.key.namespace}/{v.key.name}" for v in dict.fromkeys(v for v in vss if v))


def _sidecar_origin(sidecar) -> tuple[str, ...]:
    return (f"Sidecar/{sidecar.key.namespace}/{sidecar.key.name}",) if sidecar is not None else ()


@envoy_filter.patched(LISTENER)
def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    wp = waypoint.waypoint_of(ctx, proxy)
    if wp is not None:
        return waypoint.listeners(ctx, proxy, wp, requested, cache)
    if gateway.is_gateway(proxy):
        return gateway.listeners(ctx, proxy, requested, cache)
    if proxy.is_grpc:
        return grpc.listeners(ctx, proxy, requested, cache)
    sidecar = ctx.sidecar_for(proxy.namespace, proxy.labels)
    view = ctx.view(sidecar, proxy.dns_capture, proxy.ip_families)
    plans = view.port_plans
    settings = ctx.settings.listeners
    if view.registry_only is not None and view.registry_only != settings.registry_only:
        settings = replace(settings, registry_only=view.registry_only)  # the Sidecar's policy wins
    plan_t = ctx.telemetry_plan(proxy)
    server_settings = settings
    if plan_t.client is not settings.telemetry:
        settings = replace(settings, telemetry=plan_t.client)  # outbound listeners: CLIENT mode
    if plan_t.server is not server_settings.telemetry:
        server_settings = replace(server_settings, telemetry=plan_t.server)  # inbound: SERVER mode
    plan_w = ctx.wasm_plan(proxy)
    if plan_w.client:
        settings = replace(settings, wasm=plan_w.client)
    if ctx.mesh_sessions():  # outbound only: istiod never puts it on sidecar inbound listeners
        settings = replace(settings, session_filter=True)
    if plan_w.server:
        server_settings = replace(server_settings, wasm=plan_w.server)
    if ctx.settings.knobs.dual_stack and proxy.dual_stack:
        # ISTIO_DUAL_STACK: wildcard listeners take IPv6 too (in their cache keys via the settings).
        settings = replace(settings, dual_stack=True)
        server_settings = replace(server_settings, dual_stack=True)
    mode = proxy.interception_mode
    if mode != "NONE" and proxy.ip_families == (False, True):
        # An IPv6-only proxy's wildcard listeners bind :: (NONE-mode listeners bind addresses of their own).
        settings = replace(settings, ipv6_only=True)
        server_settings = replace(server_settings, ipv6_only=True)
    telemetry_origins = plan_t.origins + plan_w.origins
    out: list[CachedResource] = []
    if mode != "NONE":
        out.append(cache.resource(LISTENER, names.VIRTUAL_OUTBOUND_LISTENER,
                                  listeners.virtual_outbound_listener, settings,
                                  origins=("MeshConfig", *telemetry_origins)))
    for plan in plans:
        bind = view.binds.get(plan.port) or (listeners.LOCALHOST if mode == "NONE" else None)
        vss = _tcp_virtual_services(ctx, plan, proxy.namespace)
        limits, dr_origins = _tcp_limits(ctx, plan, proxy) if plan.tcp_services else ((), ())
        client = _client(proxy, vss)
        if bind is not None:
            out.append(cache.resource(LISTENER, names.listener_name(bind, plan.port), listeners.bound_outbound_listener,
                                      plan, settings, vss, ctx.domain, bind, limits, client,
                                      origins=_origins(plan, view.by_port) + _sidecar_origin(sidecar)
                                      + _vs_origins(vss) + dr_origins + telemetry_origins))
        elif plan.port != names.VIRTUAL_OUTBOUND_PORT:
            # (0.0.0.0:15001 is virtualOutbound's own address: Envoy rejects the whole LDS update
            # for a second listener there. Traffic to such a port takes the fallback.)
            out.append(cache.resource(LISTENER, names.listener_name(listeners.wildcard(settings), plan.port),
                                      listeners.unbound_outbound_listener, plan, settings, vss, ctx.domain,
                                      limits, client,
                                      origins=_origins(plan, view.by_port) + _sidecar_origin(sidecar)
                                      + _vs_origins(vss) + dr_origins + telemetry_origins))
    out.extend(_inbound(ctx, proxy, server_settings, {r.name for r in out}, cache))
    if requested is not None:
        out = [r for r in out if r.name in requested]
    return out


def _inbound(ctx: PushContext, proxy: Proxy, settings, outbound_names: set[str],
             cache: XdsCache) -> list[CachedResource]:
    plan = ctx.inbound_plan(proxy)
    out: list[CachedResource] = []
    redirected = []
    for port in plan.ports:
        if not port.bind:
            redirected.append(port)
            continue
        if names.listener_name(port.bind, port.port) in outbound_names or port.endpoint == f"{port.bind}:{port.port}":
            continue  # the address of an outbound listener, or of the app itself: Envoy would reject it
        out.append(cache.resource(LISTENER, inbound.inbound_listener_name(port.bind, port.port),
                                  inbound.bound_inbound_listener, port, plan.mesh_tls, settings,
                                  plan.policies, ctx.mesh.trust_domains,
                                  origins=(port.origin, *plan.policies.origins, *_telemetry_origins(ctx, proxy))))
    if proxy.interception_mode != "NONE" and (redirected or plan.mesh_tls):
        ports = tuple(redirected)
        out.append(cache.resource(LISTENER, inbound.VIRTUAL_INBOUND_LISTENER, inbound.virtual_inbound_listener,
                                  ports, plan.mesh_tls, settings, plan.policies, ctx.mesh.trust_domains,
                                  origins=(*dict.fromkeys(p.origin for p in ports), *plan.policies.origins,
                                           *_telemetry_origins(ctx, proxy))))
    return out


def _telemetry_origins(ctx: PushContext, proxy: Proxy) -> tuple[str, ...]:
    return ctx.telemetry_plan(proxy).origins + ctx.wasm_plan(proxy).origins
