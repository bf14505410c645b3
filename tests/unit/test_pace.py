"""Stream work per event-loop iteration is bounded (pilot/xds/pace.py): a thousand streams
woken at once by a push, or by a batch of ACKs, take turns instead of holding every timer (the
lag sampler's, other streams') for the sum of their steps."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time

from pilot.xds.pace import ADMIT_BACKLOG, Pace, Slots


def _busy(seconds: float) -> None:
    end = time.thread_time() + seconds  # this thread's CPU time: neither the load nor other threads stretch it
    while time.thread_time() < end:
        pass


async def _run(pace: Pace | None, streams: int = 200, steps: tuple[float, ...] = (0.001,)) -> tuple[float, list[int]]:
    """The longest the loop went (in the loop thread's CPU time) without running a timer, and the
    order streams finished in. Each stream takes a turn before each of its `steps` (CPU seconds)."""
    order: list[int] = []
    ticks: list[float] = []
    done = asyncio.Event()

    async def ticker():
        while not done.is_set():
            ticks.append(time.thread_time())
            await asyncio.sleep(0.001)

    async def stream(i: int, woken: asyncio.Event):
        await woken.wait()
        for step in steps:
            if pace is not None:
                await pace.turn()
            _busy(step)
        order.append(i)

    woken = asyncio.Event()
    tasks = [asyncio.create_task(stream(i, woken)) for i in range(streams)]
    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    # What is measured is the turns, not the test process's collector (with the default
    # thresholds one full collection of this process is 10-30 ms; the server sets its own).
    gc.disable()
    try:
        start = time.thread_time()
        woken.set()  # every stream is ready in the same iteration, as after a push fan-out
        await asyncio.gather(*tasks)
        end = time.thread_time()
    finally:
        gc.enable()
    done.set()
    await tick
    during = [start, *(t for t in ticks if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(during)), order


async def test_streams_woken_at_once_take_turns_and_keep_their_order():
    held, order = await _run(Pace(budget=0.005))
    assert order == list(range(200)), "turns are taken in arrival order"
    assert held < 0.05, f"the loop ran {held * 1000:.0f} ms of stream work without a timer"
    # Without turns the same wake-up holds the loop for all 200 steps at once.
    unpaced, _ = await _run(None)
    assert unpaced > 0.15, unpaced


async def test_a_batch_of_cheap_turns_does_not_size_the_next_batch_of_dear_ones():
    """A push: each stream's ACK step is cheap (20 us), its next step writes a large response
    (1 ms). Waiters woken for the dear steps after the cheap ones must still share the budget,
    not run as many as the cheap steps' cost would fit (100 ms in one iteration)."""
    held, order = await _run(Pace(budget=0.005), streams=400, steps=(0.00002, 0.00002, 0.00002, 0.001))
    assert held < 0.03, f"the loop ran {held * 1000:.0f} ms of stream work without a timer"
    assert order == list(range(400)), "turns are taken in arrival order"


async def test_a_turn_costs_nothing_while_the_iteration_has_budget():
    pace = Pace(budget=0.005)
    await pace.turn()
    await pace.turn()
    assert pace.waits == 0


async def test_new_streams_wait_while_the_server_is_behind_and_are_admitted_as_it_catches_up():
    """Admission by load: with more queued stream work than ADMIT_BACKLOG, a new stream waits;
    it is admitted once the queued work has had its turns (not after a fixed delay)."""
    pace = Pace(budget=0.002)
    order: list[str] = []

    async def stream_step(i: int):
        await pace.turn()
        _busy(0.001)
        order.append(f"step{i}")

    backlog_at_admission: list[float] = []

    async def new_stream():
        await pace.admit()
        backlog_at_admission.append(pace.backlog())
        order.append("admitted")

    steps = [asyncio.create_task(stream_step(i)) for i in range(300)]  # ~0.3 s of queued work
    await asyncio.sleep(0)  # they all ask for a turn; most wait
    assert pace.backlog() > 0.05, pace.backlog()
    arrival = asyncio.create_task(new_stream())
    await asyncio.gather(*steps, arrival)
    assert pace.admission_waits == 1
    admitted_at = order.index("admitted")
    assert 0 < admitted_at < len(order) - 1, "admitted while work remained, but not before the backlog shrank"
    assert backlog_at_admission[0] < ADMIT_BACKLOG, backlog_at_admission
    # With the server keeping up, admission is immediate.
    await pace.admit()
    assert pace.admission_waits == 1


def test_slots_bound_holders_and_serve_waiters_in_arrival_order():
    async def main():
        slots = Slots(2)
        holding: set[int] = set()
        most = 0
        order: list[int] = []

        async def proxy(i: int, release: asyncio.Event) -> None:
            nonlocal most
            await slots.acquire()
            order.append(i)
            holding.add(i)
            most = max(most, len(holding))
            await release.wait()
            holding.discard(i)
            slots.release()

        releases = [asyncio.Event() for _ in range(6)]
        tasks = [asyncio.create_task(proxy(i, releases[i])) for i in range(6)]
        for i in range(6):
            while i not in holding:  # each is let in only once an earlier holder leaves
                await asyncio.sleep(0)
            releases[i].set()
        await asyncio.gather(*tasks)
        return most, order

    most, order = asyncio.run(main())
    assert most == 2
    assert order == [0, 1, 2, 3, 4, 5]


def test_a_waiter_cancelled_after_being_handed_a_slot_passes_it_on():
    async def main():
        slots = Slots(1)
        await slots.acquire()  # held
        first = asyncio.create_task(slots.acquire())
        second = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)  # both wait
        slots.release()  # handed to `first`, which is cancelled before it runs
        first.cancel()
        await asyncio.wait_for(second, 5)  # the slot `first` was handed reached it
        third = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        held_by_second = not third.done()  # one slot, held: the next waits
        slots.release()
        await asyncio.wait_for(third, 5)
        return first.cancelled(), second.done() and not second.cancelled() and held_by_second

    cancelled, second_holds = asyncio.run(main())
    assert cancelled and second_holds is True
