"""A waypoint's own listeners, clusters and endpoints (pilot/networking/waypoint.py has the shapes).

A router proxy is a waypoint when its `gateway.networking.k8s.io/gateway-name` label names a
Gateway of class istio-waypoint in its namespace. It serves the services whose WDS entry points at
it; which ones, and the policies attached to it or to them, come from the ambient index.
"""

from __future__ import annotations

from pilot.model.ambient.index import ambient_index
from pilot.model.ambient.waypoints import WAYPOINT_CLASS, Waypoint, waypoint_policies
from pilot.model.proxy import GATEWAY_NAME_LABEL, Proxy
from pilot.model.push_context import PushContext
from pilot.model.services import endpoints_for_port
from pilot.networking import waypoint as wp
from pilot.networking.endpoints import cluster_load_assignment
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.typeurls import CLUSTER, ENDPOINT, LISTENER


def waypoint_of(ctx: PushContext, proxy: Proxy) -> Waypoint | None:
    if proxy.type != "router":
        return None
    name = proxy.labels.get(GATEWAY_NAME_LABEL)
    if not name:
        return None
    # Cheap test first: other Gateway API gateways never build the ambient index.
    if not any(e.key.namespace == proxy.namespace and e.key.name == name
               and e.obj.spec.gateway_class_name == WAYPOINT_CLASS for e in ctx.waypoint_gateways()):
        return None
    waypoints = ambient_index(ctx).waypoints
    return waypoints.by_name.get((proxy.namespace, name)) if waypoints is not None else None


def _service_chains(ctx: PushContext, waypoint: Waypoint) -> tuple[tuple, tuple[str, ...]]:
    index = ambient_index(ctx)
    chains = []
    origins = [f"KubernetesGateway/{waypoint.namespace}/{waypoint.name}"]
    for key in index.waypoint_services.get((waypoint.namespace, waypoint.name), ()):
        info = index.services[key]
        svc = ctx.service(info.hostname)
        if svc is None or not info.addresses:
            continue  # a ServiceEntry shadowed by a Service, or headless: nothing to match on
        ports = tuple((p.port, "http" if p.protocol.is_http else "tcp") for p in svc.ports)
        policies = waypoint_policies(ctx.authorization_policies(), waypoint, svc.namespace, svc.name,
                                     svc.kind)
        vs = ctx.virtual_service(info.hostname)
        chains.append((info.hostname, tuple(ip for _, ip in info.addresses), ports, policies, vs))
        origins += [*index.origins.get(key, ()), *policies.origins]
        if vs is not None:
            origins.append(f"VirtualService/{vs.key.namespace}/{vs.key.name}")
    return tuple(chains), tuple(dict.fromkeys(origins))


def listeners(ctx: PushContext, proxy: Proxy, waypoint: Waypoint, requested: frozenset[str] | None,
              cache: XdsCache) -> list[CachedResource]:
    chains, origins = _service_chains(ctx, waypoint)
    # Destination ports of VirtualService routes may be any service's: all are inputs then.
    routing = wp.RoutingInputs(ctx.all_services() if any(c[4] for c in chains) else (), ctx.domain,
                               ctx.settings.routes.retry)
    out = [cache.resource(LISTENER, wp.CONNECT_TERMINATE, wp.connect_terminate_listener, waypoint.address.port,
                          origins=origins[:1]),
           cache.resource(LISTENER, wp.MAIN_INTERNAL, wp.main_internal_listener, chains,
                          ctx.mesh.trust_domains, routing, origins=origins)]
    return [r for r in out if requested is None or r.name in requested]


def clusters(ctx: PushContext, proxy: Proxy, waypoint: Waypoint, cache: XdsCache) -> list[CachedResource]:
    chains, _ = _service_chains(ctx, waypoint)
    out = [cache.resource(CLUSTER, wp.MAIN_INTERNAL, wp.main_internal_cluster)]
    for hostname, _, ports, _, _ in chains:
        svc = ctx.service(hostname)
        assert svc is not None  # the chains are of this push's services
        # istiod: the DestinationRule the waypoint itself would use for the host (its namespace
        # and labels), applied to the VIP clusters. It is part of the cache key and, read here,
        # a recorded dependency of this proxy's clusters.
        dr = ctx.destination_rule(hostname, proxy.namespace, svc.namespace, proxy.labels)
        origins = (svc.origin,) + ((f"{dr.key.kind}/{dr.key.namespace}/{dr.key.name}",) if dr else ())
        for port_number, protocol in ports:
            port = svc.port(port_number)
            assert port is not None
            name = wp.inbound_vip_cluster_name(port_number, protocol, hostname)
            out.append(cache.resource(CLUSTER, name, wp.inbound_vip_cluster, name, svc, port, protocol,
                                      ctx.settings.clusters, dr, origins=origins))
    return out


def load_assignment(ctx: PushContext, name: str, cache: XdsCache) -> CachedResource | None:
    """EDS for an inbound-vip cluster: the service port's ready endpoints (Kubernetes Services)."""
    parsed = wp.parse_inbound_vip(name)
    if parsed is None:
        return None
    port_number, _, hostname = parsed
    svc = ctx.service(hostname)
    port = svc.port(port_number) if svc is not None and svc.kind == "Service" else None
    if port is None or svc is None:
        return None
    slices = ctx.service_slices(svc)
    return cache.resource(ENDPOINT, name, _cla, name, port, slices,
                          origins=(svc.origin, *(f"EndpointSlice/{e.key.namespace}/{e.key.name}" for e in slices)))


def _cla(name: str, port, slices: tuple):
    return cluster_load_assignment(name, endpoints_for_port(slices, port))
