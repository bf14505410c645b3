"""A token bucket for new xDS streams (PILOT_MAX_REQUESTS_PER_SECOND).

Like istiod, a stream over the limit waits for a token instead of being refused: a reconnect
storm is spread out rather than turned into a retry storm.
"""

from __future__ import annotations

import asyncio
import time


class TokenBucket:
    def __init__(self, rate: float, burst: int | None = None) -> None:
        self.rate = rate
        self.burst = max(1, burst if burst is not None else int(rate))
        self._tokens = float(self.burst)
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> float:
        """Take one token; returns the seconds waited. A rate of 0 means unlimited."""
        if self.rate <= 0:
            return 0.0
        async with self._lock:  # FIFO: waiters are served in arrival order
            waited = 0.0
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
                self._updated = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return waited
                delay = (1 - self._tokens) / self.rate
                waited += delay
                await asyncio.sleep(delay)  # pacing, not synchronisation
