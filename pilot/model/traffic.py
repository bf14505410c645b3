"""Indexes of the traffic rules (VirtualService, DestinationRule) a PushContext serves.

Precedence follows istiod: for sidecars, the oldest VirtualService claiming a host wins and the
others are reported as conflicts, except that a GAMMA consumer route (an HTTPRoute on a Service
in another namespace, exported only to its own) comes first for clients in its namespace, as
istiod imports a namespace's private VirtualServices before public ones; a producer route
(exported everywhere) competes with VirtualServices by age; a DestinationRule in the client's namespace beats one in the
service's namespace, which beats one in the root namespace; an exact host beats a wildcard.

A DestinationRule with a `workloadSelector` applies only to proxies in its own namespace whose
labels it selects, and there it beats the rule without a selector (istiod's
SidecarScope.DestinationRule); to every other proxy it does not exist.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pilot.config.networking import DestinationRule, VirtualService
from pilot.config.networking.virtual_service import HTTPRoute, TCPRoute, TLSRoute
from pilot.model.dr_merge import consolidate
from pilot.model.export_to import exported_to
from pilot.model.gateway_api.backend_tls import merged_under
from pilot.model.labels import selects
from pilot.model.store import Entry, Store

MESH_GATEWAY = "mesh"


def resolve_host(host: str, namespace: str, domain: str) -> str:
    """Short names in Istio config mean a Service in the config's own namespace."""
    if "." in host or host.startswith("*"):
        return host
    return f"{host}.{namespace}.svc.{domain}"


def _age(e: Entry) -> tuple:
    """Oldest first, as istiod orders configs: creationTimestamp, then namespace/name (file mode has
    no timestamps, so there the name decides; an edit never changes precedence)."""
    return (e.obj.metadata.creation_timestamp, e.key.namespace, e.key.name)


def host_matches(pattern: str, host: str) -> bool:
    if pattern == host or pattern == "*":
        return True
    return pattern.startswith("*.") and host.endswith(pattern[1:])


