"""Run the real control plane (`pilot-discovery discovery`) as a subprocess for tests.

Ports are bound as 0 and read back from --portsFile, so parallel runs never race for ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any, Self

import aiohttp

from .wait import StopWaiting, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]


class ControlPlane:
    def __init__(self, tmpdir: str | os.PathLike, *, env: dict[str, str] | None = None,
                 mesh_config: str | None = None, extra_args: list[str] | None = None,
                 kubeconfig: str | None = None, name: str = "control-plane", secure_grpc: bool = False,
                 python_path: list[str] | None = None) -> None:
        """File mode by default; with `kubeconfig`, Kubernetes mode (no --configDir). `secure_grpc`
        serves TLS xDS + the CA (--secureGRPCAddr) on a free port, read back as "secure_grpc".
        `python_path` goes before the repository on the process's PYTHONPATH (test hooks)."""
        self.workdir = Path(tmpdir) / name
        self.kubeconfig = kubeconfig
        self.config_dir = self.workdir / "config"
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.env = {"PILOT_DEBOUNCE_AFTER": "50ms", "PILOT_DRAIN_DURATION": "100ms", **(env or {})}
        self.mesh_config = mesh_config
        self.extra_args = list(extra_args or [])
        self.secure_grpc = secure_grpc
        self.python_path = list(python_path or [])
        self.proc: asyncio.subprocess.Process | None = None
        self.ports: dict[str, int] = {}
        self.log_path = self.workdir / "pilot.log"

    # --- lifecycle ----------------------------------------------------------------------------
    # A control plane that fails to start exits, which ends the wait at once (StopWaiting below);
    # one still running is importing and loading on a loaded machine (15-40 s seen at load 20 on
    # two cores), so this only bounds a hang.
    START_TIMEOUT = 60.0

    async def start(self, timeout: float = START_TIMEOUT) -> Self:
        """Start and wait until xDS is served."""
        return await self._start("grpc", timeout)

    async def start_process_only(self, timeout: float = START_TIMEOUT) -> Self:
        """Start and wait only until the HTTP endpoints listen (e.g. to watch /ready turn 200)."""
        return await self._start("http", timeout)

    async def _start(self, wait_for_port: str, timeout: float) -> Self:
        ports_file = self.workdir / "ports.json"
        ports_file.unlink(missing_ok=True)
        mesh_path = self.workdir / "mesh.yaml"
        mesh_path.write_text(self.mesh_config or "")
        source = ["--kubeconfig", self.kubeconfig] if self.kubeconfig else ["--configDir", str(self.config_dir)]
        args = [sys.executable, "-m", "pilot.cli", "discovery", *source,
                "--meshConfig", str(mesh_path), "--grpcAddr", "127.0.0.1:0", "--httpAddr", "127.0.0.1:0",
                "--monitoringAddr", "127.0.0.1:0", "--secureGRPCAddr", "127.0.0.1:0" if self.secure_grpc else "",
                "--httpsAddr", "127.0.0.1:0",
                "--portsFile", str(ports_file),
                *self.extra_args]
        env = {**os.environ, **self.env, "PYTHONPATH": os.pathsep.join([*self.python_path, str(REPO_ROOT)])}
        self._log = open(self.log_path, "ab")  # noqa: SIM115, ASYNC230 - lives as long as the process; local disk
        self.proc = await asyncio.create_subprocess_exec(*args, stdout=self._log, stderr=self._log, env=env,
                                                         cwd=str(self.workdir))

        def ports() -> dict | None:
            if self.proc.returncode is not None:
                raise StopWaiting(f"control plane exited with {self.proc.returncode}:\n{self.log_tail()}")
            if not ports_file.exists():
                return None
            ports = json.loads(ports_file.read_text())
            return ports if wait_for_port in ports else None

        self.ports = await wait_for(ports, timeout, message=f"control plane start\n{self.log_tail()}")
        return self

    async def kill(self) -> None:
        """SIGKILL: no drain, no lease release (a crashed replica)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
            self._log.close()

    async def stop(self) -> int | None:
        if self.proc is None or self.proc.returncode is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self._log.close()
        return self.proc.returncode

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(FileNotFoundError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    @property
    def xds_port(self) -> int:
        return self.ports["grpc"]

    @property
    def https_port(self) -> int:
        """The webhook port (served whenever there is a CA: Kubernetes mode, or secure_grpc)."""
        return self.ports["https"]

    @property
    def secure_port(self) -> int:
        """TLS xDS + CA (start with secure_grpc=True)."""
        return self.ports["secure_grpc"]

    @property
    def self_signed_ca_dir(self) -> Path:
        """Where file mode keeps its self-signed root (PILOT_SELF_SIGNED_CA_DIR, relative to the workdir)."""
        return self.workdir / self.env.get("PILOT_SELF_SIGNED_CA_DIR", "etc/cacerts-self-signed")

    def root_cert(self) -> str:
        """The file-mode CA's root (PEM)."""
        return (self.self_signed_ca_dir / "root-cert.pem").read_text()

    # --- config -------------------------------------------------------------------------------
    def write(self, name: str, text: str) -> Path:
        """Write (atomically, as editors and kubectl-like tools do) a YAML file into the config dir."""
        path = self.config_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp"
        tmp.write_text(textwrap.dedent(text))
        os.replace(tmp, path)
        return path

    def remove(self, name: str) -> None:
        (self.config_dir / name).unlink()

    # --- HTTP ---------------------------------------------------------------------------------
    async def get(self, path: str, port: str = "http") -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.ports[port]}{path}") as r:
            return r.status, await r.text()

    async def debug(self, path: str) -> Any:
        status, text = await self.get(path)
        assert status == 200, f"{path}: {status} {text}"
        return json.loads(text)

    async def metrics(self) -> str:
        return (await self.get("/metrics", "monitoring"))[1]

    async def sync_status(self, proxy_id: str) -> dict | None:
        for row in await self.debug("/debug/syncz"):
            if row["proxy"] == proxy_id:
                return row
        return None

    async def wait_synced(self, proxy_id: str, types=("cluster", "listener", "route", "endpoint"),
                          since_version: str | None = None, timeout: float = 10.0) -> dict:
        """Wait until the proxy ACKed the latest nonce of each type (optionally a version newer than
        `since_version`, meaning a push after a change was delivered and accepted)."""

        async def synced() -> dict | None:
            row = await self.sync_status(proxy_id)
            if row is None:
                return None
            for t in types:
                if not row[f"{t}_sent"] or row[f"{t}_sent"] != row[f"{t}_acked"]:
                    return None
            if since_version is not None and all(row[f"{t}_version_acked"] == since_version for t in types):
                return None
            return row

        return await wait_for(synced, timeout, message=f"{proxy_id} synced\n{self.log_tail()}")

    async def push_version(self) -> str:
        return (await self.debug("/debug/push_status"))["version"]
