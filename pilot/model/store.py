"""The Store: every accepted config object by kind/namespace/name, each with a revision.

Sources (files, Kubernetes) write here; everything downstream reads immutable snapshots. A write
that changes nothing a generator reads produces no event, so no-op updates never cause pushes.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, overload

from typing_extensions import TypeIs, TypeVar

from pilot.config.base import K8sObject
from pilot.config.kinds import KINDS
from pilot.config.validation import Rejection

if TYPE_CHECKING:
    # `list` is also a Store method: inside the class body the bare name would mean it.
    from builtins import list as _list

# The object type an Entry holds. Covariant (entries are immutable), so an Entry[Service] is an
# Entry[K8sObject]; a bare `Entry` means Entry[K8sObject] (the default), not Entry[Any], so an
# unparameterised annotation still checks attribute access against the base class.
T_co = TypeVar("T_co", bound=K8sObject, default=K8sObject, covariant=True)
# A model class as a type parameter (typed Store reads; generic helpers over entries of one kind).
ObjT = TypeVar("ObjT", bound=K8sObject)

# Store name of each model class: a kind is filed by `obj.config_kind`, which is the class's
# (one class per kind, pilot/config/kinds.py), so every entry under it holds that class.
_KIND_OF: dict[type[K8sObject], str] = {k.model: k.config_kind for k in KINDS}


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
class Entry(Generic[T_co]):
    key: ConfigKey
    obj: T_co
    revision: int  # store-wide counter at the time of the last real change
    source: str  # where it came from: "path/to/file.yaml#2" or "kube"

    # A revision is given to exactly one content of one key, so (key, revision) identifies the
    # content: entries can be cache-key inputs without hashing the whole object.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Entry) and self.key == other.key and self.revision == other.revision

    def __hash__(self) -> int:
        return hash((self.key, self.revision))


def holds(entry: Entry, model: type[ObjT]) -> TypeIs[Entry[ObjT]]:
    """Whether the entry holds a `model` (narrows an Entry[A | B] to Entry[A])."""
    return isinstance(entry.obj, model)


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
        self._handlers: _list[Handler] = []
        self._rejections: dict[str, _list[Rejection]] = {}

    # --- reads -------------------------------------------------------------------------------
    @property
    def revision(self) -> int:
        return self._revision

    @overload
    def get(self, key: ConfigKey) -> Entry | None: ...
    @overload
    def get(self, key: ConfigKey, model: type[ObjT]) -> Entry[ObjT] | None: ...

    # The implementations return Entry[Any]: a table holds entries of its kind's model, which
    # the overloads state for callers (see _KIND_OF).
    def get(self, key: ConfigKey, model: type[K8sObject] | None = None) -> Entry[Any] | None:
        """The entry at `key`; given the model class of key.kind, typed as holding it."""
        if model is not None and _KIND_OF[model] != key.kind:
            raise TypeError(f"{key} is not a {model.__name__}")
        return self._by_kind.get(key.kind, {}).get(key)

    @overload
    def list(self, kind: str, namespace: str | None = None) -> _list[Entry]: ...
    @overload
    def list(self, kind: type[ObjT], namespace: str | None = None) -> _list[Entry[ObjT]]: ...

    def list(self, kind: str | type[K8sObject], namespace: str | None = None) -> _list[Entry[Any]]:
        """Entries of one kind, by Store name or (typed) by model class."""
        entries = self._by_kind.get(kind if isinstance(kind, str) else _KIND_OF[kind], {}).values()
        if namespace is None:
            return list(entries)
        return [e for e in entries if e.key.namespace == namespace]

    def kinds(self) -> _list[str]:
        return sorted(k for k, v in self._by_kind.items() if v)

    def rejections(self) -> _list[Rejection]:
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

    def write(self, upserts: Iterable[tuple[K8sObject, str]], deletes: Iterable[ConfigKey]) -> _list[Event]:
        """Apply several (object, source) upserts and deletes as one batch of events."""
        upserts = list(upserts)
        sources = {ConfigKey.of(o): s for o, s in upserts}
        return self._write([o for o, _ in upserts], list(deletes), source_for=lambda o: sources[ConfigKey.of(o)])

    def sync(self, owner_prefix: str, desired: Iterable[tuple[K8sObject, str]]) -> _list[Event]:
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

    def set_rejections(self, owner: str, rejections: _list[Rejection]) -> None:
        with self._lock:
            if rejections:
                self._rejections[owner] = list(rejections)
            else:
                self._rejections.pop(owner, None)

    def _write(self, objs: _list[K8sObject], deletes: _list[ConfigKey],
               source_for: Callable[[K8sObject], str]) -> _list[Event]:
        events: _list[Event] = []
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
