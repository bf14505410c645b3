"""pilot-agent end to end: the real control plane (secure port 15012, CA trusting a test JWT issuer),
the real `pilot-agent proxy sidecar` process in its own working directory, and the Envoy it runs."""

from __future__ import annotations

import base64
import json
import signal
import time

import pytest
from cryptography import x509
from cryptography.x509 import verification

from tests.support.agent import PilotAgent
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)

TRUST_DOMAIN = "example.org"
MESH = f"trustDomain: {TRUST_DOMAIN}\n"
NAMESPACE, SA, POD = "shop", "cart", "cart-7d9f8b6c4d-x2x7q"
NODE_ID = f"sidecar~127.0.0.1~{POD}.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"
SPIFFE = f"spiffe://{TRUST_DOMAIN}/ns/{NAMESPACE}/sa/{SA}"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer("ES256")


def plane(tmp_path, issuer: Issuer) -> ControlPlane:
    return ControlPlane(tmp_path, secure_grpc=True, mesh_config=MESH,
                        env={"JWT_RULE": issuer.rule(), "CA_KEY_TYPE": "EC"})


def agent(tmp_path, cp: ControlPlane, issuer: Issuer, *, token: str | None = None, env: dict | None = None,
          name: str = "agent") -> PilotAgent:
    a = PilotAgent(tmp_path / name, env={
        "POD_NAME": POD, "POD_NAMESPACE": NAMESPACE, "SERVICE_ACCOUNT": SA, "INSTANCE_IP": "127.0.0.1",
        "TRUST_DOMAIN": TRUST_DOMAIN, "ISTIO_META_INTERCEPTION_MODE": "NONE",
        "ISTIO_METAJSON_LABELS": json.dumps({"app": "cart", "version": "v1"}),
        "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}",
                                    "proxyAdminPort": 0, "statusPort": 0, "concurrency": 1}),
        **(env or {})})
    a.write_root_cert(cp.root_cert())
    a.write_token(token if token is not None else issuer.token(namespace=NAMESPACE, sa=SA))
    return a


async def held_chain(a: PilotAgent) -> list[x509.Certificate]:
    """The `default` secret's certificate chain as Envoy holds it (config_dump)."""
    dump = await a.admin_json("/config_dump?resource=dynamic_active_secrets")
    for s in dump["configs"]:
        if s["name"] == "default":
            pem = base64.b64decode(s["secret"]["tls_certificate"]["certificate_chain"]["inline_bytes"])
            return x509.load_pem_x509_certificates(pem)
    raise AssertionError(f"no default secret in {dump}")


def verify(chain: list[x509.Certificate], root_pem: str) -> x509.Certificate:
    root = x509.load_pem_x509_certificate(root_pem.encode())
    verifier = verification.PolicyBuilder().store(verification.Store([root])).build_client_verifier()
    verifier.verify(chain[0], [c for c in chain[1:] if c != root])
    return chain[0]


def uris(cert: x509.Certificate) -> list[str]:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
        .get_values_for_type(x509.UniformResourceIdentifier)


async def test_envoy_gets_its_certificate_and_config_over_15012(tmp_path, issuer):
    async with plane(tmp_path, issuer) as cp:
        a = agent(tmp_path, cp, issuer)
        started = time.monotonic()
        async with a:
            await a.wait_ready()
            print(f"pilot-agent start to ready: {time.monotonic() - started:.2f}s")
            # Config came from the secure port: the control plane saw this node and it ACKed.
            row = await cp.wait_synced(NODE_ID, types=("cluster", "listener"))
            assert row["proxy"] == NODE_ID
            stats = await a.admin_json("/stats?format=json&filter=^cluster\\.xds-grpc\\.ssl\\.handshake$")
            assert stats["stats"][0]["value"] >= 1  # TLS to istiod, with the SDS-served client cert
            leaf = verify(await held_chain(a), cp.root_cert())
            assert uris(leaf) == [SPIFFE]
            # Node metadata as istio-agent sends it.
            adsz = await cp.debug("/debug/adsz")
            (client,) = [c for c in adsz["clients"] if c["metadata"].get("NAME") == POD]
            md = client["metadata"]
            assert md["NAMESPACE"] == NAMESPACE and md["SERVICE_ACCOUNT"] == SA
            assert md["LABELS"] == {"app": "cart", "version": "v1"}
            assert md["INTERCEPTION_MODE"] == "NONE" and md["CLUSTER_ID"] == "Kubernetes"
            assert md["WORKLOAD_NAME"] == "cart" and md["ISTIO_VERSION"]
