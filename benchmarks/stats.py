"""Latency summaries: the percentiles every result reports, computed the same way everywhere."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summary(values: Iterable[float]) -> dict:
    v = sorted(values)
    if not v:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None, "min": None, "mean": None}
    return {"count": len(v), "p50": round(percentile(v, 50), 2), "p90": round(percentile(v, 90), 2),
            "p99": round(percentile(v, 99), 2), "max": round(v[-1], 2), "min": round(v[0], 2),
            "mean": round(sum(v) / len(v), 2)}
