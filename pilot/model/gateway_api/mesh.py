"""GAMMA (Gateway API for service mesh): routes whose parentRef is a Service (`group: ""`,
`kind: Service`) route sidecars' outbound traffic to that Service (pure). HTTPRoute and
GRPCRoute become `http` rules, TCPRoute `tcp` rules and TLSRoute `tls` rules (by SNI: the
route's hostnames, else the Service's own name), each limited to the parentRef's port if given.

As istiod does it: the routes of one Service are merged, per route namespace, into one
VirtualService for the Service's hostname bound to the `mesh` gateway, its rules in the spec's
precedence order. A route in the Service's own namespace is a *producer* route, exported to
every namespace; a route elsewhere is a *consumer* route, exported only to its own namespace
(`exportTo: ["."]`), where it comes before any other rule for the host (see model/traffic).
The routes' hostnames do not apply to HTTP: the Service names the traffic. A parentRef naming a
Service that does not exist is not accepted (NoMatchingParent, istiod's reason and message); its
port is not checked against the Service (istiod's neither). Backends in other namespaces need
no ReferenceGrant for mesh parents (istiod enforces grants for Gateway parents only: the
sidecar could reach those Services anyway).

A parentRef may also name a networking.istio.io ServiceEntry (istiod's allowed parent kinds):
the same, for every host of the ServiceEntry (a TLSRoute without hostnames matches them by
SNI). A ServiceEntry that does not exist: NoMatchingParent, `parent service entry: "NAME" not
found` (istiod's); its ports are not checked either.
"""

from __future__ import annotations

from collections.abc import Mapping

from pilot.config.core import Service
from pilot.config.networking import ServiceEntry
from pilot.config.networking.common import GROUP as ISTIO_GROUP  # networking.istio.io
from pilot.model.gateway_api.http import Candidate
from pilot.model.gateway_api.internal import INTERNAL_SUFFIX
from pilot.model.gateway_api.listeners import Verdict
from pilot.model.store import Entry

MESH = "mesh"
MESH_ROUTE_KINDS = ("HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute")


def is_service_parent(ref) -> bool:
    return ref.group in ("", "core") and ref.kind == "Service"


def is_service_entry_parent(ref) -> bool:
    return ref.group == ISTIO_GROUP and ref.kind == "ServiceEntry"


def is_mesh_parent(ref) -> bool:
    return is_service_parent(ref) or is_service_entry_parent(ref)


def service_entry_parent(ref, route_namespace: str, entries: Mapping[tuple[str, str], Entry[ServiceEntry]]
                         ) -> tuple[tuple[str, str] | None, Verdict]:
    """As `service_parent`, for a ServiceEntry parentRef."""
    key = (ref.namespace or route_namespace, ref.name)
    if key not in entries:
        return None, Verdict(False, "NoMatchingParent", f'parent service entry: "{ref.name}" not found')
    return key, Verdict(True, "Accepted", "Route was valid")


def service_parent(ref, route_namespace: str,
                   services: Mapping[tuple[str, str], Entry[Service]]) -> tuple[tuple[str, str] | None, Verdict]:
    """The (namespace, name) of the Service a parentRef attaches the route to, or None, with
    the parent's Accepted verdict."""
    key = (ref.namespace or route_namespace, ref.name)
    if key not in services:
        return None, Verdict(False, "NoMatchingParent", f'parent service: "{ref.name}" not found')
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


def mesh_virtual_service_name(service: str, service_namespace: str, kind: str = "Service") -> str:
    # (a ServiceEntry may share its name and namespace with a Service: their names must differ)
    middle = "" if kind == "Service" else "-serviceentry"
    return f"{service}.{service_namespace}{middle}-{INTERNAL_SUFFIX}-{MESH}"


def export_to(route_namespace: str, service_namespace: str) -> list[str]:
    return ["*"] if route_namespace == service_namespace else ["."]
