"""Gateway credentials from Kubernetes Secrets, checked before they reach Envoy (pure).

istiod's formats: `tls.crt`/`tls.key` (type kubernetes.io/tls) or `cert`/`key` (generic), the
client CA in `ca.crt` or `cacert`. Values are base64 (the Secret's `data`) holding PEM. Anything
malformed raises CredentialError with the reason: a bad Secret must yield no resource (Envoy
would reject the whole SDS update) rather than a crash or a broken certificate.

The PEM check is structural (markers, base64, a DER SEQUENCE), not cryptographic: whether the
key matches the certificate is Envoy's to say (it NACKs, and keeps the previous secret), except
for Gateway API listeners, which istiod refuses in status first (`key_pair_problem`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

CERT_KEYS = (("tls.crt", "tls.key"), ("cert", "key"))
# How generated config names a Secret for SDS, as istiod: `kubernetes://NAME` (chain and key),
# `kubernetes://NAME-cacert` (its CA bundle, or that of a Secret named NAME-cacert).
SDS_PREFIX = "kubernetes://"
CA_SUFFIX = "-cacert"
# A ConfigMap's `ca.crt` (Gateway spec.tls.frontend), as istiod names it: configmap://NS/NAME-cacert.
CONFIGMAP_PREFIX = "configmap://"
# A Secret's CA bundle for the same purpose: kubernetes-gateway://NS/NAME-cacert.
SECRET_CA_PREFIX = "kubernetes-gateway://"
CA_KEYS = ("ca.crt", "cacert")
_PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.DOTALL)
_KEY_LABELS = {b"PRIVATE KEY", b"RSA PRIVATE KEY", b"EC PRIVATE KEY"}


class CredentialError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class CertificateAndKey:
    cert_chain: bytes
    private_key: bytes


def _decode(data: dict[str, str], key: str) -> bytes:
    raw = "".join(data[key].split())
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as e:
        raise CredentialError(f"data[{key!r}] is not valid base64: {e}") from None


def _blocks(pem: bytes, what: str) -> list[tuple[bytes, bytes]]:
    out = []
    for m in _PEM.finditer(pem):
        label, body = m.group(1), m.group(2)
        if b":" in body:
            raise CredentialError(f"{what}: PEM block {label.decode()} has headers (an encrypted key?)")
        try:
            der = base64.b64decode(b"".join(body.split()), validate=True)
        except (binascii.Error, ValueError):
            raise CredentialError(f"{what}: PEM block {label.decode()} is not valid base64") from None
        if not der or der[0] != 0x30:
            raise CredentialError(f"{what}: PEM block {label.decode()} does not hold DER data")
        out.append((label, der))
    if not out:
        raise CredentialError(f"{what}: no PEM block found")
    return out


def check_certificates(pem: bytes, what: str) -> bytes:
    labels = {label for label, _ in _blocks(pem, what)}
    if labels != {b"CERTIFICATE"}:
        raise CredentialError(f"{what}: expected only CERTIFICATE PEM blocks, found "
                              f"{', '.join(sorted(label.decode() for label in labels))}")
    return pem


def check_private_key(pem: bytes, what: str) -> bytes:
    blocks = _blocks(pem, what)
    keys = [label for label, _ in blocks if label in _KEY_LABELS]
    if any(label == b"ENCRYPTED PRIVATE KEY" for label, _ in blocks):
        raise CredentialError(f"{what}: encrypted private keys are not supported")
    if len(keys) != 1:
        raise CredentialError(f"{what}: expected one private key PEM block, found {len(keys)}")
    return pem


def certificate_and_key(data: dict[str, str]) -> CertificateAndKey:
    for cert_key, key_key in CERT_KEYS:
        if cert_key in data and key_key in data:
            cert = check_certificates(_decode(data, cert_key), f"data[{cert_key!r}]")
            key = check_private_key(_decode(data, key_key), f"data[{key_key!r}]")
            return CertificateAndKey(cert, key)
    raise CredentialError("no certificate and key: want data keys tls.crt and tls.key (or cert and key)")


_PAIR_VERDICTS: dict[bytes, str] = {}  # digest of (chain, key) -> "" or why not; no key material kept
_PAIR_VERDICTS_MAX = 4096


def key_pair_problem(data: dict[str, str]) -> str:
    """Why a Secret's certificate and key cannot serve TLS ("" when they can): what Go's
    tls.X509KeyPair checks (istiod's test for Gateway API listeners): both parse, and the key
    is the private half of the first certificate's public key. Remembered per content digest
    (never the key itself), so an unchanged Secret is checked once."""
    digest = hashlib.blake2b(repr(sorted(data.items())).encode(), digest_size=16).digest()
    hit = _PAIR_VERDICTS.get(digest)
    if hit is None:
        hit = _key_pair_problem(data)
        if len(_PAIR_VERDICTS) >= _PAIR_VERDICTS_MAX:
            _PAIR_VERDICTS.clear()
        _PAIR_VERDICTS[digest] = hit
    return hit


def _key_pair_problem(data: dict[str, str]) -> str:
    # Here, not at the top: the config model is loaded in every mode, `cryptography` (~10 MB of
    # RSS) only needed once a Gateway API listener names a Secret.
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        pair = certificate_and_key(data)
    except CredentialError as e:
        return str(e)
    try:
        cert = x509.load_pem_x509_certificate(pair.cert_chain)
    except ValueError as e:
        return f"the certificate does not parse: {e}"
    try:
        key = serialization.load_pem_private_key(pair.private_key, password=None)
    except (ValueError, TypeError) as e:
        return f"the private key does not parse: {e}"
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*fmt) != key.public_key().public_bytes(*fmt):
        return "private key does not match public key"
    return ""


def ca_bundle(data: dict[str, str]) -> bytes:
    for k in CA_KEYS:
        if k in data:
            return check_certificates(_decode(data, k), f"data[{k!r}]")
    raise CredentialError("no CA certificate: want data key ca.crt (or cacert)")


def config_map_ca_bundle(data: Mapping[str, str]) -> bytes:
    """A ConfigMap's CA bundle (its data is plain text, a Secret's base64), checked PEM: the first
    non-empty CA key, as istiod's ExtractRootFromString. Gateway spec.tls.frontend and
    BackendTLSPolicy read ConfigMaps through this one."""
    for k in CA_KEYS:
        if data.get(k):
            return check_certificates(data[k].encode(), f"data[{k!r}]")
    raise CredentialError("no CA certificate: want a non-empty data key ca.crt (or cacert)")
