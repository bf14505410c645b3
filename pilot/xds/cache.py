"""The resource cache: each resource serialised once per set of inputs, shared by every proxy.

The cache key *is* the builder plus the exact arguments it is called with (all hashable frozen
values), so an input the key forgot cannot exist: the builder sees nothing else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import any_pb2
from google.protobuf.message import Message

from pilot.xds import wire


@dataclass(frozen=True, slots=True, eq=False)
class CachedResource:
    name: str
    version: str  # content hash: equal bytes, equal version, on every replica
    any_bytes: bytes  # serialised google.protobuf.Any
    # The framing around any_bytes as DiscoveryResponse.resources and as
    # DeltaDiscoveryResponse.resources (a Resource message: name, version, the Any, aliases).
    # Only the few bytes around it are kept: a framed copy per protocol would hold each
    # resource three times (a port's route configuration is half a megabyte).
    sotw_prefix: bytes
    delta_prefix: bytes
    origins: tuple[str, ...] = field(default=())  # config objects it was built from, for debugging
    delta_suffix: bytes = b""

    @classmethod
    def from_message(cls, name: str, msg: Message, type_url: str, origins: tuple[str, ...] = ()) -> CachedResource:
        value = msg.SerializeToString(deterministic=True)
        # google.protobuf.Any framed by hand (type_url = 1, value = 2: the bytes its serialiser
        # writes): building an Any copies the value in and serialising copies it out again,
        # 1-2 ms for a route configuration of a thousand virtual hosts.
        any_bytes = wire.string_field(1, type_url) + (wire.length_field(2, value) if value else b"")
        version = hashlib.blake2b(any_bytes, digest_size=8).hexdigest()
        return cls(name, version, any_bytes, wire.length_prefix(wire.SOTW_RESOURCES, len(any_bytes)),
                   delta_prefix(name, version, len(any_bytes)), origins)

    @property
    def sotw_field(self) -> bytes:
        """This resource framed as DiscoveryResponse.resources (see framed() for many)."""
        return self.sotw_prefix + self.any_bytes

    @property
    def delta_field(self) -> bytes:
        return self.delta_prefix + self.any_bytes + self.delta_suffix

    def message(self, cls: type[Message]) -> Message:
        a = any_pb2.Any.FromString(self.any_bytes)
        m = cls()
        a.Unpack(m)
        return m


def delta_prefix(name: str, version: str, any_size: int, suffix_size: int = 0) -> bytes:
    """What precedes the Any in a DeltaDiscoveryResponse.resources entry: the Resource's framing,
    its name and version, and the Any's tag and length (`suffix_size` bytes follow the Any)."""
    head = b"".join((wire.string_field(wire.RESOURCE_NAME, name), wire.string_field(wire.RESOURCE_VERSION, version),
                     wire.length_prefix(wire.RESOURCE_ANY, any_size)))
    return wire.length_prefix(wire.DELTA_RESOURCES, len(head) + any_size + suffix_size) + head


def framed(resources: Iterable[CachedResource], delta: bool) -> bytes:
    """The resources framed for a SotW or a delta response, in one copy of their bytes."""
    parts: list[bytes] = []
    if delta:
        for r in resources:
            parts += (r.delta_prefix, r.any_bytes, r.delta_suffix)
    else:
        for r in resources:
            parts += (r.sotw_prefix, r.any_bytes)
    return b"".join(parts)


class XdsCache:
    """Bounded by `max_size` entries, evicting what has not been used for a while: two
    generations, where a lookup hits the young one first and a hit in the old one moves the
    entry back; when the young generation fills half the budget, the old one is dropped. Only
    one dict lookup per hit (an exact LRU re-hashes every key on every hit to reorder it, and a
    push looks up tens of thousands of keys)."""

    def __init__(self, max_size: int = 60000) -> None:
        self.max_size = max_size
        self._young: dict[Hashable, CachedResource] = {}
        self._old: dict[Hashable, CachedResource] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.builds_by_type: dict[str, int] = {}
        # Told about every newly built resource (type_url, name, version): push attribution.
        self.on_build: Callable[[str, str, str], None] | None = None
        # Told about EnvoyFilter patches (PatchRefs) found to meet a generated resource, when that
        # is first worked out for a patch set (pilot_envoy_filter_status).
        self.on_patch: Callable[[tuple], None] | None = None

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def resource(self, type_url: str, name: str, build: Callable[..., Message], *args: Any,
                 origins: tuple[str, ...] = ()) -> CachedResource:
        """Return the cached resource for `build(*args)`, building and serialising it on a miss.
        Proxies that share inputs share the returned object; within a push, GenerationMemo
        avoids even this lookup for proxies with the same traits."""
        key = (type_url, name, build, args)
        res = self._young.get(key)
        if res is not None:  # the usual hit: one lookup
            self.hits += 1
            return res
        res = self._old_hit(key)
        if res is None:
            res = self._built(type_url, name, build(*args), origins)
        return self._keep(key, res)

    def resource_steps(self, type_url: str, name: str, build: Callable[..., Message],
                       steps: Callable[..., Generator[None, None, Message]], *args: Any,
                       origins: tuple[str, ...] = ()) -> Generator[None, None, CachedResource]:
        """resource(), where `steps(*args)` builds the same message as `build(*args)` a part at a
        time (yielding between parts): the caller may pause a cold build between them. Keyed by
        `build`, so both share one entry."""
        key = (type_url, name, build, args)
        res = self._young.get(key)
        if res is not None:
            self.hits += 1
            return res
        res = self._old_hit(key)
        if res is None:
            message = yield from steps(*args)
            yield  # serialising half a megabyte is a step of its own
            res = self._built(type_url, name, message, origins)
        return self._keep(key, res)

    def _old_hit(self, key: Hashable) -> CachedResource | None:
        """A hit in the old generation: moved back to the young one by _keep."""
        res = self._old.pop(key, None)
        if res is not None:
            self.hits += 1
        return res

    def _built(self, type_url: str, name: str, message: Message, origins: tuple[str, ...]) -> CachedResource:
        self.misses += 1
        self.builds_by_type[type_url] = self.builds_by_type.get(type_url, 0) + 1
        res = CachedResource.from_message(name, message, type_url, origins)
        if self.on_build is not None:
            self.on_build(type_url, name, res.version)
        return res

    def _keep(self, key: Hashable, res: CachedResource) -> CachedResource:
        self._young[key] = res
        if len(self._young) >= max(1, self.max_size // 2):
            self.evictions += len(self._old)
            self._old, self._young = self._young, {}
        return res

    def clear(self) -> None:
        self._young.clear()
        self._old.clear()

    def stats(self) -> dict:
        return {"size": len(self), "max_size": self.max_size, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions, "builds_by_type": dict(self.builds_by_type)}
