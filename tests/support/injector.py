"""The injector's aiohttp handler served over real TLS in the test process (certificate for
istiod.istio-system.svc from a test CA), and a client that posts AdmissionReviews to it the
way the apiserver does."""

from __future__ import annotations

import json
import shutil
import ssl
from typing import Any, Self

import aiohttp
from aiohttp import web

from pilot.inject.handler import application
from pilot.inject.review import InjectionContext

from .certs import issue, make_ca

SERVER_NAME = "istiod.istio-system.svc"


class InjectorServer:
    def __init__(self, ctx: InjectionContext) -> None:
        self.ctx = ctx
        self.ca = make_ca("injector test CA")
        leaf = issue(self.ca, [SERVER_NAME])
        self._server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_ssl.load_cert_chain(*self._write(leaf))
        self.client_ssl = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    def _write(self, leaf) -> tuple[str, str]:
        import tempfile

        d = self._tmp = tempfile.mkdtemp(prefix="injector-tls-")
        cert, key = f"{d}/tls.crt", f"{d}/tls.key"
        with open(cert, "wb") as f:
            f.write(leaf.cert_pem)
        with open(key, "wb") as f:
            f.write(leaf.key_pem)
        return cert, key

    async def __aenter__(self) -> Self:
        self._runner = web.AppRunner(application(self.ctx), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._server_ssl)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        # The apiserver connects to the Service name and verifies it against caBundle.
        resolver = _StaticResolver({SERVER_NAME: "127.0.0.1"})
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.client_ssl, resolver=resolver)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()
        shutil.rmtree(self._tmp, ignore_errors=True)

    async def post(self, path: str, body: bytes, content_type: str = "application/json") -> tuple[int, Any]:
        assert self._session is not None
        async with self._session.post(
            f"https://{SERVER_NAME}:{self.port}{path}", data=body, headers={"Content-Type": content_type}
        ) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text

    async def review(self, admission_review: dict, path: str = "/inject") -> dict:
        status, doc = await self.post(path, json.dumps(admission_review).encode())
        assert status == 200, (status, doc)
        return doc


class _StaticResolver(aiohttp.abc.AbstractResolver):
    def __init__(self, hosts: dict[str, str]) -> None:
        self.hosts = hosts

    async def resolve(self, host: str, port: int = 0, family: int = 0) -> list[dict]:
        import socket

        return [
            {
                "hostname": host,
                "host": self.hosts.get(host, host),
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        pass
