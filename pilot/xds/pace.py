"""Turns on the event loop: at most `budget` seconds of stream work per loop iteration.

asyncio runs, in each iteration, every callback that was ready when the iteration began, and
only then the timers that fell due meanwhile. A push to 1,000 proxies, or 1,000 ACKs arriving in
one batch, makes 1,000 stream tasks ready at once: each is quick (50 us to 1 ms), but together
they keep every timer, the event-loop lag sampler and every other stream waiting 50-150 ms.
A stream task takes a turn before each step of work; once the current iteration has had its
budget, later takers wait, in arrival order, and the next iterations admit them a few at a time
(as many as the measured cost per step fits in the budget). Nothing is dropped or reordered
per stream: work is only spread over more, shorter iterations.

A turn is not a lock: nothing is released, and a step that itself runs long (a cold generation)
is not cut short (pilot/xds/generated.py slices those).

The same measure admits new streams (when PILOT_MAX_REQUESTS_PER_SECOND is unset): a stream
waits before its first request is served while the work already waiting for turns would take
more than ADMIT_BACKLOG to run. A storm of reconnects then goes as fast as the server keeps up,
whatever the machine, and the proxies already connected keep their turns, where a fixed rate
(istiod's 25/s) makes a thousand proxies wait 40 s on an idle server and protects nothing on a
slow one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

BUDGET = 0.005  # seconds of stream work per loop iteration before later takers wait
ADMIT_BACKLOG = 0.05  # seconds of queued turns beyond which new streams wait
ADMIT_PER_ITERATION = 8  # new streams admitted per loop iteration while the backlog is short


class Pace:
    def __init__(self, budget: float = BUDGET) -> None:
        self.budget = budget
        self._open = False  # a window is open in the current loop iteration
        self._ends = 0.0  # perf_counter() at which the open window's budget is spent
        self._started = 0.0
        self._passed = 0  # turns taken in the open window
        self._step = budget / 8  # estimated seconds per step (moving average)
        self._waiting: deque[asyncio.Future] = deque()
        self._arriving: deque[asyncio.Future] = deque()  # new streams waiting to be admitted
        self.waits = 0  # turns that had to wait (for /debug and tests)
        self.admission_waits = 0

    def backlog(self) -> float:
        """Estimated seconds of stream work waiting for a turn."""
        return len(self._waiting) * self._step

    def _begin(self, now: float) -> None:
        self._open = True
        self._started, self._ends, self._passed = now, now + self.budget, 0
        # Runs in the next iteration, after whatever this one admitted.
        asyncio.get_running_loop().call_soon(self._close)

    def _close(self) -> None:
        now = time.perf_counter()
        if self._passed:
            per_step = (now - self._started) / self._passed
            self._step = 0.8 * self._step + 0.2 * per_step
        self._open = False
        waiting = self._waiting
        if self._arriving:
            self._admit_arrivals()
        if not waiting and not self._arriving:
            return
        self._begin(now)
        admit = max(1, int(self.budget / max(self._step, 1e-6)))
        while waiting and admit:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                self._passed += 1
                admit -= 1

    def _admit_arrivals(self) -> None:
        arriving, n = self._arriving, ADMIT_PER_ITERATION
        while arriving and n and self.backlog() < ADMIT_BACKLOG:
            fut = arriving.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    async def admit(self) -> None:
        """A new stream's wait before it is served: none while the server keeps up."""
        if not self._arriving and self.backlog() < ADMIT_BACKLOG:
            return
        fut = asyncio.get_running_loop().create_future()
        self._arriving.append(fut)
        self.admission_waits += 1
        if not self._open:
            self._begin(time.perf_counter())
        await fut

    async def turn(self) -> None:
        """Return at once while this iteration has budget left, else wait for a later one."""
        now = time.perf_counter()
        if not self._open:
            self._begin(now)
        elif now >= self._ends or self._waiting:
            fut = asyncio.get_running_loop().create_future()
            self._waiting.append(fut)
            self.waits += 1
            await fut  # a cancelled waiter's future is cancelled too: _close skips it
            return
        self._passed += 1


class Slots:
    """PILOT_PUSH_THROTTLE: at most `n` holders, the rest served in arrival order, a released
    slot handed straight to the next waiter. asyncio.Semaphore (3.11) rescans its waiters, the
    woken ones still queued included, on every release and removes each waiter from its deque
    by value: with 900 proxies waiting for 100 slots, a push spent more time there than in
    planning its responses."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiters: deque[asyncio.Future] = deque()

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot, then cancelled before using it: pass it on
            raise

    def release(self) -> None:
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():  # a cancelled waiter's future is cancelled: skipped
                fut.set_result(None)
                return
        self._free += 1
