"""Status conditions as the Gateway API spec shapes them (metav1.Condition), and the one impure
step kept apart: `stamp` gives each condition its lastTransitionTime, carried over from the
status already written while the condition's status does not change (meta.SetStatusCondition's
rule), so an unchanged status is byte-for-byte the status already there and is never rewritten.
"""

from __future__ import annotations

from typing import Any

Status = dict[str, Any]


def condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation}


def sorted_conditions(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(conditions, key=lambda c: c["type"])


def _stamp_conditions(previous: list[dict] | None, desired: list[dict], now: str) -> list[dict]:
    before = {c.get("type"): c for c in previous or () if isinstance(c, dict)}
    out = []
    for c in desired:
        old = before.get(c["type"])
        when = old.get("lastTransitionTime") if old is not None and old.get("status") == c["status"] else None
        out.append({**c, "lastTransitionTime": when or now})
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
            elif k in ("listeners", "parents") and isinstance(v, list):
                ident = "name" if k == "listeners" else "parentRef"
                old = {_ident(item, ident): item for item in prev.get(k) or () if isinstance(item, dict)}
                out[k] = [_stamp(old.get(_ident(item, ident)), item, now) for item in v]
            else:
                out[k] = v
        return out
    return desired


def _ident(item: dict, key: str) -> str:
    value = item.get(key)
    return repr(sorted(value.items())) if isinstance(value, dict) else str(value)


def stamp(previous: Status | None, desired: Status, now: str) -> Status:
    return _stamp(previous or {}, desired, now)
