"""Drive a proxyless gRPC client (tests/support/grpc_xds_client.py) from a test.

The client runs in a subprocess because grpcio's xDS client is process-wide;
this class writes its bootstrap, collects its JSON output lines and lets a
test wait for a particular reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from .node import namespace_from_node_id
from .wait import StopWaiting, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]


def grpc_bootstrap(xds_port: int, node_id: str, metadata: dict[str, Any] | None = None) -> dict:
    """A grpcio xDS bootstrap talking to a control plane on 127.0.0.1:xds_port."""
    if metadata is None:
        # GENERATOR=grpc is how istio-agent marks proxyless clients.
        metadata = {"NAMESPACE": namespace_from_node_id(node_id), "GENERATOR": "grpc"}
    return {
        "xds_servers": [
            {
                "server_uri": f"127.0.0.1:{xds_port}",
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {"id": node_id, "metadata": metadata},
    }


class GrpcXdsClientProcess:
    """One ``python -m tests.support.grpc_xds_client TARGET`` subprocess.

    ``lines`` holds every parsed output line in order, so a test can take
    ``mark = len(proc.lines)`` before a config change and only look at
    attempts made after it.
    """

    def __init__(
        self,
        target: str,
        xds_port: int,
        tmpdir: str | os.PathLike,
        *,
        node_id: str = "sidecar~127.0.0.1~grpc-client-1.default~default.svc.cluster.local",
        metadata: dict[str, Any] | None = None,
        max_seconds: float = 60.0,
        call_timeout: float = 2.0,
        payload: str = "hello",
        env: dict[str, str] | None = None,
        call_metadata: dict[str, str] | None = None,
        xds_creds: bool = False,
    ) -> None:
        self.target = target
        self.bootstrap = grpc_bootstrap(xds_port, node_id, metadata)
        self.tmpdir = Path(tmpdir)
        self.max_seconds = max_seconds
        self.call_timeout = call_timeout
        self.payload = payload
        self.extra_env = dict(env or {})
        self.call_metadata = dict(call_metadata or {})
        self.xds_creds = xds_creds  # grpc.xds_channel_credentials: TLS where a cluster asks for it
        self.lines: list[dict[str, Any]] = []
        # grpc core can be chatty on stderr; keep only the end for diagnostics.
        self.stderr_tail: deque[str] = deque(maxlen=50)
        self.proc: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task] = []

    async def start(self) -> GrpcXdsClientProcess:
        if self.proc is not None:
            raise RuntimeError("client already started")
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        bootstrap_path = self.tmpdir / f"grpc-bootstrap-{id(self):x}.json"
        bootstrap_path.write_text(json.dumps(self.bootstrap, indent=2))
        env = dict(os.environ)
        env["GRPC_XDS_BOOTSTRAP"] = str(bootstrap_path)
        # Only one bootstrap source may be in effect.
        env.pop("GRPC_XDS_BOOTSTRAP_CONFIG", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        # fmt: off
        args = [
            sys.executable, "-m", "tests.support.grpc_xds_client", self.target,
            "--max-seconds", str(self.max_seconds),
            "--call-timeout", str(self.call_timeout),
            "--payload", self.payload,
            *(a for k, v in self.call_metadata.items() for a in ("--metadata", f"{k}={v}")),
            *(["--xds-creds"] if self.xds_creds else []),
        ]
        # fmt: on
        self.proc = await asyncio.create_subprocess_exec(
            *args,
            cwd=str(REPO_ROOT),
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        # Both pipes must be drained continuously or the child blocks on write.
        self._readers = [
            asyncio.create_task(self._read_stdout()),
            asyncio.create_task(self._read_stderr()),
        ]
        return self

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            text = raw.decode(errors="replace").strip()
            if not text:
                continue
            try:
                self.lines.append(json.loads(text))
            except json.JSONDecodeError:
                self.stderr_tail.append(f"(stdout) {text}")

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for raw in self.proc.stderr:
            self.stderr_tail.append(raw.decode(errors="replace").rstrip())

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def replies(self, since: int = 0) -> list[str]:
        """Successful replies among lines[since:]."""
        return [line["reply"] for line in self.lines[since:] if line.get("ok")]

    def describe(self, last: int = 10) -> str:
        out = [f"grpc client {self.target} (exit code {self.proc.returncode if self.proc else None})"]
        out += ["  " + json.dumps(line) for line in self.lines[-last:]]
        if self.stderr_tail:
            out.append("  stderr:")
            out += ["    " + line for line in list(self.stderr_tail)[-20:]]
        return "\n".join(out)

    async def wait_for_line(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 10.0,
        since: int | None = None,
        message: str = "",
    ) -> dict[str, Any]:
        """Wait for an output line (from index ``since``, default: now) matching ``predicate``."""
        start = len(self.lines) if since is None else since

        def find() -> dict[str, Any] | None:
            for line in self.lines[start:]:
                if predicate(line):
                    return line
            if not self.running:
                raise StopWaiting("client process exited")
            return None

        try:
            return await wait_for(find, timeout=timeout)
        except (AssertionError, StopWaiting) as exc:
            raise AssertionError(f"{message or 'no matching line'}: {exc}\n{self.describe()}") from None

    async def wait_for_reply(self, prefix: str, timeout: float = 10.0, since: int | None = None) -> str:
        """Wait for a successful reply starting with ``prefix`` made after this call (or ``since``)."""
        line = await self.wait_for_line(
            lambda line: bool(line.get("ok")) and line.get("reply", "").startswith(prefix),
            timeout=timeout,
            since=since,
            message=f"no reply starting with {prefix!r} within {timeout}s",
        )
        return line["reply"]

    async def wait_for_error(
        self, contains: str = "", timeout: float = 10.0, since: int | None = None
    ) -> str:
        """Wait for a failed attempt whose error text contains ``contains``."""
        line = await self.wait_for_line(
            lambda line: not line.get("ok") and contains in line.get("error", ""),
            timeout=timeout,
            since=since,
            message=f"no error containing {contains!r} within {timeout}s",
        )
        return line["error"]

    async def stop(self, grace: float = 5.0) -> None:
        """Ask the client to quit via stdin; kill it if it does not exit in time."""
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(b"quit\n")
                await proc.stdin.drain()
                proc.stdin.close()
        try:
            # An in-flight call may take up to call_timeout before the loop sees quit.
            await asyncio.wait_for(proc.wait(), grace + self.call_timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        # Readers finish on EOF once the process is gone.
        await asyncio.gather(*self._readers, return_exceptions=True)
        self._readers = []

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
