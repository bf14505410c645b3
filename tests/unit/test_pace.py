"""Stream work per event-loop iteration is bounded (pilot/xds/pace.py): a thousand streams
woken at once by a push, or by a batch of ACKs, take turns instead of holding every timer (the
lag sampler's, other streams') for the sum of their steps."""

from __future__ import annotations

import asyncio
import itertools
import time

from pilot.xds.pace import Pace


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds  # CPU time: the machine's load does not stretch it
    while time.process_time() < end:
        pass


async def _run(pace: Pace | None, streams: int = 200, step: float = 0.001) -> tuple[float, list[int]]:
    """The longest the loop went (in CPU time) without running a timer, and the order steps ran in."""
    order: list[int] = []
    ticks: list[float] = []
    done = asyncio.Event()

    async def ticker():
        while not done.is_set():
            ticks.append(time.process_time())
            await asyncio.sleep(0.001)

    async def stream(i: int, woken: asyncio.Event):
        await woken.wait()
        if pace is not None:
            await pace.turn()
        _busy(step)
        order.append(i)

    woken = asyncio.Event()
    tasks = [asyncio.create_task(stream(i, woken)) for i in range(streams)]
    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    start = time.process_time()
    woken.set()  # every stream is ready in the same iteration, as after a push fan-out
    await asyncio.gather(*tasks)
    end = time.process_time()
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


async def test_a_turn_costs_nothing_while_the_iteration_has_budget():
    pace = Pace(budget=0.005)
    await pace.turn()
    await pace.turn()
    assert pace.waits == 0
