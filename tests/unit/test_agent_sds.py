"""pilot-agent's SDS server on a real Unix socket, driven by a grpcio client speaking SotW
StreamSecrets as Envoy does. Certificates come from the project's CA, in process.

Absence of a response is shown through stream order: after an ACK (or a NACK) the next message
the client reads must be the *next* version, published afterwards, never a repeat."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from cryptography import x509
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc
from google.rpc import status_pb2

from pilot.agent.ca_client import CAClient, new_key_and_csr
from pilot.agent.sds import SECRET_TYPE, SdsServer
from pilot.agent.secrets import SecretManager, WorkloadSecret, parse_chain
from pilot.security.ca import CAOptions, CertificateAuthority, DirectoryStorage
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(30)

SPIFFE = "spiffe://cluster.local/ns/shop/sa/cart"


async def new_ca(path) -> CertificateAuthority:
    return await CertificateAuthority.create(CAOptions(root_ca_dir=None, key_type="EC"), DirectoryStorage(path))


def issue(ca: CertificateAuthority) -> WorkloadSecret:
    kc = new_key_and_csr(SPIFFE)
    return parse_chain(ca.sign(kc.csr_pem, [SPIFFE], 3600), kc.key_pem, time.time())


class Stream:
    """One StreamSecrets call, as Envoy's SDS subscription opens it."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = sds_pb2_grpc.SecretDiscoveryServiceStub(channel).StreamSecrets()

    async def request(self, names, *, version: str = "", nonce: str = "", error: str | None = None) -> None:
        req = discovery_pb2.DiscoveryRequest(type_url=SECRET_TYPE, resource_names=names, version_info=version,
                                             response_nonce=nonce)
        req.node.id = "sidecar~127.0.0.1~cart-1.shop~shop.svc.cluster.local"
        if error is not None:
            req.error_detail.CopyFrom(status_pb2.Status(code=13, message=error))
        await self.call.write(req)

    async def read(self) -> tuple[discovery_pb2.DiscoveryResponse, dict[str, secret_pb2.Secret]]:
        resp = await asyncio.wait_for(self.call.read(), 10)
        secrets = {}
        for a in resp.resources:
            s = secret_pb2.Secret()
            a.Unpack(s)
            secrets[s.name] = s
        return resp, secrets


@pytest.fixture
async def sds(tmp_path):
    ca = await new_ca(tmp_path / "ca")
    manager = SecretManager(CAClient("unused:1", root_cert_path="", token_path="", server_name=""), SPIFFE, 3600)
    server = SdsServer(manager, str(tmp_path / "uds" / "socket"))
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix:{server.path}")
    try:
        yield ca, manager, server, channel
    finally:
        await channel.close()
        await server.stop()


async def test_pushes_new_versions_and_never_answers_acks_or_nacks(sds):
    ca, manager, server, channel = sds
    s1, s2, s3 = issue(ca), issue(ca), issue(ca)
    manager.publish(s1)
    stream = Stream(channel)
    await stream.request(["default"])
    resp, secrets = await stream.read()
    assert resp.version_info == s1.version and list(secrets) == ["default"]
    tls = secrets["default"].tls_certificate
    assert tls.private_key.inline_bytes.decode() == s1.key_pem
    leaf = x509.load_pem_x509_certificates(tls.certificate_chain.inline_bytes)[0]
    assert leaf.serial_number == s1.serial

    await stream.request(["default"], version=resp.version_info, nonce=resp.nonce)  # ACK
    manager.publish(s2)
    resp, _ = await stream.read()
    assert resp.version_info == s2.version, "the ACK was answered"

    await stream.request(["default"], version=s1.version, nonce=resp.nonce, error="bad key")  # NACK
    # The NACK must have been read before the next version is published, or that version could
    # be pushed first and the NACK would then (rightly) be stale.
    await wait_for(lambda: server.service.nacks == 1, timeout=5, message="NACK recorded")
    manager.publish(s3)
    resp, _ = await stream.read()
    assert resp.version_info == s3.version, "the NACKed version was sent again"

    # Subscribing to ROOTCA as well: both, the root as a validation context.
    await stream.request(["default", "ROOTCA"], version=resp.version_info, nonce=resp.nonce)
    resp, secrets = await stream.read()
    assert set(secrets) == {"default", "ROOTCA"}
    assert secrets["ROOTCA"].validation_context.trusted_ca.inline_bytes.decode() == ca.root_cert_pem
    stream.call.cancel()


async def test_rootca_is_pushed_only_when_the_root_changes_and_unknown_names_are_not_answered(sds, tmp_path):
    ca, manager, _server, channel = sds
    manager.publish(issue(ca))
    stream = Stream(channel)
    await stream.request(["file-cert:/etc/certs/cert.pem"])  # not served by this agent
    await stream.request(["ROOTCA"])
    resp, secrets = await stream.read()
    assert list(secrets) == ["ROOTCA"], "an unknown name was answered"
    first_root = resp.version_info
    await stream.request(["ROOTCA"], version=resp.version_info, nonce=resp.nonce)

    manager.publish(issue(ca))  # a new leaf, same root: nothing for ROOTCA
    other = await new_ca(tmp_path / "other-ca")
    manager.publish(issue(other))
    resp, secrets = await stream.read()
    assert resp.version_info != first_root
    assert secrets["ROOTCA"].validation_context.trusted_ca.inline_bytes.decode() == other.root_cert_pem

    fetched = await sds_pb2_grpc.SecretDiscoveryServiceStub(channel).FetchSecrets(
        discovery_pb2.DiscoveryRequest(resource_names=["default"]), timeout=5)
    assert fetched.version_info == manager.current.version
    stream.call.cancel()


async def test_a_stream_opened_before_the_first_certificate_waits_for_it(sds):
    ca, manager, _server, channel = sds
    stream = Stream(channel)
    await stream.request(["default"])
    reading = asyncio.ensure_future(stream.read())
    secret = issue(ca)
    manager.publish(secret)
    resp, _ = await reading
    assert resp.version_info == secret.version
    stream.call.cancel()
