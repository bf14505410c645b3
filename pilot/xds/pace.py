"""Turns on the event loop: at most `budget` seconds of stream work per loop iteration.

asyncio runs, in each iteration, every callback that was ready when the iteration began, and
only then the timers that fell due meanwhile. A push to 1,000 proxies, or 1,000 ACKs arriving in
one batch, makes 1,000 stream tasks ready at once: each is quick (50 us to 1 ms), but together
they keep every timer, the event-loop lag sampler and every other stream waiting 50-150 ms.
A stream task takes a turn before each step of work; once the current iteration has had its
budget, later takers wait, in arrival order, and the next iterations wake them a batch at a time.
A woken waiter runs an iteration later, so each one checks the clock as it resumes and, once
that iteration's budget is spent, steps back to the head of the line; the batch size follows
what fitted. (An estimate of the cost per step, fixed when the batch is woken, does not hold:
turns alternate between cheap steps, ACKs, and 0.3-0.5 ms ones, writing a 300 KB response, and
one batch sized by the cheap ones held the loop 40-70 ms.) Nothing is dropped or reordered per
stream: work is only spread over more, shorter iterations.

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
MAX_WAKE = 256  # waiters woken in one iteration at most


class Pace:
    def __init__(self, budget: float = BUDGET) -> None:
        self.budget = budget
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open = False  # a window is open in the current loop iteration
        self._ends: float | None = None  # perf_counter() at which the open window's budget is spent
        self._started = 0.0
        self._passed = 0  # steps run in the open window
        self._step = budget / 8  # estimated seconds per step (moving average): admission only
        self._waiting: deque[asyncio.Future] = deque()
        self._retry: list[asyncio.Future] = []  # woken, found the budget spent: first in line again
        self._arriving: deque[asyncio.Future] = deque()  # new streams waiting to be admitted
        # Waiters woken per iteration. A woken waiter runs in the next iteration, so what fits
        # in the budget is only known once they have run: each checks the clock as it resumes
        # and steps back in line if the window is spent. The count follows what fitted.
        self._wake = 8
        self._woken = 0  # woken, not yet resumed
        self._woken_ran = 0  # of the last batch, those that ran in the budget
        self._woken_deferred = 0
        self.waits = 0  # turns that had to wait (for /debug and tests)
        self.admission_waits = 0

    def backlog(self) -> float:
        """Estimated seconds of stream work waiting for a turn."""
        return (len(self._waiting) + len(self._retry)) * self._step

    def _loop_now(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _begin(self) -> None:
        """Open a window: it lasts `budget` from its first step, until _close in the next iteration."""
        self._open = True
        self._ends = None
        self._passed = 0
        # Queued after whatever this iteration woke, so it runs once they have had their turns.
        self._loop_now().call_soon(self._close)

    def _spend(self, now: float) -> bool:
        """Count one step in the open window; False (nothing counted) if its budget is spent."""
        if self._ends is None:  # the window's first step: always runs (progress)
            self._started, self._ends = now, now + self.budget
        elif now >= self._ends:
            return False
        self._passed += 1
        return True

    def _close(self) -> None:
        now = time.perf_counter()
        if self._passed:
            per_step = (now - self._started) / self._passed
            self._step = 0.8 * self._step + 0.2 * per_step
        self._open = False
        if self._woken_deferred:  # the last batch did not fit: wake what did
            self._wake = max(1, self._woken_ran)
        elif self._woken_ran >= self._wake:  # all of it ran within the budget: try more
            self._wake = min(self._wake * 2, MAX_WAKE)
        self._woken_ran = self._woken_deferred = 0
        waiting = self._waiting
        if self._retry:  # deferred ones go first, in the order they were in
            waiting.extendleft(reversed(self._retry))
            self._retry.clear()
        if self._arriving:
            self._admit_arrivals()
        if not waiting and not self._arriving:
            return
        wake = self._wake
        while waiting and wake:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                self._woken += 1
                wake -= 1
        self._begin()

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
        fut = self._loop_now().create_future()
        self._arriving.append(fut)
        self.admission_waits += 1
        if not self._open:
            self._begin()
        await fut

    async def turn(self) -> None:
        """Return at once while this iteration has budget left, else wait for a later one."""
        if not self._open:
            self._begin()
        if not (self._waiting or self._woken or self._retry) and self._spend(time.perf_counter()):
            return
        self.waits += 1
        await self._wait()

    async def _wait(self) -> None:
        line: deque[asyncio.Future] | list[asyncio.Future] = self._waiting
        while True:
            fut = self._loop_now().create_future()
            line.append(fut)
            if not self._open:
                self._begin()
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._woken -= 1  # woken, then cancelled before it ran
                raise
            self._woken -= 1
            if self._spend(time.perf_counter()):
                self._woken_ran += 1
                return
            self._woken_deferred += 1  # the budget went on earlier ones: first in line again
            line = self._retry


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
