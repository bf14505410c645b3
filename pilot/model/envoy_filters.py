"""Which EnvoyFilter patches a proxy gets, in istiod's order (pilot/pkg/model/envoyfilter.go).

An EnvoyFilter in the root namespace applies to every proxy its workloadSelector selects, one in
another namespace to that namespace's proxies; no selector selects all of them. One with
`targetRefs` applies only to the proxies of the Gateway API Gateways it names in its own namespace
(their `gateway.networking.k8s.io/gateway-name` label), never to a proxy without it, as istiod's
WorkloadPolicyMatcher decides (a root-namespace one is no exception). Patches apply in
istiod's order: `priority`, then the root namespace's before the proxy namespace's, then age
(creationTimestamp), then `name.namespace`, so the order is the same on every replica. Proxy-level conditions (`match.proxy`: version regex and
metadata) are evaluated here, once per proxy and push; what remains to match (listener, route
configuration, cluster, context) depends only on the generated resource, so the result of applying
a patch list to a resource is shared by every proxy given that list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pilot.config.networking.envoy_filter import EnvoyConfigObjectPatch, EnvoyFilter
from pilot.model.labels import GATEWAY_API_GROUP, GATEWAY_NAME_LABEL, selects, targets_gateway_of
from pilot.model.proxy import Proxy
from pilot.model.store import ConfigKey, Entry


@dataclass(frozen=True, slots=True, eq=False)
class PatchRef:
    """One configPatch of one EnvoyFilter revision, as a cache-key input that stays equal across
    pushes while the object is unchanged: equal when it is the same parsed object (the Store
    keeps the object of an unchanged entry), which is stronger than equal (key, revision) across
    Stores (tests build several). The reference keeps the object, so its id is not reused."""

    entry: Entry[EnvoyFilter]
    index: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PatchRef) and self.index == other.index and self.entry.obj is other.entry.obj

    def __hash__(self) -> int:
        return hash((id(self.entry.obj), self.index))

    @property
    def patch(self) -> EnvoyConfigObjectPatch:
        return self.entry.obj.spec.config_patches[self.index]

    @property
    def origin(self) -> str:
        return f"EnvoyFilter/{self.entry.key.namespace}/{self.entry.key.name}"


class PatchSet:
    """The patches one proxy gets, in order: equal sets are one interned object (its hash kept),
    so it is a cheap cache-key and memo-key input, and what was worked out for a resource given
    this set (`memo`: which patches meet it) is reused by every proxy and push given the same set."""

    __slots__ = ("_hash", "memo", "refs")

    def __init__(self, refs: tuple[PatchRef, ...]) -> None:
        self.refs = refs
        self._hash = hash(refs)
        self.memo: dict = {}

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, PatchSet) and self.refs == other.refs)

    def __hash__(self) -> int:
        return self._hash

    def __bool__(self) -> bool:
        return bool(self.refs)

    def __len__(self) -> int:
        return len(self.refs)

    def __iter__(self):
        return iter(self.refs)

    def __repr__(self) -> str:
        return f"PatchSet({', '.join(f'{r.origin}#{r.index}' for r in self.refs)})"

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.origin for r in self.refs))


_INTERNED: dict[tuple[PatchRef, ...], PatchSet] = {}
_MAX_INTERNED = 4096  # distinct patch lists alive at once; beyond it, start over (only a memo is lost)


def patch_set(refs: tuple[PatchRef, ...]) -> PatchSet:
    found = _INTERNED.get(refs)
    if found is None:
        if len(_INTERNED) >= _MAX_INTERNED:
            _INTERNED.clear()
        found = _INTERNED[refs] = PatchSet(refs)
    return found


NO_PATCHES = patch_set(())
ProxyPatches = PatchSet


def index(entries: list[Entry[EnvoyFilter]], disabled: frozenset[tuple[ConfigKey, int]] = frozenset()
          ) -> Mapping[str, tuple[Entry[EnvoyFilter], ...]]:
    """EnvoyFilters by namespace, without the revisions a proxy rejected (see DiscoveryServer)."""
    out: dict[str, list[Entry[EnvoyFilter]]] = {}
    for e in entries:
        if (e.key, e.revision) not in disabled:
            out.setdefault(e.key.namespace, []).append(e)
    return {ns: tuple(v) for ns, v in out.items()}


def select(by_namespace: Mapping[str, tuple[Entry[EnvoyFilter], ...]] | Mapping[str, list[Entry[EnvoyFilter]]], root_namespace: str,
           proxy: Proxy) -> ProxyPatches:
    labels = proxy.labels
    chosen: list[tuple[tuple, Entry[EnvoyFilter]]] = []
    for ns in dict.fromkeys((root_namespace, proxy.namespace)):
        for e in by_namespace.get(ns, ()):
            spec = e.obj.spec
            if spec.target_refs:
                if not targets_gateway_of(spec.target_refs, ns, proxy.namespace, labels):
                    continue
            else:
                sel = spec.workload_selector
                if sel is not None and sel.labels and not selects(sel.labels, labels):
                    continue
            # istiod's order: priority, the root namespace's first, age, then name.namespace.
            order = (spec.priority, ns != root_namespace, e.obj.metadata.creation_timestamp,
                     f"{e.key.name}.{e.key.namespace}")
            chosen.append((order, e))
    if not chosen:
        return NO_PATCHES
    chosen.sort(key=lambda t: t[0])
    version = proxy.istio_version
    out = []
    for _, e in chosen:
        for i, p in enumerate(e.obj.spec.config_patches):
            if _proxy_matches(p, proxy, version):
                out.append(PatchRef(e, i))
    return patch_set(tuple(out))


def gateway_targets(e: Entry[EnvoyFilter]) -> frozenset[str] | None:
    """The names of the Gateways an EnvoyFilter's targetRefs name (their proxies are all it can
    select); None when it has no targetRefs (it selects by workloadSelector, or everything)."""
    refs = e.obj.spec.target_refs
    if not refs:
        return None
    return frozenset(r.name for r in refs if r.kind == "Gateway" and r.group == GATEWAY_API_GROUP)


def gateway_name(proxy: Proxy) -> str | None:
    """The Gateway API Gateway whose proxy this is (what targetRefs select on), if any."""
    return proxy.labels.get(GATEWAY_NAME_LABEL)


def metadata_keys(by_namespace: Mapping[str, tuple[Entry[EnvoyFilter], ...]]) -> tuple[str, ...]:
    """Every node metadata key some patch's `match.proxy.metadata` tests."""
    keys = {k for entries in by_namespace.values() for e in entries
            for p in e.obj.spec.config_patches
            if p.match.proxy is not None for k in p.match.proxy.metadata}
    return tuple(sorted(keys))


