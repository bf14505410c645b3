"""GAMMA (Gateway API for service mesh): HTTPRoutes and GRPCRoutes whose parentRef is a Service
(`group: ""`, `kind: Service`) route sidecars' outbound traffic to that Service (pure).

As istiod does it: the routes of one Service are merged, per route namespace, into one
VirtualService for the Service's hostname bound to the `mesh` gateway, its rules in the spec's
precedence order. A route in the Service's own namespace is a *producer* route, exported to
every namespace; a route elsewhere is a *consumer* route, exported only to its own namespace
(`exportTo: ["."]`), where it comes before any other rule for the host (see model/traffic).
The routes' hostnames do not apply: the Service names the traffic. A parentRef naming a
Service that does not exist, or a port the Service lacks, is not accepted (NoMatchingParent,
istiod's reason and message).
"""

from __future__ import annotations

from collections.abc import Mapping

from pilot.config.core import Service
from pilot.model.gateway_api.http import Candidate
from pilot.model.gateway_api.internal import INTERNAL_SUFFIX
from pilot.model.gateway_api.listeners import Verdict
from pilot.model.store import Entry

MESH = "mesh"
MESH_ROUTE_KINDS = ("HTTPRoute", "GRPCRoute")


def is_service_parent(ref) -> bool:
    return ref.group in ("", "core") and ref.kind == "Service"


def service_parent(ref, route_namespace: str,
                   services: Mapping[tuple[str, str], Entry[Service]]) -> tuple[tuple[str, str] | None, Verdict]:
    """The (namespace, name) of the Service a parentRef attaches the route to, or None, with
    the parent's Accepted verdict."""
    key = (ref.namespace or route_namespace, ref.name)
    svc = services.get(key)
    if svc is None:
        return None, Verdict(False, "NoMatchingParent", f'parent service: "{ref.name}" not found')
    if ref.port is not None and all(p.port != ref.port for p in svc.obj.spec.ports):
        return None, Verdict(False, "NoMatchingParent", f"port {ref.port} not found")
    return key, Verdict(True, "Accepted", "Route was valid")


def on_port(candidates: tuple[Candidate, ...], port: int | None) -> tuple[Candidate, ...]:
    """A parentRef with a port applies the route to that port of the Service only."""
    if port is None:
        return candidates
    out = []
    for c in candidates:
        rule = c.rule.model_copy(update={"match": [m.model_copy(update={"port": port}) for m in c.rule.match]})
        out.append(Candidate(c.rank, rule, c.origin))
    return tuple(out)


def mesh_virtual_service_name(service: str, service_namespace: str) -> str:
    return f"{service}.{service_namespace}-{INTERNAL_SUFFIX}-{MESH}"


def export_to(route_namespace: str, service_namespace: str) -> list[str]:
    return ["*"] if route_namespace == service_namespace else ["."]
