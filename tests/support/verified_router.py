"""A gateway Envoy the way gateways really run: under pilot-agent, with a workload certificate
from the control plane's CA and ADS over the secure port (15012). Only such a router has a
proven identity, so only it is served credentials (private keys) over SDS.

The control plane must run with `secure_grpc=True` and trust `issuer` (env JWT_RULE), which
signs the service-account token the agent presents for its certificate.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from pilot.gen.istio.v1.auth import ca_pb2
from tests.support.agent import PilotAgent
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

ISTIOD_NAME = "istiod.istio-system.svc"  # the name istiod's serving certificate carries
CREATE_CERTIFICATE = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


async def start_verified_router(cp: ControlPlane, workdir: Path, issuer: Issuer, *, namespace: str,
                                service_account: str, pod: str, labels: dict[str, str],
                                delta: bool = False, root_cert: str | None = None) -> tuple[PilotAgent, Envoy]:
    """Start it and wait until it is ready; returns the agent (stop it) and a view of its Envoy.
    `root_cert`: the CA root (PEM) when it is not the file-mode one (Kubernetes mode)."""
    agent = PilotAgent(workdir, proxy_type="router", env={
        "POD_NAME": pod, "POD_NAMESPACE": namespace, "SERVICE_ACCOUNT": service_account,
        "INSTANCE_IP": "127.0.0.1", "ISTIO_METAJSON_LABELS": json.dumps(labels),
        "ISTIO_DELTA_XDS": "true" if delta else "false",
        "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}",
                                    "proxyAdminPort": 0, "statusPort": 0, "concurrency": 1})})
    agent.write_root_cert(root_cert or cp.root_cert())
    agent.write_token(issuer.token(namespace=namespace, sa=service_account))
    await agent.start()
    try:
        await agent.wait_ready()
        port = await wait_for(lambda: agent.ports().get("admin"), 10, message=f"admin port\n{agent.log_tail()}")
    except BaseException:
        await agent.stop()
        raise
    return agent, Envoy.attached(f"127.0.0.1:{port}", log=agent.log_path)


async def ask_secrets_as(cp: ControlPlane, root: str, issuer: Issuer, *, namespace: str, service_account: str,
                         node_id: str, names: list[str], labels: dict[str, str] | None = None
                         ) -> tuple[list[secret_pb2.Secret], grpc.aio.Channel, grpc.aio.StreamStreamCall]:
    """One SDS request on an ADS stream to the secure port, authenticated by a fresh workload
    certificate for namespace/service_account. Returns the Secrets of the answer and the open
    channel and call (the proxy stays connected until the caller closes them)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
           .public_bytes(serialization.Encoding.PEM).decode())
    creds = grpc.ssl_channel_credentials(root.encode())
    options = [("grpc.ssl_target_name_override", ISTIOD_NAME)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_port}", creds, options=options) as ca:
        sign = ca.unary_unary(CREATE_CERTIFICATE, request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
                              response_deserializer=ca_pb2.IstioCertificateResponse.FromString)
        token = issuer.token(namespace=namespace, sa=service_account)
        chain = (await sign(ca_pb2.IstioCertificateRequest(csr=csr), timeout=10,
                            metadata=[("authorization", f"Bearer {token}")])).cert_chain
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    channel = grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_port}",
                                      grpc.ssl_channel_credentials(root.encode(), key_pem, "".join(chain).encode()),
                                      options=options)
    call = channel.stream_stream(ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                 response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
    md = struct_pb2.Struct()
    md.update({"NAMESPACE": namespace, "LABELS": labels or {}})
    await call.write(discovery_pb2.DiscoveryRequest(node=base_pb2.Node(id=node_id, metadata=md),
                                                    type_url=SECRET_TYPE, resource_names=names))
    resp = await asyncio.wait_for(call.read(), 10)
    out = []
    for a in resp.resources:
        s = secret_pb2.Secret()
        a.Unpack(s)
        out.append(s)
    return out, channel, call
