"""Label and field selectors, compiled into predicates."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .common import JSON

_LABEL_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (p.strip() for p in parts) if p]


def parse_label_selector(selector: str) -> Callable[[dict[str, str]], bool]:
    """Compile a label selector string into a predicate over a labels dict."""
    reqs: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_selector(selector or ""):
        m = re.fullmatch(r"\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*", term)
        if m:
            key, op, val = m.groups()
            if op == "!=":
                reqs.append(lambda lb, k=key, v=val: lb.get(k) != v)
            else:
                reqs.append(lambda lb, k=key, v=val: lb.get(k) == v)
            continue
        m = _LABEL_SET_RE.match(term)
        if not m:
            raise ValueError(f"unable to parse requirement: {term!r}")
        neg, key, op, values = m.groups()
        if op:
            if neg:
                raise ValueError(f"unable to parse requirement: {term!r}")
            vals = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                reqs.append(lambda lb, k=key, vs=vals: k in lb and lb[k] in vs)
            else:
                reqs.append(lambda lb, k=key, vs=vals: lb.get(k) not in vs)
        elif neg:
            reqs.append(lambda lb, k=key: k not in lb)
        else:
            reqs.append(lambda lb, k=key: k in lb)
    return lambda labels: all(r(labels) for r in reqs)


def _field_value(obj: JSON, path: str) -> str | None:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(selector: str) -> Callable[[JSON], bool]:
    """Compile a field selector (``path=v``, ``path==v``, ``path!=v``) into an object predicate."""
    reqs: list[Callable[[JSON], bool]] = []
    for term in _split_selector(selector or ""):
        m = re.fullmatch(r"\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*", term)
        if not m:
            raise ValueError(f"invalid field selector term {term!r}")
        path, op, val = m.groups()
        if op == "!=":
            reqs.append(lambda o, p=path, v=val: (_field_value(o, p) or "") != v)
        else:
            reqs.append(lambda o, p=path, v=val: (_field_value(o, p) or "") == v)
    return lambda obj: all(r(obj) for r in reqs)
