"""A JSONPatch (RFC 6902) from the pod as sent to the pod as injected.

Not jsonpatch.make_patch: that one searches lists for moves and copies, which costs more than the
whole injection on a large pod. Injection appends containers and volumes and changes a few maps, so
a direct walk is enough: maps key by key, a list that only grew gets `add`s at its end, a list of
the same length is compared element by element, anything else is replaced whole. The result
applies with any RFC 6902 implementation (tests apply it with the `jsonpatch` library)."""

from __future__ import annotations

from typing import Any


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def diff(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = []
        for k in old:
            if k not in new:
                ops.append({"op": "remove", "path": f"{path}/{_escape(k)}"})
        for k, v in new.items():
            p = f"{path}/{_escape(k)}"
            if k not in old:
                ops.append({"op": "add", "path": p, "value": v})
            else:
                ops.extend(diff(old[k], v, p))
        return ops
    if isinstance(old, list) and isinstance(new, list):
        n = len(old)
        if len(new) > n and new[:n] == old:
            return [{"op": "add", "path": f"{path}/-", "value": v} for v in new[n:]]
        if len(new) == n:
            return [op for i in range(n) for op in diff(old[i], new[i], f"{path}/{i}")]
    return (
        [{"op": "replace", "path": path, "value": new}]
        if path
        else [{"op": "replace", "path": "", "value": new}]
    )
