"""The server under test: the real `pilot.cli discovery` in its own process, on 127.0.0.1 ports
bound as 0 (read back from --portsFile), with its CPU time and RSS read through psutil."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import aiohttp
import psutil

from benchmarks.ipc import REPO_ROOT

# The server runs with its defaults (scenarios add --server-env). New streams are admitted by
# load, not at a fixed rate, so "1,000 proxies connect at once" measures the server as shipped.
SERVER_ENV: dict[str, str] = {}


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak RSS so far (the kernel's high-water mark, VmHWM): a transient a poll would miss."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class ServerError(RuntimeError):
    pass


def probe_env(path: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` plus what loads benchmarks/heapprobe into a Python process, writing to `path`; a
    PYTHONPATH already in `env` (benchmarks/diagnose, say) follows the probe's directory."""
    env = dict(env or {})
    rest = env.get("PYTHONPATH", str(REPO_ROOT))
    env["PYTHONPATH"] = f"{REPO_ROOT / 'benchmarks' / 'heapprobe'}{os.pathsep}{rest}"
    env["BENCH_HEAP_PROBE"] = str(path)
    return env


async def read_heap(pid: int, path: Path, timeout: float = 30.0) -> dict:
    """Ask the probe in process `pid` (started with probe_env(path)) for its figures, taken now."""
    before = json.loads(path.read_text())["seq"] if path.exists() else -1
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = json.loads(path.read_text())
            if found["seq"] > before:
                return found
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            raise ServerError(f"no heap figures from {pid} within {timeout}s")
        await asyncio.sleep(0.05)


def _read_ports(path: Path) -> dict[str, int] | None:
    try:
        ports = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return ports if isinstance(ports, dict) and "grpc" in ports else None


class ServerProcess:
    def __init__(self, workdir: Path, config_dir: Path, env: dict[str, str] | None = None,
                 grpc_port: int = 0) -> None:
        self.workdir = workdir
        self.grpc_port_wanted = grpc_port  # 0: any; a replica behind a load balancer keeps its port
        self.config_dir = config_dir
        self.env = {**SERVER_ENV, **(env or {})}
        self.log_path = workdir / "pilot.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.ports: dict[str, int] = {}
        self._ps: psutil.Process | None = None
        self._log = None

    async def start(self, timeout: float = 60.0) -> None:
        ports_file = self.workdir / "ports.json"
        ports_file.unlink(missing_ok=True)
        mesh_file = self.workdir / "mesh.yaml"
        mesh_file.write_text("")  # defaults; the mesh ConfigMap in the config dir is what we change
        args = [sys.executable, "-m", "pilot.cli", "discovery", "--configDir", str(self.config_dir),
                "--meshConfig", str(mesh_file), "--grpcAddr", f"127.0.0.1:{self.grpc_port_wanted}", "--httpAddr", "127.0.0.1:0",
                "--monitoringAddr", "127.0.0.1:0", "--secureGRPCAddr", "", "--portsFile", str(ports_file)]
        self._log = open(self.log_path, "ab")  # noqa: SIM115, ASYNC230 - lives as long as the server
        self.proc = await asyncio.create_subprocess_exec(
            *args, stdout=self._log, stderr=self._log, cwd=str(self.workdir),
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **self.env})
        self._ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + timeout
        # The ports file is written once every listener is bound and the config dir is loaded;
        # it is not written atomically, so a file that does not parse yet is "not yet".
        while not (ports := _read_ports(ports_file)):
            if self.proc.returncode is not None:
                raise ServerError(f"server exited with {self.proc.returncode}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerError(f"server did not start within {timeout}s\n{self.log_tail()}")
            await asyncio.sleep(0.05)
        self.ports = ports
        status = await self.get("/ready")
        if status[0] != 200:
            raise ServerError(f"server not ready: {status}\n{self.log_tail()}")

    @property
    def grpc_port(self) -> int:
        return self.ports["grpc"]

    async def get(self, path: str, port: str = "http") -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.ports[port]}{path}") as r:
            return r.status, await r.text()

    async def debug(self, path: str):
        status, text = await self.get(path)
        if status != 200:
            raise ServerError(f"{path}: {status} {text[:200]}")
        return json.loads(text)

    async def pushes(self) -> list[dict]:
        """The server's recent pushes, newest first, from /debug/push_status, reduced to the few
        fields the scenarios report (read from either the flat or the `stages_ms` layout)."""
        out = []
        for p in (await self.debug("/debug/push_status")).get("pushes", []):
            stages = p.get("stages_ms") or {}
            debounce_ms = stages.get("debounce", p["debounce_s"] * 1000 if "debounce_s" in p else None)
            build_ms = stages.get("context_build", p["context_build_s"] * 1000 if "context_build_s" in p else None)
            out.append({"version": p.get("version"), "full": p.get("full"), "proxies": p.get("proxies"),
                        "debounce_ms": debounce_ms, "context_build_ms": build_ms,
                        **({"stages_ms": stages} if stages else {})})
        return out

    def cpu_s(self) -> float:
        """User + system CPU seconds the server process has used so far (all its threads)."""
        t = self._ps.cpu_times()
        return t.user + t.system

    def rss_mb(self) -> float:
        return self._ps.memory_info().rss / (1 << 20)

    def peak_rss_mb(self) -> float | None:
        return peak_rss_mb(self._ps.pid)

    @property
    def heap_probe(self) -> Path:
        return self.workdir / "heap.json"

    async def heap(self) -> dict:
        """RSS and glibc's heap figures now, from the probe (a server started with probe_env())."""
        assert self._ps is not None
        return await read_heap(self._ps.pid, self.heap_probe)

    async def loop_lag(self, since: float = 0.0) -> dict:
        """The server's event-loop lag (pilot/loop_lag.py) since wall time `since`: samples, p50, p99, max ms."""
        return await self.debug(f"/debug/loop_lag?since={since:.3f}")

    async def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""
