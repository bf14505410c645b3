"""Entries of one namespace indexed by the labels they carry, so a selector is answered from the
entries that hold one of its labels rather than by testing every entry of the namespace.

Why: each Kubernetes Service (and each ServiceEntry with a workloadSelector) selects its
WorkloadEntries among all those of its namespace. Scanning them per selector made a cold EDS
generation quadratic: 1,000 Services and 1,000 WorkloadEntries in one namespace meant a million
label comparisons (issue 17). A PushContext builds one index per namespace, on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

from pilot.model.labels import selects

T = TypeVar("T")


class LabelIndex(Generic[T]):
    """`select(selector)` returns the entries `selects` would pick, in the order they were given.
    `evaluations` counts the entries a selection tested against its selector: the work done, which
    a test can bound without timing (a scan per selector costs the namespace's size each time)."""

    __slots__ = ("_by_pair", "_entries", "evaluations")

    def __init__(self, entries: Iterable[T], labels_of: Callable[[T], Mapping[str, str]]) -> None:
        self._entries: tuple[tuple[T, Mapping[str, str]], ...] = tuple((e, labels_of(e)) for e in entries)
        by_pair: dict[tuple[str, str], list[int]] = {}
        for i, (_, labels) in enumerate(self._entries):
            for pair in labels.items():
                by_pair.setdefault(pair, []).append(i)
        self._by_pair = by_pair
        self.evaluations = 0

    def select(self, selector: Mapping[str, str]) -> tuple[T, ...]:
        """An empty selector picks every entry (as `selects` does; callers that mean "nothing"
        check that first)."""
        entries = self._entries
        if not selector:
            return tuple(e for e, _ in entries)
        # Candidates: the entries holding the selector's rarest pair (every match holds it);
        # the positions ascend, so the result keeps the given order.
        candidates: list[int] | None = None
        for pair in selector.items():
            found = self._by_pair.get(pair)
            if found is None:
                return ()
            if candidates is None or len(found) < len(candidates):
                candidates = found
        assert candidates is not None
        self.evaluations += len(candidates)
        if len(selector) == 1:
            return tuple(entries[i][0] for i in candidates)
        return tuple(entries[i][0] for i in candidates if selects(selector, entries[i][1]))
