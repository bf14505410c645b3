"""RDS: one RouteConfiguration per outbound HTTP port, one virtual host per service."""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

from envoy.config.route.v3 import route_components_pb2, route_pb2
from google.protobuf import wrappers_pb2

from pilot.config.networking import VirtualService
from pilot.durations import parse_duration
from pilot.model.gateway_api.internal import SEMANTICS
from pilot.model.mesh_settings import RouteSettings
from pilot.model.services import MeshService
from pilot.model.store import Entry
from pilot.networking import names
from pilot.networking.http_routes import RouteInputs, virtual_service_routes
from pilot.networking.metadata import config_path
from pilot.networking.protos import duration
from pilot.networking.retries import retry_policy
from pilot.networking.traffic_policy import effective_policy

_T = TypeVar("_T")


def service_domains(svc: MeshService, port: int, proxy_namespace: str) -> list[str]:
    """Every name a client may use for a service: FQDN, name.namespace(.svc), the short name when
    the client is in the same namespace (it would resolve elsewhere otherwise), and its IPs (the
    cluster IP, a ServiceEntry's every address but CIDRs);
    each with and without the port."""
    if svc.kind == "ServiceEntry":
        hosts = [svc.hostname]  # external names have no Kubernetes short forms
    else:
        hosts = [svc.hostname, f"{svc.name}.{svc.namespace}.svc", f"{svc.name}.{svc.namespace}"]
        if proxy_namespace == svc.namespace:
            hosts.append(svc.name)
    hosts.extend(a for a in svc.addresses if "/" not in a)  # a ServiceEntry's every IP
    out: list[str] = []
    for h in hosts:
        if ":" in h:  # an IPv6 address, bracketed as istiod writes it (IPv6Compliant)
            h = f"[{h}]"
        out.append(h)
        out.append(f"{h}:{port}")
    return out


def service_virtual_host(svc: MeshService, port: int, domains: list[str], settings: RouteSettings,
                         vs_routes: list[route_components_pb2.Route] | None = None
                         ) -> route_components_pb2.VirtualHost:
    """The service's default route, or the routes of the VirtualService that applies to it."""
    if vs_routes:
        return route_components_pb2.VirtualHost(name=f"{svc.hostname}:{port}", domains=domains, routes=vs_routes)
    route = route_components_pb2.Route(
        name="default",
        match=route_components_pb2.RouteMatch(prefix="/"),
        route=route_components_pb2.RouteAction(
            cluster=names.outbound_cluster_name(port, svc.hostname),
            # istiod disables Envoy's 15 s default: long requests are the app's business.
            timeout=duration(0),
        ),
    )
    rp = retry_policy(settings.retry)
    if rp is not None:
        route.route.retry_policy.CopyFrom(rp)
    return route_components_pb2.VirtualHost(name=f"{svc.hostname}:{port}", domains=domains, routes=[route])


def _catch_all(settings: RouteSettings) -> route_components_pb2.VirtualHost:
    if settings.registry_only:
        return route_components_pb2.VirtualHost(name="block_all", domains=["*"], routes=[
            route_components_pb2.Route(name="block_all", match=route_components_pb2.RouteMatch(prefix="/"),
                                       direct_response=route_components_pb2.DirectResponseAction(status=502))])
    return route_components_pb2.VirtualHost(name="allow_any", domains=["*"], routes=[
        route_components_pb2.Route(name="allow_any", match=route_components_pb2.RouteMatch(prefix="/"),
                                   route=route_components_pb2.RouteAction(
                                       cluster=names.PASSTHROUGH_CLUSTER, timeout=duration(0)))])


def outbound_route_config(port: int, services: tuple[MeshService, ...], proxy_namespace: str,
                          settings: RouteSettings, virtual_services: tuple[Entry[VirtualService] | None, ...] = (),
                          all_services: tuple[MeshService, ...] = (), domain: str = "cluster.local",
                          hash_policies: tuple[tuple[str, HashKey], ...] = (),
                          client_labels: tuple[tuple[str, str], ...] = ()) -> route_pb2.RouteConfiguration:
    """`services` are the HTTP services on this port, in a stable order, and `virtual_services`
    the VirtualService applying to each (or None). `hash_policies` are the (cluster, key) pairs
    of destinations whose DestinationRule asks for consistent hashing: their routes carry the hash
    policy. A domain claimed twice (two Services with one cluster IP) goes to the first: Envoy
    rejects duplicate domains. `client_labels` are the labels of the client that `sourceLabels`
    matches test (only those the VirtualServices ask about: the rest must not split the cache)."""
    return drain(outbound_route_config_steps(port, services, proxy_namespace, settings, virtual_services,
                                             all_services, domain, hash_policies, client_labels))


