"""Deadline-bounded condition waits.

Tests must wait on observable conditions rather than sleep for a guessed time;
these helpers poll a predicate until it is truthy or a deadline passes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

_NOTHING = object()


class StopWaiting(Exception):
    """Raise from a predicate to abort the wait at once.

    Every other exception means "not yet"; this one exists so a predicate can
    say "this will never become true", e.g. the watched process has exited.
    """


def _describe(message: str, timeout: float, last_value: Any, last_exc: BaseException | None) -> str:
    parts = [message or "condition not met", f"(timeout {timeout}s)"]
    if last_exc is not None:
        parts.append(f"last exception: {last_exc!r}")
    elif last_value is not _NOTHING:
        parts.append(f"last value: {last_value!r}")
    return " ".join(parts)


async def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "",
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value; return that value.

    Exceptions from the predicate (AssertionError included, so predicates may
    use ``assert``) count as "not yet": the thing polled is often a process
    that is still starting. The last one is reported if the deadline passes.
    """
    deadline = time.monotonic() + timeout
    last_value: Any = _NOTHING
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            last_value, last_exc = value, None
            if value:
                return value
        except StopWaiting:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last_exc = exc
        if time.monotonic() >= deadline:
            raise AssertionError(_describe(message, timeout, last_value, last_exc))
        await asyncio.sleep(interval)


def wait_for_sync(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "",
) -> Any:
    """Blocking twin of :func:`wait_for` for code that has no event loop."""
    deadline = time.monotonic() + timeout
    last_value: Any = _NOTHING
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            last_value, last_exc = value, None
            if value:
                return value
        except StopWaiting:
            raise
        except Exception as exc:  # noqa: BLE001
            last_exc = exc
        if time.monotonic() >= deadline:
            raise AssertionError(_describe(message, timeout, last_value, last_exc))
        time.sleep(interval)
