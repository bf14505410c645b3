"""Gateway servers that use the mesh's own TLS, through a router Envoy run by pilot-agent:
ISTIO_MUTUAL (clients must present a certificate from the mesh CA) and AUTO_PASSTHROUGH (mesh
connections routed by their `outbound_.PORT_.SUBSET_.HOST` SNI without being terminated, to
endpoints that take mTLS only)."""

from __future__ import annotations

import asyncio
import json
import ssl
import textwrap

import pytest
from cryptography import x509

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.e2e.test_ca_server import create, csr, key_pem
from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend
from tests.support.certs import issue, make_ca
from tests.support.control_plane import ControlPlane
from tests.support.ports import free_ports
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)
NS, SA = "istio-system", "eastwest-gateway"


def gateway_yaml(mutual_port: int, passthrough_port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: Gateway
        metadata: {{name: eastwest, namespace: {NS}}}
        spec:
          selector: {{istio: eastwestgateway}}
          servers:
          - port: {{number: {mutual_port}, name: https-mesh, protocol: HTTPS}}
            hosts: ["*"]
            tls: {{mode: ISTIO_MUTUAL}}
          - port: {{number: {passthrough_port}, name: tls-sni, protocol: TLS}}
            hosts: ["*.local"]
            tls: {{mode: AUTO_PASSTHROUGH}}
        ---
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: plain, namespace: default}}
        spec:
          hosts: ["*"]
          gateways: [{NS}/eastwest]
          http: [{{route: [{{destination: {{host: plain.default.svc.cluster.local}}}}]}}]
        """)


ISTIO_MUTUAL_SECURE = """\
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: secure, namespace: default}
spec:
  host: secure.default.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
"""


async def https_get(port: int, ctx: ssl.SSLContext, sni: str) -> tuple[bytes, bytes]:
    """(server certificate DER, raw HTTP response) over one TLS connection through the gateway."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=sni), 5)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.write(f"GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n".encode())
    body = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return der, body


async def test_istio_mutual_and_auto_passthrough_servers(tmp_path):
    issuer = Issuer("ES256")
    mutual_port, passthrough_port, plain_port, secure_port = free_ports(4)
    backend_ca = make_ca("backend CA")
    backend_cert = issue(backend_ca, ["secure.default.svc.cluster.local"])
    tls_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    (tmp_path / "b.pem").write_bytes(backend_cert.cert_pem)
    (tmp_path / "b.key").write_bytes(backend_cert.key_pem)
    tls_ctx.load_cert_chain(tmp_path / "b.pem", tmp_path / "b.key")
    plain, secure = HttpBackend("plain"), HttpBackend("secure", ssl_context=tls_ctx)
    for b in (plain, secure):
        await b.start()
    cp = ControlPlane(tmp_path / "cp", secure_grpc=True, env={"JWT_RULE": issuer.rule()})
    cp.write("svc.yaml", service_yaml("plain", plain_port) + "---\n" + endpoint_slice_yaml("plain", plain.port)
             + "---\n" + service_yaml("secure", secure_port, port_name="tls")
             + "---\n" + endpoint_slice_yaml("secure", secure.port, port_name="tls"))
    cp.write("gateway.yaml", gateway_yaml(mutual_port, passthrough_port))
    try:
        await cp.start()
        router = PilotAgent(tmp_path / "router", proxy_type="router", env={
            "POD_NAME": "eastwest-1", "POD_NAMESPACE": NS, "SERVICE_ACCOUNT": SA, "INSTANCE_IP": "127.0.0.1",
            "ISTIO_METAJSON_LABELS": json.dumps({"istio": "eastwestgateway"}),
            "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}",
                                        "proxyAdminPort": 0, "statusPort": 0, "concurrency": 1})})
        router.write_root_cert(cp.root_cert())
        router.write_token(issuer.token(namespace=NS, sa=SA))
        async with router:
            await router.wait_ready()
            key, pem = csr()
            chain = await create(cp, pem, token=issuer.token(namespace="default", sa="remote-client"))
            (tmp_path / "c.pem").write_text("".join(chain))
            (tmp_path / "c.key").write_bytes(key_pem(key))
            mesh_client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            mesh_client.check_hostname = False
            mesh_client.load_verify_locations(cadata=cp.root_cert())
            mesh_client.load_cert_chain(tmp_path / "c.pem", tmp_path / "c.key")

            async def mutual_served():
                try:
                    _, body = await https_get(mutual_port, mesh_client, "plain.example.com")
                except (OSError, ssl.SSLError, TimeoutError):
                    return None
                return body if body.startswith(b"HTTP/1.1 200") else None

            body = await wait_for(mutual_served, timeout=20, message=f"ISTIO_MUTUAL server\n{router.log_tail()}")
            assert b'"name": "plain"' in body
            # Without a mesh client certificate the handshake is refused.
            anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            anonymous.check_hostname = False
            anonymous.load_verify_locations(cadata=cp.root_cert())
            try:
                _, body = await https_get(mutual_port, anonymous, "plain.example.com")
            except (OSError, ssl.SSLError, ValueError, TimeoutError):  # ValueError: closed mid-handshake
                body = b""
            assert not body.startswith(b"HTTP/1.1 200"), "served a client without a mesh certificate"

            # AUTO_PASSTHROUGH: the SNI names the router's sni-dnat cluster, which offers only
            # endpoints the mesh sends mTLS to (istiod's rule: the gateway cannot tell mTLS from
            # other TLS). `secure` has no sidecar label: nothing is offered, the connection drops.
            backend_client = ssl.create_default_context(cadata=backend_ca.cert_pem.decode())
            backend_client.check_hostname = False
            sni = f"outbound_.{secure_port}_._.secure.default.svc.cluster.local"
            try:
                _, body = await https_get(passthrough_port, backend_client, sni)
            except (OSError, ssl.SSLError, ValueError, TimeoutError):
                body = b""
            assert not body.startswith(b"HTTP/1.1 200"), "a non-mTLS endpoint was offered through AUTO_PASSTHROUGH"
            # A DestinationRule sending ISTIO_MUTUAL makes it an mTLS endpoint: then the TLS
            # reaches the backend untouched.
            cp.write("dr.yaml", ISTIO_MUTUAL_SECURE)

            async def passed_through():
                try:
                    got = await https_get(passthrough_port, backend_client, sni)
                except (OSError, ssl.SSLError, ValueError, TimeoutError):
                    return None
                return got if got[1].startswith(b"HTTP/1.1 200") else None
            der, body = await wait_for(passed_through, timeout=20, message=f"AUTO_PASSTHROUGH\n{router.log_tail()}")
            assert body.startswith(b"HTTP/1.1 200") and b'"name": "secure"' in body
            assert x509.load_der_x509_certificate(der).serial_number == backend_cert.serial
    finally:
        await cp.stop()
        for b in (plain, secure):
            await b.stop()
