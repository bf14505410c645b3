"""istio-agent's status port (ProxyConfig.statusPort, 15020): `/healthz/ready` answers 200 once the
workload certificate is held and Envoy's admin `/ready` says LIVE (config received), 503 with the
reason otherwise. Kubernetes readiness probes point here."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Mapping

import aiohttp
from aiohttp import web

from pilot.agent import app_probes
from pilot.agent.secrets import SecretManager
from pilot.agent.supervisor import EnvoySupervisor

PROBE_TIMEOUT = 2.0


class StatusServer:
    def __init__(self, secrets: SecretManager, envoy: EnvoySupervisor, *, host: str = "0.0.0.0",
                 port: int = 15020, on_port: Callable[[int], None] | None = None,
                 app_probers: Mapping[str, app_probes.Prober] | None = None, app_host: str = "127.0.0.1",
                 app_metrics: Mapping[str, str] | None = None, node_id: str = "",
                 agent_metrics: Callable[[], str] | None = None) -> None:
        self.secrets = secrets
        self.node_id = node_id
        self.app_probers = app_probers or {}
        self.app_host = app_host  # the pod IP: apps often listen on it rather than on loopback
        self.app_metrics = app_metrics
        self.agent_metrics = agent_metrics  # the agent's own (istio_agent_*), Prometheus text
        self.envoy = envoy
        self.host, self.port = host, port
        self.on_port = on_port
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "start() opens it before any handler runs"
        return self._session

    async def ready(self, _req: web.Request) -> web.Response:
        if self.secrets.current is None:
            return web.Response(status=503, text="no workload certificate yet\n")
        if self.envoy.draining:
            return web.Response(status=503, text="draining for termination\n")
        if not self.envoy.running or not self.envoy.admin_address:
            return web.Response(status=503, text="envoy is not running\n")
        try:
            async with self.session.get(f"http://{self.envoy.admin_address}/ready",
                                         timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT)) as r:
                state = (await r.text()).strip()
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as e:
            return web.Response(status=503, text=f"envoy admin is not answering: {e}\n")
        if status == 200 and state == "LIVE":
            return web.Response(status=200, text="LIVE\n")
        return web.Response(status=503, text=f"envoy is not ready: {state or status}\n")

    async def app_health(self, req: web.Request) -> web.Response:
        prober = self.app_probers.get(req.path)
        if prober is None:
            return web.Response(status=404, text=f"no app prober for {req.path}\n")
        status, text = await app_probes.run(prober, self.app_host, self.session)
        return web.Response(status=status, text=text)

    async def stats_prometheus(self, _req: web.Request) -> web.Response:
        """Merged metrics: the agent's own, Envoy's, then the app's (ISTIO_PROMETHEUS_ANNOTATIONS), as
        istio-agent."""
        parts = [self.agent_metrics()] if self.agent_metrics is not None else []
        if self.envoy.admin_address:
            try:
                async with self.session.get(f"http://{self.envoy.admin_address}/stats/prometheus",
                                             timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT * 2)) as r:
                    if r.status == 200:
                        parts.append(await r.text())
            except (aiohttp.ClientError, TimeoutError):
                pass
        if self.app_metrics:
            url = f"http://{self.app_host}:{self.app_metrics['port']}{self.app_metrics['path']}"
            try:
                timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT * 2)
                async with self.session.get(url, timeout=timeout) as r:
                    if r.status == 200:
                        parts.append(await r.text())
            except (aiohttp.ClientError, TimeoutError):
                pass
        if not parts:
            return web.Response(status=503, text="no metrics available yet\n")
        body = "".join(p if p.endswith("\n") else p + "\n" for p in parts)
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    async def held_secrets(self, _req: web.Request) -> web.Response:
        """What the agent holds to serve Envoy over SDS (`default`, `ROOTCA`), in Envoy's
        SecretsConfigDump JSON with the private key left out: pilotctl's view of secrets Envoy has
        not asked for (yet). Public certificates only, so the status port may serve it."""
        current = self.secrets.current
        held = []
        if current is not None:
            def b64(pem: str) -> str:
                return base64.b64encode(pem.encode()).decode()
            at = dt.datetime.fromtimestamp(current.issued_at, dt.UTC).isoformat().replace("+00:00", "Z")
            held = [{"name": "default", "version_info": current.version, "last_updated": at, "secret": {
                        "name": "default", "tls_certificate": {"certificate_chain": {"inline_bytes": b64(current.chain_pem)}}}},
                    {"name": "ROOTCA", "version_info": current.root_version, "last_updated": at, "secret": {
                        "name": "ROOTCA", "validation_context": {"trusted_ca": {"inline_bytes": b64(current.root_pem)}}}}]
        return web.json_response({"node": self.node_id, "configs": [
            {"@type": "type.googleapis.com/envoy.admin.v3.SecretsConfigDump", "dynamic_active_secrets": held}]})

    async def start(self) -> int:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.add_routes([web.get("/healthz/ready", self.ready),
                        web.get("/stats/prometheus", self.stats_prometheus),
                        web.get("/debug/secrets", self.held_secrets),
                        web.get("/app-health/{container}/{kind}", self.app_health),
                        web.post("/app-health/{container}/{kind}", self.app_health)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        # aiohttp keeps the listening server private; it is the only place the bound port is (0 asked)
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self.on_port is not None:
            self.on_port(self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
