"""DestinationRule `tls.credentialName`: a sidecar originates TLS to an upstream and verifies it
with the CA of a Secret of its namespace, served to it over SDS, as istiod does.

    client --HTTP--> 127.0.0.1:SVC_PORT  sidecar (pilot-agent, mesh identity, NONE mode)
                     --TLS, verified by the Secret's CA--> the "secure" backend (its own PKI)

The Secret holds only the CA (`ca.crt`); swapping it for another CA makes Envoy refuse the
backend, so the test proves the Secret's CA is what verifies it, read from Envoy itself.
"""

from __future__ import annotations

import base64
import json
import ssl
import textwrap

import aiohttp
import pytest

from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend
from tests.support.certs import b64, issue, make_ca
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.ports import free_ports
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)
NS = "default"
HOST = "secure.default.svc.cluster.local"


def ca_secret(pem: bytes) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Secret
        metadata: {{name: secure-ca, namespace: {NS}}}
        type: Opaque
        data: {{ca.crt: {b64(pem)}}}
        """)


def mesh(svc_port: int, backend_port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: secure, namespace: {NS}}}
        spec: {{ports: [{{name: http, port: {svc_port}}}]}}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata: {{name: secure-1, namespace: {NS}, labels: {{kubernetes.io/service-name: secure}}}}
        addressType: IPv4
        ports: [{{name: http, port: {backend_port}}}]
        endpoints: [{{addresses: [127.0.0.1], conditions: {{ready: true}}}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: DestinationRule
        metadata: {{name: secure, namespace: {NS}}}
        spec:
          host: secure
          trafficPolicy:
            tls: {{mode: SIMPLE, credentialName: secure-ca, sni: {HOST}, subjectAltNames: [{HOST}]}}
        """)


async def test_client_tls_verified_with_the_ca_of_a_secret_served_over_sds(tmp_path):
    backend_ca, other_ca = make_ca("backend CA"), make_ca("someone else")
    leaf = issue(backend_ca, [HOST])
    (tmp_path / "b.pem").write_bytes(leaf.cert_pem)
    (tmp_path / "b.key").write_bytes(leaf.key_pem)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(tmp_path / "b.pem", tmp_path / "b.key")
    backend = await HttpBackend("secure", ssl_context=server_tls).start()
    (svc_port,) = free_ports(1)
    issuer = Issuer("ES256")
    cp = ControlPlane(tmp_path / "cp", secure_grpc=True, env={"JWT_RULE": issuer.rule()})
    cp.write("mesh.yaml", mesh(svc_port, backend.port))
    cp.write("secret.yaml", ca_secret(backend_ca.cert_pem))
    try:
        await cp.start()
        agent = PilotAgent(tmp_path / "client", env={
            "POD_NAME": "client-1", "POD_NAMESPACE": NS, "SERVICE_ACCOUNT": "client", "INSTANCE_IP": "127.0.0.3",
            "ISTIO_META_INTERCEPTION_MODE": "NONE", "ISTIO_METAJSON_LABELS": json.dumps({"app": "client"}),
            "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}", "proxyAdminPort": 0,
                                        "statusPort": 0, "concurrency": 1})})
        agent.write_root_cert(cp.root_cert())
        agent.write_token(issuer.token(namespace=NS, sa="client"))
        async with agent:
            await agent.wait_ready()
            envoy = Envoy.attached(f"127.0.0.1:{agent.ports()['admin']}", log=agent.log_path)

            def answered(expected: int):
                async def check() -> bool:
                    try:
                        async with aiohttp.ClientSession() as s, s.get(
                                f"http://127.0.0.1:{svc_port}/", headers={"Host": HOST},
                                timeout=aiohttp.ClientTimeout(total=5)) as r:
                            return r.status == expected
                    except (aiohttp.ClientError, TimeoutError):
                        return False
                return check

            await wait_for(answered(200), 20, message=f"TLS to the backend\n{agent.log_tail()}")
            assert backend.request_count > 0
            # Envoy holds the Secret's CA as the SDS resource the cluster names.
            dump = await envoy.config_dump(resource="dynamic_active_secrets")
            names = {s["name"] for s in dump["configs"]}
            assert "kubernetes://secure-ca-cacert" in names, names
            # Another CA in the Secret: once Envoy holds it, the backend's certificate no longer
            # verifies on a new upstream connection (the backend restarts, so none is reused).
            cp.write("secret.yaml", ca_secret(other_ca.cert_pem))

            async def holds_other_ca() -> bool:
                dump = await envoy.config_dump(resource="dynamic_active_secrets")
                held = {c["name"]: c["secret"].get("validation_context", {}).get("trusted_ca", {})
                        .get("inline_bytes", "") for c in dump["configs"]}
                return base64.b64decode(held.get("kubernetes://secure-ca-cacert", "")) == other_ca.cert_pem

            await wait_for(holds_other_ca, 20, message=f"the new CA reached Envoy\n{agent.log_tail()}")
            port = backend.port
            await backend.stop()
            backend = await HttpBackend("secure", port, ssl_context=server_tls).start()
            await wait_for(answered(503), 20, message=f"refused with the other CA\n{agent.log_tail()}")
            cp.write("secret.yaml", ca_secret(backend_ca.cert_pem))
            await wait_for(answered(200), 20, message="verified again")
            await envoy.stop()  # the admin session (the agent stops Envoy itself)
    finally:
        await cp.stop()
        await backend.stop()
