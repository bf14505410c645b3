"""How late the event loop runs what is due: every xDS stream, push and debug request shares one
loop, so a long synchronous step (a large PushContext build, a GC pause, a blocked call) delays
all of them. A sampler asks to be woken every `interval` and records how late it woke, as
`pilot_event_loop_lag_seconds` (not an istiod metric: istiod has no single loop to watch), and
keeps the recent samples for /debug/loop_lag (a percentile over a window, which a histogram's
buckets cannot give to the millisecond).
"""

from __future__ import annotations

import asyncio
import time
from array import array

from prometheus_client import Gauge, Histogram

from pilot.metrics import Metrics

# Seconds between samples. A sample costs a few microseconds, so 50 a second is free, and a
# stall of more than 20 ms cannot pass between two samples unseen.
INTERVAL = 0.02
KEEP = 30_000  # samples kept for /debug/loop_lag: 10 minutes at INTERVAL, 480 KB


def lag_metrics(metrics: Metrics) -> tuple[Histogram, Gauge]:
    r = metrics.registry
    histogram = Histogram("pilot_event_loop_lag_seconds", "How late the event loop woke a timer it had due.",
                          buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
    worst = Gauge("pilot_event_loop_lag_max_seconds", "The largest event-loop lag seen so far.", registry=r)
    return histogram, worst


class LagSamples:
    """A ring of the last `keep` (wall time, lag) samples, in two flat arrays (no object per sample)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._at = array("d")
        self._lag = array("d")
        self._next = 0  # where the next sample goes once the ring is full
        self.count = 0  # samples ever recorded

    def add(self, at: float, lag: float) -> None:
        if len(self._at) < self.keep:
            self._at.append(at)
            self._lag.append(lag)
        else:
            self._at[self._next] = at
            self._lag[self._next] = lag
            self._next = (self._next + 1) % self.keep
        self.count += 1

    def since(self, t: float) -> list[float]:
        """The lags sampled at or after wall time `t` (seconds), in no particular order."""
        return [lag for at, lag in zip(self._at, self._lag, strict=True) if at >= t]

    def summary(self, t: float = 0.0) -> dict:
        """Milliseconds: p50, p99 and max of the samples since `t`, and how many there were."""
        lags = sorted(self.since(t))
        n = len(lags)
        if not n:
            return {"samples": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}

        def q(p: float) -> float:
            return round(lags[min(n - 1, int(p * n))] * 1000, 2)

        return {"samples": n, "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(lags[-1] * 1000, 2)}


async def sample_lag(histogram: Histogram, worst: Gauge, stop: asyncio.Event,
                     interval: float = INTERVAL, samples: LagSamples | None = None) -> None:
    """Until `stop` is set (seen within one interval). The sleep is the measurement itself, not a
    synchronisation."""
    highest = 0.0
    while not stop.is_set():
        due = time.monotonic() + interval
        await asyncio.sleep(interval)
        lag = max(0.0, time.monotonic() - due)
        histogram.observe(lag)
        if samples is not None:
            samples.add(time.time(), lag)
        if lag > highest:
            highest = lag
            worst.set(lag)
