"""How late the event loop runs what is due: every xDS stream, push and debug request shares one
loop, so a long synchronous step (a large PushContext build, a GC pause, a blocked call) delays
all of them. A sampler asks to be woken every `interval` and records how late it woke, as
`pilot_event_loop_lag_seconds` (not an istiod metric: istiod has no single loop to watch).
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import Gauge, Histogram

from pilot.metrics import Metrics

INTERVAL = 0.25  # seconds between samples: a sample costs microseconds


def lag_metrics(metrics: Metrics) -> tuple[Histogram, Gauge]:
    r = metrics.registry
    histogram = Histogram("pilot_event_loop_lag_seconds", "How late the event loop woke a timer it had due.",
                          buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
    worst = Gauge("pilot_event_loop_lag_max_seconds", "The largest event-loop lag seen so far.", registry=r)
    return histogram, worst


async def sample_lag(histogram: Histogram, worst: Gauge, stop: asyncio.Event,
                     interval: float = INTERVAL) -> None:
    """Until `stop` is set. The wait is the measurement itself, not a synchronisation."""
    highest = 0.0
    while not stop.is_set():
        due = time.monotonic() + interval
        try:
            await asyncio.wait_for(stop.wait(), interval)
            return
        except TimeoutError:
            pass
        lag = max(0.0, time.monotonic() - due)
        histogram.observe(lag)
        if lag > highest:
            highest = lag
            worst.set(lag)
