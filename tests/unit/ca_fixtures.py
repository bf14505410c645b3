"""Shared pieces of the CA tests: test roots (made once per key type), storages, CSRs, chain
checks and plugged-in CA directories."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from pilot.security.ca import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    CERT_CHAIN_FILE,
    ROOT_CERT_FILE,
    CAOptions,
    CertificateAuthority,
    generate_root,
    key_to_pem,
)

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

