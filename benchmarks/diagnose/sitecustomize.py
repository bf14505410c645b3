"""Opt-in stall diagnostics for the server under test (docs/performance.md, round 5). Not used
by any scenario unless asked for: put this directory first on the server's PYTHONPATH and name
an output file (absolute paths: the server runs in its own working directory), e.g.

    python -m benchmarks push --full --rounds 5 \\
        --server-env PYTHONPATH=$PWD/benchmarks/diagnose:$PWD --server-env PILOT_BENCH_DIAG_OUT=/tmp/diag.json

Python imports `sitecustomize` at start-up; this one acts only in the `pilot.cli discovery`
process (the load generator and the floor are left alone) and writes, at exit:

- `gc`: every cyclic collection as [wall time, generation, wall ms, thread CPU ms, collected].
  Wall minus CPU is the machine's share; the CPU figure is the pause the collector itself costs.
- `pushes`: each `DiscoveryServer.push` (the debounce task's synchronous step) as [wall time,
  total ms, context build ms].
- `rss`: once a second, [wall time, RSS MB].
- `callbacks` (only with PILOT_BENCH_DIAG_CALLBACKS=1, it costs ~1 us per callback): every
  event-loop callback over 12 ms as [wall time, task or callback name, wall ms, thread CPU ms].

PILOT_BENCH_GC_THRESHOLDS=A,B,C replaces the server's own `gc.set_threshold` call (experiments).
"""

from __future__ import annotations

import asyncio.events
import atexit
import contextlib
import gc
import json
import os
import sys
import threading
import time

OUT = os.environ.get("PILOT_BENCH_DIAG_OUT")
ACTIVE = bool(OUT) and "discovery" in sys.argv and any("pilot.cli" in a for a in sys.orig_argv)

_gc: list[list] = []
_pushes: list[list] = []
_rss: list[list] = []
_callbacks: list[list] = []
_started = [0.0, 0.0]


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0], _started[1] = time.perf_counter(), time.thread_time()
        return
    _gc.append([round(time.time(), 3), info["generation"], round((time.perf_counter() - _started[0]) * 1000, 2),
                round((time.thread_time() - _started[1]) * 1000, 2), info["collected"]])


def _wrap_push() -> bool:
    mod = sys.modules.get("pilot.xds.discovery")
    cls = getattr(mod, "DiscoveryServer", None)
    if cls is None:
        return False
    push, build = cls.push, cls._build_context
    current: dict[str, float] = {}

    def timed_push(self, req, debounce_s=0.0):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        current.clear()
        try:
            return push(self, req, debounce_s)
        finally:
            _pushes.append([round(time.time(), 3), round((time.perf_counter() - t0) * 1000, 2), current.get("build")])

    def timed_build(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return build(self, *args, **kwargs)
        finally:
            current["build"] = round((time.perf_counter() - t0) * 1000, 2)

    cls.push, cls._build_context = timed_push, timed_build
    return True


def _sampler() -> None:
    wrapped = False
    while True:
        time.sleep(1.0)
        if not wrapped:
            with contextlib.suppress(Exception):  # a module half imported: try again next second
                wrapped = _wrap_push()
        try:
            with open("/proc/self/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
        except (OSError, StopIteration):
            continue
        _rss.append([round(time.time(), 1), round(rss, 1)])


def _timed_callbacks() -> None:
    run = asyncio.events.Handle._run
    main = threading.main_thread()

    def timed(self):  # type: ignore[no-untyped-def]
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return run(self)
        finally:
            ms = (time.perf_counter() - t0) * 1000
            if ms > 12 and threading.current_thread() is main:
                cb = self._callback
                owner = getattr(cb, "__self__", None)
                name = getattr(cb, "__qualname__", repr(cb))
                if owner is not None and hasattr(owner, "get_coro"):
                    name = f"{owner.get_name()}:{getattr(owner.get_coro(), '__qualname__', '?')}"
                _callbacks.append([round(time.time(), 3), name[:100], round(ms, 1),
                                   round((time.thread_time() - c0) * 1000, 1)])

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]


def _dump() -> None:
    with open(OUT or os.devnull, "w") as f:
        json.dump({"gc": _gc, "pushes": _pushes, "rss": _rss, "callbacks": _callbacks}, f)


if ACTIVE:
    gc.callbacks.append(_on_gc)
    threading.Thread(target=_sampler, name="diag-sampler", daemon=True).start()
    if os.environ.get("PILOT_BENCH_DIAG_CALLBACKS") == "1":
        _timed_callbacks()
    thresholds = os.environ.get("PILOT_BENCH_GC_THRESHOLDS")
    if thresholds:
        values = tuple(int(x) for x in thresholds.split(","))
        set_threshold = gc.set_threshold
        gc.set_threshold = lambda *_: set_threshold(*values)  # type: ignore[assignment]
    atexit.register(_dump)
