"""The HTTP side: /ready, /version, /metrics and /debug/* on --httpAddr and --monitoringAddr."""

from __future__ import annotations

import ipaddress

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from pilot import __version__
from pilot.http.debug import DebugHandlers
from pilot.metrics import render
from pilot.status.view import GatewayStatusView
from pilot.xds.discovery import DiscoveryServer


def _is_local(request: web.Request) -> bool:
    peer = request.remote or ""
    try:
        return ipaddress.ip_address(peer.split("%")[0]).is_loopback
    except ValueError:
        return peer == ""  # unix sockets


@web.middleware
async def local_only_debug(request: web.Request, handler):
    """Debug views reveal config: only callers on this host may read them until authenticated
    access exists (the security issue adds it)."""
    if request.path.startswith("/debug") and not _is_local(request):
        return web.json_response({"error": "debug endpoints are only served to localhost"}, status=403)
    return await handler(request)


def build_app(server: DiscoveryServer, ready, gateway_status: GatewayStatusView | None = None) -> web.Application:
    """`ready` is a callable returning (is_ready, reason); `gateway_status` feeds /debug/gatewayz."""
    app = web.Application(middlewares=[local_only_debug])

    async def ready_handler(_req: web.Request) -> web.Response:
        ok, reason = ready()
        return web.Response(text=(reason or "ok") + "\n", status=200 if ok else 503)

    async def version_handler(_req: web.Request) -> web.Response:
        return web.json_response({"version": __version__})

    async def metrics_handler(_req: web.Request) -> web.Response:
        server.metrics.config_rejections.set(len(server.store.rejections()))
        body = render(server.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.add_routes([web.get("/ready", ready_handler), web.get("/version", version_handler),
                    web.get("/metrics", metrics_handler), *DebugHandlers(server, gateway_status).routes()])
    return app
