"""PATCH bodies: RFC 7386 JSON merge patch and RFC 6902 JSON patch."""

from __future__ import annotations

import copy
from typing import Any

from .common import JSON


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (returns a new value; inputs are not mutated)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer_parts(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"invalid JSON pointer {pointer!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def json_patch(doc: Any, ops: list[JSON]) -> Any:
    """RFC 6902 JSON patch (add/remove/replace/move/copy/test). Raises ValueError."""
    doc = copy.deepcopy(doc)

    def resolve(parts: list[str]) -> tuple[Any, str]:
        parent = doc
        for part in parts[:-1]:
            if isinstance(parent, list):
                parent = parent[int(part)]
            elif isinstance(parent, dict):
                parent = parent[part]
            else:
                raise ValueError("path does not exist")  # noqa: TRY004 - callers catch ValueError
        return parent, parts[-1]

    def get(parts: list[str]) -> Any:
        value = doc
        for part in parts:
            value = value[int(part)] if isinstance(value, list) else value[part]
        return value

    def remove(parts: list[str]) -> Any:
        parent, last = resolve(parts)
        if isinstance(parent, list):
            return parent.pop(int(last))
        return parent.pop(last)

    def add(parts: list[str], value: Any) -> None:
        nonlocal doc
        if not parts:
            doc = value
            return
        parent, last = resolve(parts)
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            else:
                idx = int(last)
                if idx < 0 or idx > len(parent):
                    raise ValueError("index out of range")
                parent.insert(idx, value)
        elif isinstance(parent, dict):
            parent[last] = value
        else:
            raise ValueError("path does not exist")  # noqa: TRY004 - callers catch ValueError

    if not isinstance(ops, list):
        raise ValueError("json patch must be a list of operations")  # noqa: TRY004
    try:
        for op in ops:
            kind = op["op"]
            parts = _pointer_parts(op["path"])
            if kind == "add":
                add(parts, copy.deepcopy(op["value"]))
            elif kind == "remove":
                remove(parts)
            elif kind == "replace":
                get(parts)  # must exist
                if parts:
                    remove(parts)
                add(parts, copy.deepcopy(op["value"]))
            elif kind == "move":
                value = remove(_pointer_parts(op["from"]))
                add(parts, value)
            elif kind == "copy":
                add(parts, copy.deepcopy(get(_pointer_parts(op["from"]))))
            elif kind == "test":
                if get(parts) != op["value"]:
                    raise ValueError(f"test operation failed at {op['path']}")
            else:
                raise ValueError(f"unknown json patch op {kind!r}")
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"json patch failed: {exc!r}") from exc
    return doc
