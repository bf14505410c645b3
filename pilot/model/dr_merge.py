"""Several DestinationRules for one host in one namespace, consolidated as istiod's
mergeDestinationRule (pilot/pkg/model/destination_rule.go) does, oldest first:

- Rules merge when both have no workloadSelector or the same one: the later rule's subsets are
  appended (a subset name already present is skipped), its top-level trafficPolicy is taken only
  when the merged rule has none; everything else (exportTo, port settings) is the first's.
- Rules with different workloadSelectors stay separate entries; a rule with a selector merged
  into one without is also kept on its own (istiod's "merge and append separately").
- ENABLE_ENHANCED_DESTINATIONRULE_MERGE (istiod's default true): rules whose exportTo differ do
  not merge; one whose exportTo is a superset of an earlier rule's merges into it and is also
  kept on its own. Off, exportTo plays no part.

A consolidated entry keeps the first rule's key (what metadata and debug views name) and gets a
revision of its own (negative: never a Store revision) derived from every part's (key,
revision), so it changes whenever any part does. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from pilot.config.networking import DestinationRule
from pilot.model.store import Entry


def _export_set(e: Entry[DestinationRule]) -> frozenset[str]:
    export = e.obj.spec.export_to or ["*"]
    return frozenset(e.key.namespace if x == "." else x for x in export)


def _selector(e: Entry[DestinationRule]) -> tuple | None:
    ws = e.obj.spec.workload_selector
    return None if ws is None else tuple(sorted(ws.match_labels.items()))


class _Merged:
    def __init__(self, first: Entry[DestinationRule]) -> None:
        self.parts = [first]
        self.spec = first.obj.spec
        self.exports = _export_set(first)
        self.selector = _selector(first)

    def absorb(self, e: Entry[DestinationRule]) -> None:
        self.parts.append(e)
        have = {s.name for s in self.spec.subsets}
        subsets = [*self.spec.subsets, *(s for s in e.obj.spec.subsets if s.name not in have)]
        policy = self.spec.traffic_policy if self.spec.traffic_policy is not None else e.obj.spec.traffic_policy
        self.spec = self.spec.model_copy(update={"subsets": subsets, "traffic_policy": policy})

    def entry(self) -> Entry[DestinationRule]:
        first = self.parts[0]
        if len(self.parts) == 1:
            return first
        revision = -(abs(hash(tuple((p.key, p.revision) for p in self.parts))) + 1)
        return Entry(first.key, first.obj.model_copy(update={"spec": self.spec}), revision, first.source)


def consolidate(entries: Sequence[Entry[DestinationRule]], enhanced: bool = True) -> tuple[Entry[DestinationRule], ...]:
    """`entries`: one host's rules, oldest first (any namespaces); the consolidated ones, in order."""
    by_ns: dict[str, list[_Merged]] = {}
    order: list[_Merged] = []
    for e in entries:
        merged_list = by_ns.setdefault(e.key.namespace, [])
        separately = True
        exports, selector = _export_set(e), _selector(e)
        for m in merged_list:
            if enhanced:
                if exports == m.exports:
                    separately = False
                elif m.exports and exports > m.exports:
                    separately = True  # merge, and keep it on its own too
                else:
                    separately = True
                    continue
            if selector is not None and m.selector is not None and selector != m.selector:
                separately = True
                continue
            if selector == m.selector:
                separately = False
            m.absorb(e)
        if separately or not merged_list:
            m = _Merged(e)
            merged_list.append(m)
            order.append(m)
    return tuple(m.entry() for m in order)
