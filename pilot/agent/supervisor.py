"""Runs Envoy and keeps it running: signals are forwarded, crashes restart it after a backoff (never
silently), and repeated crashes make the agent give up with Envoy's exit code.

istio-agent exits when Envoy does and lets the kubelet restart the container; outside Kubernetes
nothing would, so here the agent restarts Envoy itself. An exit with code 0 is taken as asked for
(Envoy's admin `/quitquitquit`, used to end Jobs) and ends the agent too.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pilot import logging as plog

log = plog.get("envoy")

STOP_TIMEOUT = 10.0  # after forwarding SIGTERM, then SIGKILL
STABLE_AFTER = 30.0  # an Envoy up this long that crashes starts a fresh crash count
MAX_BACKOFF = 30.0


def exit_status(returncode: int) -> int:
    """A shell-style status: a death by signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def describe(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class EnvoySupervisor:
    def __init__(self, args: Sequence[str], *, admin_address_path: str, max_restarts: int = 5,
                 backoff: float = 0.2, on_admin_address: Callable[[str], None] | None = None) -> None:
        self.args = list(args)
        self.admin_address_path = Path(admin_address_path)
        self.max_restarts = max_restarts
        self.backoff = backoff
        self.on_admin_address = on_admin_address
        self.proc: asyncio.subprocess.Process | None = None
        self.admin_address: str | None = None
        self.starts = 0
        self._stop = asyncio.Event()
        self._stop_signal: int = signal.SIGTERM
        self._watcher: asyncio.Task | None = None
        self.draining = False  # Envoy is being drained before a stop: never restart it

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def request_stop(self, sig: int = signal.SIGTERM) -> None:
        """Forward `sig` to Envoy (now, if it runs) and end the agent when Envoy has exited."""
        if not self._stop.is_set():
            log.info("stopping envoy", signal=signal.Signals(sig).name)
        self._stop_signal = sig
        self._stop.set()
        if self.running and self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def begin_drain(self) -> None:
        self.draining = True

    async def _start(self) -> asyncio.subprocess.Process:
        self.admin_address = None
        with contextlib.suppress(FileNotFoundError):
            self.admin_address_path.unlink()
        proc = await asyncio.create_subprocess_exec(*self.args, stdin=subprocess.DEVNULL)
        self.starts += 1
        log.info("envoy started", pid=proc.pid, start=self.starts)
        self._watcher = asyncio.create_task(self._watch_admin_address(proc))
        return proc

    async def _watch_admin_address(self, proc: asyncio.subprocess.Process) -> None:
        """Envoy writes its admin address once listening; an ephemeral port is known from then."""
        deadline = time.monotonic() + 60
        while proc.returncode is None and time.monotonic() < deadline:
            try:
                text = self.admin_address_path.read_text().strip()
            except FileNotFoundError:
                text = ""
            if text:
                self.admin_address = text
                if self.on_admin_address is not None:
                    self.on_admin_address(text)
                return
            await asyncio.sleep(0.02)

    async def _wait_exit(self, proc: asyncio.subprocess.Process) -> int:
        stop = asyncio.ensure_future(self._stop.wait())
        exited = asyncio.ensure_future(proc.wait())
        await asyncio.wait({stop, exited}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not exited.done():
            # request_stop already forwarded the signal; give Envoy a bounded time to finish.
            try:
                await asyncio.wait_for(asyncio.shield(exited), STOP_TIMEOUT)
            except TimeoutError:
                log.error("envoy did not exit after the signal; killing it", timeout=f"{STOP_TIMEOUT:.0f}s")
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await exited
        if self._watcher is not None:
            self._watcher.cancel()
        return exited.result()  # done: awaited above, or Envoy had exited

    async def run(self) -> int:
        """Until Envoy exits for good; returns the agent's exit status."""
        crashes = 0
        while not self._stop.is_set() and not self.draining:
            try:
                self.proc = await self._start()
            except OSError as e:
                log.error("cannot start envoy", binary=self.args[0], error=str(e))
                return 127 if isinstance(e, FileNotFoundError) else 126
            if self._stop.is_set() and self.running:  # a signal arrived while starting
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(self._stop_signal)
            started = time.monotonic()
            code = await self._wait_exit(self.proc)
            if self._stop.is_set() or self.draining:
                log.info("envoy exited", reason=describe(code))
                return exit_status(code)
            if code == 0:
                log.info("envoy exited with code 0 (asked to quit); pilot-agent exits too")
                return 0
            if time.monotonic() - started >= STABLE_AFTER:
                crashes = 0
            crashes += 1
            if crashes > self.max_restarts:
                log.error(f"envoy crashed {crashes} times in a row; giving up", reason=describe(code),
                          max_restarts=self.max_restarts)
                return exit_status(code) or 1
            delay = min(self.backoff * 2 ** (crashes - 1), MAX_BACKOFF)
            log.error("envoy exited unexpectedly; restarting it", reason=describe(code),
                      restart_in=f"{delay:.2f}s", restart=f"{crashes}/{self.max_restarts}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
        return 0
