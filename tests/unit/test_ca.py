"""The CA (pilot/security/ca.py), SPIFFE identities and the CA service's generated protos.

Certificates are checked with `cryptography` directly: extensions, SANs, lifetimes, and every
signature along the returned chain.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import os
import stat
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pilot import features
from pilot.security import spiffe
from pilot.security.ca import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    CA_SECRET_NAME,
    CA_SECRET_TYPE,
    CERT_CHAIN_FILE,
    MAX_CSR_BYTES,
    PLUGGED_IN,
    PRIVATE_KEY_FILE,
    ROOT_CERT_FILE,
    SELF_SIGNED,
    CABundleError,
    CAError,
    CAOptions,
    CAStorageError,
    CertificateAuthority,
    CSRError,
    DirectoryStorage,
    IdentityError,
    KubeSecrets,
    KubeSecretStorage,
    TTLError,
    generate_root,
    key_to_pem,
    load_bundle,
)

pytestmark = pytest.mark.timeout(60)

ID = "spiffe://cluster.local/ns/default/sa/bookinfo-productpage"
HOUR = 3600.0
DAY = 86400.0
NS = "istio-system"

# Root generation (RSA 2048) dominates these tests; most share one self-signed CA per key type.
_ROOTS: dict[str, dict[str, str]] = {}


def root_files(key_type: str = "RSA") -> dict[str, str]:
    if key_type not in _ROOTS:
        _ROOTS[key_type] = generate_root(org="cluster.local", key_type=key_type)
    return dict(_ROOTS[key_type])


class MemoryStorage:
    """A CAStorage holding preset files (or none); counts creates."""

    description = "memory"

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files, self.creates = files, 0

    async def load(self) -> dict[str, str] | None:
        return self.files

    async def create(self, files: dict[str, str]) -> dict[str, str]:
        self.creates += 1
        if self.files is None:
            self.files = files
        return self.files


class Untouchable:
    description = "untouchable"

    async def load(self):
        raise AssertionError("storage must not be consulted")

    async def create(self, files):
        raise AssertionError("storage must not be consulted")


def ca_from(files: dict[str, str], **opts) -> CertificateAuthority:
    options = CAOptions(root_ca_dir=None, **opts)
    return asyncio.run(CertificateAuthority.create(options, MemoryStorage(files)))


@pytest.fixture(scope="module")
def rsa_ca() -> CertificateAuthority:
    return ca_from(root_files("RSA"))


@pytest.fixture(scope="module")
def ec_ca() -> CertificateAuthority:
    return ca_from(root_files("EC"))


def make_csr(key_type: str = "EC", *, sans: list[x509.GeneralName] | None = None,
             subject: str | None = None, ask_ca: bool = False, key=None) -> bytes:
    if key is None:
        key = (ec.generate_private_key(ec.SECP256R1()) if key_type == "EC"
               else rsa.generate_private_key(public_exponent=65537, key_size=2048 if key_type == "RSA" else 1024))
    b = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]) if subject else x509.Name([]))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if ask_ca:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def certs(chain: list[str]) -> list[x509.Certificate]:
    return [x509.load_pem_x509_certificate(p.encode()) for p in chain]


def verify_chain(chain: list[x509.Certificate]) -> None:
    """Each certificate is signed by the next; the last one is self-signed."""
    for child, parent in itertools.pairwise(chain):
        child.verify_directly_issued_by(parent)
    chain[-1].verify_directly_issued_by(chain[-1])


def uri_sans(cert: x509.Certificate) -> list[str]:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier)


# --------------------------------------------------------------------------------- protos


def test_generated_ca_protos_import_as_package_and_round_trip():
    from pilot.gen.istio.v1.auth import ca_pb2, ca_pb2_grpc

    req = ca_pb2.IstioCertificateRequest(csr="-----BEGIN CERTIFICATE REQUEST-----", validity_duration=3600)
    req.metadata.update({"ClusterID": "Kubernetes", "WorkloadName": "productpage-v1"})
    back = ca_pb2.IstioCertificateRequest.FromString(req.SerializeToString())
    assert back == req and back.metadata["ClusterID"] == "Kubernetes"
    fields = {f.name: f.number for f in ca_pb2.IstioCertificateRequest.DESCRIPTOR.fields}
    assert fields == {"csr": 1, "validity_duration": 3, "metadata": 4}
    resp = ca_pb2.IstioCertificateResponse(cert_chain=["leaf", "root"])
    assert list(ca_pb2.IstioCertificateResponse.FromString(resp.SerializeToString()).cert_chain) == ["leaf", "root"]
    service = ca_pb2.DESCRIPTOR.services_by_name["IstioCertificateService"]
    assert service.full_name == "istio.v1.auth.IstioCertificateService"
    assert service.methods_by_name["CreateCertificate"].input_type.full_name == "istio.v1.auth.IstioCertificateRequest"
    assert hasattr(ca_pb2_grpc, "IstioCertificateServiceStub")
    assert hasattr(ca_pb2_grpc, "add_IstioCertificateServiceServicer_to_server")
    # Imported once, under pilot.gen only: no second top-level `istio` package.
    import sys
    assert "istio" not in sys.modules
    assert ca_pb2_grpc.istio_dot_v1_dot_auth_dot_ca__pb2 is ca_pb2


# --------------------------------------------------------------------------------- SPIFFE


def test_spiffe_build_and_parse():
    uri = spiffe.build("cluster.local", "default", "bookinfo-productpage")
    assert uri == ID
    ident = spiffe.parse(uri)
    assert (ident.trust_domain, ident.namespace, ident.service_account) == (
        "cluster.local", "default", "bookinfo-productpage")
    assert str(ident) == uri
    assert spiffe.validate_spiffe_id("spiffe://example.org/some/path") == "spiffe://example.org/some/path"
    assert spiffe.validate_spiffe_id("spiffe://example.org") == "spiffe://example.org"


@pytest.mark.parametrize(("uri", "message"), [
    ("https://cluster.local/ns/a/sa/b", "must start with 'spiffe://'"),
    ("spiffe:///ns/a/sa/b", "trust domain is empty"),
    ("spiffe://Cluster.Local/ns/a/sa/b", "lowercase"),
    ("spiffe://cluster.local:8080/ns/a/sa/b", "port"),
    ("spiffe://cluster.local/ns/a/sa/b?x=1", "query or fragment"),
    ("spiffe://cluster.local/ns//sa/b", "empty path segment"),
    ("spiffe://cluster.local/ns/../sa/b", "'.' or '..'"),
    ("spiffe://cluster.local/ns/a/sa/b/", "may not end with '/'"),
    ("spiffe://cluster.local/ns/a/sa/b c", "may only hold"),
    ("spiffe://cluster.local/ns/a/serviceaccount/b", "not an Istio workload identity"),
    ("spiffe://cluster.local/ns/a", "not an Istio workload identity"),
])
def test_spiffe_parse_errors(uri, message):
    with pytest.raises(spiffe.SpiffeIdError, match=message.replace("?", r"\?").replace(".", r"\.")):
        spiffe.parse(uri)


def test_spiffe_build_rejects_bad_parts():
    with pytest.raises(spiffe.SpiffeIdError, match="namespace"):
        spiffe.build("cluster.local", "", "sa")
    with pytest.raises(spiffe.SpiffeIdError, match="service account"):
        spiffe.build("cluster.local", "ns", "a/b")
    with pytest.raises(spiffe.SpiffeIdError, match="trust domain"):
        spiffe.build("Bad_Domain!", "ns", "sa")


# --------------------------------------------------------------------------------- roots


def _check_root(ca: CertificateAuthority, key_type: str) -> x509.Certificate:
    root = x509.load_pem_x509_certificate(ca.root_cert_pem.encode())
    assert ca.mode == SELF_SIGNED
    assert root.subject == root.issuer
    assert root.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "cluster.local"
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert root.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    root.verify_directly_issued_by(root)
    life = root.not_valid_after_utc - root.not_valid_before_utc
    assert dt.timedelta(days=3649) < life < dt.timedelta(days=3651)  # CITADEL_SELF_SIGNED_CA_CERT_TTL 87600h
    pub = root.public_key()
    if key_type == "RSA":
        assert isinstance(pub, rsa.RSAPublicKey) and pub.key_size == 2048
        assert root.signature_hash_algorithm.name == "sha256"
    else:
        assert isinstance(pub, ec.EllipticCurvePublicKey) and pub.curve.name == "secp256r1"
    return root


@pytest.mark.parametrize("key_type", ["RSA", "EC"])
def test_self_signed_root_created_once_and_reloaded_from_directory(tmp_path, key_type):
    async def run():
        opts = CAOptions(root_ca_dir=str(tmp_path / "cacerts-absent"), key_type=key_type)
        first = await CertificateAuthority.create(opts, DirectoryStorage(tmp_path / "ca"))
        # A restart: a new CA object over the same directory.
        second = await CertificateAuthority.create(opts, DirectoryStorage(tmp_path / "ca"))
        return first, second

    first, second = asyncio.run(run())
    root = _check_root(first, key_type)
    assert second.root_cert_pem == first.root_cert_pem
    assert second.bundle.ca_key.private_numbers() == first.bundle.ca_key.private_numbers()
    d = tmp_path / "ca"
    assert {p.name for p in d.iterdir() if not p.name.startswith(".")} == {
        CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE}
    assert stat.S_IMODE((d / CA_KEY_FILE).stat().st_mode) == 0o600
    assert x509.load_pem_x509_certificate((d / ROOT_CERT_FILE).read_bytes()) == root
    assert (d / CERT_CHAIN_FILE).read_text() == ""
    assert (b"RSA PRIVATE KEY" if key_type == "RSA" else b"EC PRIVATE KEY") in (d / CA_KEY_FILE).read_bytes()


def test_partial_directory_is_an_error_not_a_new_root(tmp_path):
    (tmp_path / CA_CERT_FILE).write_text(root_files()[CA_CERT_FILE])
    with pytest.raises(CAStorageError, match="ca-key.pem is missing.*refusing to mint"):
        asyncio.run(CertificateAuthority.create(CAOptions(root_ca_dir=None), DirectoryStorage(tmp_path)))
    assert not (tmp_path / CA_KEY_FILE).exists()


class FakeSecrets:
    """An in-memory SecretsClient. `hold_gets` makes that many readers wait for each other,
    so concurrent replicas all see "no secret" before any creates one (the race)."""

    class Conflict(Exception):
        status = 409

    def __init__(self, hold_gets: int = 0) -> None:
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self.creates = self.conflicts = 0
        self._hold, self._waiting = hold_gets, 0
        self._released = asyncio.Event()

    async def get_secret(self, namespace, name):
        if self._hold:
            self._waiting += 1
            if self._waiting >= self._hold:
                self._hold = 0
                self._released.set()
            await self._released.wait()
        data = self.secrets.get((namespace, name))
        return None if data is None else {k: v.encode() for k, v in data.items()}

    async def create_secret(self, namespace, name, data):
        await asyncio.sleep(0)
        if (namespace, name) in self.secrets:
            self.conflicts += 1
            raise self.Conflict("secrets \"istio-ca-secret\" already exists")
        self.creates += 1
        self.secrets[(namespace, name)] = dict(data)


def test_kubernetes_secret_root_created_once_and_reloaded():
    async def run():
        fake = FakeSecrets()
        opts = CAOptions(root_ca_dir=None)
        first = await CertificateAuthority.create(opts, KubeSecretStorage(fake, NS))
        restarted = await CertificateAuthority.create(opts, KubeSecretStorage(fake, NS))
        return fake, first, restarted

    fake, first, restarted = asyncio.run(run())
    assert fake.creates == 1 and fake.conflicts == 0
    stored = fake.secrets[(NS, CA_SECRET_NAME)]
    assert set(stored) == {CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE, PRIVATE_KEY_FILE}
    assert stored[CA_CERT_FILE] == stored[ROOT_CERT_FILE] == first.root_cert_pem
    assert restarted.root_cert_pem == first.root_cert_pem


def test_kubernetes_secret_race_409_adopts_the_winners_root():
    async def run():
        fake = FakeSecrets(hold_gets=3)
        opts = CAOptions(root_ca_dir=None, key_type="EC")
        cas = await asyncio.gather(*(CertificateAuthority.create(opts, KubeSecretStorage(fake, NS))
                                     for _ in range(3)))
        return fake, cas

    fake, cas = asyncio.run(run())
    assert fake.creates == 1 and fake.conflicts == 2  # all three minted, one stored, two adopted it
    stored = fake.secrets[(NS, CA_SECRET_NAME)]
    assert {ca.root_cert_pem for ca in cas} == {stored[CA_CERT_FILE]}
    leaf_chain = cas[2].sign(make_csr(), [ID])
    certs(leaf_chain)[0].verify_directly_issued_by(x509.load_pem_x509_certificate(stored[CA_CERT_FILE].encode()))


def test_kubernetes_secret_incomplete_or_unreadable_is_an_error():
    async def run(fake):
        return await CertificateAuthority.create(CAOptions(root_ca_dir=None), KubeSecretStorage(fake, NS))

    fake = FakeSecrets()
    fake.secrets[(NS, CA_SECRET_NAME)] = {CA_CERT_FILE: root_files()[CA_CERT_FILE], CA_KEY_FILE: ""}
    with pytest.raises(CAStorageError, match="istio-system/istio-ca-secret exists but ca-key.pem"):
        asyncio.run(run(fake))
    assert fake.creates == 0

    class Down(FakeSecrets):
        async def get_secret(self, namespace, name):
            raise ConnectionError("apiserver unreachable")

    with pytest.raises(CAStorageError, match="cannot read secret istio-system/istio-ca-secret: apiserver"):
        asyncio.run(run(Down()))


def test_secret_written_by_istiod_is_adopted():
    # istiod's istio-ca-secret: root-cert.pem, cert-chain.pem and key.pem empty.
    files = root_files()
    istiod = {CA_CERT_FILE: files[CA_CERT_FILE], CA_KEY_FILE: files[CA_KEY_FILE],
              CERT_CHAIN_FILE: "", ROOT_CERT_FILE: "", PRIVATE_KEY_FILE: ""}
    fake = FakeSecrets()
    fake.secrets[(NS, CA_SECRET_NAME)] = istiod
    ca = asyncio.run(CertificateAuthority.create(CAOptions(root_ca_dir=None), KubeSecretStorage(fake, NS)))
    assert ca.root_cert_pem == files[CA_CERT_FILE] and fake.creates == 0


async def test_kube_secrets_against_the_fake_apiserver():
    from pilot.sources.kube.client import Kube
    from tests.fakes.apiserver import FakeApiServer

    async with FakeApiServer() as server:
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        kube = Kube(server.api_client())
        try:
            secrets = KubeSecrets(kube)
            assert await secrets.get_secret(NS, CA_SECRET_NAME) is None
            opts = CAOptions(root_ca_dir=None, key_type="EC")
            first = await CertificateAuthority.create(opts, KubeSecretStorage(secrets, NS))
            again = await CertificateAuthority.create(opts, KubeSecretStorage(secrets, NS))
            assert again.root_cert_pem == first.root_cert_pem
            obj = await kube.request("GET", f"/api/v1/namespaces/{NS}/secrets/{CA_SECRET_NAME}")
            assert obj["type"] == CA_SECRET_TYPE
            # A create that loses the race gets the apiserver's 409 and returns the stored root.
            other = generate_root(org="cluster.local", key_type="EC")
            stored = await KubeSecretStorage(secrets, NS).create(other)
            assert stored[CA_CERT_FILE] == first.root_cert_pem != other[CA_CERT_FILE]
        finally:
            await kube.close()


# --------------------------------------------------------------------------------- plugged-in CA


def make_intermediate(root: dict[str, str], *, key_type: str = "EC", cn: str = "istiod intermediate",
                      days: float = 365) -> dict[str, str]:
    """Files of a plugged-in CA: an intermediate signed by `root` (istio's cacerts layout)."""
    root_cert = x509.load_pem_x509_certificate(root[CA_CERT_FILE].encode())
    root_key = serialization.load_pem_private_key(root[CA_KEY_FILE].encode(), None)
    key = ec.generate_private_key(ec.SECP256R1()) if key_type == "EC" else rsa.generate_private_key(65537, 2048)
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Istio"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(root_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(min(now - dt.timedelta(minutes=5), now + dt.timedelta(days=days - 1)))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(root_key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    # As istio's Makefile.selfsigned.mk builds it: cert-chain.pem = ca-cert.pem + root-cert.pem.
    return {CA_CERT_FILE: cert_pem, CA_KEY_FILE: key_to_pem(key), ROOT_CERT_FILE: root[CA_CERT_FILE],
            CERT_CHAIN_FILE: cert_pem + root[CA_CERT_FILE]}


def write_dir(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def test_plugged_in_ca_takes_precedence_and_signs_with_the_intermediate(tmp_path):
    root = root_files("EC")
    plugged = make_intermediate(root)
    write_dir(tmp_path / "cacerts", plugged)
    ca = asyncio.run(CertificateAuthority.create(CAOptions(root_ca_dir=str(tmp_path / "cacerts")), Untouchable()))
    assert ca.mode == PLUGGED_IN
    assert ca.root_cert_pem == root[CA_CERT_FILE]
    chain = certs(ca.sign(make_csr(), [ID]))
    assert [c.subject for c in chain[1:]] == [
        x509.load_pem_x509_certificate(plugged[CA_CERT_FILE].encode()).subject,
        x509.load_pem_x509_certificate(root[CA_CERT_FILE].encode()).subject]
    verify_chain(chain)  # leaf <- intermediate <- root; root self-signed
    assert chain[0].issuer == chain[1].subject


def test_plugged_in_ca_reloads_when_files_change(tmp_path):
    root = root_files("EC")
    d = tmp_path / "cacerts"
    write_dir(d, make_intermediate(root, cn="first"))
    ca = CertificateAuthority.from_plugged_in_dir(d, CAOptions(root_ca_dir=str(d)))
    assert ca.reload_if_changed() is False  # nothing changed
    first_issuer = certs(ca.sign(make_csr(), [ID]))[1]

    second = make_intermediate(root, cn="second")
    write_dir(d, second)
    assert ca.reload_if_changed() is True
    chain = certs(ca.sign(make_csr(), [ID]))
    assert chain[1].subject != first_issuer.subject
    assert chain[1].subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "second"
    verify_chain(chain)
    assert ca.reload_if_changed() is False

    # A half-done rotation (new cert, old key): reported once, the previous CA keeps signing.
    third = make_intermediate(root, cn="third")
    (d / CA_CERT_FILE).write_text(third[CA_CERT_FILE])
    with pytest.raises(CABundleError, match="ca-key.pem does not match the public key of ca-cert.pem"):
        ca.reload_if_changed()
    assert ca.reload_if_changed() is False  # same broken content: not reported again
    assert certs(ca.sign(make_csr(), [ID]))[1].subject == chain[1].subject
    write_dir(d, third)  # the rotation completes
    assert ca.reload_if_changed() is True
    assert certs(ca.sign(make_csr(), [ID]))[1].subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "third"


def test_plugged_in_ca_errors_are_clear(tmp_path):
    root = root_files("EC")
    good = make_intermediate(root)
    other_root = generate_root(org="other", key_type="EC")

    cases = [
        ({**good, CA_KEY_FILE: "not a key"}, "ca-key.pem is not an unencrypted PEM private key"),
        ({**good, ROOT_CERT_FILE: other_root[CA_CERT_FILE], CERT_CHAIN_FILE: good[CA_CERT_FILE]},
         "which no certificate in root-cert.pem signed"),
        ({**good, ROOT_CERT_FILE: ""}, "root-cert.pem is missing and ca-cert.pem is not self-signed"),
        ({**make_intermediate(root, days=-1)}, "expired"),
    ]
    for i, (files, message) in enumerate(cases):
        d = tmp_path / f"c{i}"
        write_dir(d, files)
        with pytest.raises(CABundleError, match=message):
            CertificateAuthority.from_plugged_in_dir(d, CAOptions(root_ca_dir=str(d)))

    # A leaf certificate is not a CA.
    leaf_ca = ca_from(root)
    server = leaf_ca.sign_server_cert(["not-a-ca.example"])
    with pytest.raises(CABundleError, match="is not a CA certificate"):
        load_bundle({CA_CERT_FILE: server.cert_chain[0], CA_KEY_FILE: server.key_pem,
                     ROOT_CERT_FILE: root[CA_CERT_FILE]})


# --------------------------------------------------------------------------------- workload leaves


@pytest.mark.parametrize("csr_type", ["RSA", "EC"])
def test_leaf_has_only_the_callers_spiffe_id(rsa_ca, csr_type):
    csr = make_csr(csr_type, subject="admin", ask_ca=True, sans=[
        x509.DNSName("evil.example.com"),
        x509.UniformResourceIdentifier("spiffe://cluster.local/ns/istio-system/sa/istiod"),
        x509.RFC822Name("root@example.com")])
    chain = certs(rsa_ca.sign(csr, [ID]))
    leaf = chain[0]
    assert len(chain) == 2
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical  # empty subject
    assert list(san.value) == [x509.UniformResourceIdentifier(ID)]
    assert leaf.subject == x509.Name([])
    bc = leaf.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and not bc.value.ca
    ku = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and ku.key_encipherment and not ku.key_cert_sign
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert leaf.issuer == chain[1].subject
    verify_chain(chain)
    assert x509.load_pem_x509_certificate(rsa_ca.root_cert_pem.encode()) == chain[-1]


def test_leaf_verifies_with_a_real_path_validator(ec_ca):
    from cryptography.x509.verification import PolicyBuilder, Store

    chain = certs(ec_ca.sign(make_csr("EC"), [ID]))
    verifier = (PolicyBuilder().store(Store([x509.load_pem_x509_certificate(ec_ca.root_cert_pem.encode())]))
                .build_client_verifier())
    verified = verifier.verify(chain[0], chain[1:-1])
    assert verified.subjects == [x509.UniformResourceIdentifier(ID)]


def test_several_identities_deduplicated(ec_ca):
    other = "spiffe://cluster.local/ns/default/sa/other"
    leaf = certs(ec_ca.sign(make_csr(), [ID, other, ID]))[0]
    assert uri_sans(leaf) == [ID, other]


@pytest.mark.parametrize(("identities", "message"), [
    ([], "no identity"),
    (["https://example.com"], "must start with 'spiffe://'"),
    (["spiffe://cluster.local/ns/a/sa/b", "spiffe://x/ns/../sa/b"], r"'\.' or '\.\.'"),
])
def test_invalid_identities_rejected(ec_ca, identities, message):
    with pytest.raises(IdentityError, match=message) as e:
        ec_ca.sign(make_csr(), identities)
    assert e.value.code == "INVALID_ARGUMENT"


def _lifetime(leaf: x509.Certificate, start: dt.datetime) -> dt.timedelta:
    return leaf.not_valid_after_utc - start


def test_ttl_default_explicit_and_too_long(ec_ca):
    csr = make_csr()
    for requested in (None, 0, -5):
        start = dt.datetime.now(dt.UTC)
        life = _lifetime(certs(ec_ca.sign(csr, [ID], requested))[0], start)
        assert abs(life - dt.timedelta(hours=24)).total_seconds() < 5, requested  # DEFAULT_WORKLOAD_CERT_TTL
    start = dt.datetime.now(dt.UTC)
    leaf = certs(ec_ca.sign(csr, [ID], 2 * HOUR))[0]
    assert abs(_lifetime(leaf, start) - dt.timedelta(hours=2)).total_seconds() < 5
    assert leaf.not_valid_before_utc <= start  # backdated for clock skew, never in the future
    # Exactly the maximum is fine; one second more is refused.
    assert certs(ec_ca.sign(csr, [ID], 90 * DAY))[0]
    with pytest.raises(TTLError, match="requested certificate TTL 2160h1s") as e:
        ec_ca.sign(csr, [ID], 90 * DAY + 1)
    assert "exceeds the maximum 2160h (MAX_WORKLOAD_CERT_TTL)" in e.value.message
    assert e.value.code == "INVALID_ARGUMENT" and isinstance(e.value, CAError)


def test_ttl_options_from_env():
    opts = CAOptions.from_env({"DEFAULT_WORKLOAD_CERT_TTL": "1h", "MAX_WORKLOAD_CERT_TTL": "48h",
                               "CA_KEY_TYPE": "ec", "ROOT_CA_DIR": "/etc/cacerts"})
    assert (opts.default_cert_ttl, opts.max_cert_ttl, opts.key_type, opts.root_ca_dir) == (
        3600.0, 48 * 3600.0, "EC", "/etc/cacerts")
    assert CAOptions.from_env({}).key_type == "RSA" and CAOptions.from_env({}).root_cert_ttl == 87600 * 3600.0
    assert "CA_KEY_TYPE" in features.KNOBS
    with pytest.raises(ValueError, match="CA_KEY_TYPE='DSA': must be RSA or EC"):
        CAOptions.from_env({"CA_KEY_TYPE": "DSA"})
    ca = ca_from(root_files("EC"), default_cert_ttl=3600.0, max_cert_ttl=7200.0)
    start = dt.datetime.now(dt.UTC)
    assert abs(_lifetime(certs(ca.sign(make_csr(), [ID]))[0], start) - dt.timedelta(hours=1)).total_seconds() < 5
    with pytest.raises(TTLError, match="exceeds the maximum 2h"):
        ca.sign(make_csr(), [ID], 3 * HOUR)


def test_leaf_never_outlives_the_signing_chain(tmp_path):
    # A root with 2 hours left: a 10 hour request ends when the root does.
    files = generate_root(org="cluster.local", key_type="EC", ttl_seconds=2 * HOUR)
    ca = ca_from(files)
    root = x509.load_pem_x509_certificate(files[CA_CERT_FILE].encode())
    assert certs(ca.sign(make_csr(), [ID], 10 * HOUR))[0].not_valid_after_utc == root.not_valid_after_utc
    assert certs(ca.sign(make_csr(), [ID]))[0].not_valid_after_utc == root.not_valid_after_utc  # 24h default
    # Plugged-in: the intermediate expiring first is the bound.
    d = tmp_path / "cacerts"
    write_dir(d, make_intermediate(root_files("EC"), days=1 / 24))
    plugged = CertificateAuthority.from_plugged_in_dir(d, CAOptions(root_ca_dir=str(d)))
    chain = certs(plugged.sign(make_csr(), [ID], 5 * HOUR))
    assert chain[0].not_valid_after_utc == chain[1].not_valid_after_utc
    assert plugged.cert_chain_expiry == chain[1].not_valid_after_utc


def test_malformed_and_oversized_csrs_rejected(ec_ca):
    good = make_csr().decode()
    cases = [
        ("", "the CSR is empty"),
        ("hello", "the CSR is not PEM"),
        (good.replace("-----BEGIN CERTIFICATE REQUEST-----", "-----BEGIN CERTIFICATE-----")
         .replace("-----END CERTIFICATE REQUEST-----", "-----END CERTIFICATE-----"), "the CSR is not PEM"),
        ("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
         "cannot be parsed as PKCS#10"),
        (good + "x" * MAX_CSR_BYTES, f"the CSR is {len(good) + MAX_CSR_BYTES} bytes; the limit is 16384"),
        (make_csr("RSA1024").decode(), "RSA key of 1024 bits; 2048 to 8192 are accepted"),
    ]
    for csr, message in cases:
        with pytest.raises(CSRError) as e:
            ec_ca.sign(csr, [ID])
        assert message in e.value.message, (message, e.value.message)
        assert e.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize("csr_type", ["RSA", "EC"])
def test_csr_with_bad_signature_rejected(ec_ca, csr_type):
    csr = x509.load_pem_x509_csr(make_csr(csr_type))
    der = bytearray(csr.public_bytes(serialization.Encoding.DER))
    der[-1] ^= 0x01  # the last byte belongs to the signature
    bad = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CSRError, match="the CSR signature is invalid"):
        ec_ca.sign(bad, [ID])


def test_csr_signed_by_another_key_rejected(ec_ca):
    # A CSR carrying key A signed by key B: proof of possession fails.
    a, b = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    csr_a = x509.load_pem_x509_csr(make_csr(key=a))
    csr_b = x509.load_pem_x509_csr(make_csr(key=b))
    # Splice: A's CertificationRequestInfo with B's signature over B's info.
    der_a, der_b = csr_a.public_bytes(serialization.Encoding.DER), csr_b.public_bytes(serialization.Encoding.DER)
    info_a, info_b = csr_a.tbs_certrequest_bytes, csr_b.tbs_certrequest_bytes
    spliced = der_b.replace(info_b, info_a)
    assert len(info_a) == len(info_b) and spliced != der_b and der_a  # P-256 infos have equal length
    pem = x509.load_der_x509_csr(spliced).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CSRError, match="signature is invalid"):
        ec_ca.sign(pem, [ID])