def outbound_route_config_steps(port: int, services: tuple[MeshService, ...], proxy_namespace: str,
                                settings: RouteSettings,
                                virtual_services: tuple[Entry[VirtualService] | None, ...] = (),
                                all_services: tuple[MeshService, ...] = (), domain: str = "cluster.local",
                                hash_policies: tuple[tuple[str, HashKey], ...] = (),
                                client_labels: tuple[tuple[str, str], ...] = (),
                                ) -> Generator[None, None, route_pb2.RouteConfiguration]:
    """outbound_route_config, a virtual host at a time: it yields after each one (a port's route
    configuration of a thousand services takes 15-30 ms to build, so a caller on the event loop
    may pause between them) and returns the same message."""
    by_host = {s.hostname: s for s in all_services} if any(virtual_services) else {}
    rc = route_pb2.RouteConfiguration(name=names.route_config_name(port),
                                      validate_clusters=wrappers_pb2.BoolValue(value=False))
    used: set[str] = set()
    for i, svc in enumerate(services):
        domains = [d for d in service_domains(svc, port, proxy_namespace) if d not in used]
        used.update(domains)
        vs = virtual_services[i] if i < len(virtual_services) else None
        vs_routes = None
        if vs is not None:
            inputs = RouteInputs(vs.key.namespace, domain, port, by_host, settings.retry,
                                 proxy_namespace, dict(client_labels),
                                 gateway_semantics=vs.obj.metadata.annotations.get(SEMANTICS) == "gateway",
                                 sidecar=True, config=config_path(vs.key.kind, vs.key.namespace, vs.key.name))
            vs_routes = virtual_service_routes(vs.obj.spec.http, inputs)
        rc.virtual_hosts.append(service_virtual_host(svc, port, domains, settings, vs_routes))
        yield
    if hash_policies:
        _apply_hash_policies(rc, dict(hash_policies))
    rc.virtual_hosts.append(_catch_all(settings))
    return rc


def drain(steps: Generator[None, None, _T]) -> _T:
    """Run a step-wise builder to its end, at once."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


# (header name, cookie name, cookie ttl seconds, use source IP, query parameter name, cookie path,
#  cookie attributes as (name, value) pairs)
HashKey = tuple[str, str, float, bool, str, str, tuple[tuple[str, str], ...]]


def hash_key(consistent_hash) -> HashKey:
    cookie = consistent_hash.http_cookie
    ttl = parse_duration(cookie.ttl) if cookie is not None and cookie.ttl else 0.0
    return (consistent_hash.http_header_name or "", cookie.name if cookie is not None else "", ttl,
            bool(consistent_hash.use_source_ip), consistent_hash.http_query_parameter_name or "",
            (cookie.path or "") if cookie is not None else "",
            tuple((a.name, a.value) for a in cookie.attributes) if cookie is not None else ())


def _hash_policy(key: HashKey) -> route_components_pb2.RouteAction.HashPolicy:
    header, cookie, ttl, source_ip, query, path, attributes = key
    hp = route_components_pb2.RouteAction.HashPolicy()
    if header:
        hp.header.header_name = header
    elif cookie:
        hp.cookie.name = cookie
        if ttl:
            hp.cookie.ttl.CopyFrom(duration(ttl))
        if path:
            hp.cookie.path = path
        for name, value in attributes:
            hp.cookie.attributes.add(name=name, value=value)
    elif source_ip:
        hp.connection_properties.source_ip = True
    elif query:
        hp.query_parameter.name = query
    return hp


def consistent_hash_keys(spec, host: str, ports: tuple[int, ...]) -> list[tuple[str, HashKey]]:
    """(cluster name, hash key) for every cluster of `host` whose DestinationRule policy, with the
    subset's and the port's settings merged in as for the cluster itself, hashes consistently."""
    out = []
    for subset in ("", *(s.name for s in spec.subsets)):
        for port in ports:
            lb = effective_policy(spec, subset, port)["load_balancer"]
            if lb is not None and lb.consistent_hash is not None:
                out.append((names.outbound_cluster_name(port, host, subset), hash_key(lb.consistent_hash)))
    return out


def _apply_hash_policies(rc: route_pb2.RouteConfiguration, by_cluster: dict[str, HashKey]) -> None:
    """Consistent hashing needs the key on the route: the cluster's RING_HASH alone hashes nothing.
    A route splitting over several clusters takes the first one's key."""
    for vh in rc.virtual_hosts:
        for route in vh.routes:
            if not route.HasField("route"):
                continue
            action = route.route
            cluster = action.cluster or (action.weighted_clusters.clusters[0].name
                                         if action.weighted_clusters.clusters else "")
            key = by_cluster.get(cluster)
            if key is not None:
                action.hash_policy.append(_hash_policy(key))


apply_hash_policies = _apply_hash_policies  # (proxyless gRPC route configs use it too)
