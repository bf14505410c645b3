"""Proxyless gRPC clients: API listeners and per-target route configs (istiod's grpcgen).

grpcio's xDS client names every resource: LDS/RDS `host:port` (the target, possibly a short
alias), then the clusters those routes name. istiod's grpcgen builds the route config with the
same virtual-host code as a sidecar's (VirtualService matches, weighted destinations, subsets,
fault injection, retries) and relies on grpc to skip what it does not implement. This module
does the same, then adapts each route to what grpcio reads (gRFC A28 routing, A31 timeouts,
A33 fault injection, A44 retries):

- grpc ignores a route's `timeout`: a VirtualService timeout is also written as
  `max_stream_duration`, which grpc applies as the call deadline (istiod's setTimeout does the
  same for proxyless clients);
- `typed_per_filter_config` may only name filters grpc implements (fault, RBAC): anything
  else (CORS) makes grpc NACK the whole route config, so it is not sent; CORS is a browser
  concern with no meaning to a gRPC client;

Everything else stays as istiod sends it. grpc reads of a retry policy only `retry_on`'s gRPC
status conditions (cancelled, deadline-exceeded, internal, resource-exhausted, unavailable),
`num_retries` and `retry_back_off`, and ignores the HTTP conditions and host predicates; it
ignores header rewrites and mirrors, skips routes with query-parameter matches, and fails RPCs
matching a redirect or direct response (as istiod's clients see).
"""

from __future__ import annotations

from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from pilot.config.networking import VirtualService
from pilot.model.mesh_settings import RouteSettings
from pilot.model.services import MeshService
from pilot.model.store import Entry
from pilot.networking.filters import fault_filter, router_filter
from pilot.networking.http_routes import FAULT_FILTER, RouteInputs, virtual_service_routes
from pilot.networking.metadata import config_path
from pilot.networking.protos import ads_config_source, pack
from pilot.networking.routes import service_domains, service_virtual_host

# Per-route filter configs grpc accepts; any other makes it NACK the RouteConfiguration.
_GRPC_ROUTE_FILTERS = frozenset({FAULT_FILTER, "envoy.filters.http.rbac"})


def api_listener(name: str, hostname: str, port: int) -> listener_pb2.Listener:
    """An API listener answering under the name the client asked for (possibly a short alias),
    whose HCM fetches the same-named route config. The fault filter is inert until a route
    configures it (istiod's grpcgen sends fault + router)."""
    hcm = hcm_pb2.HttpConnectionManager(
        rds=hcm_pb2.Rds(config_source=ads_config_source(), route_config_name=name),
        http_filters=[fault_filter(), router_filter()],
    )
    del hostname, port  # part of the cache key: the resolved service, not only the name asked for
    return listener_pb2.Listener(name=name, api_listener=api_listener_pb2.ApiListener(api_listener=pack(hcm)))


def route_config(route_name: str, svc: MeshService, port: int, settings: RouteSettings,
                 vs: Entry[VirtualService] | None, all_services: tuple[MeshService, ...], domain: str,
                 client_namespace: str, client_labels: tuple[tuple[str, str], ...]) -> route_pb2.RouteConfiguration:
    """One virtual host matching every name of the service: the VirtualService's routes that
    apply to this port and client, else the default route (with the mesh's default retries,
    as istiod's)."""
    host = route_name.rpartition(":")[0]
    domains = list(dict.fromkeys([host, route_name, *service_domains(svc, port, svc.namespace)]))
    vs_routes = None
    if vs is not None:
        inputs = RouteInputs(vs.key.namespace, domain, port, {s.hostname: s for s in all_services}, settings.retry,
                             client_namespace, dict(client_labels), sidecar=True,
                             config=config_path(vs.key.kind, vs.key.namespace, vs.key.name))
        vs_routes = virtual_service_routes(vs.obj.spec.http, inputs)
    vh = service_virtual_host(svc, port, domains, settings, vs_routes)
    for route in vh.routes:
        _adapt(route)
    return route_pb2.RouteConfiguration(name=route_name, virtual_hosts=[vh])


def _adapt(route: rc.Route) -> None:
    for filter_name in list(route.typed_per_filter_config):
        if filter_name not in _GRPC_ROUTE_FILTERS:
            del route.typed_per_filter_config[filter_name]
    if not route.HasField("route"):
        return
    action = route.route
    if action.timeout.seconds or action.timeout.nanos:
        # (the timeout itself stays, as istiod sends it: grpc ignores it)
        action.max_stream_duration.max_stream_duration.CopyFrom(action.timeout)
