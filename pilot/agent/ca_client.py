"""The workload key, its CSR, and the call to istiod's CA (IstioCertificateService/CreateCertificate).

Each call re-reads the root certificate and the service-account token: the kubelet rotates the
projected token and the root ConfigMap may change, and neither should need an agent restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pilot.gen.istio.v1.auth import ca_pb2, ca_pb2_grpc

CALL_TIMEOUT = 10.0
# Worth retrying: the CA is starting, restarting or briefly unreachable. Anything else (bad token,
# refused identity, bad request) will not fix itself by asking again.
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
                       grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})


class CertificateError(Exception):
    """Getting a certificate failed; `transient` says whether retrying may help."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class KeyAndCSR:
    key_pem: str
    csr_pem: str


def new_key_and_csr(spiffe_id: str) -> KeyAndCSR:
    """An EC P-256 key and a CSR whose only name is the SPIFFE URI SAN (critical: the subject is
    empty, RFC 5280 4.2.1.6)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([]))
           .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(spiffe_id)]), critical=True)
           .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return KeyAndCSR(key_pem, csr.public_bytes(serialization.Encoding.PEM).decode())


class CAClient:
    def __init__(self, address: str, *, root_cert_path: str, token_path: str, server_name: str,
                 cluster_id: str = "Kubernetes") -> None:
        self.address = address
        self.root_cert_path = root_cert_path
        self.token_path = token_path
        self.server_name = server_name
        self.cluster_id = cluster_id

    def root_pem(self) -> str:
        return self._root().decode()

    def _root(self) -> bytes:
        try:
            data = Path(self.root_cert_path).read_bytes()
        except OSError as e:
            raise CertificateError(f"cannot read the mesh root certificate {self.root_cert_path} "
                                   f"(needed to verify the CA at {self.address}): {e.strerror or e}",
                                   transient=False) from None
        try:
            x509.load_pem_x509_certificates(data)
        except ValueError as e:
            raise CertificateError(f"the mesh root certificate {self.root_cert_path} is not PEM "
                                   f"certificates: {e}", transient=False) from None
        return data

    def _token(self) -> str:
        try:
            token = Path(self.token_path).read_text().strip()
        except OSError as e:
            raise CertificateError(f"cannot read the service-account token {self.token_path} "
                                   f"(the CA needs it to authenticate this workload): {e.strerror or e}",
                                   transient=False) from None
        if not token:
            raise CertificateError(f"the service-account token file {self.token_path} is empty", transient=False)
        return token

    async def sign(self, csr_pem: str, ttl_seconds: float,
                   client_cert: tuple[str, str] | None = None) -> list[str]:
        """The certificate chain (leaf first, root last) for `csr_pem`. `client_cert` (key PEM,
        chain PEM), when the agent already holds a valid certificate, is presented in the TLS
        handshake: istiod authenticates a renewal by it even if the token is gone."""
        root = self._root()
        try:
            token = self._token()
        except CertificateError:
            if client_cert is None:
                raise
            token = None
        creds = grpc.ssl_channel_credentials(
            root, *((client_cert[0].encode(), client_cert[1].encode()) if client_cert else (None, None)))
        metadata = [("clusterid", self.cluster_id)]
        if token:
            metadata.append(("authorization", f"Bearer {token}"))
        request = ca_pb2.IstioCertificateRequest(csr=csr_pem, validity_duration=max(1, int(ttl_seconds)))
        async with grpc.aio.secure_channel(self.address, creds, options=[
                ("grpc.ssl_target_name_override", self.server_name)]) as channel:
            stub = ca_pb2_grpc.IstioCertificateServiceStub(channel)
            try:
                response = await stub.CreateCertificate(request, metadata=metadata, timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError as e:
                transient = e.code() in TRANSIENT
                what = "the certificate request to the CA at {} failed" if transient else \
                    "the CA at {} refused the certificate request"
                raise CertificateError(f"{what.format(self.address)}: {e.code().name}: {e.details()}",
                                       transient=transient) from None
        chain = list(response.cert_chain)
        if not chain:
            raise CertificateError(f"the CA at {self.address} returned an empty certificate chain", transient=True)
        return chain
