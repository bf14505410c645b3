"""Where the CA's root comes from: created once and reloaded (directory, Kubernetes Secret,
races between replicas, istiod's own Secret layout), and plugged-in CAs from ROOT_CA_DIR."""

from __future__ import annotations

import asyncio
import datetime as dt
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from pilot.security.ca import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    CA_SECRET_NAME,
    CA_SECRET_TYPE,
    CERT_CHAIN_FILE,
    PLUGGED_IN,
    PRIVATE_KEY_FILE,
    ROOT_CERT_FILE,
    SELF_SIGNED,
    CABundleError,
    CAOptions,
    CAStorageError,
    CertificateAuthority,
    DirectoryStorage,
    KubeSecrets,
    KubeSecretStorage,
    generate_root,
    load_bundle,
)

from .ca_fixtures import *

pytestmark = pytest.mark.timeout(60)

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


