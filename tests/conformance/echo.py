"""Local stand-ins for the upstream conformance backends (echo-basic): one HTTP server per
Deployment of the vendored manifests, answering as echo-basic does so the upstream expectations
can be checked unchanged: JSON with the request's path, host, method, proto and headers (name ->
list of values) and the serving pod's namespace, service and pod name. Like echo-basic,
`X-Echo-Set-Header: name:value,...` sets response headers, `?delay=1s` answers late, and
`/status/NNN` answers with that status.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from dataclasses import dataclass, field

from aiohttp import web

_STATUS_PATH = re.compile(r"^/status/(\d\d\d)$")


def _seconds(duration: str) -> float:
    """Go duration strings as echo-basic's `delay` takes them (`1s`, `500ms`)."""
    m = re.fullmatch(r"([0-9.]+)(ms|s|m)?", duration)
    if m is None:
        raise ValueError(duration)
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]


@dataclass
class EchoServer:
    namespace: str
    deployment: str
    service: str = ""
    tls: ssl.SSLContext | None = None
    requests: list[dict] = field(default_factory=list)  # what it was sent (mirroring checks)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def pod(self) -> str:
        # echo-basic reports POD_NAME; Deployment pods are named DEPLOYMENT-<hash>-<suffix>.
        return f"{self.deployment}-5f7d8c9b4-local"

    async def _handle(self, request: web.Request) -> web.Response:
        headers: dict[str, list[str]] = {}
        for name, value in request.headers.items():
            if name.lower() != "host":  # Go's Request.Header leaves Host out; echo-basic too
                headers.setdefault(name, []).append(value)
        info = {"path": request.raw_path, "host": request.host,
                "method": request.method, "proto": f"HTTP/{request.version.major}.{request.version.minor}",
                "headers": headers, "namespace": self.namespace, "ingress": "", "service": self.service,
                "pod": self.pod}
        self.requests.append(info)
        m = _STATUS_PATH.match(request.path)
        if m is not None:
            return web.Response(status=int(m.group(1)))
        delay = request.query.get("delay")
        if delay:
            await asyncio.sleep(min(_seconds(delay), 30))
        response = web.Response(text=json.dumps(info), content_type="application/json")
        for kv_list in request.headers.getall("X-Echo-Set-Header", []):
            for kv in kv_list.split(","):
                name, sep, value = kv.partition(":")
                if sep and name.strip():
                    response.headers.add(name.strip(), value.strip())
        return response

    async def start(self) -> EchoServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
