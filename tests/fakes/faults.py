"""Fault injection (``Fault``, ``fail_next``/``fail_when``/``hang_when``) and the request log
(``RequestInfo``/``RequestRecord``, counters and rates).

``FaultInjection`` and ``RequestLog`` are mixins of ``FakeApiServer``; the state they use is
created in ``FakeApiServer.__init__``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .apiserver import FakeApiServer


class RequestRecord(NamedTuple):
    """(method, path, query) of one request, as logged in ``FakeApiServer.requests``."""

    method: str
    path: str
    query: dict[str, str]


@dataclass
class RequestInfo:
    """Everything the fake knows about one request (``FakeApiServer.request_log``)."""

    method: str
    path: str
    query: dict[str, str]
    at: float  # time.monotonic()
    verb: str = "unknown"  # list/watch/get/create/update/patch/delete/deletecollection/discovery/...
    resource: str | None = None  # plural
    group: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    status: int | None = None  # None while a watch stream is still open
    faulted: bool = False
    user_agent: str = ""  # tells replicas of one client apart

    @property
    def record(self) -> RequestRecord:
        return RequestRecord(self.method, self.path, self.query)


@dataclass(eq=False)
class Fault:
    """An injected failure; returned by ``fail_next``/``fail_when``/``hang_when``."""

    predicate: Callable[[RequestInfo], bool] | None
    status: int = 500
    body: str | bytes | dict = ""
    remaining: int | None = None  # None: unlimited
    hang: asyncio.Event | None = None
    hits: int = 0
    _owner: FakeApiServer | None = None

    def matches(self, info: RequestInfo) -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        return self.predicate is None or bool(self.predicate(info))

    def release(self) -> None:
        """For ``hang_when`` faults: let held requests (and future ones) proceed."""
        if self.hang is not None:
            self.hang.set()
        self.remove()

    def remove(self) -> None:
        if self._owner is not None and self in self._owner._faults:
            self._owner._faults.remove(self)


class FaultInjection:
    """Injected failures and hangs (a FakeApiServer mixin)."""

    _faults: list[Fault]

    # -------------------------------------------------------- fault injection

    def fail_next(self, n: int = 1, status: int = 500, body: str | bytes | dict = "",
                  match: Callable[[RequestInfo], bool] | None = None) -> Fault:
        """The next ``n`` requests (matching ``match`` if given) get ``status`` with ``body``
        (default: empty body; a dict is sent as JSON)."""
        fault = Fault(match, status, body, remaining=n, _owner=self)
        self._faults.append(fault)
        return fault

    def fail_when(self, match: Callable[[RequestInfo], bool], status: int = 500,
                  body: str | bytes | dict = "") -> Fault:
        """Every request matching ``match`` fails until ``fault.remove()``/``clear_faults()``."""
        fault = Fault(match, status, body, remaining=None, _owner=self)
        self._faults.append(fault)
        return fault

    def hang_when(self, match: Callable[[RequestInfo], bool]) -> Fault:
        """Matching requests hang (no response) until ``fault.release()``."""
        fault = Fault(match, 0, "", remaining=None, hang=asyncio.Event(), _owner=self)
        self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        for fault in list(self._faults):
            if fault.hang is not None:
                fault.hang.set()
        self._faults.clear()


class RequestLog:
    """Every request the fake saw, with counters and rates (a FakeApiServer mixin)."""

    request_log: list[RequestInfo]

    # ------------------------------------------------------------ request log

    @property
    def requests(self) -> list[RequestRecord]:
        return [info.record for info in self.request_log]

    def mark(self) -> int:
        """A position in the request log, for ``count(since=...)``/``requests_since``."""
        return len(self.request_log)

    def requests_since(self, mark: int = 0) -> list[RequestInfo]:
        return self.request_log[mark:]

    def count(self, verb: str | None = None, resource: str | None = None, *, since: int = 0,
              method: str | None = None, path: str | None = None) -> int:
        """Requests since ``since`` matching verb (list/watch/get/create/update/patch/delete/...),
        resource plural, HTTP method and/or path regex."""
        n = 0
        for info in self.request_log[since:]:
            if verb is not None and info.verb != verb:
                continue
            if resource is not None and info.resource != resource:
                continue
            if method is not None and info.method != method.upper():
                continue
            if path is not None and not re.search(path, info.path):
                continue
            n += 1
        return n

    def request_rate(self, verb: str | None = None, resource: str | None = None, *,
                     window: float = 1.0) -> float:
        """Matching requests per second over the last ``window`` seconds."""
        cutoff = time.monotonic() - window
        n = sum(1 for i in self.request_log
                if i.at >= cutoff and (verb is None or i.verb == verb)
                and (resource is None or i.resource == resource))
        return n / window
