"""Debounce: merge push requests until PILOT_DEBOUNCE_AFTER of quiet or PILOT_DEBOUNCE_MAX since
the first, then hand the merged request to the pusher. Pushes run one at a time; requests that
arrive meanwhile wait and merge, as in istiod."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from pilot.model.push_request import PushRequest


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
            first = last = time.monotonic()
            merged = req
            # An endpoint-only request may skip debounce entirely (PILOT_ENABLE_EDS_DEBOUNCE=false).
            while merged.full or self.debounce_eds:
                now = time.monotonic()
                wait = min(self.after - (now - last), self.max_delay - (now - first))
                if wait <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(self._queue.get(), wait)
                except asyncio.TimeoutError:
                    break
                merged = merged.merge(nxt)
                self.merged_events += 1
                last = time.monotonic()
            await self.on_push(merged, time.monotonic() - first)
