"""The gateway.networking.k8s.io kinds: GatewayClass, Gateway (filed as `KubernetesGateway`),
ListenerSet, HTTPRoute, GRPCRoute, TCPRoute, TLSRoute, ReferenceGrant and BackendTLSPolicy.

`common` holds what they share (references, hostnames, filters, the base whose `status` never
pushes), `gateway` the class and the Gateway, `listener_set` the ListenerSet, `routes` the routes and
ReferenceGrant, `policies` BackendTLSPolicy. What the
objects mean (attachment, hostnames, status) is model/gateway_api's business.
"""

from __future__ import annotations

from pilot.config.gateway_api.common import (
    CONTROLLER_NAME,
    DEFAULT_CLASS,
    GROUP,
    BackendObjectReference,
    BackendRef,
    GatewayApiObject,
    HeaderMatch,
    HeaderModifier,
    ParentReference,
    RequestMirror,
    SecretObjectReference,
    first_per_name,
    hostname_problem,
)
from pilot.config.gateway_api.gateway import (
    AllowedRoutes,
    GatewayClass,
    GatewayTLSConfig,
    KubernetesGateway,
    Listener,
    RouteGroupKind,
)
from pilot.config.gateway_api.listener_set import ListenerEntry, ListenerSet
from pilot.config.gateway_api.policies import BackendTLSPolicy
from pilot.config.gateway_api.routes import (
    GRPCRoute,
    GRPCRouteRule,
    HTTPRoute,
    HTTPRouteFilter,
    HTTPRouteMatch,
    HTTPRouteRule,
    L4RouteRule,
    ReferenceGrant,
    SessionPersistence,
    TCPRoute,
    TLSRoute,
)

# Store names (ConfigKey.kind) of every Gateway API kind.
GATEWAY_API_KINDS = ("GatewayClass", "KubernetesGateway", "ListenerSet", "HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute",
                     "ReferenceGrant", "BackendTLSPolicy")
ROUTE_KINDS = ("HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute")

__all__ = [
    "CONTROLLER_NAME",
    "DEFAULT_CLASS",
    "GATEWAY_API_KINDS",
    "GROUP",
    "ROUTE_KINDS",
    "AllowedRoutes",
    "BackendObjectReference",
    "BackendRef",
    "BackendTLSPolicy",
    "GRPCRoute",
    "GRPCRouteRule",
    "GatewayApiObject",
    "GatewayClass",
    "GatewayTLSConfig",
    "HTTPRoute",
    "HTTPRouteFilter",
    "HTTPRouteMatch",
    "HTTPRouteRule",
    "HeaderMatch",
    "HeaderModifier",
    "KubernetesGateway",
    "L4RouteRule",
    "Listener",
    "ListenerEntry",
    "ListenerSet",
    "ParentReference",
    "ReferenceGrant",
    "RequestMirror",
    "RouteGroupKind",
    "SecretObjectReference",
    "SessionPersistence",
    "TCPRoute",
    "TLSRoute",
    "first_per_name",
    "hostname_problem",
]
