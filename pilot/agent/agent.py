"""Wires pilot-agent together: certificate first, then the SDS socket, the xDS proxy (Envoy's ADS
goes through the agent to istiod), the bootstrap, the status port and Envoy; SIGTERM drains Envoy then stops it (drain.py), and the agent exits with Envoy's
status.

The certificate is fetched before Envoy starts: a wrong token or an unreachable root then fails
the agent at once with the CA's reason, rather than leaving an Envoy that never becomes ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

from pilot import logging as plog
from pilot.agent import bootstrap_xds, health
from pilot.agent.bootstrap import envoy_bootstrap, node_metadata
from pilot.agent.ca_client import CAClient, CertificateError
from pilot.agent.config import (
    ADMIN_ADDRESS_PATH,
    BOOTSTRAP_PATH,
    POD_ANNOTATIONS_PATH,
    POD_LABELS_PATH,
    ROOT_CERT_PATH,
    SDS_SOCKET_PATH,
    TOKEN_PATH,
    WASM_CACHE_PATH,
    XDS_SOCKET_PATH,
    AgentConfig,
)
from pilot.agent.drain import GracefulStop
from pilot.agent.sds import SdsServer
from pilot.agent.secrets import SecretManager
from pilot.agent.status import StatusServer
from pilot.agent.supervisor import EnvoySupervisor
from pilot.agent.wasm import ModuleCache, insecure_registries, rewrite_response
from pilot.agent.xds_proxy import XdsProxy

log = plog.get("agent")


def envoy_args(cfg: AgentConfig) -> list[str]:
    args = [cfg.envoy_binary, "-c", BOOTSTRAP_PATH,
            "--drain-time-s", str(int(cfg.proxy.drain_duration)), "--drain-strategy", "immediate",
            # IPv6 only when every pod address is (istio-agent's IsIPv6): a dual-stack pod stays v4.
            "--local-address-ip-version", "v6" if all(":" in a for a in cfg.instance_ips) else "v4",
            "--file-flush-interval-msec", "1000",
            # Several Envoys on one host (tests, VMs) each need their own hot-restart base id.
            "--use-dynamic-base-id",
            "--admin-address-path", ADMIN_ADDRESS_PATH,
            "--allow-unknown-static-fields",
            "-l", cfg.log_level, "--component-log-level", cfg.component_log_level]
    if cfg.proxy.concurrency > 0:  # 0: Envoy's default, one worker per core
        args += ["--concurrency", str(cfg.proxy.concurrency)]
    return args


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return ""


class PortsFile:
    """--portsFile: the bound ports as JSON (status at once, admin once Envoy listens)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.ports: dict[str, int] = {}

    def set(self, name: str, port: int) -> None:
        self.ports[name] = port
        if self.path:
            tmp = f"{self.path}.tmp"
            Path(tmp).write_text(json.dumps(self.ports))
            os.replace(tmp, self.path)


async def _fetch_bootstrap(cfg: AgentConfig, base: dict, xds: XdsProxy, stop: asyncio.Event) -> bool:
    """BOOTSTRAP_XDS_AGENT: write the control plane's bootstrap (EnvoyFilter BOOTSTRAP patches
    merged) over the agent's own, once Envoy would accept it. False: stopped while waiting."""
    started = time.monotonic()
    fetch = asyncio.ensure_future(bootstrap_xds.fetch(xds.channel, base, cfg.envoy_binary,
                                                      str(Path(BOOTSTRAP_PATH).parent)))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not fetch.done():
        fetch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fetch
        return False
    outcome = fetch.result()
    if outcome.patched:
        Path(BOOTSTRAP_PATH).write_text(json.dumps(outcome.bootstrap, indent=1))
        log.info("bootstrap from the control plane", path=BOOTSTRAP_PATH,
                 took_s=round(time.monotonic() - started, 3))
    elif not outcome.reason:
        log.info("no BOOTSTRAP patches for this proxy: starting Envoy with the agent's own bootstrap",
                 took_s=round(time.monotonic() - started, 3))
    else:
        log.warning("starting Envoy with the agent's own bootstrap", reason=outcome.reason,
                    took_s=round(time.monotonic() - started, 3))
    return True


