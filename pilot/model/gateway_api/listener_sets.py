"""ListenerSets (pure), as istiod's ListenerSetCollection judges them: which Gateway each adds its
listeners to, and the ListenerSet's own status.

A ListenerSet is ours when its parentRef names a Gateway (group gateway.networking.k8s.io, kind
Gateway) that exists and is of one of our classes; otherwise it is left alone (no status). The
Gateway must allow it by `spec.allowedListeners.namespaces` (None, the default: no ListenerSet;
Same; All; Selector on the ListenerSet's namespace labels), else Accepted and Programmed are
False / NotAllowed and it adds nothing. An allowed one's listeners are merged after the
Gateway's (listeners.evaluate_gateway: oldest ListenerSet first, then by namespace/name) and
judged like the Gateway's, conflicts included; only its programmed listeners are served and
take routes (a route names it as parent: group gateway.networking.k8s.io, kind ListenerSet,
optionally a sectionName). Its Accepted is True when one of its listeners is valid (else
ListenersNotValid, or "Parent not accepted" when the Gateway has an address it ignores);
Programmed as the Gateway's address checks for its listeners' ports, ListenersNotValid first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pilot.config.core import Service
from pilot.config.gateway_api import GROUP, KubernetesGateway, ListenerSet
from pilot.model.gateway_api.conditions import Status, condition, sorted_conditions
from pilot.model.gateway_api.listeners import (
    GatewayState,
    ListenerState,
    Verdict,
    programmed_verdict,
    resolve_addresses,
)
from pilot.model.store import ConfigKey, Entry

_NOT_ALLOWED = Verdict(False, "NotAllowed",
                       "The parent Gateway does not allow this reference; check the 'spec.allowedRoutes'")


def _age(e: Entry) -> tuple:
    return (e.obj.metadata.creation_timestamp, e.key.namespace, e.key.name)


def parent_of(entry: Entry[ListenerSet]) -> tuple[str, str] | None:
    """(namespace, name) of the Gateway a ListenerSet names, or None for another kind."""
    ref = entry.obj.spec.parent_ref
    if not ref.refers_to_gateway():
        return None
    return (ref.namespace or entry.key.namespace, ref.name)


def allows(gateway: Entry[KubernetesGateway], namespace: str, labels: Mapping[str, Mapping[str, str]]) -> bool:
    """istiod's NamespaceAcceptedByAllowListeners: the default allows none."""
    allowed = gateway.obj.spec.allowed_listeners
    if allowed is None:
        return False
    ns = allowed.namespaces
    if ns.from_ == "All":
        return True
    if ns.from_ == "Same":
        return namespace == gateway.key.namespace
    if ns.from_ == "None" or ns.selector is None:
        return False
    if namespace not in labels:
        return False  # istiod: a namespace it cannot find is not selected
    return ns.selector.matches({**labels[namespace], "kubernetes.io/metadata.name": namespace})


def by_gateway(sets: Iterable[Entry[ListenerSet]], gateways: Mapping[tuple[str, str], Entry[KubernetesGateway]],
               labels: Mapping[str, Mapping[str, str]], statuses: dict[ConfigKey, Status]
               ) -> dict[tuple[str, str], tuple[Entry[ListenerSet], ...]]:
    """The allowed ListenerSets of each of our Gateways, in merge precedence order. Those our
    Gateways do not allow get their NotAllowed status in `statuses`."""
    out: dict[tuple[str, str], list[Entry[ListenerSet]]] = {}
    for s in sorted(sets, key=_age):
        where = parent_of(s)
        gw = gateways.get(where) if where is not None else None
        if gw is None:
            continue  # not ours to report on
        if not allows(gw, s.key.namespace, labels):
            gen = s.obj.metadata.generation
            statuses[s.key] = {"conditions": sorted_conditions([
                condition("Accepted", False, _NOT_ALLOWED.reason, _NOT_ALLOWED.message, gen),
                condition("Programmed", False, _NOT_ALLOWED.reason, _NOT_ALLOWED.message, gen)])}
            continue
        out.setdefault((gw.key.namespace, gw.key.name), []).append(s)
    return {k: tuple(v) for k, v in out.items()}


def listener_set_status(state: GatewayState, entry: Entry[ListenerSet], listeners: tuple[ListenerState, ...],
                        attached: Mapping[str, int], services: Mapping[tuple[str, str], Entry[Service]],
                        domain: str) -> Status:
    """istiod's ReportListenerSetStatus for an allowed ListenerSet of `state`'s Gateway."""
    gen = entry.obj.metadata.generation
    valid = any(ls.programmed for ls in listeners)
    problem = state.address_problem
    if not state.report_listeners:  # the Gateway has no usable address at all
        assert problem is not None
        accepted = Verdict(False, problem.reason, "Parent not accepted: " + problem.message)
        return {"conditions": sorted_conditions([
            condition("Accepted", accepted.ok, accepted.reason, accepted.message, gen),
            condition("Programmed", state.programmed.ok, state.programmed.reason, state.programmed.message, gen)])}
    not_valid = None if valid else Verdict(False, "ListenersNotValid", "None of the ListenerSet's listeners are valid")
    if problem is not None:
        accepted = Verdict(False, problem.reason, "Parent not accepted: " + problem.message)
    else:
        accepted = not_valid or Verdict(True, "Accepted", "Resource accepted")
    ports = sorted({ls.spec.port for ls in listeners if ls.has_server})
    internal, warnings, usable = resolve_addresses(state.entry.key.namespace, list(state.hosts), ports, services, domain)
    programmed = not_valid or programmed_verdict(internal, warnings, usable)
    return {
        "conditions": sorted_conditions([
            condition("Accepted", accepted.ok, accepted.reason, accepted.message, gen),
            condition("Programmed", programmed.ok, programmed.reason, programmed.message, gen)]),
        "listeners": [ls.status(attached.get(ls.name, 0), gen) for ls in listeners],
    }


def refers_to_listener_set(ref) -> bool:
    return ref.group == GROUP and ref.kind == "ListenerSet"
