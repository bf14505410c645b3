"""RDS: one RouteConfiguration per outbound HTTP port, one virtual host per service."""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2, route_pb2
from google.protobuf import wrappers_pb2

from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2

from pilot.config.mesh import HttpRetryPolicy
from pilot.durations import parse_duration
from pilot.model.services import MeshService
from pilot.networking import names
from pilot.networking.protos import duration
from pilot.model.mesh_settings import RouteSettings


def service_domains(svc: MeshService, port: int, proxy_namespace: str) -> list[str]:
    """Every name a client may use for a service: FQDN, name.namespace(.svc), the short name when
    the client is in the same namespace (it would resolve elsewhere otherwise), and the cluster IP;
    each with and without the port."""
    hosts = [svc.hostname, f"{svc.name}.{svc.namespace}.svc", f"{svc.name}.{svc.namespace}"]
    if proxy_namespace == svc.namespace:
        hosts.append(svc.name)
    if svc.cluster_ip:
        hosts.append(svc.cluster_ip)
    out: list[str] = []
    for h in hosts:
        out.append(h)
        out.append(f"{h}:{port}")
    return out


def retry_policy(policy: HttpRetryPolicy) -> route_components_pb2.RetryPolicy | None:
    if policy.attempts <= 0:
        return None
    rp = route_components_pb2.RetryPolicy(
        retry_on=policy.retry_on,
        num_retries=wrappers_pb2.UInt32Value(value=policy.attempts),
        host_selection_retry_max_attempts=5,
        retriable_status_codes=[503],
    )
    rp.retry_host_predicate.add(name="envoy.retry_host_predicates.previous_hosts").typed_config.Pack(
        previous_hosts_pb2.PreviousHostsPredicate())
    if policy.per_try_timeout:
        rp.per_try_timeout.CopyFrom(duration(parse_duration(policy.per_try_timeout)))
    return rp


def service_virtual_host(svc: MeshService, port: int, domains: list[str],
                         settings: RouteSettings) -> route_components_pb2.VirtualHost:
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
                          settings: RouteSettings) -> route_pb2.RouteConfiguration:
    """`services` are the HTTP services on this port, in a stable order. A domain claimed twice
    (two Services with one cluster IP) goes to the first: Envoy rejects duplicate domains."""
    rc = route_pb2.RouteConfiguration(name=names.route_config_name(port),
                                      validate_clusters=wrappers_pb2.BoolValue(value=False))
    used: set[str] = set()
    for svc in services:
        domains = [d for d in service_domains(svc, port, proxy_namespace) if d not in used]
        used.update(domains)
        rc.virtual_hosts.append(service_virtual_host(svc, port, domains, settings))
    rc.virtual_hosts.append(_catch_all(settings))
    return rc


def grpc_route_config(route_name: str, svc: MeshService, port: int) -> route_pb2.RouteConfiguration:
    """Proxyless gRPC: the route config is named like the listener (`host:port`, possibly a short
    alias the client used) and holds one virtual host matching every name of the service.
    No retry policy: grpcio applies its own retry semantics from service config."""
    host = route_name.rpartition(":")[0]
    domains = list(dict.fromkeys([host, route_name, *service_domains(svc, port, svc.namespace)]))
    vh = route_components_pb2.VirtualHost(
        name=f"{svc.hostname}:{port}", domains=domains,
        routes=[route_components_pb2.Route(
            name="default", match=route_components_pb2.RouteMatch(prefix="/"),
            route=route_components_pb2.RouteAction(cluster=names.outbound_cluster_name(port, svc.hostname)))])
    return route_pb2.RouteConfiguration(name=route_name, virtual_hosts=[vh])
