"""The processes of one scenario: a fresh mesh directory, the server under test, load generators
(and, for `push`, the floor server), each in its own process, all stopped on the way out.

Every scenario starts from a fresh server so that one scenario's cache, connections and garbage
never colour the next one's numbers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

import psutil

from benchmarks import lagcontrol, stats
from benchmarks.ipc import REPO_ROOT, Child
from benchmarks.mesh import MeshFiles
from benchmarks.options import Options
from benchmarks.report import environment
from benchmarks.server import ServerProcess, peak_rss_mb


class Loadgen:
    """The orchestrator's handle on one load generator process."""

    def __init__(self, child: Child, opts: Options) -> None:
        self.child = child
        self.opts = opts

    async def connect(self, start: int, count: int, capture_all: bool = False) -> dict:
        return await self.child.request("connect", start=start, count=count, capture_all=capture_all)

    async def sharing(self) -> dict:
        """Per type: resources and bytes held over all proxies, and the distinct bytes among them."""
        return await self.child.request("sharing", wait=120)

    async def synced(self, timeout: float) -> dict:
        return await self.child.request("synced", timeout=timeout, wait=timeout + 30)

    async def converge(self, type_: str, changes: list[tuple[float, str | None]], timeout: float) -> dict:
        """Per change, per proxy: ms from the change's wall time to the ACK of the first response
        of `type_` received after it that carries the named resource (None: any response)."""
        return await self.child.request("converge", type=type_, changes=changes, timeout=timeout,
                                        wait=timeout + 30)

    async def watching(self, type_: str, name: str) -> int:
        return (await self.child.request("watching", type=type_, name=name))["watching"]

    async def capture(self, type_: str, path: Path) -> int:
        return (await self.child.request("capture", type=type_, path=str(path)))["bytes"]

    async def stats(self) -> dict:
        return await self.child.request("stats")

    async def stop(self) -> None:
        await self.child.stop()


