"""The webhook's TLS server in process: its certificate names (with a REVISION), HTTP/1.1 only,
and a re-issued certificate served from the next handshake on without a restart."""

from __future__ import annotations

import asyncio
import json
import ssl

import aiohttp
import pytest
from cryptography import x509

from pilot.security.ca import CAOptions, CertificateAuthority, DirectoryStorage
from pilot.security.ca_server import istiod_dns_names
from pilot.webhook.server import WebhookServer

REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u", "operation": "DELETE"}}


async def _serial_and_alpn(port: int, ctx: ssl.SSLContext, name: str) -> tuple[int, str | None]:
    _, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=name)
    sslobj = w.get_extra_info("ssl_object")
    der = sslobj.getpeercert(binary_form=True)
    alpn = sslobj.selected_alpn_protocol()
    w.close()
    return x509.load_der_x509_certificate(der).serial_number, alpn


async def test_revision_names_http11_and_reissue(tmp_path):
    options = CAOptions(root_ca_dir=None, key_type="EC")
    ca = await CertificateAuthority.create(options, DirectoryStorage(tmp_path))
    server = WebhookServer(ca, istiod_dns_names("istio-system", revision="canary"))
    port = await server.start("127.0.0.1", 0)
    try:
        client = ssl.create_default_context(cadata=ca.root_cert_pem)
        client.set_alpn_protocols(["h2", "http/1.1"])  # as the apiserver's Go client offers
        first, alpn = await _serial_and_alpn(port, client, "istiod-canary.istio-system.svc")
        assert alpn == "http/1.1"  # never h2: the server speaks HTTP/1.1 only
        assert (await _serial_and_alpn(port, client, "istiod.istio-system.svc"))[0] == first
        with pytest.raises(ssl.SSLCertVerificationError):
            await _serial_and_alpn(port, client, "istiod-other.istio-system.svc")

        await server.reissue()
        second, _ = await _serial_and_alpn(port, client, "istiod.istio-system.svc")
        assert second != first
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client)) as s, \
                s.post(f"https://127.0.0.1:{port}/validate", data=json.dumps(REVIEW),
                       headers={"Content-Type": "application/json"},
                       server_hostname="istiod.istio-system.svc") as r:
            assert r.status == 200 and (await r.json())["response"] == {"uid": "u", "allowed": True}
        assert server.reviews == 1
    finally:
        await server.stop()
