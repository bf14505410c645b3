"""Which listeners a route's parentRef attaches it to, and the parent's Accepted condition (pure).

A parentRef selects the listeners of its Gateway named by `sectionName` and/or `port` (all when
neither is given; none at all is NoMatchingParent). A listener takes the route when it is
accepted, allows the route's kind (allowedRoutes.kinds, else its protocol's kinds), allows the
route's namespace (allowedRoutes.namespaces: Same, All, or a Selector on the namespace's
labels), and, for routes with hostnames, shares a hostname with it. The parent is Accepted when
any listener takes the route; otherwise NoMatchingListenerHostname if only hostnames kept it
out, else NotAllowedByListeners.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pilot.config.gateway_api import GROUP
from pilot.model.gateway_api.hostnames import intersect
from pilot.model.gateway_api.listeners import ListenerState, Verdict
from pilot.model.store import Entry


@dataclass(frozen=True, slots=True)
class Attachment:
    listener: ListenerState
    hosts: tuple[str, ...]  # "*" for any


def _namespace_allowed(listener: ListenerState, route_ns: str, labels: Mapping[str, Mapping[str, str]]) -> bool:
    allowed = listener.spec.allowed_routes.namespaces
    if allowed.from_ == "All":
        return True
    if allowed.from_ == "Same":
        return route_ns == listener.gateway.key.namespace
    ns_labels = {**labels.get(route_ns, {}), "kubernetes.io/metadata.name": route_ns}
    return allowed.selector is not None and allowed.selector.matches(ns_labels)


def attach(route: Entry, parent_ref, listeners: tuple[ListenerState, ...],
           labels: Mapping[str, Mapping[str, str]], route_hosts: list[str] | None) -> tuple[list[Attachment], Verdict]:
    """`route_hosts` is None for kinds without hostnames (TCPRoute)."""
    kind = (GROUP, route.key.kind)
    chosen = [ls for ls in listeners
              if (parent_ref.section_name is None or ls.name == parent_ref.section_name)
              and (parent_ref.port is None or ls.spec.port == parent_ref.port)]
    if not chosen:
        if parent_ref.section_name is not None:
            return [], Verdict(False, "NoMatchingParent", f'sectionName "{parent_ref.section_name}" not found')
        return [], Verdict(False, "NoMatchingParent", f"port {parent_ref.port} not found")
    out: list[Attachment] = []
    refused: list[str] = []  # listeners that would not take the route at all
    hostless: list[str] = []  # listeners that would, but for the hostnames
    for ls in chosen:
        if not ls.accepted.ok:
            refused.append(f"listener {ls.name} is not accepted ({ls.accepted.reason})")
        elif kind not in ls.kinds:
            refused.append(f"kind {route.key.kind} is not allowed by listener {ls.name}")
        elif not _namespace_allowed(ls, route.key.namespace, labels):
            refused.append(f"namespace {route.key.namespace!r} is not allowed by listener {ls.name}")
        else:
            hosts = intersect(ls.spec.hostname, route_hosts) if route_hosts is not None else ["*"]
            if hosts:
                out.append(Attachment(ls, tuple(hosts)))
            else:
                hostless.append(f"no hostname of the route matches listener {ls.name} ({ls.spec.hostname})")
    if out:
        return out, Verdict(True, "Accepted", "Route was valid")
    if hostless:
        return [], Verdict(False, "NoMatchingListenerHostname", "; ".join(hostless))
    return [], Verdict(False, "NotAllowedByListeners", "; ".join(refused))