class Harness:
    def __init__(self, opts: Options, scenario: str) -> None:
        self.opts = opts
        self.scenario = scenario
        self.workdir = Path(tempfile.mkdtemp(prefix=f"pilot-bench-{scenario}-"))
        self.mesh = MeshFiles(self.workdir / "config", opts.services, opts.namespaces, opts.port_name)
        self.server = ServerProcess(self.workdir, self.mesh.root, dict(opts.server_env))
        self._children: list[Child] = []
        self._failed = False
        self._results: list[dict] = []
        self._figures: dict | None = None
        self._control: asyncio.subprocess.Process | None = None
        self._control_file = self.workdir / "control-lag.txt"
        self.started_at = 0.0

    def control_lag(self, since: float, until: float | None = None) -> dict:
        """The idle control process's loop lag from `since` to `until` (benchmarks/lagcontrol.py)."""
        return lagcontrol.summary(str(self._control_file), since, until)

    async def __aenter__(self) -> Self:
        try:
            self.mesh.write_all()
            await self.server.start(timeout=self.opts.timeout())
            self.started_at = time.time()
            # The machine's own lag, beside the server's (benchmarks/lagcontrol.py).
            self._control = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchmarks.lagcontrol", str(self._control_file),
                cwd=str(REPO_ROOT), env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        except BaseException as e:
            await self.__aexit__(type(e), e, e.__traceback__)  # never leave a server behind
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self._failed = exc_type is not None
        if not self._failed:
            await self.server_figures()
            self._apply_figures()
        for child in reversed(self._children):
            await child.stop()
        await self.server.stop()
        if self._control is not None and self._control.returncode is None:
            self._control.terminate()
            await self._control.wait()
        if self._failed or self.opts.keep_workdir:
            print(f"[{self.scenario}] logs kept in {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def child(self, module: str, args: list[str], label: str) -> tuple[Child, dict]:
        child = Child(module, args, self.workdir / f"{label}.log")
        self._children.append(child)
        hello = await child.start()
        return child, hello

    async def loadgen(self, port: int, label: str = "loadgen") -> Loadgen:
        args = ["--target", f"127.0.0.1:{port}", "--channels", str(self.opts.channels),
                "--namespaces", str(self.opts.namespaces), *(["--delta"] if self.opts.delta else [])]
        child, _ = await self.child("benchmarks.loadgen", args, label)
        return Loadgen(child, self.opts)

    async def connect_all(self, lg: Loadgen, count: int, start: int = 0, capture_all: bool = False) -> dict:
        """Connect proxies and wait until each holds its full config; a setup step, so any
        proxy left without config makes the scenario fail rather than report half a mesh."""
        await lg.connect(start, count, capture_all)
        sync = await lg.synced(self.opts.timeout())
        if sync["synced"] != sync["proxies"]:
            raise RuntimeError(f"only {sync['synced']}/{sync['proxies']} proxies got full config: "
                               f"missing {sync['missing']}, errors {sync['errors']}\n{self.server.log_tail()}")
        return sync

    async def last_push(self) -> dict:
        pushes = await self.server.pushes()
        return pushes[0] if pushes else {}

    def result(self, **fields: Any) -> dict:
        """The fields every scenario's JSON has, then the scenario's own. The server's event-loop
        lag and peak RSS over the whole scenario are added on the way out (`_server_figures`),
        while the server still runs."""
        out = {"scenario": self.scenario,
               "params": {**self.opts.public(), "server_env": self.server.env},
               "environment": environment(),
               "proxies": self.opts.proxies,
               **fields}
        self._results.append(out)
        return out

    async def server_figures(self) -> dict:
        """Event-loop lag from the server's first ready moment to now (cold cache and setup
        included: a stall there stalls proxies too), and its peak RSS. Taken once: a scenario
        that stops the server early (to free the CPU for the floor) calls this first."""
        if self._figures is None:
            try:
                lag = await self.server.loop_lag(self.started_at)
            except Exception as e:  # noqa: BLE001 - a figure missing is reported, not fatal
                lag = {"error": str(e)}
            self._figures = {"loop_lag_ms": lag, "control_loop_lag_ms": self.control_lag(self.started_at),
                             "server_peak_rss_mb": self.server.peak_rss_mb()}
        return self._figures

    def _apply_figures(self) -> None:
        for r in self._results:
            r.update(self._figures or {})
            peak, floor_peak = r.get("server_peak_rss_mb"), r.get("floor_peak_rss_mb")
            if peak and floor_peak:
                r["peak_rss_ratio"] = round(peak / floor_peak, 2)


def pooled(changes: list[dict], key: str = "ack_ms") -> list[float]:
    return [v for c in changes for v in c[key]]


def summarize(changes: list[dict]) -> dict:
    return stats.summary(pooled(changes))


class CpuWindow:
    """CPU seconds a process spends between open and close, with the wall time it took."""

    def __init__(self, cpu_s) -> None:
        self._cpu_s = cpu_s
        self.cpu0 = cpu_s()
        self.t0 = time.time()
        self.cpu = self.wall = 0.0

    def close(self) -> float:
        self.cpu = self._cpu_s() - self.cpu0
        self.wall = time.time() - self.t0
        return self.cpu


async def floor_connect(h: Harness, opts: Options, responses: dict[str, Path], label: str = "floor-connect") -> dict:
    """The floor's initial sync: proxies connecting at once to a floor that answers each
    subscription with the captured response of its type (the bytes our server sent proxy 0),
    timed as the `connect` scenario times ours: until each holds CDS, EDS, LDS and RDS."""
    args = [a for path in responses.values() for a in ("--response", str(path))]
    floor, hello = await h.child("benchmarks.floor", [*args, *(["--delta"] if opts.delta else [])], label)
    ps = psutil.Process(floor.pid)
    lg = await h.loadgen(hello["port"], label=f"loadgen-{label}")

    def cpu_s() -> float:
        t = ps.cpu_times()
        return t.user + t.system

    window = CpuWindow(cpu_s)
    await lg.connect(0, opts.proxies)
    sync = await lg.synced(opts.timeout())
    window.close()
    ms = [(t - window.t0) * 1000 for t in sync["synced_at"]]
    result = {"convergence_ms": stats.summary(ms), "all_synced_ms": max(ms, default=None),
              "proxies_acked": sync["synced"], "cpu_s": window.cpu,
              "rss_mb": ps.memory_info().rss / (1 << 20), "peak_rss_mb": peak_rss_mb(floor.pid)}
    await lg.stop()
    await floor.stop()
    return result


async def floor_rounds(h: Harness, opts: Options, responses: dict[str, Path], label: str, *,
                       measure: tuple[str, ...], pushed: tuple[Path, ...] = ()) -> dict:
    """The floor (benchmarks/floor.py) measured with a load generator of its own: proxies set up
    with `responses` (type -> a captured response, streamed in this order on a push unless
    `pushed` names what a push sends), then `opts.rounds` pushes, each timed until every proxy
    ACKed a response of each `measure` type. `convergence_ms` is the first measured type's."""
    args = [a for path in responses.values() for a in ("--response", str(path))]
    args += [a for path in pushed for a in ("--push", str(path))]
    floor, hello = await h.child("benchmarks.floor", [*args, *(["--delta"] if opts.delta else [])], label)
    ps = psutil.Process(floor.pid)
    lg = await h.loadgen(hello["port"], label=f"loadgen-{label}")
    await lg.connect(0, opts.proxies)
    # The floor answers only the captured types, so "set up" means every proxy holds those.
    for type_ in responses:
        setup = (await lg.converge(type_, [(0.0, None)], opts.timeout()))["changes"][0]
        if setup["acked"] != opts.proxies:
            raise RuntimeError(f"{label}: only {setup['acked']}/{opts.proxies} proxies got {type_}")

    def cpu_s() -> float:
        t = ps.cpu_times()
        return t.user + t.system

    rounds = []
    for _ in range(opts.rounds):
        window = CpuWindow(cpu_s)
        x = time.time()
        await floor.request("push")
        acks = {type_: (await lg.converge(type_, [(x, None)], opts.timeout()))["changes"][0] for type_ in measure}
        window.close()
        rounds.append({**acks, "cpu_s": window.cpu})
    first = measure[0]
    result = {"convergence_ms": stats.summary(pooled([r[first] for r in rounds])),
              "ack_ms": {t: stats.summary(pooled([r[t] for r in rounds])) for t in measure},
              "proxies_acked": min(r[t]["acked"] for r in rounds for t in measure),
              "cpu_s": sum(r["cpu_s"] for r in rounds) / len(rounds),
              "rss_mb": ps.memory_info().rss / (1 << 20),
              "peak_rss_mb": peak_rss_mb(floor.pid),
              "rounds": [{"p50": stats.summary(r[first]["ack_ms"])["p50"],
                          "p99": stats.summary(r[first]["ack_ms"])["p99"], "cpu_s": r["cpu_s"]} for r in rounds]}
    await lg.stop()
    await floor.stop()
    return result
