"""Which security policies apply to a workload: an immutable index built from the Store per push.

Selection follows istiod (pilot/pkg/model/authentication.go, authorization.go, policyattachment.go):

- AuthorizationPolicy and RequestAuthentication: the policies of the workload's namespace and of
  the root namespace (which therefore apply mesh-wide). A policy without selector or targetRef
  selects every workload in its namespace; a `selector.matchLabels` selects the workloads whose
  labels include it; a `targetRef(s)` selects only a Kubernetes Gateway's proxies (kind Gateway,
  same namespace, the proxy's `gateway.networking.k8s.io/gateway-name` label) — Service and
  ServiceEntry targets are for waypoints, so sidecars never pick them up.
- PeerAuthentication: the effective mTLS mode is composed from at most one mesh-level policy (root
  namespace, no selector), one namespace-level policy (no selector) and one workload-level policy
  (selector, not in the root namespace); at each level the oldest wins (creationTimestamp, then
  name). The narrowest level that says something wins, and UNSET inherits from the level above,
  down to port level (`portLevelMtls` of the workload policy, keyed by the workload's port).
  Nothing at all means PERMISSIVE.

Everything a caller gets back is hashable and equal for equal inputs, so it can be a cache-key
argument of the builders that read it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import urlsplit

from pilot.config.security import AuthorizationPolicy, PeerAuthentication, RequestAuthentication
from pilot.model.ext_authz import ResolvedExtAuthz
from pilot.model.ext_authz import for_workload as ext_authz_for_workload
from pilot.model.labels import selects, targets_gateway_of
from pilot.model.store import Entry, ObjT, Store

# The kinds that select workloads with `selector` (matchLabels).
_Policy = PeerAuthentication | AuthorizationPolicy | RequestAuthentication

STRICT, PERMISSIVE, DISABLE, UNSET = "STRICT", "PERMISSIVE", "DISABLE", "UNSET"
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
GATEWAY_API_GROUP = "gateway.networking.k8s.io"


def jwks_uri_host_port(uri: str) -> tuple[str, int] | None:
    """istiod's ParseJwksURI: (host, port) of an http(s) URI, the scheme's port by default."""
    parsed = urlsplit(uri)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    try:
        port = parsed.port
    except ValueError:
        return None
    return parsed.hostname, port or (443 if parsed.scheme == "https" else 80)


def jwks_fallback_cluster(uri: str) -> str | None:
    hp = jwks_uri_host_port(uri)
    return None if hp is None else f"outbound|{hp[1]}||{hp[0]}"


def jwks_source(rule) -> str | None:
    """Where a JWT rule's keys come from when not inline: its jwksUri, else its issuer (OpenID
    discovery). None for inline keys."""
    if rule.jwks:
        return None
    return rule.jwks_uri or rule.issuer or None


@dataclass(frozen=True)
class JwksSnapshot:
    """What the JWKS resolver (pilot/security/jwks.py) holds: keys and last errors by source."""

    keys: Mapping[str, str] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)


def _age(e: Entry) -> tuple[str, str, str]:
    """istiod's order: creationTimestamp, then name, then namespace (file mode has no timestamps)."""
    return (e.obj.metadata.creation_timestamp, e.key.name, e.key.namespace)


def _match_labels(e: Entry[_Policy]) -> dict[str, str]:
    selector = e.obj.spec.selector
    return selector.match_labels if selector is not None else {}


@dataclass(frozen=True)
class MtlsPolicy:
    """The effective mTLS settings of one workload: a mode and per-port overrides."""

    mode: str = PERMISSIVE
    ports: tuple[tuple[int, str], ...] = ()  # (workload port, mode), sorted by port

    def for_port(self, port: int) -> str:
        for p, mode in self.ports:
            if p == port:
                return mode
        return self.mode


