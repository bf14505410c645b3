"""Debounce: merge push requests until PILOT_DEBOUNCE_AFTER of quiet or PILOT_DEBOUNCE_MAX since
the first, then hand the merged request to the pusher. Pushes run one at a time; requests that
arrive meanwhile wait and merge, as in istiod."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from pilot import logging as plog
from pilot.model.push_request import PushRequest

log = plog.get("debounce")


class Debouncer:
    def __init__(self, after: float, max_delay: float, debounce_eds: bool,
                 on_push: Callable[[PushRequest, float], Awaitable[None]]) -> None:
        self.after = after
        self.max_delay = max_delay
        self.debounce_eds = debounce_eds
        self.on_push = on_push
        self._queue: asyncio.Queue[PushRequest] = asyncio.Queue()
        self.merged_events = 0

    def enqueue(self, req: PushRequest) -> None:
        self._queue.put_nowait(req)

    async def run(self) -> None:
        while True:
            req = await self._queue.get()
            if self._immediate(req):
                await self._push(req, 0.0)
                continue
            first = last = time.monotonic()
            merged = req
            while True:
                now = time.monotonic()
                # Endpoint-only batches close PILOT_DEBOUNCE_AFTER after their *first* event:
                # under steady endpoint churn (10 changes/s) istiod's rolling quiet period never
                # comes and every change waits PILOT_DEBOUNCE_MAX. Config changes keep istiod's
                # rolling window, since a full push costs far more.
                limit = self.max_delay if merged.full else min(self.max_delay, self.after)
                wait = min(self.after - (now - last), limit - (now - first))
                if wait <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(self._queue.get(), wait)
                except TimeoutError:
                    break
                if self._immediate(nxt):
                    # As in istiod, an endpoint-only request skips debounce even while a config
                    # change waits for its quiet period; it does not extend that period.
                    await self._push(nxt, 0.0)
                    continue
                merged = merged.merge(nxt)
                self.merged_events += 1
                last = time.monotonic()
            await self._push(merged, time.monotonic() - first)

    def _immediate(self, req: PushRequest) -> bool:
        """An endpoint-only request skips debounce entirely when PILOT_ENABLE_EDS_DEBOUNCE=false."""
        return not req.full and not self.debounce_eds

    async def _push(self, req: PushRequest, debounce_s: float) -> None:
        # A failed push must not end the loop: every later change would silently never be pushed.
        try:
            await self.on_push(req, debounce_s)
        except Exception:
            log.exception("push failed; waiting for the next change", full=req.full,
                          reasons=req.reason_text())
