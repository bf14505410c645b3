"""The Store: every accepted config object by kind/namespace/name, each with a revision.

Sources (files, Kubernetes) write here; everything downstream reads immutable snapshots. A write
that changes nothing a generator reads produces no event, so no-op updates never cause pushes.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from pilot.config.base import K8sObject
from pilot.config.validation import Rejection


@dataclass(frozen=True, slots=True, order=True)
class ConfigKey:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}" if self.namespace else f"{self.kind}/{self.name}"

    @classmethod
    def of(cls, obj: K8sObject) -> ConfigKey:
        return cls(obj.config_kind, obj.metadata.namespace, obj.metadata.name)


@dataclass(frozen=True, slots=True, eq=False)
class Entry:
    key: ConfigKey
    obj: K8sObject
    revision: int  # store-wide counter at the time of the last real change
    source: str  # where it came from: "path/to/file.yaml#2" or "kube"

    # A revision is given to exactly one content of one key, so (key, revision) identifies the
    # content: entries can be cache-key inputs without hashing the whole object.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Entry) and self.key == other.key and self.revision == other.revision

    def __hash__(self) -> int:
        return hash((self.key, self.revision))


@dataclass(frozen=True, slots=True)
class Event:
    op: Literal["add", "update", "delete"]
    key: ConfigKey
    old: Entry | None
    new: Entry | None


Handler = Callable[[list[Event]], None]


class Store:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_kind: dict[str, dict[ConfigKey, Entry]] = defaultdict(dict)
        self._revision = 0
        self._handlers: list[Handler] = []
        self._rejections: dict[str, list[Rejection]] = {}

    # --- reads -------------------------------------------------------------------------------
    @property
    def revision(self) -> int:
        return self._revision

    def get(self, key: ConfigKey) -> Entry | None:
        return self._by_kind.get(key.kind, {}).get(key)

    def list(self, kind: str, namespace: str | None = None) -> list[Entry]:
        entries = self._by_kind.get(kind, {}).values()
        if namespace is None:
            return list(entries)
        return [e for e in entries if e.key.namespace == namespace]

    def kinds(self) -> list[str]:
        return sorted(k for k, v in self._by_kind.items() if v)

    def rejections(self) -> list[Rejection]:
        return [r for rs in self._rejections.values() for r in rs]

    # --- writes ------------------------------------------------------------------------------
    def subscribe(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def apply(self, obj: K8sObject, source: str = "") -> Event | None:
        events = self._write([obj], [], source_for=lambda _o: source)
        return events[0] if events else None

    def delete(self, key: ConfigKey) -> Event | None:
        events = self._write([], [key], source_for=lambda _o: "")
        return events[0] if events else None

    def write(self, upserts: Iterable[tuple[K8sObject, str]], deletes: Iterable[ConfigKey]) -> list[Event]:
        """Apply several (object, source) upserts and deletes as one batch of events."""
        upserts = list(upserts)
        sources = {ConfigKey.of(o): s for o, s in upserts}
        return self._write([o for o, _ in upserts], list(deletes), source_for=lambda o: sources[ConfigKey.of(o)])

    def sync(self, owner_prefix: str, desired: Iterable[tuple[K8sObject, str]]) -> list[Event]:
        """Make the objects whose source starts with `owner_prefix` exactly `desired`
        ((object, source) pairs). Used by sources that know their whole state at once."""
        wanted: dict[ConfigKey, tuple[K8sObject, str]] = {}
        for obj, src in desired:
            wanted[ConfigKey.of(obj)] = (obj, src)
        gone = [
            e.key for kind in list(self._by_kind) for e in self._by_kind[kind].values()
            if e.source.startswith(owner_prefix) and e.key not in wanted
        ]
        sources = {k: s for k, (_, s) in wanted.items()}
        return self._write([o for o, _ in wanted.values()], gone,
                           source_for=lambda o: sources[ConfigKey.of(o)])

    def set_rejections(self, owner: str, rejections: list[Rejection]) -> None:
        with self._lock:
            if rejections:
                self._rejections[owner] = list(rejections)
            else:
                self._rejections.pop(owner, None)

    def _write(self, objs: list[K8sObject], deletes: list[ConfigKey],
               source_for: Callable[[K8sObject], str]) -> list[Event]:
        events: list[Event] = []
        with self._lock:
            for obj in objs:
                key = ConfigKey.of(obj)
                table = self._by_kind[key.kind]
                old = table.get(key)
                src = source_for(obj)
                if old is not None and old.obj.spec_equal(obj):
                    if old.source != src:  # moved between files: remember where, but no push
                        table[key] = Entry(key, obj, old.revision, src)
                    continue
                self._revision += 1
                new = Entry(key, obj, self._revision, src)
                table[key] = new
                events.append(Event("update" if old else "add", key, old, new))
            for key in deletes:
                old = self._by_kind.get(key.kind, {}).pop(key, None)
                if old is not None:
                    self._revision += 1
                    events.append(Event("delete", key, old, None))
        if events:
            for h in self._handlers:
                h(events)
        return events
