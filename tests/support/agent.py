"""Run the real `pilot-agent proxy` as a subprocess in its own working directory, the way
istio-agent runs in the istio-proxy container (paths relative to the cwd)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Self

import aiohttp
import psutil

from .control_plane import REPO_ROOT
from .wait import StopWaiting, wait_for


class PilotAgent:
    def __init__(self, workdir: str | os.PathLike, *, env: dict[str, str] | None = None,
                 args: list[str] | None = None, proxy_type: str = "sidecar") -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env or {})
        self.args = list(args or [])
        self.proxy_type = proxy_type
        self.proc: asyncio.subprocess.Process | None = None
        self.log_path = self.workdir / "agent.log"
        self.ports_path = self.workdir / "ports.json"
        self._session: aiohttp.ClientSession | None = None

    # --- files the agent reads ----------------------------------------------------------------
    def write_root_cert(self, pem: str) -> None:
        self._write("var/run/secrets/istio/root-cert.pem", pem)

    def write_token(self, token: str) -> None:
        self._write("var/run/secrets/tokens/istio-token", token)

    def _write(self, rel: str, text: str) -> None:
        p = self.workdir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> Self:
        self.ports_path.unlink(missing_ok=True)
        args = [sys.executable, "-m", "pilot.agent", "proxy", self.proxy_type, "--portsFile", str(self.ports_path),
                *self.args]
        # No termination drain unless a test asks for one: every teardown would otherwise wait 5s.
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TERMINATION_DRAIN_DURATION_SECONDS": "0", **self.env}
        self._log = open(self.log_path, "ab")  # noqa: SIM115, ASYNC230 - lives as long as the process; local disk
        self.proc = await asyncio.create_subprocess_exec(*args, stdout=self._log, stderr=self._log, env=env,
                                                         cwd=str(self.workdir))
        return self

    # An agent that exits on its own still has to import, fetch its certificate and run Envoy
    # first: 20 s was overrun at load 15 on two cores (make test runs two workers). This only
    # bounds a hang; a prompt exit returns at once.
    async def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"pilot-agent still running after {timeout}s\n{self.log_tail()}") from None

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def stop(self) -> int | None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            envoys = self.envoy_processes()
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
            for p in envoys:  # never leave an Envoy behind, even if the agent failed
                with contextlib.suppress(psutil.Error):
                    p.kill()
        self._log.close()
        return self.proc.returncode

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- inspection ---------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def envoy_processes(self) -> list[psutil.Process]:
        if self.proc is None or self.proc.returncode is not None:
            return []
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []
        return [c for c in children if c.name() == "envoy"]

    def envoy_pid(self) -> int:
        (p,) = self.envoy_processes()
        return p.pid

    def ports(self) -> dict[str, int]:
        try:
            return json.loads(self.ports_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    async def get(self, port_name: str, path: str, timeout: float = 5.0) -> tuple[int, str]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        port = self.ports()[port_name]
        async with self._session.get(f"http://127.0.0.1:{port}{path}",
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            return r.status, await r.text()

    async def admin_json(self, path: str) -> Any:
        status, text = await self.get("admin", path)
        assert status == 200, f"{path}: {status} {text[:300]}"
        return json.loads(text)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the agent's /healthz/ready (Envoy's /ready behind it) answers 200."""

        async def ready() -> bool:
            if self.proc.returncode is not None:
                raise StopWaiting(f"pilot-agent exited with {self.proc.returncode}:\n{self.log_tail()}")
            status, _ = await self.get("status", "/healthz/ready", timeout=3)
            return status == 200

        await wait_for(ready, timeout, interval=0.05, message=f"pilot-agent ready\n{self.log_tail()}")
