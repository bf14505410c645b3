"""Which EnvoyFilter patches a proxy gets, in istiod's order (pilot/pkg/model/envoyfilter.go).

An EnvoyFilter in the root namespace applies to every proxy its workloadSelector selects, one in
another namespace to that namespace's proxies; no selector selects all of them. Patches apply in
order of `priority`, then age (creationTimestamp), root namespace first on ties, then name, so the
order is the same on every replica. Proxy-level conditions (`match.proxy`: version regex and
metadata) are evaluated here, once per proxy and push; what remains to match (listener, route
configuration, cluster, context) depends only on the generated resource, so the result of applying
a patch list to a resource is shared by every proxy given that list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pilot.config.networking.envoy_filter import EnvoyConfigObjectPatch
from pilot.model.labels import selects
from pilot.model.proxy import Proxy
from pilot.model.store import ConfigKey, Entry


@dataclass(frozen=True, slots=True)
class PatchRef:
    """One configPatch of one EnvoyFilter revision. Entries compare by key and revision, so a
    PatchRef is a cache-key input that stays equal across pushes while the object is unchanged."""

    entry: Entry
    index: int

    @property
    def patch(self) -> EnvoyConfigObjectPatch:
        return self.entry.obj.spec.config_patches[self.index]  # type: ignore[attr-defined]

    @property
    def origin(self) -> str:
        return f"EnvoyFilter/{self.entry.key.namespace}/{self.entry.key.name}"


ProxyPatches = tuple[PatchRef, ...]
NO_PATCHES: ProxyPatches = ()


def index(entries: list[Entry], disabled: frozenset[tuple[ConfigKey, int]] = frozenset()
          ) -> Mapping[str, tuple[Entry, ...]]:
    """EnvoyFilters by namespace, without the revisions a proxy rejected (see DiscoveryServer)."""
    out: dict[str, list[Entry]] = {}
    for e in entries:
        if (e.key, e.revision) not in disabled:
            out.setdefault(e.key.namespace, []).append(e)
    return out


def select(by_namespace: Mapping[str, tuple[Entry, ...]] | Mapping[str, list[Entry]], root_namespace: str,
           proxy: Proxy) -> ProxyPatches:
    labels = proxy.labels
    chosen: list[tuple[tuple, Entry]] = []
    for ns in dict.fromkeys((root_namespace, proxy.namespace)):
        for e in by_namespace.get(ns, ()):
            spec = e.obj.spec  # type: ignore[attr-defined]
            sel = spec.workload_selector
            if sel is not None and sel.labels and not selects(sel.labels, labels):
                continue
            order = (spec.priority, e.obj.metadata.creation_timestamp, ns != root_namespace, e.key.name)
            chosen.append((order, e))
    if not chosen:
        return NO_PATCHES
    chosen.sort(key=lambda t: t[0])
    version = proxy.istio_version
    out = []
    for _, e in chosen:
        for i, p in enumerate(e.obj.spec.config_patches):  # type: ignore[attr-defined]
            if _proxy_matches(p, proxy, version):
                out.append(PatchRef(e, i))
    return tuple(out)


def _proxy_matches(p: EnvoyConfigObjectPatch, proxy: Proxy, version: str) -> bool:
    m = p.match.proxy
    if m is None:
        return True
    regex = p.version_regex
    if regex is not None and not regex.search(version):
        return False
    meta = proxy.metadata
    return all(str(meta.get(k, "")) == v for k, v in m.metadata.items()) if m.metadata else True
