"""Go-style duration strings (``100ms``, ``1h30m``, ``10s``), as istiod's flags and env knobs use them."""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 micro sign
    "μs": 1e-6,  # U+03BC Greek small letter mu; Go accepts both
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    # Not Go syntax, but istiod's docs write cert TTLs such as "90d"; accept it rather than surprise.
    "d": 86400.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h|d)")


def parse_duration(text: str) -> float:
    """Return seconds. Raises ValueError with the offending text on anything Go would reject."""
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
        if not s:  # a bare sign is not a duration (Go rejects it too)
            raise ValueError(f"invalid duration {text!r}")
    if s == "0":
        return 0.0
    pos = 0
    total = 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if not m:
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total
