"""Wire everything from parsed options and run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path

import grpc
from aiohttp import web

from pilot import features as feat
from pilot import logging as plog
from pilot.cli import Options
from pilot.config.mesh import MeshConfig, MeshConfigError, parse_mesh_config
from pilot.http.server import build_app
from pilot.model.mesh import MeshHolder
from pilot.model.store import Store
from pilot.sources.files import FileSource
from pilot.xds.ads import AdsService
from pilot.xds.discovery import DiscoveryServer

log = plog.get("bootstrap")


def split_addr(addr: str, default_host: str = "0.0.0.0") -> tuple[str, int] | None:
    """Go-style `host:port` (`:15010` means every interface); empty disables the listener."""
    if not addr:
        return None
    host, sep, port = addr.rpartition(":")
    if not sep:
        raise ValueError(f"address {addr!r} must be host:port")
    return (host.strip("[]") or default_host), int(port)


def load_mesh_file(path: str) -> MeshConfig:
    p = Path(path)
    if not p.exists():
        log.info("no mesh config file; using defaults", path=path)
        return MeshConfig()
    try:
        return parse_mesh_config(p.read_text())
    except MeshConfigError as e:
        raise SystemExit(f"--meshConfig {path}: {e}") from None


class ControlPlane:
    def __init__(self, opts: Options, features: feat.Features) -> None:
        self.opts = opts
        self.features = features
        self.store = Store()
        self.mesh = MeshHolder(load_mesh_file(opts.mesh_config), features.pod_namespace)
        self.discovery = DiscoveryServer(self.store, self.mesh, features, opts.domain)
        self.files = FileSource(opts.config_dir, self.store) if opts.config_dir else None
        self.loaded = False
        self.ports: dict[str, int] = {}
        self._grpc: grpc.aio.Server | None = None
        self._runners: list[web.AppRunner] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def ready(self) -> tuple[bool, str]:
        if not self.loaded:
            return False, "initial config not loaded"
        return True, "ok"

    async def start(self) -> None:
        if self.files is not None:
            self.files.load()
            self._tasks.append(asyncio.create_task(self.files.watch(self._stop), name="file-watch"))
        elif self.opts.kubeconfig:
            raise SystemExit("Kubernetes mode is not implemented yet; use --configDir")
        # The first context is built from what is loaded now; everything after goes through debounce.
        self.discovery.rebuild()
        self.discovery.start()
        await self._start_grpc()
        await self._start_http()
        self.loaded = True
        if self.opts.ports_file:  # atomically: a reader never sees a half-written file
            tmp = Path(self.opts.ports_file + ".tmp")
            tmp.write_text(json.dumps(self.ports))
            os.replace(tmp, self.opts.ports_file)
        log.info("ready", ports=self.ports, config_dir=self.opts.config_dir)

    async def _start_grpc(self) -> None:
        addr = split_addr(self.opts.grpc_addr)
        if addr is None:
            return
        options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 16 << 20),
                   ("grpc.keepalive_time_ms", 30_000), ("grpc.http2.max_pings_without_data", 0)]
        if self.opts.keepalive_max_server_connection_age:
            options.append(("grpc.max_connection_age_ms", int(self.opts.keepalive_max_server_connection_age * 1000)))
        self._grpc = grpc.aio.server(options=options)
        self._grpc.add_generic_rpc_handlers((AdsService(self.discovery).handler(),))
        host, port = addr
        try:
            self.ports["grpc"] = self._grpc.add_insecure_port(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
        except RuntimeError as e:
            raise OSError(98, f"--grpcAddr {self.opts.grpc_addr}: cannot listen ({e})") from None
        await self._grpc.start()

    async def _start_http(self) -> None:
        seen: dict[tuple[str, int], None] = {}
        for name, addr_text in (("http", self.opts.http_addr), ("monitoring", self.opts.monitoring_addr)):
            addr = split_addr(addr_text)
            if addr is None:
                continue
            if addr in seen and addr[1] != 0:  # the same fixed address twice: serve both roles on one
                self.ports[name] = self.ports["http"]
                continue
            seen[addr] = None
            runner = web.AppRunner(build_app(self.discovery, self.ready), access_log=None)
            await runner.setup()
            self._runners.append(runner)
            site = web.TCPSite(runner, addr[0], addr[1])
            try:
                await site.start()
            except OSError as e:
                raise OSError(e.errno, f"--{name}Addr {addr_text}: {e.strerror}") from None
            self.ports[name] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        self.loaded = False
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        await self.discovery.stop()
        for r in self._runners:
            await r.cleanup()

    async def run_until_signalled(self) -> None:
        try:
            await self.start()
        except OSError as e:
            await self.stop()
            raise SystemExit(f"cannot start: {e}") from None
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
        log.info("shutting down")
        await self.stop()


def run(opts: Options) -> int:
    plog.configure(plog.parse_level(opts.log_output_level), opts.log_as_json)
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    try:
        features = feat.Features.from_env(dict(os.environ))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    asyncio.run(ControlPlane(opts, features).run_until_signalled())
    return 0
