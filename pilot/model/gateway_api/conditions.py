"""Status conditions as the Gateway API spec shapes them (metav1.Condition), and the one impure
step kept apart: `stamp` gives each condition its lastTransitionTime, carried over from the
status already written while the condition's status does not change (meta.SetStatusCondition's
rule), so an unchanged status is byte-for-byte the status already there and is never rewritten.
Condition types another controller wrote on the same object or route parent are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Status = dict[str, Any]


def condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation}


def sorted_conditions(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(conditions, key=lambda c: c["type"])


def _stamp_conditions(previous: list[dict] | None, desired: list[dict], now: str) -> list[dict]:
    """Ours set in place, in the order already written; condition types we do not set (another
    controller's, on the same object or route parent) kept as they are; new ones appended
    (istiod's SetListenerConditions)."""
    mine = {c["type"]: c for c in desired}
    out = []
    for old in previous or ():
        if not isinstance(old, dict):
            continue
        c = mine.pop(old.get("type"), None)
        if c is None:
            out.append(old)
            continue
        when = old.get("lastTransitionTime") if old.get("status") == c["status"] else None
        out.append({**c, "lastTransitionTime": when or now})
    out.extend({**c, "lastTransitionTime": now} for c in mine.values())
    return out


def _stamp(previous: Any, desired: Any, now: str) -> Any:
    """Walk `desired` alongside `previous`: every `conditions` list is stamped against the list at
    the same place before (listeners matched by name, route parents by parentRef)."""
    if isinstance(desired, dict):
        prev = previous if isinstance(previous, dict) else {}
        out = {}
        for k, v in desired.items():
            if k == "conditions" and isinstance(v, list):
                out[k] = _stamp_conditions(prev.get(k), v, now)
            elif k in ("listeners", "parents", "ancestors") and isinstance(v, list):
                ident = {"listeners": ("name",), "parents": ("parentRef", "controllerName"),
                         "ancestors": ("ancestorRef", "controllerName")}[k]
                old = {_ident(item, ident): item for item in prev.get(k) or () if isinstance(item, dict)}
                out[k] = [_stamp(old.get(_ident(item, ident)), item, now) for item in v]
            else:
                out[k] = v
        return out
    return desired


def _ident(item: dict, keys: tuple[str, ...]) -> str:
    return repr([sorted(v.items()) if isinstance(v := item.get(key), dict) else str(v) for key in keys])


def _merge(current: list | None, ours: list[dict], ref_key: str, answered: Callable[[dict], bool]) -> list[dict]:
    """Entries as written: those `answered` does not claim kept where they are; each of ours
    replacing the claimed entry for the same `ref_key` in place, claimed ones we no longer report
    dropped, new ones appended."""
    desired = {_ident(p, (ref_key,)): p for p in ours}
    out = []
    for p in current or ():
        if not isinstance(p, dict):
            continue
        if not answered(p):
            out.append(p)
            continue
        mine = desired.pop(_ident(p, (ref_key,)), None)
        if mine is not None:
            out.append(mine)
    out.extend(desired.values())
    return out


def merge_parents(current: list | None, ours: list[dict], controller: str,
                  keep: Callable[[dict], bool] = lambda _p: False) -> list[dict]:
    """A route's `parents` as written: other controllers' entries untouched and where they are
    (and those of our controller name that `keep` says another revision answers for);
    each of ours replacing our entry for the same parentRef in place (its conditions merged by
    `stamp`), our entries for parents we no longer report dropped, new ones appended (istiod's
    createRouteStatus)."""
    return _merge(current, ours, "parentRef", lambda p: p.get("controllerName") == controller and not keep(p))


def merge_ancestors(current: list | None, ours: list[dict], controllers: frozenset[str]) -> list[dict]:
    """A policy's `ancestors` as written (istiod's mergeAncestors): the same, over the entries
    of any of `controllers`, by ancestorRef; at most 16 (the CRD's limit)."""
    return _merge(current, ours, "ancestorRef", lambda a: a.get("controllerName") in controllers)[:16]


def stamp(previous: Status | None, desired: Status, now: str) -> Status:
    return _stamp(previous or {}, desired, now)
