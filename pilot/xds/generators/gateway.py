"""LDS and RDS for router proxies (ingress/egress gateways): the Gateways that select them.

lds.generate and rds.generate hand router proxies here. The Gateways selecting a router
(its LABELS) and their merged servers come from PushContext.gateways, built once per push per
selected set; the VirtualServices bound to each server are filtered by the router's namespace
(exportTo). Cache keys are the builders' arguments: the listener plan (every chain, SNI name,
TLS setting and destination), or for routes the Gateway and VirtualService Entries (hashed by
key and revision), the destination services they name, the retry default and the hash policies.
CDS adds a router's sni-dnat clusters (`sni_dnat_targets`) and otherwise ignores Sidecar scoping
for routers, as istiod does; EDS offers those clusters only endpoints that take mTLS.
"""

from __future__ import annotations

from dataclasses import replace

from pilot import logging as plog
from pilot.model.gateway_api.internal import has_session
from pilot.model.gateways import GatewayView, config_origins, host_matches
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.services import MeshService, ServicePort
from pilot.networking import gateway, names, routes
from pilot.networking.tls import outbound_sni
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.typeurls import LISTENER, ROUTE

log = plog.get("gateway")

_HTTP = {"http", "http2", "grpc", "grpc-web", "http_proxy"}


def is_gateway(proxy: Proxy) -> bool:
    return proxy.type == "router" and not proxy.is_grpc


def _view(ctx: PushContext, proxy: Proxy) -> GatewayView:
    index = ctx.gateway_index()
    return index.view(index.select_for(proxy.labels, proxy.namespace), ctx.gateway_port_map(proxy))


def cluster_hosts(ctx: PushContext, proxy: Proxy) -> set[str] | None:
    """PILOT_FILTER_GATEWAY_CLUSTER_CONFIG: the hosts the router's servers route to (through the
    VirtualServices bound to them), None for every host: the knob is off, or an AUTO_PASSTHROUGH
    server routes mesh traffic to any service by SNI."""
    if not ctx.settings.knobs.filter_gateway_clusters:
        return None
    index = ctx.gateway_index()
    view = _view(ctx, proxy)
    refs = [ref for pv in view.ports for ref in pv.servers]
    if any(ref.auto_passthrough for ref in refs):
        return None
    vss = tuple(dict.fromkeys(b.virtual_service for ref in refs for b in index.bindings(ref, proxy.namespace)))
    return gateway.referenced_hosts(vss, ctx.domain)


def listeners(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
              cache: XdsCache) -> list[CachedResource]:
    index = ctx.gateway_index()
    view = _view(ctx, proxy)
    for reason in view.skipped:
        log.warning("gateway server skipped", proxy=proxy.id, reason=reason)
    out: list[CachedResource] = []

    def bindings(ref):
        return index.bindings(ref, proxy.namespace)

    # AuthorizationPolicies (selector or targetRefs to its Gateway) and RequestAuthentications
    # selecting the router apply to its listeners, as istiod's gateway listener builder does.
    policies = ctx.workload_policies(proxy.namespace, proxy.labels)
    hops = num_trusted_proxies(ctx, proxy)

    for pv in view.ports:
        if requested is not None and pv.listener_name not in requested:
            continue
        vss = tuple(dict.fromkeys(b.virtual_service for ref in pv.servers for b in bindings(ref)))
        hosts = gateway.referenced_hosts(vss, ctx.domain)
        services = {h: svc for h in sorted(hosts) if (svc := ctx.service(h)) is not None}
        plan, skipped = gateway.listener_plan(pv, bindings, services, ctx.domain, proxy.traits.mesh_tls,
                                              lambda ref: _sni_clusters(ctx, proxy, ref))
        for reason in skipped:
            log.warning("gateway server skipped", proxy=proxy.id, reason=reason)
        if plan is None:
            continue
        telemetry = ctx.telemetry_plan(proxy)  # a gateway's listeners are CLIENT mode, as istiod's
        settings = ctx.settings.listeners
        if telemetry.client is not settings.telemetry:
            settings = replace(settings, telemetry=telemetry.client)
        plugins = ctx.wasm_plan(proxy)  # CLIENT mode too
        if plugins.client:
            settings = replace(settings, wasm=plugins.client)
        if ctx.settings.knobs.dual_stack and proxy.dual_stack:
            settings = replace(settings, dual_stack=True)  # ISTIO_DUAL_STACK: [::] beside 0.0.0.0
        if any(has_session(vs) for vs in vss):  # the routes of this port set sessions
            settings = replace(settings, session_filter=True)
        out.append(cache.resource(LISTENER, plan.name, gateway.gateway_listener, plan, settings,
                                  policies, ctx.mesh.trust_domains, hops,
                                  origins=plan.origins + telemetry.origins + plugins.origins + policies.origins))
    return out


