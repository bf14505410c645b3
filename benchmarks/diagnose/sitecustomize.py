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
- `iterations` (with PILOT_BENCH_DIAG_CALLBACKS=1 too): every loop iteration whose callbacks
  took over 12 ms together, as [wall time, total ms, callbacks run, ms of steps that took a
  stream turn (pilot/xds/pace.py), the five names that took longest in it as [name, count, ms]]:
  lag made of many short callbacks, which `callbacks` misses. `iteration_ms`: how many
  iterations took each whole number of ms (all of them, from start to exit).

PILOT_BENCH_GC_THRESHOLDS=A,B,C replaces the server's own `gc.set_threshold` call (experiments).
"""

from __future__ import annotations

import asyncio.base_events
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
_iterations: list[list] = []
_iteration_ms: dict[int, int] = {}
_turned = [False]  # the running step took a turn (set by the wrapped Pace.turn)
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


def _name(handle) -> str:  # type: ignore[no-untyped-def]
    cb = handle._callback
    owner = getattr(cb, "__self__", None)
    name = getattr(cb, "__qualname__", repr(cb))
    if owner is not None and hasattr(owner, "get_coro"):
        coro = owner.get_coro()
        name = f"{owner.get_name().split('-')[0][:24]}:{getattr(coro, '__qualname__', '?')}"
        # Where the task resumes: the innermost coroutine it awaits, and its line.
        inner, where, depth = coro, None, 0
        while inner is not None and depth < 40:
            frame = getattr(inner, "cr_frame", None) or getattr(inner, "gi_frame", None)
            if frame is not None:
                where = f"{getattr(inner, '__qualname__', '?')}:{frame.f_lineno}"
            inner = getattr(inner, "cr_await", None) or getattr(inner, "gi_yieldfrom", None)
            depth += 1
        if where is not None:
            name += f" @{where}"
    return name[:140]


def _timed_callbacks() -> None:
    run = asyncio.events.Handle._run
    run_once = asyncio.base_events.BaseEventLoop._run_once
    main = threading.main_thread()
    iteration: dict[str, list] = {}  # name -> [count, ms] for the callbacks of the current iteration
    total = [0.0, 0, 0.0]  # ms, callbacks, ms of turned steps

    def timed(self):  # type: ignore[no-untyped-def]
        name = _name(self) if threading.current_thread() is main else ""
        _turned[0] = False
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return run(self)
        finally:
            ms = (time.perf_counter() - t0) * 1000
            if name:
                total[0] += ms
                total[1] += 1
                if _turned[0]:
                    total[2] += ms
                else:
                    name = "(no turn) " + name
                entry = iteration.setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += ms
                if ms > 12:
                    _callbacks.append([round(time.time(), 3), name, round(ms, 1),
                                       round((time.thread_time() - c0) * 1000, 1)])

    def timed_once(self):  # type: ignore[no-untyped-def]
        if total[1]:
            bucket = int(total[0])
            _iteration_ms[bucket] = _iteration_ms.get(bucket, 0) + 1
        if total[0] > 12:
            top = sorted(iteration.items(), key=lambda kv: -kv[1][1])[:5]
            _iterations.append([round(time.time(), 3), round(total[0], 1), total[1], round(total[2], 1),
                                [[n, c, round(ms, 1)] for n, (c, ms) in top]])
        iteration.clear()
        total[0], total[1], total[2] = 0.0, 0, 0.0
        return run_once(self)

    def wrap_turn() -> bool:
        mod = sys.modules.get("pilot.xds.pace")
        if mod is None:
            return False
        spend = mod.Pace._spend  # every step a turn lets run passes here, however turn() was bound

        def spent(self, now):  # type: ignore[no-untyped-def]
            ran = spend(self, now)
            if ran:
                _turned[0] = True  # in the step that took (or resumed from) the turn
            return ran

        mod.Pace._spend = spent
        return True

    def wrap_turn_later() -> None:
        while not wrap_turn():
            time.sleep(0.05)

    threading.Thread(target=wrap_turn_later, name="diag-turn", daemon=True).start()

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop._run_once = timed_once  # type: ignore[method-assign]


def _dump() -> None:
    with open(OUT or os.devnull, "w") as f:
        json.dump({"gc": _gc, "pushes": _pushes, "rss": _rss, "callbacks": _callbacks,
                   "iterations": _iterations,
                   "iteration_ms": _iteration_ms}, f)


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