def _proxy_matches(p: EnvoyConfigObjectPatch, proxy: Proxy, version: str) -> bool:
    m = p.match.proxy
    if m is None:
        return True
    regex = p.version_regex
    # A proxy that sends no ISTIO_VERSION never matches a version regex (istiod's proxyMatch).
    if regex is not None and (not version or not regex.search(version)):
        return False
    meta = proxy.metadata
    return all(str(meta.get(k, "")) == v for k, v in m.metadata.items()) if m.metadata else True


def waypoint_target_problems(by_namespace: Mapping[str, tuple[Entry[EnvoyFilter], ...]],
                             waypoints: Iterable[tuple[str, str]]) -> list[dict]:
    """EnvoyFilters whose targetRefs name a waypoint (a Gateway of class istio-waypoint): istiod
    would patch it; waypoints here get no EnvoyFilter patches, so say so (/debug/push_status)
    rather than leave the filter silently without effect. `waypoints`: (namespace, name)."""
    known = set(waypoints)
    out = []
    for ns, entries in by_namespace.items():
        for e in entries:
            for name in sorted(gateway_targets(e) or ()):
                if (ns, name) in known:
                    out.append({"envoyFilter": f"EnvoyFilter/{ns}/{e.key.name}", "gateway": f"{ns}/{name}",
                                "reason": "targetRefs names a waypoint; EnvoyFilter patches are not applied to "
                                          "waypoints by this control plane, so it has no effect there"})
    return out
