"""BackendTLSPolicy through a real gateway Envoy: an HTTPRoute to a Service whose only endpoint
serves HTTPS on loopback with a certificate from a test CA. With the policy's CA (a ConfigMap)
and hostname the request reaches the backend over TLS with the policy's SNI; a wrong hostname,
a CA that did not sign the backend's certificate (the ConfigMap changed under the policy) or a
missing ConfigMap answer 503, and the policy's status says why, as istiod reports it."""

from __future__ import annotations

import ssl
import textwrap

import pytest

from tests.e2e.gateway_api_env import (
    API,
    GW_NAME,
    GW_NS,
    SERVICE_PORT,
    GatewayApiEnv,
    conditions,
    gateway_service_yaml,
    gateway_yaml,
    route_yaml,
    running_env,
)
from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.support.backends import HttpBackend
from tests.support.certs import Issued, issue, make_ca
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(90)
HOSTNAME = "secure.example.com"


@pytest.fixture
async def env(tmp_path):
    async with running_env(tmp_path, ("alpha",)) as e:
        yield e


def server_tls(ca: Issued, leaf: Issued, tmp_path, seen: list[str]) -> ssl.SSLContext:
    (tmp_path / "leaf.pem").write_bytes(leaf.cert_pem + ca.cert_pem)
    (tmp_path / "leaf.key").write_bytes(leaf.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "leaf.pem", tmp_path / "leaf.key")
    ctx.sni_callback = lambda _sock, name, _ctx: seen.append(name or "")  # what the client asked for
    return ctx


def ca_config_map(pem: bytes, name: str = "secure-ca") -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: ConfigMap
        metadata: {{name: {name}, namespace: default}}
        data:
          ca.crt: |
        """) + textwrap.indent(pem.decode(), "    ")


def policy_yaml(hostname: str = HOSTNAME, config_map: str = "secure-ca", generation: int = 1) -> str:
    return textwrap.dedent(f"""\
        apiVersion: {API}/v1
        kind: BackendTLSPolicy
        metadata: {{name: secure-tls, namespace: default, generation: {generation}}}
        spec:
          targetRefs: [{{group: "", kind: Service, name: secure}}]
          validation:
            caCertificateRefs: [{{group: "", kind: ConfigMap, name: {config_map}}}]
            hostname: {hostname}
        """)


async def test_gateway_originates_tls_to_the_backend_as_the_policy_says(env: GatewayApiEnv, tmp_path):
    ca, other_ca = make_ca("backend CA"), make_ca("unrelated CA")
    seen: list[str] = []
    backend = await HttpBackend("secure", ssl_context=server_tls(ca, issue(ca, [HOSTNAME]), tmp_path, seen)).start()
    try:
        (port,) = free_ports(1)
        env.cp.write("secure.yaml", service_yaml("secure", SERVICE_PORT) + "---\n"
                     + endpoint_slice_yaml("secure", backend.port))
        env.cp.write("gateway.yaml", gateway_yaml(f"""\
            - {{name: http, port: {port}, protocol: HTTP, allowedRoutes: {{namespaces: {{from: All}}}}}}
            """) + "---\n" + gateway_service_yaml(port))
        env.cp.write("route.yaml", route_yaml("HTTPRoute", "to-secure", f"""\
            parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
            hostnames: [app.example.com]
            rules: [{{backendRefs: [{{name: secure, port: {SERVICE_PORT}}}]}}]
            """))
        env.cp.write("ca.yaml", ca_config_map(ca.cert_pem))
        env.cp.write("policy.yaml", policy_yaml())
        await env.start()

        r = await env.served(port, "app.example.com", "/hello", "secure")
        assert r.body["path"] == "/hello" and seen[-1] == HOSTNAME  # over TLS, with the policy's SNI

        async def policy_conditions(want: dict) -> dict:
            async def check():
                st = await env.status("BackendTLSPolicy", "secure-tls")
                got = {(a["ancestorRef"]["kind"], a["ancestorRef"]["name"]): conditions(a)
                       for a in (st or {}).get("ancestors", [])}
                return got if got == want else None
            return await env.until(check, f"BackendTLSPolicy status {want}")

        ok = {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
        await policy_conditions({("Service", "secure"): ok, ("Gateway", GW_NAME): ok})

        # The certificate does not carry the policy's hostname: refused, 503.
        env.cp.write("policy.yaml", policy_yaml("other.example.com", generation=2))
        await env.served(port, "app.example.com", "/hello", None, status=503)
        assert seen[-1] == "other.example.com"

        # Back to the right hostname, but the ConfigMap now holds a CA that did not sign it.
        env.cp.write("policy.yaml", policy_yaml(generation=3))
        await env.served(port, "app.example.com", "/hello", "secure")
        env.cp.write("ca.yaml", ca_config_map(other_ca.cert_pem))
        await env.served(port, "app.example.com", "/hello", None, status=503)
        env.cp.write("ca.yaml", ca_config_map(ca.cert_pem))
        await env.served(port, "app.example.com", "/hello", "secure")

        # A ConfigMap that does not exist: the policy is not accepted and traffic fails closed.
        env.cp.write("policy.yaml", policy_yaml(config_map="missing", generation=4))
        bad = {"Accepted": ("False", "NoValidCACertificate"), "ResolvedRefs": ("False", "InvalidCACertificateRef")}
        await policy_conditions({("Service", "secure"): bad, ("Gateway", GW_NAME): bad})
        await env.served(port, "app.example.com", "/hello", None, status=503)
    finally:
        await backend.stop()