@dataclass(frozen=True)
class WorkloadPolicies:
    """The AuthorizationPolicies (by action) and RequestAuthentications selecting one workload.

    Entries hash by (key, revision), so a changed policy changes the value; `jwks` carries the
    keys fetched for the rules without inline keys, as (source, JWKS text) sorted by source, where
    the source is the rule's jwksUri or, without one, its issuer."""

    custom: tuple[Entry[AuthorizationPolicy], ...] = ()
    deny: tuple[Entry[AuthorizationPolicy], ...] = ()
    allow: tuple[Entry[AuthorizationPolicy], ...] = ()
    audit: tuple[Entry[AuthorizationPolicy], ...] = ()
    request_authentications: tuple[Entry[RequestAuthentication], ...] = ()
    jwks: tuple[tuple[str, str], ...] = ()
    # The ext_authz provider the CUSTOM policies name (its `error` set: they deny); None without CUSTOM.
    ext_authz: ResolvedExtAuthz | None = None
    # PILOT_JWT_ENABLE_REMOTE_JWKS: (jwksUri, cluster) of the rules whose keys Envoy fetches itself
    # (remote_jwks); the other rules' keys are inlined from `jwks`.
    remote_jwks: tuple[tuple[str, str], ...] = ()

    @property
    def authorization_policies(self) -> tuple[Entry[AuthorizationPolicy], ...]:
        return self.custom + self.deny + self.audit + self.allow

    @property
    def empty(self) -> bool:
        return not self.authorization_policies and not self.request_authentications

    @property
    def origins(self) -> tuple[str, ...]:
        """`Kind/namespace/name` of every policy applied, for /debug explain."""
        return tuple(f"{e.key.kind}/{e.key.namespace}/{e.key.name}"
                     for e in self.authorization_policies + self.request_authentications)

    def remote_cluster(self, jwks_uri: str) -> str | None:
        for uri, cluster in self.remote_jwks:
            if uri == jwks_uri:
                return cluster
        return None

    def jwks_for(self, source: str) -> str | None:
        for src, text in self.jwks:
            if src == source:
                return text
        return None


NO_POLICIES = WorkloadPolicies()