async def run(cfg: AgentConfig, warnings: list[str]) -> int:
    for w in warnings:
        log.warning(w)
    log.info("pilot-agent starting", node=cfg.node_id, identity=cfg.spiffe_id,
             discovery=cfg.discovery_address, ca=cfg.ca_address, istiod_san=cfg.istiod_san,
             envoy=cfg.envoy_binary)
    ports = PortsFile(cfg.ports_file)
    supervisor = EnvoySupervisor(
        envoy_args(cfg), admin_address_path=ADMIN_ADDRESS_PATH, max_restarts=cfg.max_restarts,
        backoff=cfg.restart_backoff,
        on_admin_address=lambda a: ports.set("admin", int(a.rsplit(":", 1)[1])))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    graceful = GracefulStop(supervisor, duration=cfg.termination_drain,
                            inbound_only=cfg.proxy_type == "sidecar")

    def on_signal(sig: int) -> None:
        stop.set()
        graceful.on_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    ca = CAClient(cfg.ca_address, root_cert_path=ROOT_CERT_PATH, token_path=TOKEN_PATH, server_name=cfg.istiod_san,
                  cluster_id=str(cfg.env.get("ISTIO_META_CLUSTER_ID") or "Kubernetes"))
    secrets = SecretManager(ca, cfg.spiffe_id, cfg.secret_ttl, grace_ratio=cfg.grace_ratio,
                            grace_jitter=cfg.grace_jitter)
    first = asyncio.ensure_future(secrets.start())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({first, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not first.done():
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError, CertificateError):
            await first
        log.info("stopped before the workload certificate arrived")
        return 0
    try:
        first.result()
    except CertificateError as e:
        log.error("cannot get the workload certificate; exiting", error=str(e))
        return 1

    metadata, md_warnings = node_metadata(cfg, _read(POD_LABELS_PATH), _read(POD_ANNOTATIONS_PATH))
    for w in md_warnings:
        log.warning(w)
    Path(BOOTSTRAP_PATH).parent.mkdir(parents=True, exist_ok=True)
    base = envoy_bootstrap(cfg, metadata)
    Path(BOOTSTRAP_PATH).write_text(json.dumps(base, indent=1))

    sds = SdsServer(secrets, SDS_SOCKET_PATH)
    await sds.start()
    modules = ModuleCache(WASM_CACHE_PATH, insecure_registries(cfg.wasm_insecure_registries),
                          blocked=cfg.wasm_blocked_cidrs,
                          http_request_timeout=cfg.wasm_http_request_timeout,
                          http_attempts=cfg.wasm_http_attempts, module_expiry=cfg.wasm_module_expiry)
    xds = XdsProxy(upstream=cfg.discovery_address, server_name=cfg.istiod_san, root_cert_path=ROOT_CERT_PATH,
                   secrets=secrets, socket_path=XDS_SOCKET_PATH,
                   rewrite_ecds=lambda data, delta: rewrite_response(data, delta, modules))
    await xds.start()
    try:
        readiness = health.parse(cfg.proxy.raw.get("readinessProbe"))
    except health.ProbeConfigError as e:
        log.error("bad readiness probe", error=str(e))
        await xds.stop()
        await sds.stop()
        return 1
    prober = None if readiness is None else asyncio.create_task(
        health.run_forever(readiness, cfg.instance_ip, xds.report_health), name="readiness-probe")
    status = StatusServer(secrets, supervisor, port=cfg.proxy.status_port,
                          on_port=lambda p: ports.set("status", p), app_probers=cfg.app_probers,
                          app_host=cfg.instance_ip, app_metrics=cfg.app_metrics, node_id=cfg.node_id,
                          agent_metrics=modules.metrics.render)
    rotation = asyncio.create_task(secrets.rotate_forever(), name="certificate-rotation")
    purge = asyncio.create_task(modules.purge_forever(cfg.wasm_purge_interval), name="wasm-module-purge")
    try:
        if cfg.bootstrap_xds and not await _fetch_bootstrap(cfg, base, xds, stop):
            log.info("stopped before the bootstrap arrived")
            return 0
        try:
            await status.start()
        except OSError as e:
            log.error("cannot listen on the status port (ProxyConfig.statusPort)", port=cfg.proxy.status_port,
                      error=str(e))
            return 1
        code = await supervisor.run()
    finally:
        await graceful.close()
        for task in (rotation, purge):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if prober is not None:
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober
        await status.stop()
        await xds.stop()
        await sds.stop()
    log.info("pilot-agent exiting", status=code)
    return code
