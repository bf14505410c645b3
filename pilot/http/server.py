"""The HTTP side: /ready, /version, /metrics and /debug/* on --httpAddr and --monitoringAddr."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from pilot.http.auth import debug_auth
from pilot.http.debug import DebugHandlers
from pilot.http.version import version_handler
from pilot.metrics import render
from pilot.security.authn import Authenticators
from pilot.status.view import GatewayStatusView
from pilot.xds.discovery import DiscoveryServer


def build_app(server: DiscoveryServer, ready, authenticators: Authenticators | None = None,
              system_namespace: str = "istio-system", gateway_status: GatewayStatusView | None = None
              ) -> web.Application:
    """`ready` is a callable returning (is_ready, reason); `authenticators` admit debug callers
    that are not on this host (None: localhost only); `gateway_status` feeds /debug/gatewayz."""
    app = web.Application(middlewares=[debug_auth(authenticators, system_namespace)])

    async def ready_handler(_req: web.Request) -> web.Response:
        ok, reason = ready()
        return web.Response(text=(reason or "ok") + "\n", status=200 if ok else 503)

    async def metrics_handler(_req: web.Request) -> web.Response:
        server.metrics.config_rejections.set(len(server.store.rejections()))
        body = render(server.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.add_routes([web.get("/ready", ready_handler), web.get("/version", version_handler),
                    web.get("/metrics", metrics_handler), *DebugHandlers(server, gateway_status).routes()])
    return app
