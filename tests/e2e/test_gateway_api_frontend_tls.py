"""Gateway spec.tls.frontend (client certificate validation) through a real gateway Envoy and
real TLS: AllowValidOnly refuses clients without a certificate from the referenced CA (a
ConfigMap's or a Secret's ca.crt) in the handshake, a perPort AllowInsecureFallback lets them
in, a rotated CA reaches Envoy, and a malformed CA refuses the listener in status instead of
reaching Envoy."""

from __future__ import annotations

import ssl
import textwrap

import aiohttp
import pytest

from tests.e2e.gateway_api_env import (
    GW_NAME,
    GW_NS,
    SERVICE_PORT,
    GatewayApiEnv,
    client_tls,
    conditions,
    gateway_service_yaml,
    listener_status,
    request,
    route_yaml,
    running_env,
)
from tests.support.certs import b64, issue, make_ca, tls_secret_yaml
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def env(tmp_path):
    async with running_env(tmp_path, ("alpha",)) as e:
        yield e


def ca_object(kind: str, name: str, pem: str) -> str:
    """A ConfigMap, or a Secret (istiod's other kind), holding `pem` as ca.crt."""
    if kind == "Secret":
        return (f"apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {GW_NS}}}\n"
                f"data: {{ca.crt: {b64(pem.encode())}}}\n")
    return (f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {GW_NS}}}\n"
            f"data:\n  ca.crt: |\n" + textwrap.indent(pem, "    "))


def gateway_with_frontend(strict: int, fallback: int, kind: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: gateway.networking.k8s.io/v1
        kind: Gateway
        metadata: {{name: {GW_NAME}, namespace: {GW_NS}, generation: 1}}
        spec:
          gatewayClassName: istio
          tls:
            frontend:
              default:
                validation:
                  caCertificateRefs: [{{group: "", kind: {kind}, name: client-ca}}]
              perPort:
              - port: {fallback}
                tls:
                  validation:
                    mode: AllowInsecureFallback
                    caCertificateRefs: [{{group: "", kind: {kind}, name: client-ca}}]
          listeners:
          - name: strict
            port: {strict}
            protocol: HTTPS
            tls: {{certificateRefs: [{{name: server-cert}}]}}
            allowedRoutes: {{namespaces: {{from: All}}}}
          - name: fallback
            port: {fallback}
            protocol: HTTPS
            tls: {{certificateRefs: [{{name: server-cert}}]}}
            allowedRoutes: {{namespaces: {{from: All}}}}
        """)


async def outcome(port: int, tls: ssl.SSLContext) -> str:
    """What a client sees: the backend's name, or "refused" when the handshake (or the first
    read, where TLS 1.3 reports a refused client certificate) fails."""
    try:
        r = await request(port, "a.example.com", "/", tls=tls)
    except (aiohttp.ClientError, ssl.SSLError, ConnectionError, OSError):
        return "refused"
    return r.backend or f"status {r.status}"


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret"])
async def test_client_certificates_checked_against_the_referenced_ca(env: GatewayApiEnv, kind: str):
    server_ca, client_ca, other_ca = make_ca("server CA"), make_ca("client CA"), make_ca("other CA")
    server = issue(server_ca, ["a.example.com"])
    good, stranger = issue(client_ca, ["client"], client=True), issue(other_ca, ["stranger"], client=True)
    strict, fallback = free_ports(2)
    env.cp.write("secrets.yaml", tls_secret_yaml("server-cert", GW_NS, server))
    env.cp.write("ca.yaml", ca_object(kind, "client-ca", client_ca.cert_pem.decode()))
    env.cp.write("gateway.yaml", gateway_with_frontend(strict, fallback, kind) + "---\n"
                 + gateway_service_yaml(strict, fallback))
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "r", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        rules:
        - backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]
        """))
    await env.start(verified=True)

    async def strict_served():
        return await outcome(strict, client_tls(server_ca, good)) == "alpha"

    await env.until(strict_served, "HTTPS with a client certificate from the referenced CA")
    # AllowValidOnly: no certificate, or one from another CA, fails the handshake.
    assert await outcome(strict, client_tls(server_ca)) == "refused"
    assert await outcome(strict, client_tls(server_ca, stranger)) == "refused"
    # perPort AllowInsecureFallback (istiod: OPTIONAL_MUTUAL accepting untrusted): all get in.
    assert await outcome(fallback, client_tls(server_ca)) == "alpha"
    assert await outcome(fallback, client_tls(server_ca, stranger)) == "alpha"
    assert await outcome(fallback, client_tls(server_ca, good)) == "alpha"
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    assert conditions(gw)["InsecureFrontendValidationMode"] == ("True", "ConfigurationChanged")
    assert conditions(listener_status(gw, "strict"))["ResolvedRefs"] == ("True", "ResolvedRefs")

    # Rotating the CA reaches Envoy (the ConfigMap or Secret is a recorded dependency).
    env.cp.write("ca.yaml", ca_object(kind, "client-ca", other_ca.cert_pem.decode()))

    async def rotated():
        return await outcome(strict, client_tls(server_ca, stranger)) == "alpha"

    await env.until(rotated, "the rotated client CA in force")
    assert await outcome(strict, client_tls(server_ca, good)) == "refused"

    # A malformed CA never reaches Envoy: the listeners are refused in status.
    env.cp.write("ca.yaml", ca_object(kind, "client-ca", "-----BEGIN CERTIFICATE-----\nnot base64!\n"
                                                      "-----END CERTIFICATE-----\n"))

    async def refused_in_status():
        gw = await env.status("Gateway", GW_NAME, GW_NS)
        ls = listener_status(gw, "strict") if gw else None
        return ls is not None and conditions(ls)["ResolvedRefs"] == ("False", "InvalidCACertificateRef")

    await env.until(refused_in_status, "InvalidCACertificateRef in status")
    ls = listener_status(await env.status("Gateway", GW_NAME, GW_NS), "strict")
    assert conditions(ls)["Programmed"] == ("False", "Invalid")
    assert "the bundle is malformed" in next(c["message"] for c in ls["conditions"] if c["type"] == "ResolvedRefs")
