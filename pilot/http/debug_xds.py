"""The /debug pages as `istio.io/debug` xDS serves them (istiod's DebugGen): a page is rendered
by the same handlers the HTTP port uses, in process, with the caller's namespace scoping
applied here instead of by the HTTP authentication middleware."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from pilot.http import config_dump
from pilot.xds.discovery import DiscoveryServer
from pilot.xds.generators.debug import HttpView


def http_view(app: web.Application, server: DiscoveryServer) -> HttpView:
    """`app` is an application built by http.server.build_app (its routes, not its middleware)."""

    async def view(name: str, caller_namespace: str) -> bytes:
        request = make_mocked_request("GET", "/debug/" + name.lstrip("/"), app=app)
        if caller_namespace and request.path == "/debug/config_dump":
            response = await config_dump.config_dump(server, request, caller_namespace)
        else:
            match = await app.router.resolve(request)
            if match.http_exception is not None:
                return (
                    f"{match.http_exception.status} {match.http_exception.reason}: /debug/{name}\n".encode()
                )
            response = await match.handler(request)
        assert isinstance(response, web.Response)  # the debug handlers answer whole bodies
        return response.body if isinstance(response.body, bytes) else str(response.text or "").encode()

    return view
