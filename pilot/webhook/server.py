"""The webhook port (--httpsAddr, 15017): HTTPS with a serving certificate from the built-in CA
for istiod's names (`istiod.NS.svc`, and `istiod-REV.NS.svc` with a REVISION), answering
`POST /validate` (and `/validate/...`, and the pre-1.5 `/admitpilot`) with admission.py, and
`POST /inject` (pilot/inject) mounted beside it.

The certificate is re-issued at half its lifetime and whenever the CA's chain changes; new
handshakes get the new one at once (the listening context hands each connection the current
context from its SNI callback), existing connections keep theirs.

Metrics keep istiod's names: galley_validation_passed, galley_validation_failed{reason} and
galley_validation_http_error{status}.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from pilot import logging as plog
from pilot.security.ca import CertificateAuthority, ServerCertificate
from pilot.security.ca_server import ServerCertRotator, server_ssl_context
from pilot.webhook.admission import Answer, review_bytes

log = plog.get("validationServer")

PATHS = ("/validate", "/validate/{tail:.*}", "/admitpilot")
# kube-apiserver caps an object at ~1.5 MiB in etcd; an AdmissionReview carries it twice on UPDATE.
MAX_BODY = 6 << 20


def webhook_ssl_context(cert: ServerCertificate, roots_pem: str) -> ssl.SSLContext:
    """TLS 1.2+, HTTP/1.1 only (aiohttp's server does not speak h2; offering h2 in ALPN would
    make the apiserver's Go client pick it), no client certificates: the apiserver does not
    present one to webhooks unless configured to."""
    ctx = server_ssl_context(cert, roots_pem)
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class _Metrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry or CollectorRegistry()
        labels = ["group", "version", "resource"]
        self.passed = Counter("galley_validation_passed", "Resources the validation webhook admitted.",
                              labels, registry=r)
        self.failed = Counter("galley_validation_failed", "Resources the validation webhook refused.",
                              [*labels, "reason"], registry=r)
        self.http_error = Counter("galley_validation_http_error", "Webhook requests that were not reviews.",
                                  ["status"], registry=r)


class WebhookServer:
    def __init__(self, ca: CertificateAuthority, dns_names: list[str],
                 registry: CollectorRegistry | None = None,
                 mount: Sequence[Callable[[web.Application], None]] = ()) -> None:
        """`mount`: other webhooks served on this port (the injector's /inject)."""
        self.certs = ServerCertRotator(ca, dns_names, make_context=webhook_ssl_context)
        self.mount = tuple(mount)
        self.metrics = _Metrics(registry)
        self.reviews = 0
        self._current: ssl.SSLContext | None = None
        self._runner: web.AppRunner | None = None
        self._rotation: asyncio.Task | None = None

    # --- HTTP -------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.metrics.http_error.labels("413").inc()
            return web.Response(status=413, text=f"request body larger than {MAX_BODY} bytes")
        answer = review_bytes(body, request.headers.get("Content-Type", ""))
        self._account(answer)
        return web.Response(status=answer.status, body=answer.body, content_type=answer.content_type)

    def _account(self, answer: Answer) -> None:
        v = answer.verdict
        if v is None:
            self.metrics.http_error.labels(str(answer.status)).inc()
            log.info("not an AdmissionReview", status=answer.status,
                     error=answer.body.decode(errors="replace"))
            return
        self.reviews += 1
        labels = (v.group, v.version, v.resource)
        if v.allowed and not v.reason:
            self.metrics.passed.labels(*labels).inc()
            return
        # As istiod, an operation or kind this webhook does not check counts under its reason.
        self.metrics.failed.labels(*labels, v.reason).inc()
        if not v.allowed:
            log.info(v.message + (" (dry run)" if answer.dry_run else ""), kind=v.kind, namespace=v.namespace,
                     name=v.name)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes([web.post(p, self._handle) for p in PATHS])
        for mount in self.mount:
            mount(app)
        return app

    # --- TLS --------------------------------------------------------------------------------
    def _choose_context(self, sslobj: ssl.SSLObject, _server_name: str | None,
                        listening: ssl.SSLContext) -> None:
        current = self._current
        if current is not None and current is not listening:
            sslobj.context = current

    def _set_context(self, ctx: ssl.SSLContext) -> None:
        self._current = ctx

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> int:
        listening = await asyncio.to_thread(self.certs.issue)
        listening.sni_callback = self._choose_context
        self._current = listening
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=listening)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp: bound port is private
        self._rotation = asyncio.get_running_loop().create_task(self.certs.run(self._set_context),
                                                                name="webhook-cert-rotation")
        return bound

    async def reissue(self) -> None:
        """Serve a certificate from the CA's new chain from the next handshake on."""
        self._set_context(await asyncio.to_thread(self.certs.issue))

    async def stop(self) -> None:
        if self._rotation is not None:
            self._rotation.cancel()
            await asyncio.gather(self._rotation, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