@dataclass(frozen=True)
class TrafficIndex:
    # mesh-bound VirtualServices by resolved host (exact or wildcard), oldest first
    virtual_services: Mapping[str, tuple[Entry[VirtualService], ...]] = field(default_factory=dict)
    destination_rules: Mapping[str, tuple[Entry[DestinationRule], ...]] = field(default_factory=dict)
    conflicts: tuple[str, ...] = ()
    root_namespace: str = "istio-system"
    # Every distinct `sourceLabels` selector of VirtualService matches, in a fixed order: a proxy's
    # routes depend on its labels only through which of these it matches.
    source_selectors: tuple[tuple[tuple[str, str], ...], ...] = ()
    # GAMMA consumer routes: (host, client namespace) -> the VirtualService they became
    consumer_routes: Mapping[tuple[str, str], Entry[VirtualService]] = field(default_factory=dict)
    # Every distinct DestinationRule `workloadSelector`, in a fixed order: which DestinationRule a
    # proxy gets depends on its labels only through which of these it matches.
    rule_selectors: tuple[tuple[tuple[str, str], ...], ...] = ()

    def source_signature(self, labels: Mapping[str, str]) -> frozenset[int]:
        """Which `source_selectors` these labels satisfy (part of the route generation key)."""
        if not self.source_selectors:
            return frozenset()
        return frozenset(i for i, sel in enumerate(self.source_selectors)
                         if selects(sel, labels))

    def rule_signature(self, labels: Mapping[str, str]) -> frozenset[int]:
        """Which DestinationRule `rule_selectors` these labels satisfy: with the proxy's
        namespace, all that its DestinationRules depend on (part of the generation key)."""
        if not self.rule_selectors:
            return frozenset()
        return frozenset(i for i, sel in enumerate(self.rule_selectors) if selects(sel, labels))

    @classmethod
    def build(cls, store: Store, domain: str, root_namespace: str,
              mesh_routes: tuple[Entry[VirtualService], ...] = (), enhanced_dr_merge: bool = True,
              backend_rules: tuple[Entry[DestinationRule], ...] = ()) -> TrafficIndex:
        """`mesh_routes`: the VirtualServices GAMMA routes became (model/gateway_api/mesh).
        DestinationRules of one host and namespace are consolidated (pilot/model/dr_merge.py;
        `enhanced_dr_merge`: ENABLE_ENHANCED_DESTINATIONRULE_MERGE); `backend_rules`, the
        DestinationRules BackendTLSPolicies became (model/gateway_api/backend_tls), then merge
        under the consolidated user rules."""
        vs: dict[str, list[Entry[VirtualService]]] = defaultdict(list)
        consumers: dict[tuple[str, str], Entry[VirtualService]] = {}
        for e in mesh_routes:  # (a ServiceEntry parent's route holds every host of the ServiceEntry)
            for h in e.obj.spec.hosts:
                if e.obj.spec.export_to == ["."]:
                    consumers[(h, e.key.namespace)] = e
                else:
                    vs[h].append(e)
        for e in store.list(VirtualService):
            spec = e.obj.spec
            gateways = spec.gateways or [MESH_GATEWAY]
            if MESH_GATEWAY not in gateways:
                continue
            for h in spec.hosts:
                vs[resolve_host(h, e.key.namespace, domain)].append(e)
        dr: dict[str, list[Entry[DestinationRule]]] = defaultdict(list)
        rule_selectors: set[tuple[tuple[str, str], ...]] = set()
        for e in store.list(DestinationRule):
            dr[resolve_host(e.obj.spec.host, e.key.namespace, domain)].append(e)
            if (ws := e.obj.spec.workload_selector) is not None:
                rule_selectors.add(tuple(sorted(ws.match_labels.items())))
        conflicts = []
        for host, entries in vs.items():
            entries.sort(key=_age)
            for loser in entries[1:]:
                conflicts.append(f"VirtualService {loser.key.namespace}/{loser.key.name}: host {host} is already "
                                 f"claimed by {entries[0].key.namespace}/{entries[0].key.name}; ignored for sidecars")
        # Gateway-bound VirtualServices too: a router's routes depend on its labels the same way.
        bound = [*(e for entries in vs.values() for e in entries), *store.list(VirtualService)]
        selectors = sorted({tuple(sorted(m.source_labels.items()))
                            for e in bound
                            for rule in _rules(e.obj)
                            for m in rule.match if m.source_labels})
        return cls(MappingProxyType({h: tuple(v) for h, v in vs.items()}),
                   MappingProxyType({h: tuple(v) for h, v in _with_backend_rules(
                       {h: list(consolidate(sorted(v, key=_age), enhanced_dr_merge)) for h, v in dr.items()},
                       backend_rules).items()}),
                   tuple(sorted(conflicts)), root_namespace, tuple(selectors), MappingProxyType(consumers),
                   tuple(sorted(rule_selectors)))

    def virtual_service(self, host: str, client_namespace: str = "") -> Entry[VirtualService] | None:
        consumer = self.consumer_routes.get((host, client_namespace)) if self.consumer_routes else None
        if consumer is not None:
            return consumer
        # A VirtualService's exportTo limits the client namespaces it applies to (for routers:
        # pilot.model.gateways); one that is not exported to the client does not exist for it.
        visible = [e for e in self.virtual_services.get(host, ()) if _exported_to(e, client_namespace)]
        if visible:
            return visible[0]
        best = None
        for pattern, entries in self.virtual_services.items():
            if pattern.startswith("*") and host_matches(pattern, host):
                exported = [e for e in entries if _exported_to(e, client_namespace)]
                if exported and (best is None or len(pattern) > len(best[0])):
                    best = (pattern, exported[0])
        return best[1] if best else None

    def destination_rule(self, host: str, client_namespace: str, service_namespace: str,
                         client_labels: Mapping[str, str] | None = None) -> Entry[DestinationRule] | None:
        """The rule in force for a client. `client_labels` None: the client is no workload (a
        lookup on behalf of config, not of a proxy), so no rule with a workloadSelector applies."""
        candidates = list(self.destination_rules.get(host, ()))
        if not candidates:
            wild = [(p, es) for p, es in self.destination_rules.items() if p.startswith("*") and host_matches(p, host)]
            if wild:
                candidates = list(max(wild, key=lambda pe: len(pe[0]))[1])
        if not candidates:
            return None
        # The first namespace (client's, service's, root) holding rules for the host decides, as
        # in istiod: within it a selector rule of the client's own namespace that selects the
        # client, else its rule without a selector, else none (no fall-through to the next).
        for ns in (client_namespace, service_namespace, self.root_namespace):
            tier = [e for e in candidates if e.key.namespace == ns and _exported_to(e, client_namespace)]
            if tier:
                return _applicable(tier, client_namespace, client_labels)
        tier = [e for e in candidates if _exported_to(e, client_namespace)]
        return _applicable(tier, client_namespace, client_labels) if tier else None


