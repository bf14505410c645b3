"""Watch streams: initial/replayed events, live fan-out, BOOKMARKs, 410 Expired, timeouts,
and the test helpers that inspect or cut open watches.

``WatchHub`` is a mixin of ``FakeApiServer``; the state it uses is created in
``FakeApiServer.__init__``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from .common import JSON, FakeApiError, _dumps, make_status, parse_bool
from .faults import RequestInfo
from .resources import ResourceType, _present

INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"


class _Marker:
    def __init__(self, name: str, rv: int = 0):
        self.name = name
        self.rv = rv


_CLOSE = "close"
_ABORT = "abort"
_BOOKMARK = "bookmark"


@dataclass(eq=False)
class _Watcher:
    rtype: ResourceType
    namespace: str | None
    match: Callable[[JSON], bool]
    queue: asyncio.Queue
    start_rv: int


class WatchHub:
    """Open watch streams and the WATCH verb (a FakeApiServer mixin)."""

    bookmark_interval: float | None
    default_watch_timeout: float | None
    _watchers: set[_Watcher]
    _changed: asyncio.Event | None

    # ----------------------------------------------------------- watches

    def open_watches(self, resource: str | None = None) -> int:
        """Number of open watch streams (optionally for one resource)."""
        if resource is None:
            return len(self._watchers)
        key = self.resolve(resource).store_key
        return sum(1 for w in self._watchers if w.rtype.store_key == key)

    async def wait_for_watches(self, count: int = 1, resource: str | None = None, timeout: float = 10.0) -> None:
        """Wait (deadline-bounded, event-driven) until at least ``count`` watches are open."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.open_watches(resource) < count:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise AssertionError(f"expected {count} open watches on {resource or 'any'}, "
                                     f"have {self.open_watches(resource)}")
            try:
                await asyncio.wait_for(self._changed_event().wait(), remaining)
            except TimeoutError:
                pass

    def _changed_event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify_changed(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def drop_watches(self, resource: str | None = None, *, abort: bool = True) -> int:
        """End open watch streams mid-stream. ``abort=True`` cuts the TCP connection (the client
        sees a truncated chunked body); ``abort=False`` ends the response cleanly (client sees EOF).
        Returns the number of streams ended."""
        key = self.resolve(resource).store_key if resource else None
        n = 0
        for w in list(self._watchers):
            if key is None or w.rtype.store_key == key:
                w.queue.put_nowait(_Marker(_ABORT if abort else _CLOSE))
                n += 1
        return n

    def _end_watches(self, how: str) -> None:
        for w in list(self._watchers):
            w.queue.put_nowait(_Marker(how))

    def send_bookmarks(self, resource: str | None = None) -> int:
        """Send a BOOKMARK now on every open watch that allowed bookmarks."""
        key = self.resolve(resource).store_key if resource else None
        n = 0
        for w in list(self._watchers):
            if key is None or w.rtype.store_key == key:
                w.queue.put_nowait(_Marker(_BOOKMARK, self._rv))
                n += 1
        return n

    @staticmethod
    def _filter_event(w: _Watcher, etype: str, obj: JSON, old: JSON | None) -> tuple[str, JSON] | None:
        cur = w.match(obj)
        if etype in ("ADDED", "DELETED"):
            return (etype, obj) if cur else None
        prev = old is not None and w.match(old)
        if cur and prev:
            return ("MODIFIED", obj)
        if cur:
            return ("ADDED", obj)
        if prev:
            return ("DELETED", obj)
        return None

    async def _watch(self, request: web.Request, rtype: ResourceType, namespace: str | None,
                     query: dict[str, str], info: RequestInfo) -> web.StreamResponse:
        try:
            bookmarks = parse_bool(query.get("allowWatchBookmarks", "false"))
            send_initial = query.get("sendInitialEvents")
            send_initial_b = parse_bool(send_initial) if send_initial is not None else None
            match = self._matcher(namespace, query.get("labelSelector"), query.get("fieldSelector"))
            timeout_s = query.get("timeoutSeconds")
            timeout = float(timeout_s) if timeout_s not in (None, "") else self.default_watch_timeout
        except ValueError as exc:
            raise FakeApiError(400, "BadRequest", str(exc)) from exc
        rv_param = query.get("resourceVersion", "")
        if rv_param and not rv_param.isdigit():
            raise FakeApiError(400, "BadRequest", f'invalid resource version "{rv_param}"')
        self._store(rtype)  # 404 if the resource went away

        # Everything up to registering the watcher is synchronous, so no event can slip between
        # the snapshot/replay and the live queue.
        watcher = _Watcher(rtype, namespace, match, asyncio.Queue(), self._rv)
        initial: list[tuple[str, JSON]] = []
        expired: JSON | None = None
        if send_initial_b or rv_param in ("", "0"):
            # Synthetic ADDED for the current state (RV "" / "0", or sendInitialEvents=true).
            initial = [("ADDED", o) for o in self._select(rtype, match)]
        else:
            n = int(rv_param)
            if n < self._compacted_rv:
                expired = make_status(410, "Expired",
                                      f"too old resource version: {n} ({self._compacted_rv})")
            else:
                watcher.start_rv = n
                for e in self._history:
                    if e.rv > n and e.key == rtype.store_key:
                        delivered = self._filter_event(watcher, e.type, e.obj, e.old)
                        if delivered is not None:
                            initial.append(delivered)

        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Cache-Control": "no-cache, private"})
        resp.enable_chunked_encoding()
        if expired is not None:
            await resp.prepare(request)
            await resp.write((_dumps({"type": "ERROR", "object": expired}) + "\n").encode())
            await resp.write_eof()
            info.status = 200
            return resp

        for item in initial:
            watcher.queue.put_nowait(item)
        if send_initial_b and bookmarks:
            watcher.queue.put_nowait(_Marker("initial-end", self._rv))
        self._watchers.add(watcher)
        self._notify_changed()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        interval = self.bookmark_interval if bookmarks else None
        next_bookmark = loop.time() + interval if interval else None
        aborted = False
        try:
            await resp.prepare(request)
            info.status = 200
            while True:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    break
                # A periodic bookmark carries the current RV, which is only truthful once every
                # queued event has been written: postpone it while the queue is non-empty.
                if next_bookmark is not None and now >= next_bookmark and watcher.queue.empty():
                    await resp.write(self._bookmark_line(rtype, max(self._rv, watcher.start_rv)))
                    next_bookmark = now + interval
                    continue
                if not watcher.queue.empty():
                    item = watcher.queue.get_nowait()
                else:
                    waits = [t - now for t in (deadline, next_bookmark) if t is not None]
                    try:
                        if waits:
                            item = await asyncio.wait_for(watcher.queue.get(), max(min(waits), 0))
                        else:
                            item = await watcher.queue.get()
                    except TimeoutError:
                        continue
                if isinstance(item, _Marker):
                    if item.name == _CLOSE:
                        break
                    if item.name == _ABORT:
                        aborted = True
                        break
                    if item.name == _BOOKMARK:
                        if bookmarks:
                            await resp.write(self._bookmark_line(rtype, max(item.rv, watcher.start_rv)))
                        continue
                    if item.name == "initial-end":
                        await resp.write(self._bookmark_line(rtype, item.rv, initial_end=True))
                        continue
                etype, obj = item
                await resp.write((_dumps({"type": etype, "object": _present(obj, rtype, copy_=False)})
                                  + "\n").encode())
            if aborted:
                if request.transport is not None:
                    request.transport.abort()
                return resp
            await resp.write_eof()
            return resp
        finally:  # also on client disconnect (handler_cancellation) or a broken connection
            self._watchers.discard(watcher)
            self._notify_changed()

    @staticmethod
    def _bookmark_line(rtype: ResourceType, rv: int, initial_end: bool = False) -> bytes:
        meta: JSON = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
        obj = {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": meta}
        return (_dumps({"type": "BOOKMARK", "object": obj}) + "\n").encode()
