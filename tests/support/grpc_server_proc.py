"""Drive a proxyless gRPC xDS server (tests/support/grpc_xds_server.py) from a test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections import deque
from pathlib import Path
from typing import Any

from .grpc_client_proc import REPO_ROOT, grpc_bootstrap

SERVER_TEMPLATE = "xds.istio.io/grpc/lds/inbound/%s"  # istio-agent's grpc bootstrap


class GrpcXdsServerProcess:
    """``python -m tests.support.grpc_xds_server NAME PORT`` with a bootstrap naming istio's
    server listener template and, given `certs` (a dict with cert/key/ca file paths), a
    `default` file_watcher certificate provider as istio-agent writes it."""

    def __init__(self, name: str, port: int, xds_port: int, tmpdir: str | os.PathLike, *, node_id: str,
                 labels: dict[str, str] | None = None, certs: dict[str, str] | None = None) -> None:
        self.name, self.port = name, port
        meta: dict[str, Any] = {"NAMESPACE": "default", "GENERATOR": "grpc"}
        if labels:
            meta["LABELS"] = labels
        self.bootstrap = grpc_bootstrap(xds_port, node_id, meta)
        self.bootstrap["server_listener_resource_name_template"] = SERVER_TEMPLATE
        if certs:
            self.bootstrap["certificate_providers"] = certificate_providers(certs)
        self.tmpdir = Path(tmpdir)
        self.stderr_tail: deque[str] = deque(maxlen=50)
        self.lines: list[dict] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task] = []

    async def start(self) -> GrpcXdsServerProcess:
        path = self.tmpdir / f"grpc-server-bootstrap-{id(self):x}.json"
        path.write_text(json.dumps(self.bootstrap, indent=2))
        env = {**os.environ, "GRPC_XDS_BOOTSTRAP": str(path), "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        env.pop("GRPC_XDS_BOOTSTRAP_CONFIG", None)
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.grpc_xds_server", self.name, str(self.port), cwd=str(REPO_ROOT),
            env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self._readers = [asyncio.create_task(self._read(self.proc.stdout, True)),
                         asyncio.create_task(self._read(self.proc.stderr, False))]
        return self

    async def _read(self, stream, is_stdout: bool) -> None:
        async for raw in stream:
            text = raw.decode(errors="replace").rstrip()
            if is_stdout:
                with contextlib.suppress(json.JSONDecodeError):
                    self.lines.append(json.loads(text))
                    continue
            self.stderr_tail.append(text)

    def describe(self) -> str:
        code = self.proc.returncode if self.proc else None
        return f"grpc server {self.name}:{self.port} (exit code {code})\n" + "\n".join(list(self.stderr_tail)[-20:])

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(b"quit\n")
                await proc.stdin.drain()
                proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)


def certificate_providers(certs: dict[str, str]) -> dict:
    """istio-agent's grpc bootstrap: one `default` file_watcher provider with the workload's
    certificate chain, key and the mesh roots."""
    return {"default": {"plugin_name": "file_watcher", "config": {
        "certificate_file": certs["cert"], "private_key_file": certs["key"], "ca_certificate_file": certs["ca"],
        "refresh_interval": "900s"}}}