@dataclass(frozen=True)
class SecurityIndex:
    root_namespace: str = "istio-system"
    # by namespace, oldest first
    peer_authentications: Mapping[str, tuple[Entry[PeerAuthentication], ...]] = field(default_factory=dict)
    authorization_policies: Mapping[str, tuple[Entry[AuthorizationPolicy], ...]] = field(default_factory=dict)
    request_authentications: Mapping[str, tuple[Entry[RequestAuthentication], ...]] = field(default_factory=dict)
    # keys fetched at the edge (pilot/security/jwks.py) by source; a missing source is not fetched
    jwks: JwksSnapshot = field(default_factory=JwksSnapshot)
    # MeshConfig's ext_authz extension providers by name, resolved against the registry
    ext_authz: Mapping[str, ResolvedExtAuthz] = field(default_factory=dict)
    # PILOT_JWT_ENABLE_REMOTE_JWKS as istiod reads it: "istiod" (false), "hybrid" (true), "envoy";
    # `jwks_clusters`: jwksUri -> the outbound cluster of the mesh service it names.
    jwks_mode: str = "istiod"
    jwks_clusters: Mapping[str, str] = field(default_factory=dict)
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, store: Store, root_namespace: str, jwks: JwksSnapshot | None = None,
              ext_authz: Mapping[str, ResolvedExtAuthz] | None = None, jwks_mode: str = "istiod",
              jwks_cluster: Callable[[str], str | None] | None = None) -> SecurityIndex:
        """`jwks_cluster(uri)`: the mesh cluster serving a jwksUri (None: not a mesh service)."""
        authns = store.list(RequestAuthentication)
        clusters: dict[str, str] = {}
        if jwks_mode != "istiod" and jwks_cluster is not None:
            for e in authns:
                for r in e.obj.spec.rules:
                    if r.jwks_uri and r.jwks_uri not in clusters and (c := jwks_cluster(r.jwks_uri)):
                        clusters[r.jwks_uri] = c
        return cls(root_namespace,
                   _by_namespace(store.list(PeerAuthentication)),
                   _by_namespace(store.list(AuthorizationPolicy)),
                   _by_namespace(authns),
                   jwks or JwksSnapshot(),
                   MappingProxyType(dict(ext_authz or {})), jwks_mode, MappingProxyType(clusters))

    def remote_jwks(self, authns: list[Entry[RequestAuthentication]]) -> tuple[tuple[str, str], ...]:
        """istiod's policy_applier choice per rule with a jwksUri: a mesh service behind it is
        fetched by Envoy (hybrid and envoy modes); otherwise hybrid falls back to istiod fetching
        and envoy mode still tells Envoy to fetch, through `outbound|PORT||HOST` (a cluster that
        exists only once a ServiceEntry registers the JWKS server, as istiod logs)."""
        if self.jwks_mode == "istiod":
            return ()
        out: dict[str, str] = {}
        for e in authns:
            for r in e.obj.spec.rules:
                if not r.jwks_uri or r.jwks_uri in out:
                    continue
                cluster = self.jwks_clusters.get(r.jwks_uri)
                if cluster is None and self.jwks_mode == "envoy":
                    cluster = jwks_fallback_cluster(r.jwks_uri)
                if cluster is not None:
                    out[r.jwks_uri] = cluster
        return tuple(sorted(out.items()))

    # --- mutual TLS ---------------------------------------------------------------------------
    def mtls_policy(self, namespace: str, labels: Mapping[str, str]) -> MtlsPolicy:
        """The workload's effective PeerAuthentication, composed as istiod does (once per
        namespace and label set: inbound plans and auto mTLS ask per port and per cluster)."""
        memo_key = ("mtls", namespace, frozenset(labels.items()))
        found = self._memo.get(memo_key)
        if found is None:
            found = self._memo[memo_key] = self._mtls_policy(namespace, labels)
        return found

    def _mtls_policy(self, namespace: str, labels: Mapping[str, str]) -> MtlsPolicy:
        mesh, namespace_level, workload = peer_authentication_levels(
            self.peer_authentications, namespace, labels, self.root_namespace)
        mode = PERMISSIVE
        for e in (mesh, namespace_level, workload):
            if e is not None and e.obj.spec.mode != UNSET:
                mode = e.obj.spec.mode
        ports: tuple[tuple[int, str], ...] = ()
        if workload is not None:
            ports = tuple(sorted((p, mode if m == UNSET else m)
                                 for p, m in workload.obj.spec.port_modes().items()))
        return MtlsPolicy(mode, ports)

    def mtls_mode(self, namespace: str, labels: Mapping[str, str], port: int) -> str:
        return self.mtls_policy(namespace, labels).for_port(port)

    # --- authorization and request authentication -----------------------------------------------
    def for_workload(self, namespace: str, labels: Mapping[str, str]) -> WorkloadPolicies:
        memo_key = ("authz", namespace, frozenset(labels.items()))
        found = self._memo.get(memo_key)
        if found is None:
            found = self._select(namespace, labels)
            self._memo[memo_key] = found
        return found

    def _select(self, namespace: str, labels: Mapping[str, str]) -> WorkloadPolicies:
        lookup = (self.root_namespace,) if namespace == self.root_namespace else (self.root_namespace, namespace)
        by_action: dict[str, list[Entry[AuthorizationPolicy]]] = defaultdict(list)
        for ns in lookup:
            for e in self.authorization_policies.get(ns, ()):
                if _selects(e, namespace, labels):
                    by_action[e.obj.spec.action].append(e)
        authns = [e for ns in lookup for e in self.request_authentications.get(ns, ()) if _selects(e, namespace, labels)]
        keys = self.jwks.keys
        sources = sorted({src for e in authns for r in e.obj.spec.rules
                          if (src := jwks_source(r)) is not None and src in keys})
        if not by_action and not authns:
            return NO_POLICIES
        custom, deny, allow, audit = (tuple(sorted(by_action.get(a, ()), key=_age))
                                      for a in ("CUSTOM", "DENY", "ALLOW", "AUDIT"))
        provider = None
        if custom:
            names = [e.obj.spec.provider.name if e.obj.spec.provider else "" for e in custom]
            provider = ext_authz_for_workload(self.ext_authz, names)
        return WorkloadPolicies(custom, deny, allow, audit,
                                tuple(sorted(authns, key=_age)),
                                tuple((src, keys[src]) for src in sources), provider, self.remote_jwks(authns))

    # --- what cannot be honoured as written -----------------------------------------------------
    @property
    def problems(self) -> tuple[dict, ...]:
        """Policies this control plane applies differently from what they ask, with the reason
        (shown in /debug/configz): CUSTOM actions whose provider does not resolve (they deny)
        and JWKS URIs whose keys are not fetched."""
        out = []
        for entries in self.authorization_policies.values():
            for e in entries:
                spec = e.obj.spec
                if spec.action == "CUSTOM":
                    error = self.custom_problem(e)
                    if error:
                        out.append(_problem(e, error))
        for entries in self.request_authentications.values():
            for e in entries:
                remote = dict(self.remote_jwks([e]))
                for i, r in enumerate(e.obj.spec.rules):
                    src = jwks_source(r)
                    if src is None or src in self.jwks.keys or r.jwks_uri in remote:
                        continue  # inline keys, fetched keys, or Envoy fetches them itself
                    where = f"jwksUri {src}" if r.jwks_uri else f"issuer {src} (OpenID discovery)"
                    error = self.jwks.errors.get(src)
                    out.append(_problem(e, f"jwtRules[{i}]: the keys of {where} are not fetched "
                                           f"{'(' + error + ')' if error else '(yet)'}; tokens of issuer "
                                           f"{r.issuer!r} are rejected with 401 until they are"))
        return tuple(sorted(out, key=lambda p: (p["kind"], p["namespace"], p["name"], p["reason"])))


    def custom_problem(self, e: Entry[AuthorizationPolicy]) -> str:
        """Why a CUSTOM policy's provider cannot be used (empty when it can)."""
        provider = e.obj.spec.provider.name if e.obj.spec.provider else ""
        resolved = ext_authz_for_workload(self.ext_authz, [provider])
        if not resolved.error:
            return ""
        return (f"CUSTOM action: {resolved.error}; as istiod does, requests to the selected workloads "
                "are denied (default-deny-all-due-to-bad-CUSTOM-action)")


