"""The control for event-loop lag: an idle asyncio process beside the server, sampling its own
loop exactly as pilot/loop_lag.py samples the server's (a 20 ms sleep, how late it woke).
On a shared 2-core machine an idle loop is itself sometimes late by 50-500 ms (the kernel gives
the core to someone else); the server's lag is only its own where it exceeds this.

    python -m benchmarks.lagcontrol FILE     # appends "unix_time lag_seconds" lines until killed
"""

from __future__ import annotations

import asyncio
import sys
import time

from pilot.loop_lag import INTERVAL


async def sample(path: str) -> None:
    with open(path, "a", buffering=1) as out:  # noqa: ASYNC230 - a local file, line-buffered
        while True:
            due = time.monotonic() + INTERVAL
            await asyncio.sleep(INTERVAL)
            out.write(f"{time.time():.4f} {max(0.0, time.monotonic() - due):.5f}\n")


def summary(path: str, since: float, until: float | None = None) -> dict:
    """The same figures as /debug/loop_lag, for the samples from `since` to `until`."""
    from pilot.loop_lag import LagSamples
    samples = LagSamples(keep=10**7)
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and (until is None or float(parts[0]) <= until):
                    samples.add(float(parts[0]), float(parts[1]))
    except FileNotFoundError:
        pass
    return samples.summary(since)


if __name__ == "__main__":
    asyncio.run(sample(sys.argv[1]))
