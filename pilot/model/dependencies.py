"""What generated config read, and which changes reach it (pure: no I/O, no clocks).

Hand-kept "does this change matter to that proxy" predicates drift from what the builders read
(a Pod arriving after its EndpointSlice pushed nothing, because "Pods don't matter"). Instead,
while a result is generated, the PushContext accessors note what they were asked and what they
returned as *facets* into the `Deps` of that result; a change becomes the facets it touches, and
a result must be regenerated when the two meet.

A facet is a small tuple naming one thing a lookup depended on, present or absent:
- ("host", H): the service called H (a lookup of a missing host records it too, so a new
  Service or ServiceEntry with that host meets it);
- ("services",) every service, ("ns-services", NS) those of one namespace;
- ("slices", NS, SVC) the EndpointSlices of a Kubernetes Service; ("pod", NS, NAME) a Pod an
  endpoint refers to (whether or not that Pod exists yet); ("sans", H) the identities of a
  Kubernetes service's workloads (the set: a change meets it only when the set differs);
  ("ns-pods", NS) every Pod of a namespace (a ServiceEntry's workloadSelector runs over them);
  ("node", NAME) a Node an endpoint runs on (its topology labels are the endpoint's locality);
- ("dr", H) / ("vs", H) the DestinationRules / VirtualServices claiming host H (a change of one
  with a wildcard host, ("dr*",) / ("vs*",), meets every such lookup), ("dr-all",) every
  DestinationRule;
- ("sidecars", NS) the Sidecars of a namespace (selection runs over all of them);
- ("envoyfilters", NS) the EnvoyFilters of a namespace without targetRefs (the root namespace's
  select everywhere); ("envoyfilters-gateway", NS, NAME) those with targetRefs naming Gateway NAME
  of NS (they select only that Gateway's proxies, so only those record it);
- ("security", NS) PeerAuthentications, AuthorizationPolicies, RequestAuthentications of NS;
  ("jwks",) keys fetched for RequestAuthentication;
- ("workload-entries", NS), ("service-entry", NS, NAME), ("secret", NS, NAME);
- ("gateways",) the Gateways and the VirtualServices bound to them, as a router sees them;
- ("grants",) the Secrets other namespaces' ReferenceGrants let a gateway present;
- ("sessions",) whether some mesh (GAMMA) route sets a session;
- ("telemetry", NS) the Telemetries of a namespace (the root namespace's reach every proxy);
- ("wasm", NS) the WasmPlugins of a namespace (the root namespace's reach every proxy);
- ("kind", K) every object of kind K (indexes read whole, such as ztunnel's);
- ("networks",) the mesh's network gateways and endpoint network defaults (split-horizon EDS).

Besides facets, a result may have evaluated a Sidecar's egress hosts over every service (a
scoped view): a changed service meets it when the Sidecar's egress names it, before or after.

A mesh change (MeshConfig) meets everything. Recording happens once per generated result (the
generation memo, the per-push accessor memos), never per proxy: proxies that share a result
share its Deps, and a change is matched against each distinct Deps once (`Matcher`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pilot.config.networking import Sidecar
from pilot.model.sidecar_scope import egress_names
from pilot.model.store import ConfigKey, Entry

ALL_SERVICES = ("services",)
DR_WILDCARD = ("dr*",)
DR_ALL = ("dr-all",)
VS_WILDCARD = ("vs*",)
GATEWAYS = ("gateways",)
GRANTS = ("grants",)
SESSIONS = ("sessions",)  # whether any mesh route sets a session (sidecars' stateful session filter)
JWKS = ("jwks",)
AMBIENT = ("ambient",)  # ztunnel's index, read whole (AMBIENT_INPUT_KINDS)
NETWORKS = ("networks",)  # the network gateways and endpoint network defaults (pilot/model/networks.py)


def host(h: str) -> tuple:
    return ("host", h)


def ns_services(namespace: str) -> tuple:
    return ("ns-services", namespace)


def slices(namespace: str, service: str) -> tuple:
    return ("slices", namespace, service)


def pod(namespace: str, name: str) -> tuple:
    return ("pod", namespace, name)


def ns_pods(namespace: str) -> tuple:
    return ("ns-pods", namespace)


def node(name: str) -> tuple:
    return ("node", name)


def destination_rule(h: str) -> tuple:
    return ("dr", h)


def virtual_service(h: str) -> tuple:
    return ("vs", h)


def sidecars(namespace: str) -> tuple:
    return ("sidecars", namespace)


def envoy_filters(namespace: str) -> tuple:
    return ("envoyfilters", namespace)


def envoy_filters_for_gateway(namespace: str, gateway: str) -> tuple:
    return ("envoyfilters-gateway", namespace, gateway)


def envoy_filter_change(key: ConfigKey, old, new) -> set[tuple]:
    """What a changed EnvoyFilter can reach, from what it was and what it is: with targetRefs,
    the proxies of the Gateways named; otherwise every proxy of its namespace (of the mesh, from
    the root namespace). Neither version indexed (never valid): the namespace, to be safe."""
    out: set[tuple] = set()
    found = False
    for ctx in (old, new):
        for e in ctx.envoy_filters.get(key.namespace, ()):
            if e.key != key:
                continue
            found = True
            refs = e.obj.spec.target_refs
            if refs:
                out.update(envoy_filters_for_gateway(key.namespace, r.name) for r in refs)
            else:
                out.add(envoy_filters(key.namespace))
    if not found:
        out.add(envoy_filters(key.namespace))
    return out


def security(namespace: str) -> tuple:
    return ("security", namespace)


def workload_entries(namespace: str) -> tuple:
    return ("workload-entries", namespace)


def service_entry(namespace: str, name: str) -> tuple:
    return ("service-entry", namespace, name)


def secret(namespace: str, name: str) -> tuple:
    return ("secret", namespace, name)


def configmap(namespace: str, name: str) -> tuple:
    return ("configmap", namespace, name)


def telemetry(namespace: str) -> tuple:
    return ("telemetry", namespace)


def wasm(namespace: str) -> tuple:
    return ("wasm", namespace)


def kind(k: str) -> tuple:
    return ("kind", k)


class Deps:
    """What one generated result read. Mutable only while it is being recorded."""

    __slots__ = ("_flat", "children", "facets", "named", "scopes")

    def __init__(self) -> None:
        # Made per generated result and, for EDS, per resource: the lists start empty as ().
        self.facets: set[tuple] = set()
        self.children: list[Deps] | tuple[()] = ()  # memoized sub-results it used (shared Deps)
        self.scopes: list[Entry[Sidecar]] | tuple[()] = ()  # Sidecars whose egress it evaluated over every service
        # Per resource name, for types pushed resource by resource (EDS): name -> its Deps.
        self.named: dict[str, Deps] | None = None
        self._flat: tuple[set[tuple], tuple[Entry[Sidecar], ...]] | None = None

    def flattened(self) -> tuple[set[tuple], tuple[Entry[Sidecar], ...]]:
        """The facets and Sidecar scopes of this result and every memoized sub-result it used,
        in one set and one tuple. Worked out once, when first matched: a result is matched only
        once it is held, and recording into it is over by then. A change meets a result when it
        meets any part of it, so this answers what walking the children would (a namespace's
        CDS has a child per service: a thousand calls per result, per push, walked again)."""
        flat = self._flat
        if flat is None:
            if not self.children:
                flat = (self.facets, tuple(self.scopes))
            else:
                facets = set(self.facets)
                scopes = list(self.scopes)
                for child in self.children:
                    child_facets, child_scopes = child.flattened()
                    facets |= child_facets
                    scopes.extend(sc for sc in child_scopes if sc not in scopes)
                flat = (facets, tuple(scopes))
            self._flat = flat
        return flat

    def add_child(self, child: Deps) -> None:
        children = self.children
        if not children:
            self.children = [child]
        elif children[-1] is not child:  # the same memo asked twice in a row: once is enough
            children.append(child)

    def all_facets(self) -> set[tuple]:
        """Every facet, children and named resources included (for /debug/explain)."""
        out: set[tuple] = set()
        seen: set[int] = set()
        stack = [self]
        while stack:
            d = stack.pop()
            if id(d) in seen:
                continue
            seen.add(id(d))
            out |= d.facets
            out |= {("sidecar-egress", s.key.namespace, s.key.name) for s in d.scopes}
            stack.extend(d.children)
            if d.named:
                stack.extend(d.named.values())
        return out


# Deps of something that read nothing the Store holds (only the mesh, which meets everything).
NOTHING = Deps()


def merged_named(old: Deps | None, partial: Deps) -> Deps:
    """After a push of some resources of a per-resource type: the old Deps with those resources'
    Deps replaced (the rest of what the proxy holds still rests on what it read before)."""
    if old is None or not old.named:
        return partial
    out = Deps()
    out.facets = old.facets | partial.facets
    out.children = [*old.children, *(c for c in partial.children if all(c is not o for o in old.children))]
    out.scopes = [*old.scopes, *(s for s in partial.scopes if s not in old.scopes)]
    out.named = {**old.named, **(partial.named or {})}
    return out


def describe(f: tuple) -> str:
    """A facet as an operator reads it in /debug/explain."""
    what, *args = f
    labels = {
        "host": "Service or ServiceEntry with host {}",
        "services": "every Service and ServiceEntry",
        "ns-services": "every Service and ServiceEntry in namespace {}",
        "slices": "EndpointSlices of Service {}/{}",
        "pod": "Pod/{}/{}",
        "node": "Node/{} (its topology labels: endpoint locality)",
        "ns-pods": "every Pod in namespace {} (a workloadSelector over them)",
        "sans": "the service accounts of the Pods behind {}",
        "dr": "DestinationRules for host {}",
        "dr*": "DestinationRules with a wildcard host",
        "dr-all": "every DestinationRule",
        "vs": "VirtualServices for host {}",
        "vs*": "VirtualServices with a wildcard host",
        "sidecars": "Sidecars in namespace {}",
        "envoyfilters": "EnvoyFilters in namespace {} (without targetRefs)",
        "envoyfilters-gateway": "EnvoyFilters in namespace {} with targetRefs to Gateway {}",
        "sidecar-egress": "every Service the egress hosts of Sidecar/{}/{} may name",
        "security": "PeerAuthentication, AuthorizationPolicy, RequestAuthentication in namespace {}",
        "jwks": "keys fetched for RequestAuthentication jwksUri",
        "workload-entries": "WorkloadEntries in namespace {}",
        "service-entry": "ServiceEntry/{}/{}",
        "secret": "Secret/{}/{}",
        "gateways": "Gateways and the VirtualServices bound to them",
        "grants": "ReferenceGrants for gateway credentials",
        "sessions": "whether some mesh route sets a session",
        "telemetry": "Telemetries in namespace {}",
        "wasm": "WasmPlugins in namespace {}",
        "kind": "every {}",
        "ambient": "every object ztunnel's workload index reads (Pods, Namespaces, Nodes, Services, ...)",
        "networks": "the network gateways (meshNetworks, Services labelled topology.istio.io/network) and "
                    "the system namespace's network",
    }
    text = labels.get(what)
    return text.format(*args) if text is not None else repr(f)


# --- changes ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    """What one (merged) push changed, as facets; `everything` for the mesh."""

    facets: frozenset[tuple] = frozenset()
    services: tuple[tuple[str, str], ...] = ()  # (namespace, hostname) of services that changed
    everything: bool = False
    keys: frozenset[ConfigKey] = field(default_factory=frozenset)


def _diff(old: Mapping, new: Mapping) -> list:
    """Keys whose values differ (entries compare by key and revision; identical objects first)."""
    out = []
    for k, v in new.items():
        w = old.get(k)
        if w is not v and w != v:
            out.append(k)
    out.extend(k for k in old if k not in new)
    return out


def change_of(keys: Iterable[ConfigKey], old, new, *, mesh_changed: bool, service_endpoints_kind: str,
              ambient_kinds: frozenset[str]) -> Change:
    """The facets a push touches: those of the changed config keys, and those of the context
    indexes that differ between `old` and `new` (what translations and precedence made of the
    objects: the services by host, the traffic rules by host, the gateway bindings)."""
    keys = frozenset(keys)
    if mesh_changed or old is None:
        return Change(everything=True, keys=keys)
    facets: set[tuple] = set()
    for k in keys:
        facets.add(kind(k.kind))
        if k.kind == service_endpoints_kind:
            facets.add(slices(k.namespace, k.name))
        elif k.kind == "Pod":
            facets.update((pod(k.namespace, k.name), ns_pods(k.namespace)))
        elif k.kind == "Node":
            facets.add(node(k.name))
        elif k.kind == "Sidecar":
            facets.add(sidecars(k.namespace))
        elif k.kind == "EnvoyFilter":
            facets.update(envoy_filter_change(k, old, new))
        elif k.kind in ("PeerAuthentication", "AuthorizationPolicy", "RequestAuthentication"):
            facets.add(security(k.namespace))
        elif k.kind == "WorkloadEntry":
            facets.add(workload_entries(k.namespace))
        elif k.kind == "ServiceEntry":
            facets.add(service_entry(k.namespace, k.name))
        elif k.kind == "Secret":
            facets.add(secret(k.namespace, k.name))
        elif k.kind == "ConfigMap":
            facets.add(configmap(k.namespace, k.name))
        elif k.kind == "JWKS":
            facets.add(JWKS)
        elif k.kind == "Telemetry":
            facets.add(telemetry(k.namespace))
        elif k.kind == "WasmPlugin":
            facets.add(wasm(k.namespace))
        if k.kind in ambient_kinds:
            facets.add(AMBIENT)
    services: list[tuple[str, str]] = []
    if new is not old and old.by_host is not new.by_host:  # an endpoint push keeps the services
        for h in _diff(old.by_host, new.by_host):
            svc = new.by_host.get(h) or old.by_host.get(h)
            facets.update((host(h), ns_services(svc.namespace), ALL_SERVICES))
            services.append((svc.namespace, h))
    oa, na = getattr(old, "auto_addresses", None), getattr(new, "auto_addresses", None)
    if oa is not na and oa is not None and na is not None:
        # A ServiceEntry host's auto-allocated address moves when an older one it collided with
        # goes (collisions resolve in age order): the DNS-capturing proxies that see the host
        # (Sidecar-scoped ones included) must regenerate though its ServiceEntry did not change.
        for ns, h in _diff(oa, na):
            facets.update((host(h), ns_services(ns), ALL_SERVICES))
            if (ns, h) not in services:
                services.append((ns, h))
    facets.update(_identities_changed(keys, old, new, service_endpoints_kind))
    if new is not old:
        ot, nt = old.traffic, new.traffic
        if ot is not nt:
            for h in _diff(ot.destination_rules, nt.destination_rules):
                facets.update((destination_rule(h), DR_ALL))
                if h.startswith("*"):
                    facets.add(DR_WILDCARD)
            for h in _diff(ot.virtual_services, nt.virtual_services):
                facets.add(virtual_service(h))
                if h.startswith("*"):
                    facets.add(VS_WILDCARD)
            for h, _ns in _diff(ot.consumer_routes, nt.consumer_routes):
                facets.add(virtual_service(h))
        og, ng = old.gateways, new.gateways
        if og is not ng and (og.gateways != ng.gateways or _diff(og.virtual_services, ng.virtual_services)):
            facets.add(GATEWAYS)
        if old.gateway_api.credentials != new.gateway_api.credentials:
            facets.add(GRANTS)
        if old.gateway_api.mesh_sessions != new.gateway_api.mesh_sessions:
            facets.add(SESSIONS)
        if old.networks != new.networks:
            facets.add(NETWORKS)
    return Change(frozenset(facets), tuple(services), False, keys)


def _identities_changed(keys: frozenset[ConfigKey], old, new, service_endpoints_kind: str) -> set[tuple]:
    """("sans", HOST) for the Kubernetes services whose workload identities (the service
    accounts of their endpoints' Pods, what mTLS clients verify) differ: only the services
    whose EndpointSlices changed or whose slices name a changed Pod are compared."""
    candidates = {(k.namespace, k.name) for k in keys if k.kind == service_endpoints_kind}
    # A WorkloadEntry a Kubernetes Service selects is one of its workloads too.
    we_namespaces = {k.namespace for k in keys if k.kind == "WorkloadEntry"}
    if we_namespaces:
        for ctx in (old, new):
            candidates.update((s.namespace, s.name) for s in ctx.services
                              if s.kind == "Service" and s.selector and s.namespace in we_namespaces)
    pods = {(k.namespace, k.name) for k in keys if k.kind == "Pod"}
    if pods:
        for ctx in (old, new):
            for (ns, name), entries in ctx.slices.items():
                if (ns, name) in candidates:
                    continue
                for e in entries:
                    if any(ep.target_ref is not None and ep.target_ref.kind == "Pod"
                           and (ep.target_ref.namespace or ns, ep.target_ref.name) in pods
                           for ep in e.obj.endpoints):
                        candidates.add((ns, name))
                        break
    out = set()
    for ns, name in candidates:
        h = f"{name}.{ns}.svc.{new.domain}"
        a, b = old.by_host.get(h), new.by_host.get(h)
        if a is None or b is None or a.kind != "Service" or b.kind != "Service":
            continue  # the service itself came or went: its host facets say so
        if old.service_accounts(a) != new.service_accounts(b):
            out.add(("sans", h))
    return out


class Matcher:
    """Does a change meet a result's Deps? Each distinct Deps (shared by every proxy given the
    same result) is matched once per push."""

    def __init__(self, change: Change) -> None:
        self.change = change
        self._seen: dict[int, tuple[Deps, bool]] = {}
        self._scopes: dict[Entry[Sidecar], bool] = {}
        self._named: dict[int, tuple[Deps, frozenset[str]]] = {}
        # A wildcard-host rule changed: it may now claim any host looked up (lookups record only
        # their own host, so the common case costs one facet per lookup).
        self._wild = frozenset(w for w, f in (("dr", DR_WILDCARD), ("vs", VS_WILDCARD)) if f in change.facets)

    def meets(self, d: Deps) -> bool:
        if self.change.everything:
            return True
        hit = self._seen.get(id(d))
        if hit is not None and hit[0] is d:
            return hit[1]
        facets, scopes = d.flattened()
        out = (not facets.isdisjoint(self.change.facets)
               or (self._wild and any(f[0] in self._wild for f in facets))
               or any(self._scope(s) for s in scopes))
        self._seen[id(d)] = (d, out)
        return out

    def _scope(self, sidecar: Entry[Sidecar]) -> bool:
        found = self._scopes.get(sidecar)
        if found is None:
            found = any(egress_names(sidecar, ns, h) for ns, h in self.change.services)
            self._scopes[sidecar] = found
        return found

    def names(self, d: Deps) -> frozenset[str] | None:
        """For a per-resource Deps: the resource names the change meets; None when the change
        meets what the whole result read (every resource then)."""
        if self.meets(d):
            return None
        hit = self._named.get(id(d))
        if hit is not None and hit[0] is d:
            return hit[1]
        out = frozenset(n for n, nd in (d.named or {}).items() if self.meets(nd))
        self._named[id(d)] = (d, out)
        return out


# The whole of a type (None) or some of its resources (names); types left out are not pushed.
Scope = Mapping[str, frozenset[str] | None]


def push_scope(matcher: Matcher, held: Mapping[str, Deps | None], cluster_type: str,
               endpoint_type: str) -> dict[str, frozenset[str] | None]:
    """Which of a proxy's types (and, per resource, which names) a change must regenerate.
    `held`: per watched type, the Deps of what the proxy was last given (None: nothing yet,
    so it is pushed). A pushed CDS takes the whole EDS along: Envoy re-creates changed
    clusters and keeps them warming until their endpoints are sent again."""
    out: dict[str, frozenset[str] | None] = {}
    for type_url, d in held.items():
        if d is None:
            out[type_url] = None
        elif d.named is not None:
            names = matcher.names(d)
            if names is None or names:
                out[type_url] = names
        elif matcher.meets(d):
            out[type_url] = None
    if cluster_type in out and endpoint_type in held:
        out[endpoint_type] = None
    return out


def merge_scopes(a: Scope | None, b: Scope | None) -> Scope | None:
    """Union; None is "every watched type, whole"."""
    if a is None or b is None:
        return None
    out = dict(a)
    for t, names in b.items():
        if t in out:
            mine = out[t]
            out[t] = None if mine is None or names is None else mine | names
        else:
            out[t] = names
    return out