def _problem(e: Entry[_Policy], reason: str) -> dict:
    return {"kind": e.key.kind, "namespace": e.key.namespace, "name": e.key.name, "reason": reason}


def _selects(e: Entry[AuthorizationPolicy | RequestAuthentication], namespace: str, labels: Mapping[str, str]) -> bool:
    """istiod's WorkloadPolicyMatcher.ShouldAttachPolicy for a sidecar or gateway proxy."""
    spec = e.obj.spec
    refs = spec.target_references
    if not refs:
        return selects(_match_labels(e), labels)
    return targets_gateway_of(refs, e.key.namespace, namespace, labels)


def peer_authentication_levels(peer_authentications: Mapping[str, tuple[Entry[PeerAuthentication], ...]], namespace: str,
                               labels: Mapping[str, str], root_namespace: str
                               ) -> tuple[Entry[PeerAuthentication] | None, Entry[PeerAuthentication] | None,
                                      Entry[PeerAuthentication] | None]:
    """The PeerAuthentications in force for a workload at each level, the oldest at each: the
    mesh's (root namespace, no selector), its namespace's (no selector) and the workload's (a
    selector matching its labels). Sidecars and ztunnel compose them differently."""
    mesh = min((e for e in peer_authentications.get(root_namespace, ()) if not _match_labels(e)),
               key=_age, default=None)
    if namespace == root_namespace:
        return mesh, None, None
    local = peer_authentications.get(namespace, ())
    namespace_level = min((e for e in local if not _match_labels(e)), key=_age, default=None)
    workload = min((e for e in local if (sel := _match_labels(e)) and selects(sel, labels)), key=_age, default=None)
    return mesh, namespace_level, workload


def _by_namespace(entries: list[Entry[ObjT]]) -> Mapping[str, tuple[Entry[ObjT], ...]]:
    out: dict[str, list[Entry[ObjT]]] = defaultdict(list)
    for e in entries:
        out[e.key.namespace].append(e)
    return MappingProxyType({ns: tuple(sorted(v, key=_age)) for ns, v in out.items()})
