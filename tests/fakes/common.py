"""Wire-level primitives shared by the fake apiserver's modules: the JSON alias, Go-style
boolean parsing, ``metav1.Status`` objects and the ``FakeApiError`` carrying them."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

JSON = dict[str, Any]


def parse_bool(value: str) -> bool:
    """Parse a boolean exactly like Go's strconv.ParseBool (ValueError otherwise)."""
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{value}": invalid syntax')


def make_status(code: int, reason: str, message: str, details: JSON | None = None) -> JSON:
    """A ``metav1.Status`` failure object, as kube-apiserver returns it."""
    status: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        status["details"] = details
    return status


class FakeApiError(Exception):
    """An apiserver error; ``.status`` is the ``Status`` object sent on the wire."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None):
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.status = make_status(code, reason, message, details)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
