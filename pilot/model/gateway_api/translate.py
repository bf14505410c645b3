"""One pass over the Gateway API objects in the Store: the Istio config they become and the
status of each, computed together so the status says what proxies get (istiod's design).

Ours: GatewayClasses whose controllerName is istio.io/gateway-controller (and the built-in
`istio` class unless a GatewayClass of that name says otherwise), their Gateways, and the
route parents that are those Gateways. Gateways of other classes, routes' other parents and
parents that do not exist are left alone: their status belongs to whoever serves them.

Output per served listener: an internal Gateway (selecting routers labelled with the Gateway's
name in its namespace) and VirtualServices bound to it: for HTTP(S) one per hostname holding
every attached HTTPRoute/GRPCRoute rule for it in precedence order (then, after them, the rules
of wildcard hostnames covering it, most specific first, as Envoy picks one virtual host per
request); for TLS passthrough and TCP one per attached route, oldest first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pilot.config.core import ConfigMap, Namespace, Secret, Service
from pilot.config.gateway_api import (
    CONTROLLER_NAME,
    DEFAULT_CLASS,
    BackendTLSPolicy,
    GatewayClass,
    GRPCRoute,
    HTTPRoute,
    KubernetesGateway,
    ListenerSet,
    ReferenceGrant,
    TCPRoute,
    TLSRoute,
)
from pilot.config.networking import DestinationRule, Gateway, ServiceEntry, VirtualService
from pilot.model.gateway_api import backend_tls
from pilot.model.gateway_api.attach import Attachment, attach
from pilot.model.gateway_api.conditions import Status, condition, sorted_conditions
from pilot.model.gateway_api.hostnames import isolate, matches
from pilot.model.gateway_api.http import (
    Candidate,
    RouteRefs,
    grpc_route_rules,
    http_route_rules,
    referenced_services,
)
from pilot.model.gateway_api.internal import (
    PARENTS,
    Route,
    gateway_entry,
    has_session,
    internal_gateway_name,
    tcp_rule,
    tls_rule,
    virtual_service_entry,
)
from pilot.model.gateway_api.listener_sets import by_gateway, listener_set_status, refers_to_listener_set
from pilot.model.gateway_api.listeners import GatewayState, ListenerState, evaluate_gateway
from pilot.model.gateway_api.mesh import (
    MESH,
    MESH_ROUTE_KINDS,
    export_to,
    is_mesh_parent,
    is_service_parent,
    mesh_virtual_service_name,
    on_port,
    service_entry_parent,
    service_parent,
)
from pilot.model.gateway_api.references import (
    INVALID_BACKEND_HOST,
    NO_GRANTS_NEEDED,
    Backend,
    ReferenceGrants,
    resolve_backend,
)
from pilot.model.store import ConfigKey, Entry, Store, holds


@dataclass(eq=False)
class TranslationMemo:
    """Work a translation can hand to the next one: per route, its rules (while the route, the
    Services it names and the ReferenceGrants are the same Entries); per generated object, the
    object (while what it is made of is the same). A full push for an unrelated change then
    redoes almost nothing, and unchanged generated Entries stay the very same objects."""

    routes: dict[tuple[ConfigKey, bool], tuple[tuple, tuple]] = field(default_factory=dict)  # (route, mesh)
    virtual_services: dict[str, tuple[tuple, Entry[VirtualService]]] = field(default_factory=dict)
    gateways: dict[tuple, Entry[Gateway]] = field(default_factory=dict)


@dataclass(frozen=True)
class GatewayApiResult:
    gateways: tuple[Entry[Gateway], ...] = ()  # internal networking.istio.io Gateways
    virtual_services: tuple[Entry[VirtualService], ...] = ()
    # GAMMA: VirtualServices bound to `mesh`, from routes whose parent is a Service (sidecars')
    mesh_virtual_services: tuple[Entry[VirtualService], ...] = ()
    statuses: Mapping[ConfigKey, Status] = field(default_factory=dict)  # without lastTransitionTime
    # (gateway namespace, secret namespace, secret name): Secrets in other namespaces that a
    # ReferenceGrant lets this namespace's gateways present (served over SDS).
    credentials: frozenset[tuple[str, str, str]] = frozenset()
    # Some mesh VirtualService sets a session: sidecars' outbound HCMs need the stateful session filter.
    mesh_sessions: bool = False
    # (gateway namespace, SDS name) -> the checked PEM: the CAs (ConfigMap or Secret ca.crt) that
    # Gateways' spec.tls.frontend let this namespace's routers verify clients with (over SDS).
    client_cas: Mapping[tuple[str, str], bytes] = field(default_factory=dict)
    # BackendTLSPolicy: the DestinationRules they become (merged under users' in the traffic index)
    destination_rules: tuple[Entry[DestinationRule], ...] = ()
    memo: TranslationMemo = field(default_factory=TranslationMemo, compare=False, repr=False)

    def allows_credential(self, proxy_namespace: str, namespace: str, name: str) -> bool:
        return (proxy_namespace, namespace, name) in self.credentials


EMPTY = GatewayApiResult()


def _age(e: Entry) -> tuple:
    return (e.obj.metadata.creation_timestamp, e.key.namespace, e.key.name)


def _our_classes(classes: list[Entry[GatewayClass]]) -> dict[str, Entry[GatewayClass] | None]:
    ours: dict[str, Entry[GatewayClass] | None] = {}
    named = {e.key.name: e for e in classes}
    if DEFAULT_CLASS not in named:
        ours[DEFAULT_CLASS] = None
    for e in classes:
        if e.obj.spec.controller_name == CONTROLLER_NAME:
            ours[e.key.name] = e
    return ours


def _resolved(problems: list[Backend], unsupported: list[str], generation: int) -> dict:
    if problems:
        # istiod keeps the last invalid backend's error (each one overwrites the one before):
        # of an unknown Service then an unknown kind, InvalidKind is reported.
        last = problems[-1]
        return condition("ResolvedRefs", False, last.reason, last.message, generation)
    if unsupported:
        return condition("ResolvedRefs", False, "InvalidKind", unsupported[0], generation)
    return condition("ResolvedRefs", True, "ResolvedRefs", "All references resolved", generation)


@dataclass
class _Pass:
    """The mutable state of one translation (local to `translate`)."""

    refs: RouteRefs
    labels: Mapping[str, Mapping[str, str]]
    gateways: dict[tuple[str, str], GatewayState]
    previous: TranslationMemo
    memo: TranslationMemo
    grants: tuple[Entry[ReferenceGrant], ...]
    # (namespace, name) of each allowed ListenerSet -> its Gateway and its listeners
    listener_sets: dict[tuple[str, str], tuple[GatewayState, tuple[ListenerState, ...]]] = field(default_factory=dict)
    http: dict[tuple[ConfigKey, str], dict[str, list[tuple[int, Candidate]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    l4: list[tuple[ListenerState, Entry[Route], tuple[str, ...], tuple]] = field(default_factory=list)
    # (Gateway, listener name) -> the routes attached to it (its status's attachedRoutes)
    attached: dict[tuple[ConfigKey, str], set[ConfigKey]] = field(default_factory=lambda: defaultdict(set))
    statuses: dict[ConfigKey, Status] = field(default_factory=dict)
    # GAMMA: (route namespace, parent namespace, parent name, parent kind: Service or
    # ServiceEntry) -> (order, route, candidates)
    mesh: dict[tuple[str, str, str, str], list[tuple[int, Entry[Route], tuple[Candidate, ...]]]] = field(
        default_factory=lambda: defaultdict(list))
    # ... and TCPRoute/TLSRoute: (order, route, parentRef port, SNI hosts, targets)
    mesh_l4: dict[tuple[str, str, str, str], list[tuple[int, Entry, int | None, tuple[str, ...], tuple]]] = field(
        default_factory=lambda: defaultdict(list))
    # (namespace, name) -> ServiceEntry: mesh parents besides Services
    service_entries: Mapping[tuple[str, str], Entry[ServiceEntry]] = field(default_factory=dict)

    def _rules(self, route: Entry[Route], mesh: bool = False) -> tuple:
        """(candidates, l4 targets, backend problems, unsupported filters) of a route, reused from
        the previous translation when nothing it reads changed. `mesh`: for Service parents,
        where backends in other namespaces need no ReferenceGrant (istiod's rule); the same
        as for Gateways when the route names no other namespace."""
        services = self.refs.services
        referenced = referenced_services(route)
        elsewhere = {ns for ns, _ in referenced if ns != route.key.namespace}
        mesh = mesh and bool(elsewhere)
        # (a Hostname backendRef reads the ServiceEntries declaring its host)
        signature = (route, tuple(services.get(k) for k in referenced),
                     tuple(self.refs.hostnames.get(name) for _, name in referenced),
                     tuple(g for g in self.grants if g.key.namespace in elsewhere) if elsewhere and not mesh else ())
        memo_key = (route.key, mesh)
        hit = self.previous.routes.get(memo_key)
        if hit is not None and hit[0] == signature:
            self.memo.routes[memo_key] = hit
            return hit[1]
        refs = RouteRefs(services, NO_GRANTS_NEEDED, self.refs.domain, self.refs.hostnames) if mesh else self.refs
        problems: list[Backend] = []
        unsupported: list[str] = []
        candidates: list[Candidate] = []
        l4_targets: list[tuple[str, int, int]] = []
        if holds(route, HTTPRoute):
            candidates = http_route_rules(route, refs, problems, unsupported)
        elif holds(route, GRPCRoute):
            candidates = grpc_route_rules(route, refs, problems, unsupported)
        else:
            l4_targets = self._l4_targets(route, refs, problems)
        out = (tuple(candidates), tuple(l4_targets), tuple(problems), tuple(unsupported))
        self.memo.routes[memo_key] = (signature, out)
        return out

    def route(self, route: Entry[Route], order: int) -> None:
        spec = route.obj.spec
        kind = route.key.kind
        candidates, l4_targets, problems, unsupported = self._rules(route)
        gen = route.obj.metadata.generation
        parents = []
        hosts = list(getattr(spec, "hostnames", [])) if kind != "TCPRoute" else None
        for ref in spec.parent_refs:
            if kind in MESH_ROUTE_KINDS and is_mesh_parent(ref):
                parents.append(self._mesh_parent(route, order, ref, self._rules(route, mesh=True), gen))
                continue
            where = (ref.namespace or route.key.namespace, ref.name)
            if refers_to_listener_set(ref):
                # a ListenerSet our Gateway allows (else not ours to report on): its listeners
                gw_of_set, own = self.listener_sets.get(where, (None, ()))
                if gw_of_set is None or not gw_of_set.report_listeners:
                    continue
                gw, candidates_listeners = gw_of_set, own
            elif ref.refers_to_gateway():
                gw = self.gateways.get(where)
                if gw is None or not gw.report_listeners:
                    # another controller's Gateway, none at all, or one refused whole (no usable
                    # address: istiod makes it no route parent): not ours to report on
                    continue
                candidates_listeners = gw.listeners
            else:
                continue
            found, verdict = attach(route, ref, candidates_listeners, self.labels, hosts)
            for a in found:
                self._attach(route, order, a, candidates, l4_targets, gw.merged)
            parents.append({"parentRef": ref.as_status(), "controllerName": CONTROLLER_NAME,
                            "conditions": sorted_conditions([
                                condition("Accepted", verdict.ok, verdict.reason, verdict.message, gen),
                                _resolved(problems, unsupported, gen)])})
        if parents:  # a route naming none of our Gateways is someone else's to report on
            self.statuses[route.key] = {"parents": parents}

    def _mesh_parent(self, route: Entry[Route], order: int, ref, rules: tuple, gen: int) -> dict:
        candidates, l4_targets, problems, unsupported = rules
        if is_service_parent(ref):
            svc, verdict = service_parent(ref, route.key.namespace, self.refs.services)
            parent_kind = "Service"
        else:
            svc, verdict = service_entry_parent(ref, route.key.namespace, self.service_entries)
            parent_kind = "ServiceEntry"
        if svc is not None:
            where = (route.key.namespace, *svc, parent_kind)
            if route.key.kind in ("TCPRoute", "TLSRoute"):
                # a TLSRoute without hostnames matches the parent's hosts by SNI (istiod's)
                hosts = tuple(getattr(route.obj.spec, "hostnames", ())) or self.mesh_hosts(where)
                self.mesh_l4[where].append((order, route, ref.port, hosts, l4_targets))
            else:
                self.mesh[where].append((order, route, on_port(candidates, ref.port)))
        return {"parentRef": ref.as_status(), "controllerName": CONTROLLER_NAME,
                "conditions": sorted_conditions([condition("Accepted", verdict.ok, verdict.reason, verdict.message, gen),
                                                 _resolved(list(problems), list(unsupported), gen)])}

    def mesh_hosts(self, where: tuple[str, str, str, str]) -> tuple[str, ...]:
        """The hosts a mesh parent names: a Service's hostname, a ServiceEntry's hosts."""
        _, ns, name, kind = where
        if kind == "Service":
            return (f"{name}.{ns}.svc.{self.refs.domain}",)
        return tuple(self.service_entries[(ns, name)].obj.spec.hosts)

    def _attach(self, route: Entry[Route], order: int, a: Attachment, candidates: tuple[Candidate, ...],
                l4_targets: tuple[tuple[str, int, int], ...], listeners: tuple) -> None:
        key = (a.listener.owner_key, a.listener.name)
        if route.key in self.attached[key]:
            return  # two parentRefs naming the same listener
        self.attached[key].add(route.key)
        if route.key.kind in ("HTTPRoute", "GRPCRoute"):
            spec = a.listener.spec
            siblings = [ls.spec.hostname for ls in listeners if ls is not a.listener and ls.accepted.ok
                        and ls.spec.port == spec.port and ls.spec.protocol in _HTTP_PROTOCOLS]
            for host in isolate(spec.hostname, list(a.hosts), siblings):
                self.http[key][host].extend((order, c) for c in candidates)
        elif route.key.kind == "TLSRoute":
            self.l4.append((a.listener, route, a.hosts, l4_targets))
        else:
            self.l4.append((a.listener, route, ("*",), l4_targets))

    def virtual_service(self, namespace: str, name: str, gateway: str, hosts: tuple[str, ...],
                        parents: tuple[str, ...], created: str, http: tuple = (), l4: tuple = (),
                        kind: str = "HTTPRoute", export: tuple[str, ...] = (), mesh_tcp: tuple = (),
                        mesh_tls: tuple = ()) -> Entry[VirtualService]:
        """`mesh_tcp` ((port, targets), ...) and `mesh_tls` ((SNI hosts, port, targets), ...):
        the L4 rules of a mesh VirtualService, which also holds its Service's HTTP rules."""
        signature = (namespace, gateway, hosts, parents, created, http, l4, kind, export, mesh_tcp, mesh_tls)
        hit = self.previous.virtual_services.get(name)
        if hit is None or hit[0] != signature:
            extra: dict[str, list]
            if kind == "TLSRoute":
                extra = {"tls": [tls_rule(list(hosts), list(l4))]}
            elif kind == "TCPRoute":
                extra = {"tcp": [tcp_rule(list(l4))]}
            else:
                extra = {"http": [c.rule for c in http],
                         "tcp": [tcp_rule(list(t), port) for port, t in mesh_tcp],
                         "tls": [tls_rule(list(h), list(t), port) for h, port, t in mesh_tls]}
            hit = (signature, virtual_service_entry(namespace, name, gateway, list(hosts), parents, created,
                                                    export_to=export, **extra))
        self.memo.virtual_services[name] = hit
        return hit[1]

    def gateway(self, *args) -> Entry[Gateway]:
        entry = self.previous.gateways.get(args) or gateway_entry(*args)
        self.memo.gateways[args] = entry
        return entry

    def _l4_targets(self, route: Entry[Route], refs: RouteRefs, problems: list[Backend]) -> list[tuple[str, int, int]]:
        rules = route.obj.spec.rules
        out = []
        for ref in rules[0].backend_refs if rules else ():
            b = resolve_backend(ref, route.key.kind, route.key.namespace, refs.services, refs.grants, refs.domain,
                                refs.hostnames)
            if not b.valid:
                problems.append(b)
            if b.weight > 0:
                out.append((b.host, b.port, b.weight))
        # Connections with nowhere to go are refused: a cluster that never exists.
        return out or [(INVALID_BACKEND_HOST, 1, 1)]


_HTTP_PROTOCOLS = ("HTTP", "HTTPS")


def _http_rules(by_host: Mapping[str, list[tuple[int, Candidate]]], host: str,
                wildcards: list[str]) -> tuple[Candidate, ...]:
    """The rules for one hostname: its own, then those of the wildcards covering it (`wildcards`:
    this listener's, most specific first)."""
    out: list[Candidate] = []
    for h in (host, *(w for w in wildcards if w != host and matches(w, host))):
        out.extend(c for _, c in sorted(by_host[h], key=lambda oc: (oc[1].rank, oc[0])))
    return tuple(out)


def translate(store: Store, domain: str, previous: GatewayApiResult | None = None) -> GatewayApiResult:
    """`previous`: the last result from this Store, whose memo spares unchanged work."""
    classes = store.list(GatewayClass)
    ours = _our_classes(classes)
    statuses: dict[ConfigKey, Status] = {}
    for entry in ours.values():
        if entry is not None:
            statuses[entry.key] = {"conditions": [condition("Accepted", True, "Accepted", "Handled by Istio controller",
                                                            entry.obj.metadata.generation)]}
    kube_gateways = [g for g in store.list(KubernetesGateway)
                     if g.obj.spec.gateway_class_name in ours]
    routes: list[Entry[Route]] = [*store.list(HTTPRoute), *store.list(GRPCRoute), *store.list(TLSRoute),
                                  *store.list(TCPRoute)]
    if not kube_gateways and not any(is_mesh_parent(ref) for r in routes
                                     for ref in r.obj.spec.parent_refs):
        btls = backend_tls.evaluate(store, domain, {})
        statuses.update(btls.statuses)
        if not statuses:
            return EMPTY
        return GatewayApiResult(statuses=MappingProxyType(statuses), destination_rules=btls.destination_rules)
    services = {(e.key.namespace, e.key.name): e for e in store.list(Service)}
    secrets = {(e.key.namespace, e.key.name): e for e in store.list(Secret)}
    # (only indexed when some Gateway has spec.tls: clusters hold many ConfigMaps)
    configmaps = ({(e.key.namespace, e.key.name): e for e in store.list(ConfigMap)}
                  if any(g.obj.spec.tls is not None for g in kube_gateways) else {})
    grant_entries = tuple(sorted(store.list(ReferenceGrant), key=lambda e: e.key))
    grants = ReferenceGrants.of(list(grant_entries))
    labels = {e.key.name: e.obj.metadata.labels for e in store.list(Namespace)}
    sets = by_gateway(store.list(ListenerSet), {(g.key.namespace, g.key.name): g for g in kube_gateways},
                      labels, statuses)
    states = {}
    for g in sorted(kube_gateways, key=_age):
        states[(g.key.namespace, g.key.name)] = evaluate_gateway(
            g, g.obj.spec.gateway_class_name, services, secrets, grants, domain,
            sets.get((g.key.namespace, g.key.name), ()), configmaps)
    hostnames: dict[str, list[tuple[str, tuple[str, ...]]]] = defaultdict(list)
    service_entries = store.list(ServiceEntry)
    for se in service_entries:
        for h in se.obj.spec.hosts:
            hostnames[h].append((se.key.namespace, tuple(se.obj.spec.export_to)))
    p = _Pass(RouteRefs(services, grants, domain, {h: tuple(v) for h, v in hostnames.items()}), labels, states,
              previous.memo if previous is not None else TranslationMemo(), TranslationMemo(), grant_entries,
              service_entries={(e.key.namespace, e.key.name): e for e in service_entries})
    for state in states.values():
        for entry, listeners in state.sets:
            p.listener_sets[(entry.key.namespace, entry.key.name)] = (state, listeners)
    for order, route in enumerate(sorted(routes, key=_age)):
        p.route(route, order)
    statuses.update(p.statuses)

    gateways: list[Entry[Gateway]] = []
    virtual_services: list[Entry[VirtualService]] = []
    credentials: set[tuple[str, str, str]] = set()
    client_cas: dict[tuple[str, str], bytes] = {}
    for state in states.values():
        statuses[state.entry.key] = state.status({ls.name: len(p.attached.get((state.entry.key, ls.name), ()))
                                                  for ls in state.listeners})
        for entry, listeners in state.sets:
            statuses[entry.key] = listener_set_status(
                state, entry, listeners, {ls.name: len(p.attached.get((entry.key, ls.name), ())) for ls in listeners},
                services, domain)
        for ls in state.merged:
            if not ls.programmed:
                continue
            gateways.append(_internal_gateway(state, ls, p))
            if "/" in ls.credential:
                secret_ns, _, secret = ls.credential.partition("/")
                credentials.add((state.entry.key.namespace, secret_ns, secret))
            if ls.client_ca:
                client_cas[(state.entry.key.namespace, ls.client_ca)] = ls.client_ca_pem
            virtual_services.extend(_http_virtual_services(state, ls, p))
    for ls, route, hosts, targets in p.l4:
        if not ls.programmed:
            continue
        gw = ls.gateway
        internal = internal_gateway_name(gw.key.name, ls.server_name)
        name = f"{internal}-{route.key.kind.lower()}-{route.key.namespace}-{route.key.name}"
        virtual_services.append(p.virtual_service(gw.key.namespace, name, internal, hosts, (str(route.key),),
                                                  route.obj.metadata.creation_timestamp, l4=targets,
                                                  kind=route.key.kind))
    mesh = _mesh_virtual_services(p)
    # (the ancestors index walks every route: only built when some policy will read it)
    btls = (backend_tls.evaluate(store, domain, _gateways_by_backend(gateways, virtual_services), services,
                                 p.service_entries)
            if store.list(BackendTLSPolicy) else backend_tls.EMPTY)
    statuses.update(btls.statuses)
    return GatewayApiResult(tuple(gateways), tuple(virtual_services), mesh, MappingProxyType(statuses),
                            frozenset(credentials), mesh_sessions=any(has_session(vs) for vs in mesh),
                            client_cas=MappingProxyType(client_cas), destination_rules=btls.destination_rules,
                            memo=p.memo)


def _gateways_by_backend(gateways: list[Entry[Gateway]], virtual_services: list[Entry[VirtualService]]
                         ) -> dict[str, frozenset[tuple[str, str]]]:
    """Backend host -> the Gateways (namespace, name) whose routes send traffic to it (the
    ancestors a BackendTLSPolicy reports, istiod's AncestorBackend index)."""
    owner: dict[str, tuple[str, str]] = {}
    for g in gateways:
        parent = g.obj.metadata.annotations.get(PARENTS, "")  # KubernetesGateway/NS/NAME
        _, ns, name = parent.split("/", 2)
        owner[f"{g.key.namespace}/{g.key.name}"] = (ns, name)
    out: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for vs in virtual_services:
        gws = {owner[b] for b in vs.obj.spec.gateways if b in owner}
        if not gws:
            continue
        spec = vs.obj.spec
        dests = [d.destination for rule in spec.http for d in rule.route]
        dests += [m.destination for rule in spec.http for m in rule.mirrors]
        dests += [rule.mirror for rule in spec.http if rule.mirror is not None]
        dests += [d.destination for tcp in spec.tcp for d in tcp.route]
        dests += [d.destination for tls in spec.tls for d in tls.route]
        for d in dests:
            out[d.host] |= gws
    return {h: frozenset(v) for h, v in out.items()}


def _mesh_virtual_services(p: _Pass) -> tuple[Entry[VirtualService], ...]:
    """One VirtualService per (route namespace, Service or ServiceEntry) for its hosts: its HTTP
    routes' rules in precedence order, its TCPRoutes' and TLSRoutes' rules oldest first. Its
    creationTimestamp is its oldest route's, which places it among VirtualServices for the same
    host (oldest first)."""
    out = []
    for where in sorted(set(p.mesh) | set(p.mesh_l4)):
        route_ns, svc_ns, svc, parent_kind = where
        attached = p.mesh.get(where, [])
        l4 = sorted(p.mesh_l4.get(where, []), key=lambda t: t[0])
        ranked = sorted(((c.rank, order, c) for order, _, cs in attached for c in cs), key=lambda t: t[:2])
        candidates = tuple(c for _, _, c in ranked)
        routes = sorted(dict.fromkeys([r for _, r, _ in attached] + [t[1] for t in l4]), key=_age)
        parents = tuple(str(r.key) for r in routes)
        tcp = tuple((port, targets) for _, r, port, _, targets in l4 if r.key.kind == "TCPRoute")
        tls = tuple((hosts, port, targets) for _, r, port, hosts, targets in l4 if r.key.kind == "TLSRoute")
        out.append(p.virtual_service(route_ns, mesh_virtual_service_name(svc, svc_ns, parent_kind), MESH,
                                     p.mesh_hosts(where), parents,
                                     routes[0].obj.metadata.creation_timestamp, http=candidates,
                                     export=tuple(export_to(route_ns, svc_ns)), mesh_tcp=tcp, mesh_tls=tls))
    return tuple(out)


def _internal_gateway(state: GatewayState, ls: ListenerState, p: _Pass) -> Entry[Gateway]:
    spec = ls.spec
    gw = state.entry
    if spec.protocol == "HTTP":
        protocol, mode = "HTTP", ""
    elif spec.protocol == "HTTPS":
        protocol, mode = "HTTPS", ls.tls_mode
    elif spec.protocol == "TLS":
        protocol, mode = "TLS", ("PASSTHROUGH" if spec.tls.mode == "Passthrough" else ls.tls_mode)
    else:
        protocol, mode = "TCP", ""
    # A ListenerSet's listener is served by the Gateway's routers: its internal Gateway lives in
    # the Gateway's namespace (istiod's lives in the ListenerSet's, marked with the parent namespace).
    parents = (f"KubernetesGateway/{gw.key.namespace}/{gw.key.name}",) if ls.owner is None else (
        f"ListenerSet/{ls.owner.key.namespace}/{ls.owner.key.name}", f"KubernetesGateway/{gw.key.namespace}/{gw.key.name}")
    created = (ls.owner or gw).obj.metadata.creation_timestamp
    return p.gateway(gw.key.namespace, gw.key.name, ls.server_name, created, spec.port,
                     protocol, spec.hostname, mode, ls.credential, parents, ls.client_ca, ls.insecure_fallback)


def _http_virtual_services(state: GatewayState, ls: ListenerState, p: _Pass) -> list[Entry[VirtualService]]:
    by_host = p.http.get((ls.owner_key, ls.name))
    if not by_host:
        return []
    gw = state.entry
    internal = internal_gateway_name(gw.key.name, ls.server_name)
    wildcards = sorted((h for h in by_host if h.startswith("*")), key=lambda h: (h == "*", -len(h), h))
    out = []
    for host in sorted(by_host):
        candidates = _http_rules(by_host, host, wildcards)
        parents = tuple(dict.fromkeys(c.origin for c in candidates))
        out.append(p.virtual_service(gw.key.namespace, f"{internal}-{host}", internal, (host,), parents,
                                     gw.obj.metadata.creation_timestamp, http=candidates))
    return out
