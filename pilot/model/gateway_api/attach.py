"""Which listeners a route's parentRef attaches it to, and the parent's Accepted condition (pure),
as istiod decides them (referenceAllowed, then createRouteStatus's ranking).

Each listener of the Gateway that is a route parent (not conflicted) is judged in turn: the
parentRef's `port` and `sectionName` must select it (else NoMatchingParent); the route must
share a hostname with it (else NoMatchingListenerHostname) and come from a namespace its
allowedRoutes.namespaces allows (Same, All, or a Selector on the namespace's labels; else
NotAllowedByListeners); and its kind must be one the listener takes (allowedRoutes.kinds, else
its protocol's; else NotAllowedByListeners). The parent is Accepted when any listener takes the
route; otherwise the best-ranked refusal is reported."""

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
        return route_ns == listener.namespace  # the ListenerSet's, for its listeners
    ns_labels = {**labels.get(route_ns, {}), "kubernetes.io/metadata.name": route_ns}
    return allowed.selector is not None and allowed.selector.matches(ns_labels)


# istiod's ranking of one parentRef's per-listener verdicts: any listener taking the route wins,
# then NotAllowedByListeners, then NoMatchingListenerHostname, then NoMatchingParent (a listener
# the ref's sectionName/port does not select); verdicts of equal rank join their messages.
_RANK = {"Accepted": 0, "NotAllowedByListeners": 1, "NoMatchingListenerHostname": 2, "NoMatchingParent": 4}


def _listener_verdict(route: Entry, parent_ref, ls: ListenerState, labels: Mapping[str, Mapping[str, str]],
                      route_hosts: list[str] | None) -> tuple[Verdict, tuple[str, ...]]:
    """istiod's referenceAllowed, in its order: port, sectionName, hostname (with namespace),
    kind. Also the hostnames the route serves there."""
    if parent_ref.port is not None and parent_ref.port != ls.spec.port:
        return Verdict(False, "NoMatchingParent", f"port {parent_ref.port} not found"), ()
    if parent_ref.section_name is not None and parent_ref.section_name != ls.name:
        return Verdict(False, "NoMatchingParent", f'sectionName "{parent_ref.section_name}" not found'), ()
    hosts = ("*",) if route_hosts is None else tuple(intersect(ls.spec.hostname, route_hosts))
    original = ls.spec.hostname or ""
    if not hosts:
        return Verdict(False, "NoMatchingListenerHostname", f'no hostnames matched parent hostname "{original}"'), ()
    if not _namespace_allowed(ls, route.key.namespace, labels):
        return Verdict(False, "NotAllowedByListeners", f'hostnames matched parent hostname "{original}", but '
                                                       f'namespace "{route.key.namespace}" is not allowed by the '
                                                       "parent"), ()
    if (GROUP, route.key.kind) not in ls.kinds:
        version = getattr(route.obj, "api_version", f"{GROUP}/v1")
        return Verdict(False, "NotAllowedByListeners", f"kind {version}, Kind={route.key.kind} is not allowed"), ()
    return ACCEPTED_ROUTE, hosts


ACCEPTED_ROUTE = Verdict(True, "Accepted", "Route was valid")


def attach(route: Entry, parent_ref, listeners: tuple[ListenerState, ...],
           labels: Mapping[str, Mapping[str, str]], route_hosts: list[str] | None) -> tuple[list[Attachment], Verdict]:
    """`route_hosts` is None for kinds without hostnames (TCPRoute). The listeners are the
    Gateway's route parents (conflicted ones are none)."""
    out: list[Attachment] = []
    best: Verdict | None = None
    messages: list[str] = []
    for ls in listeners:
        if not ls.parent:
            continue
        verdict, hosts = _listener_verdict(route, parent_ref, ls, labels, route_hosts)
        if verdict.ok:
            out.append(Attachment(ls, hosts))
            continue
        if best is None or _RANK[verdict.reason] < _RANK[best.reason]:
            best, messages = verdict, [verdict.message]
        elif verdict.reason == best.reason and verdict.message not in messages:
            messages.append(verdict.message)
    if out:
        return out, (ACCEPTED_ROUTE if len(out) == 1 else
                     Verdict(True, "Accepted", f"Route was valid, bound to {len(out)} parents"))
    if best is None:
        return [], Verdict(False, "NoMatchingParent", "no listener of the parent can take routes")
    return [], Verdict(False, best.reason, "; ".join(messages))
