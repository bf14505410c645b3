"""Plain HTTP backends that say who they are, and a one-shot HTTP client.

Tests route traffic through Envoy and need to know which backend answered
and what Envoy forwarded (Host rewrite, added headers), so every response is
a JSON description of the request plus the backend's name.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any, Self

import aiohttp
from aiohttp import web


class HttpBackend:
    """An aiohttp server on 127.0.0.1 answering every method and path.

    The response body is JSON: ``{"name", "method", "path", "query", "host",
    "headers"}``. ``status`` may be changed at any time to simulate failures.
    """

    def __init__(self, name: str, port: int = 0, *, host: str = "127.0.0.1", status: int = 200,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.name = name
        self.host = host
        self.status = status
        self.ssl_context = ssl_context  # serve HTTPS (a TLS passthrough target)
        self.fail_next = 0
        self.request_count = 0
        self.requests: list[dict[str, Any]] = []
        self._requested_port = port
        self._port: int | None = None
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"HttpBackend {self.name!r} not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        info = {
            "name": self.name,
            "method": request.method,
            "path": request.path,
            "query": request.query_string,
            "host": request.headers.get("Host", ""),
            "headers": dict(request.headers),
        }
        self.request_count += 1
        self.requests.append(info)
        # `?delay=SECONDS` makes the answer slow (timeouts); `fail_next` answers 503 that many times (retries).
        delay = float(request.query.get("delay", "0") or 0)
        if delay > 0:
            await asyncio.sleep(min(delay, 30))
        status = self.status
        if self.fail_next > 0:
            self.fail_next -= 1
            status = 503
        return web.Response(
            status=status,
            text=json.dumps(info),
            content_type="application/json",
            headers={"x-backend-name": self.name},
        )

    async def start(self) -> HttpBackend:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # access_log=None: the default logger adds noise to every test failure.
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._requested_port, ssl_context=self.ssl_context)
        await site.start()
        # With port 0 the kernel picks the port; read back the real one.
        self._port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 5) -> tuple[int, str]:
    """GET ``url`` and return (status, body text).

    A fresh session per call means no pooled connection survives between
    calls, so each request exercises Envoy's current listener config.
    ``headers={"Host": ...}`` overrides the Host header, as curl -H does.
    """
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.get(url, headers=headers, allow_redirects=False) as resp,
    ):
        return resp.status, await resp.text()


async def answered_by(url: str, host: str, timeout: float = 5) -> tuple[int, str | None]:
    """GET ``url`` with a Host header: (status, name of the backend that answered, or None)."""
    status, body = await http_get(url, {"Host": host}, timeout)
    try:
        return status, json.loads(body).get("name")
    except ValueError:
        return status, None


async def serve(app: web.Application, host: str = "127.0.0.1", *,
                ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    """Start `app` on a port the kernel picks (no free-port race): (its runner, to clean up; the port)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=ssl_context)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