def _with_backend_rules(rules: dict[str, list[Entry[DestinationRule]]],
                        backend_rules: tuple[Entry[DestinationRule], ...]) -> dict[str, list[Entry[DestinationRule]]]:
    for b in backend_rules:
        _merge_backend_rule(rules.setdefault(b.obj.spec.host, []), b)
    return rules


def _merge_backend_rule(rules: list[Entry[DestinationRule]], backend: Entry[DestinationRule]) -> None:
    """istiod's mergeDestinationRule for a rule synthesized from a backend policy: merged under
    the user's rule of its namespace with no selector and the same (default) exportTo, whose
    fields win whatever their ages; otherwise a rule of its own."""
    for i, e in sorted(enumerate(rules), key=lambda ie: _age(ie[1])):
        spec = e.obj.spec
        if (e.key.namespace == backend.key.namespace and spec.workload_selector is None
                and spec.export_to in ([], ["*"])):
            rules[i] = merged_under(e, backend)
            return
    rules.append(backend)
    rules.sort(key=_age)  # (stable) among the host's rules by age, as istiod's list is


def _applicable(rules: list[Entry[DestinationRule]], client_namespace: str,
                client_labels: Mapping[str, str] | None) -> Entry[DestinationRule] | None:
    catch_all = None
    for e in rules:
        selector = e.obj.spec.workload_selector
        if selector is None:
            catch_all = catch_all or e
        elif (client_labels is not None and e.key.namespace == client_namespace
              and selects(selector.match_labels, client_labels)):
            return e
    return catch_all


def _rules(vs: VirtualService) -> tuple[HTTPRoute | TCPRoute | TLSRoute, ...]:
    """Every route rule, http then tcp then tls."""
    return (*vs.spec.http, *vs.spec.tcp, *vs.spec.tls)


def _exported_to(e: Entry[VirtualService | DestinationRule], namespace: str) -> bool:
    return exported_to(e.obj.spec.export_to, e.key.namespace, namespace)


def destination_problems(index: TrafficIndex, known_hosts: set[str], domain: str) -> tuple[str, ...]:
    """VirtualService destinations that go nowhere: unknown hosts, and subsets no
    DestinationRule defines (istiod reports these in push status; traffic to them gets 503)."""
    problems: list[str] = []
    seen: set = set()
    for entries in index.virtual_services.values():
        for vs in entries:
            if vs.key in seen:
                continue
            seen.add(vs.key)
            spec = vs.obj.spec
            dests = [d.destination for rule in spec.http for d in rule.route]
            dests += [rule.mirror for rule in spec.http if rule.mirror is not None]
            dests += [m.destination for rule in spec.http for m in rule.mirrors]
            dests += [d.destination for rule in _rules(vs.obj)[len(spec.http):] for d in rule.route]  # tcp, tls
            for dest in dests:
                host = resolve_host(dest.host, vs.key.namespace, domain)
                where = f"VirtualService {vs.key.namespace}/{vs.key.name}"
                if host not in known_hosts and not host.startswith("*"):
                    problems.append(f"{where}: destination host {host} is not a known service")
                elif dest.subset:
                    dr = index.destination_rule(host, vs.key.namespace, host.split(".")[1] if host.count(".") > 1 else "")
                    subsets = {s.name for s in dr.obj.spec.subsets} if dr else set()
                    if dest.subset not in subsets:
                        problems.append(f"{where}: subset {dest.subset!r} of {host} is not defined by any "
                                        "DestinationRule")
    return tuple(sorted(set(problems)))


# The parts of a DestinationRule's traffic policy; port-level settings carry the first four.
_FIELDS = ("load_balancer", "connection_pool", "outlier_detection", "tls")
_POLICY_ONLY = ("retry_budget", "proxy_protocol")  # not in port-level settings


def effective_policy(spec, subset: str, port: int) -> dict:
    """The policy parts in force for (subset, port): {field: value or None}."""
    layers = [spec.traffic_policy]
    if subset:
        layers.append(next((s.traffic_policy for s in spec.subsets if s.name == subset), None))
    out: dict = {f: None for f in (*_FIELDS, *_POLICY_ONLY)}
    for layer in layers:
        if layer is None:
            continue
        for f in (*_FIELDS, *_POLICY_ONLY):
            if getattr(layer, f) is not None:
                out[f] = getattr(layer, f)
        for pls in layer.port_level_settings:
            if pls.port is not None and pls.port.number == port:
                for f in _FIELDS:
                    if getattr(pls, f) is not None:
                        out[f] = getattr(pls, f)
    return out
