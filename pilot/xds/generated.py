"""Generator output shared by every proxy with the same traits and subscription in one push.

A push to 1,000 sidecars in ten namespaces runs each generator ten times, not a thousand: the
memo is keyed by (type, proxy traits, requested names) and lives as long as the PushContext.
The assembled bytes of a SotW response body are shared too; each proxy adds only its nonce.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping

from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.xds.cache import CachedResource, XdsCache


@dataclass(eq=False)
class Generated:
    resources: tuple[CachedResource, ...]
    _versions: dict[str, str] | None = field(default=None, repr=False)
    _sotw_fields: bytes | None = field(default=None, repr=False)

    def versions(self) -> Mapping[str, str]:
        """name -> version. Shared by every proxy given this output: read-only by convention."""
        if self._versions is None:
            self._versions = {r.name: r.version for r in self.resources}
        return self._versions

    def sotw_fields(self) -> bytes:
        if self._sotw_fields is None:
            self._sotw_fields = b"".join(r.sotw_field for r in self.resources)
        return self._sotw_fields


Generator = Callable[[PushContext, Proxy, frozenset[str] | None, XdsCache], list[CachedResource]]


class GenerationMemo:
    def __init__(self, generators: Mapping[str, Generator], cache: XdsCache) -> None:
        self.generators = generators
        self.cache = cache
        self._version: str | None = None
        self._memo: dict[Hashable, Generated] = {}
        self._diffs: dict[tuple[int, int], tuple[Mapping, Generated, frozenset[str]]] = {}
        self.hits = 0
        self.misses = 0

    def generate(self, ctx: PushContext, type_url: str, proxy: Proxy,
                 requested: frozenset[str] | None) -> Generated:
        if ctx.version != self._version:
            self._memo = {}
            self._diffs = {}
            self._version = ctx.version
        # Generators read nothing of a proxy but its traits: the traits are the whole key.
        key = (type_url, proxy.traits, requested)
        out = self._memo.get(key)
        if out is None:
            self.misses += 1
            out = Generated(tuple(self.generators[type_url](ctx, proxy, requested, self.cache)))
            self._memo[key] = out
        else:
            self.hits += 1
        return out

    def changed(self, held: Mapping[str, str], new: Generated) -> frozenset[str]:
        """Names in `new` whose version differs from `held` (what a proxy has). Proxies that held
        the same shared version map get the same answer without comparing again."""
        key = (id(held), id(new))
        hit = self._diffs.get(key)
        if hit is not None and hit[0] is held and hit[1] is new:
            return hit[2]
        result = frozenset(r.name for r in new.resources if held.get(r.name) != r.version)
        self._diffs[key] = (held, new, result)  # the references keep both ids from being reused
        return result
