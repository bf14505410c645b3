"""JSON-lines request/reply between the orchestrator and its helper processes (load generator,
floor server), over the child's stdin and stdout.

A request is `{"id": N, "cmd": NAME, ...}`; the child answers each with `{"id": N, ...}` (or
`{"id": N, "error": TEXT}`) whenever it is done, so a long wait never blocks a quick question.
The helpers are separate processes so that their CPU is not charged to the orchestrator's event
loop or the server's: each side of the measurement runs on its own interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
_LINE_LIMIT = 64 << 20  # replies carry per-proxy latency lists


class ChildError(RuntimeError):
    pass


class Child:
    """Orchestrator side: a `python -m MODULE` child we send commands to."""

    def __init__(self, module: str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.module = module
        self.args = args
        self.log_path = log_path
        self.env = env or {}
        self.proc: asyncio.subprocess.Process | None = None
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None
        self._log = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, timeout: float = 30.0) -> dict:
        """Start the child and return its first line (it announces itself when it is ready)."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115, ASYNC230 - lives as long as the child
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **self.env}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", self.module, *self.args, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=self._log, env=env, cwd=str(REPO_ROOT), limit=_LINE_LIMIT)
        hello = self._loop().create_future()
        self._waiting[0] = hello
        self._reader = self._loop().create_task(self._read())
        try:
            return await asyncio.wait_for(hello, timeout)
        except TimeoutError:
            raise ChildError(f"{self.module} did not start within {timeout}s\n{self.log_tail()}") from None

    async def request(self, cmd: str, *, wait: float = 60.0, **fields: Any) -> dict:
        """Send a command and await its reply; `wait` is our deadline, fields go to the child."""
        assert self.proc is not None and self.proc.stdin is not None
        self._next_id += 1
        rid = self._next_id
        fut = self._loop().create_future()
        self._waiting[rid] = fut
        self.proc.stdin.write((json.dumps({"id": rid, "cmd": cmd, **fields}) + "\n").encode())
        await self.proc.stdin.drain()
        try:
            reply = await asyncio.wait_for(fut, wait)
        except TimeoutError:
            raise ChildError(f"{self.module}: no answer to {cmd!r} within {wait}s\n{self.log_tail()}") from None
        finally:
            self._waiting.pop(rid, None)
        if "error" in reply:
            raise ChildError(f"{self.module} {cmd!r} failed: {reply['error']}\n{self.log_tail()}")
        reply.pop("id", None)
        return reply

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            msg = json.loads(line)
            fut = self._waiting.pop(msg.get("id", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        # The child is gone: fail every pending request now instead of at its timeout.
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ChildError(f"{self.module} exited\n{self.log_tail()}"))
        self._waiting.clear()

    async def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, ConnectionResetError, BrokenPipeError):
                self.proc.stdin.close()  # EOF on stdin asks the child to exit
                try:
                    await asyncio.wait_for(self.proc.wait(), timeout)
                except TimeoutError:
                    self.proc.send_signal(signal.SIGKILL)
                    await self.proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(FileNotFoundError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    @staticmethod
    def _loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()


Handler = Callable[[dict], Awaitable[dict]]


def _emit(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


async def serve_commands(hello: dict, handlers: dict[str, Handler]) -> None:
    """Child side: announce `hello`, then run each command line as its own task until EOF."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    _emit({"id": 0, **hello})
    tasks: set[asyncio.Task] = set()

    async def run(msg: dict) -> None:
        rid = msg.get("id")
        handler = handlers.get(msg.get("cmd", ""))
        try:
            if handler is None:
                raise ValueError(f"unknown command {msg.get('cmd')!r}")
            _emit({"id": rid, **(await handler(msg))})
        except Exception as e:  # noqa: BLE001 - reported to the orchestrator, not lost
            traceback.print_exc()
            _emit({"id": rid, "error": f"{type(e).__name__}: {e}"})

    while line := await reader.readline():
        task = loop.create_task(run(json.loads(line)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