def num_trusted_proxies(ctx: PushContext, proxy: Proxy) -> int:
    """ProxyConfig gatewayTopology.numTrustedProxies, as istiod reads it: the proxy's own
    ProxyConfig (PROXY_CONFIG node metadata, which pilot-agent fills with the mesh's
    defaultConfig and the pod's overrides), else the mesh's defaultConfig; 0 when unset."""
    config = proxy.metadata.get("PROXY_CONFIG")
    if not isinstance(config, dict):  # the lenient model keeps the field as written, in model_extra
        config = ctx.mesh.default_config.model_extra or {}
    topology = config.get("gatewayTopology")
    value = topology.get("numTrustedProxies", 0) if isinstance(topology, dict) else 0
    try:
        hops = int(value)
    except (TypeError, ValueError):
        log.warning("gatewayTopology.numTrustedProxies is not a number; using 0", proxy=proxy.id, value=repr(value))
        return 0
    return max(0, min(hops, 2**32 - 1))


def _sni_clusters(ctx: PushContext, proxy: Proxy, ref) -> tuple[tuple[str, str], ...]:
    """AUTO_PASSTHROUGH: every (cluster, SNI) of the services the server's hosts match, subsets
    included, as sidecars name them when they call those clusters with mTLS. The cluster is the
    router's sni-dnat one, named as the SNI (istiod's): it forwards the TLS untouched."""
    return tuple((names.sni_dnat_cluster_name(port.port, svc.hostname, subset),
                  outbound_sni(port.port, subset, svc.hostname)) for svc, port, subset in _sni_targets(ctx, proxy, ref))


def _sni_targets(ctx: PushContext, proxy: Proxy, ref) -> list[tuple[MeshService, ServicePort, str]]:
    out = []
    for svc in ctx.all_services():
        if not any(h.namespace in ("*", svc.namespace) and host_matches(h.host, svc.hostname) for h in ref.hosts):
            continue
        dr = ctx.destination_rule(svc.hostname, proxy.namespace, svc.namespace, proxy.labels)
        subsets = [s.name for s in dr.obj.spec.subsets] if dr else []
        for port in svc.ports:
            if port.protocol.value == "UDP":
                continue
            for subset in ("", *subsets):
                out.append((svc, port, subset))
    return out


def sni_dnat_targets(ctx: PushContext, proxy: Proxy) -> list[tuple[MeshService, ServicePort, str]]:
    """The (service, port, subset) of every sni-dnat cluster the router's AUTO_PASSTHROUGH
    servers forward to (CDS builds them; istiod's buildOutboundSniDnatClusters)."""
    if not is_gateway(proxy):
        return []
    seen: dict[tuple[str, int, str], tuple[MeshService, ServicePort, str]] = {}
    for pv in _view(ctx, proxy).ports:
        for ref in pv.servers:
            if pv.kind == "tls" and ref.auto_passthrough:
                for svc, port, subset in _sni_targets(ctx, proxy, ref):
                    seen.setdefault((svc.hostname, port.port, subset), (svc, port, subset))
    return [seen[k] for k in sorted(seen)]


def route_configs(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
                  cache: XdsCache) -> list[CachedResource]:
    index = ctx.gateway_index()
    view = _view(ctx, proxy)
    out: list[CachedResource] = []
    for name in sorted(requested or ()):
        rv = view.routes.get(name)
        if rv is None:
            continue
        sources = []
        for ref in rv.servers:
            tls = ref.server.tls
            redirect = ref.protocol in _HTTP and tls is not None and bool(tls.https_redirect)
            for b in index.bindings(ref, proxy.namespace):
                sources.append(gateway.VhostSource(ref.gateway_name, b.virtual_service, b.hosts, redirect))
        vss = tuple(dict.fromkeys(s.virtual_service for s in sources))
        hosts = gateway.referenced_hosts(vss, ctx.domain)
        services = tuple(svc for h in sorted(hosts) if (svc := ctx.service(h)) is not None)
        hashes = hash_policies(ctx, proxy.namespace, hosts, proxy.labels)
        origins = tuple(dict.fromkeys([ref.origin for ref in rv.servers] + [o for v in vss for o in config_origins(v)]))
        # sourceLabels/sourceNamespace matches test the router itself, as in istiod: only the
        # labels they ask about are inputs, so routers that agree on them share bytes.
        asked = {k for v in vss for rule in v.obj.spec.http
                 for m in rule.match for k in m.source_labels}
        labels = tuple(sorted((k, v) for k, v in proxy.labels.items() if k in asked))
        out.append(cache.resource(ROUTE, name, gateway.gateway_route_config, name, rv.port, tuple(sources),
                                  ctx.settings.routes.retry, services, ctx.domain, hashes, proxy.namespace,
                                  labels, origins=origins))
    return out


def hash_policies(ctx: PushContext, namespace: str, hosts, labels) -> tuple:
    """(cluster, hash key) for the destinations among `hosts` whose DestinationRule, as this
    client sees it, asks for consistent hashing (the key must be on the route for RING_HASH/MAGLEV
    to work; the subset's and the port's policy merged in, as for the cluster)."""
    out = []
    for host in sorted(hosts):
        svc = ctx.service(host)
        if svc is None:
            continue
        dr = ctx.destination_rule(host, namespace, svc.namespace, labels)
        if dr is not None:
            out.extend(routes.consistent_hash_keys(dr.obj.spec, host, tuple(p.port for p in svc.ports)))
    return tuple(out)
