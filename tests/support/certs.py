"""Test PKI: a self-signed CA and server certificates it signs (EC P-256: fast to make)."""

from __future__ import annotations

import base64
import datetime
import textwrap
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes
    serial: int
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(common_name: str = "test root CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    serial = x509.random_serial_number()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(serial).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), serial, cert, key)


def issue(ca: Issued, hosts: list[str], *, client: bool = False) -> Issued:
    """A leaf certificate for `hosts` (DNS SANs; a URI SAN for one with a scheme), signed by `ca`.
    No hosts: a client certificate named `default` without SANs (upstream conformance's
    MustCreateCASignedClientCertSecret)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    serial = x509.random_serial_number()
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "default")]))
               .issuer_name(ca.cert.subject).public_key(key.public_key()).serial_number(serial)
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=2)))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier(h) if "://" in h else x509.DNSName(h) for h in hosts]), critical=False)
    cert = (builder
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
            .sign(ca.key, hashes.SHA256()))
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), serial, cert, key)


def serial_of_der(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def tls_secret_yaml(name: str, namespace: str, leaf: Issued, ca: Issued | None = None) -> str:
    """A kubernetes.io/tls Secret as `kubectl create secret tls` makes it (plus ca.crt)."""
    ca_line = f"\n  ca.crt: {b64(ca.cert_pem)}" if ca is not None else ""
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Secret
        metadata: {{name: {name}, namespace: {namespace}}}
        type: kubernetes.io/tls
        data:
          tls.crt: {b64(leaf.cert_pem)}
          tls.key: {b64(leaf.key_pem)}""") + ca_line + "\n"
