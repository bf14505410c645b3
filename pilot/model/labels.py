"""Label selectors as Kubernetes and Istio use them: every selector label must be present with
the same value (an empty selector matches everything; callers that treat it as "selects
nothing" say so where they call this)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def selects(selector: Mapping[str, str] | Iterable[tuple[str, str]], labels: Mapping[str, str]) -> bool:
    pairs = selector.items() if isinstance(selector, Mapping) else selector
    return all(labels.get(k) == v for k, v in pairs)