def test_expired_chain_refused():
    files = generate_root(org="cluster.local", key_type="EC", ttl_seconds=1)
    ca = ca_from(files)
    time.sleep(1.1)
    with pytest.raises(CAError, match="the CA certificate chain expired"):
        ca.sign(make_csr(), [ID])


# --------------------------------------------------------------------------------- server cert


@pytest.mark.parametrize("key_type", ["RSA", "EC"])
def test_server_cert_for_istiod(rsa_ca, key_type):
    names = [f"istiod.{NS}.svc", f"istiod.{NS}.svc.cluster.local", "istiod"]
    sc = rsa_ca.sign_server_cert(names, 12 * HOUR, key_type=key_type)
    chain = certs(sc.cert_chain)
    leaf = chain[0]
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == names
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == names[0]
    key = serialization.load_pem_private_key(sc.key_pem.encode(), None)
    assert key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) \
        == leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert isinstance(key, rsa.RSAPrivateKey if key_type == "RSA" else ec.EllipticCurvePrivateKey)
    assert sc.not_after == leaf.not_valid_after_utc
    verify_chain(chain)

    from cryptography.x509.verification import PolicyBuilder, Store
    verifier = (PolicyBuilder().store(Store([chain[-1]])).build_server_verifier(x509.DNSName(names[0])))
    verifier.verify(leaf, [])


# --------------------------------------------------------------------------------- throughput


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_signing_throughput():
    """Signatures per second and CPU per signature, by CA key and CSR key type."""
    per_case = float(os.environ.get("CA_BENCH_SECONDS", "3"))
    figures: dict[str, dict[str, float]] = {}
    for ca_type in ("RSA", "EC"):
        ca = ca_from(root_files(ca_type))
        for csr_type in ("RSA", "EC"):
            csrs = [make_csr(csr_type) for _ in range(20)]
            ca.sign(csrs[0], [ID])  # warm up
            n = 0
            wall0, cpu0 = time.perf_counter(), time.process_time()
            while time.perf_counter() - wall0 < per_case:
                ca.sign(csrs[n % len(csrs)], [ID])
                n += 1
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            figures[f"ca_{ca_type.lower()}_csr_{csr_type.lower()}"] = {
                "signatures": n, "per_second": round(n / wall, 1),
                "cpu_ms_per_signature": round(cpu / n * 1000, 3)}
    print("FIGURES " + json.dumps({"ca_sign": figures}))
    assert all(f["per_second"] > 50 for f in figures.values())
