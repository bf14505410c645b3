"""CA key material: key generation, PEM helpers, loading and checking a CA bundle
(`load_bundle` / `KeyCertBundle`), minting a self-signed root (`generate_root`) and validating
workload CSRs. Used by `pilot.security.ca`; no I/O beyond what the caller passes in."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509.oid import NameOID

from pilot.security.ca_errors import CABundleError, CAError, CSRError

# File names, istiod's.
CA_CERT_FILE = "ca-cert.pem"
CA_KEY_FILE = "ca-key.pem"
CERT_CHAIN_FILE = "cert-chain.pem"
ROOT_CERT_FILE = "root-cert.pem"
BUNDLE_FILES = (CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE)

MAX_CSR_BYTES = 16 * 1024
MIN_RSA_KEY_BITS = 2048
MAX_RSA_KEY_BITS = 8192
# Certificates start this far in the past so a node whose clock is slightly behind ours still
# accepts them. The TTL counts from now, not from not_before.
CLOCK_SKEW = dt.timedelta(minutes=1)

PrivateKey = (rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
              | ed448.Ed448PrivateKey)


# ------------------------------------------------------------------------------------------ helpers

def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def human_duration(seconds: float) -> str:
    """Go-style, as istiod prints TTLs: 2160h, 1h30m, 45s."""
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec else "")
    return out or "0s"


def _text(v: str | bytes | None) -> str:
    if v is None:
        return ""
    return v.decode() if isinstance(v, bytes) else v


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _spki(key: Any) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _hash_for(key: Any) -> hashes.SHA256 | hashes.SHA384 | hashes.SHA512 | None:
    if isinstance(key, rsa.RSAPrivateKey):
        return hashes.SHA256()
    if isinstance(key, ec.EllipticCurvePrivateKey):
        bits = key.curve.key_size
        return hashes.SHA256() if bits <= 256 else hashes.SHA384() if bits <= 384 else hashes.SHA512()
    if isinstance(key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)):
        return None
    raise CABundleError(f"unsupported CA key type {type(key).__name__}")


def generate_key(key_type: str, rsa_key_size: int = 2048) -> PrivateKey:
    kt = key_type.upper()
    if kt == "RSA":
        return rsa.generate_private_key(public_exponent=65537, key_size=rsa_key_size)
    if kt == "EC":
        return ec.generate_private_key(ec.SECP256R1())
    raise CAError(f"unknown key type {key_type!r}: expected RSA or EC")


def key_to_pem(key: PrivateKey) -> str:
    # PKCS#1 / SEC1 ("RSA PRIVATE KEY" / "EC PRIVATE KEY") as istiod writes them, so a Secret we
    # create stays readable by istiod and the reverse; Ed keys only exist in PKCS#8.
    fmt = (serialization.PrivateFormat.PKCS8
           if isinstance(key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey))
           else serialization.PrivateFormat.TraditionalOpenSSL)
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption()).decode()


def _load_certs(text: str, what: str) -> list[x509.Certificate]:
    if not text.strip():
        return []
    try:
        return x509.load_pem_x509_certificates(text.encode())
    except ValueError as e:
        raise CABundleError(f"{what}: not PEM certificates ({e})") from None


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
        return True
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):  # name mismatch, bad signature
        return False


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    if not bc.ca:
        return False
    try:
        ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return True
    return ku.key_cert_sign


def _describe(cert: x509.Certificate) -> str:
    return cert.subject.rfc4514_string() or f"serial {cert.serial_number:x}"


# -------------------------------------------------------------------------------------- the bundle

@dataclass(frozen=True)
class KeyCertBundle:
    """Verified CA material: the signing key and certificate, the chain served after every leaf,
    and the trust bundle (root-cert.pem) to distribute."""

    ca_cert: x509.Certificate
    ca_key: PrivateKey
    chain: tuple[x509.Certificate, ...]  # ca_cert, intermediates..., root
    roots: tuple[x509.Certificate, ...]
    chain_pem: tuple[str, ...]
    roots_pem: str
    not_after: dt.datetime  # the earliest expiry on the chain: no leaf may outlive it
    files: Mapping[str, str]  # the material as loaded (or to store), by file name


def load_bundle(files: Mapping[str, str | bytes | None], *, source: str = "CA",
                now: dt.datetime | None = None) -> KeyCertBundle:
    """Parse and check CA material given as istiod's file names -> PEM text.

    ``root-cert.pem`` may be empty when ``ca-cert.pem`` is itself the (self-signed) root, as in
    the ``istio-ca-secret`` istiod writes; ``cert-chain.pem`` holds any intermediates between
    ``ca-cert.pem`` and the root (copies of the CA cert and of roots in it are tolerated).
    """
    now = now or _now()
    texts = {k: _text(v) for k, v in files.items()}
    for required in (CA_CERT_FILE, CA_KEY_FILE):
        if not texts.get(required, "").strip():
            raise CABundleError(f"{source}: {required} is missing or empty")
    certs = _load_certs(texts[CA_CERT_FILE], f"{source}: {CA_CERT_FILE}")
    ca_cert, extra = certs[0], certs[1:]
    try:
        ca_key = serialization.load_pem_private_key(texts[CA_KEY_FILE].encode(), password=None)
    except (ValueError, TypeError) as e:
        raise CABundleError(f"{source}: {CA_KEY_FILE} is not an unencrypted PEM private key ({e})") from None
    except UnsupportedAlgorithm as e:
        raise CABundleError(f"{source}: {CA_KEY_FILE} cannot be loaded ({e})") from None
    if not isinstance(ca_key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey,
                               ed448.Ed448PrivateKey)):
        raise CABundleError(f"{source}: unsupported CA key type {type(ca_key).__name__}")
    if _spki(ca_key.public_key()) != _spki(ca_cert.public_key()):
        raise CABundleError(f"{source}: {CA_KEY_FILE} does not match the public key of {CA_CERT_FILE}")
    if not _is_ca(ca_cert):
        raise CABundleError(f"{source}: {CA_CERT_FILE} ({_describe(ca_cert)}) is not a CA certificate "
                            "(basicConstraints CA:TRUE with keyCertSign is required)")

    roots = _load_certs(texts.get(ROOT_CERT_FILE, ""), f"{source}: {ROOT_CERT_FILE}")
    self_signed = ca_cert.subject == ca_cert.issuer and _issued_by(ca_cert, ca_cert)
    if not roots:
        if not self_signed:
            raise CABundleError(f"{source}: {ROOT_CERT_FILE} is missing and {CA_CERT_FILE} is not self-signed")
        roots = [ca_cert]
    root_ders = {_der(r) for r in roots}
    ca_der = _der(ca_cert)
    intermediates: list[x509.Certificate] = []
    for c in extra + _load_certs(texts.get(CERT_CHAIN_FILE, ""), f"{source}: {CERT_CHAIN_FILE}"):
        d = _der(c)
        if d == ca_der or d in root_ders or any(_der(i) == d for i in intermediates):
            continue
        intermediates.append(c)
    chain = [ca_cert, *intermediates]
    for child, parent in itertools.pairwise(chain):
        if not _issued_by(child, parent):
            raise CABundleError(f"{source}: {CERT_CHAIN_FILE}: {_describe(child)} is not signed by "
                                f"{_describe(parent)} (order the chain from the CA cert up to the root)")
    if _der(chain[-1]) not in root_ders:
        root = next((r for r in roots if _issued_by(chain[-1], r)), None)
        if root is None:
            raise CABundleError(f"{source}: the chain from {CA_CERT_FILE} ends at {_describe(chain[-1])}, "
                                f"which no certificate in {ROOT_CERT_FILE} signed")
        chain.append(root)
    for c in chain:
        if c.not_valid_after_utc <= now:
            raise CABundleError(f"{source}: certificate {_describe(c)} expired at "
                                f"{c.not_valid_after_utc.isoformat()}")
    _hash_for(ca_key)  # rejects key types we cannot sign with
    return KeyCertBundle(
        ca_cert=ca_cert, ca_key=ca_key, chain=tuple(chain), roots=tuple(roots),
        chain_pem=tuple(_pem(c) for c in chain), roots_pem="".join(_pem(r) for r in roots),
        not_after=min(c.not_valid_after_utc for c in chain),
        files={k: texts.get(k, "") for k in BUNDLE_FILES})


def generate_root(*, org: str, key_type: str = "RSA", rsa_key_size: int = 2048,
                  ttl_seconds: float = 10 * 365 * 86400.0, now: dt.datetime | None = None) -> dict[str, str]:
    """A new self-signed root as istiod's files (``cert-chain.pem`` empty, root = CA cert)."""
    now = now or _now()
    key = generate_key(key_type, rsa_key_size)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)])
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + dt.timedelta(seconds=ttl_seconds))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, _hash_for(key)))
    pem = _pem(cert)
    return {CA_CERT_FILE: pem, CA_KEY_FILE: key_to_pem(key), CERT_CHAIN_FILE: "", ROOT_CERT_FILE: pem}


def _content_hash(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name in BUNDLE_FILES:
        v = files.get(name)
        h.update(name.encode() + (b"\x00" if v is None else b"\x01" + v.encode()) + b"\x02")
    return h.hexdigest()


def _csr_public_key(csr_pem: str | bytes) -> Any:
    """The public key of a well-formed, correctly self-signed CSR of an accepted key type."""
    raw = csr_pem.encode() if isinstance(csr_pem, str) else bytes(csr_pem)
    if not raw.strip():
        raise CSRError("the CSR is empty")
    if len(raw) > MAX_CSR_BYTES:
        raise CSRError(f"the CSR is {len(raw)} bytes; the limit is {MAX_CSR_BYTES}")
    if b"-----BEGIN CERTIFICATE REQUEST-----" not in raw and b"-----BEGIN NEW CERTIFICATE REQUEST-----" not in raw:
        raise CSRError("the CSR is not PEM: expected a '-----BEGIN CERTIFICATE REQUEST-----' block")
    try:
        csr = x509.load_pem_x509_csr(raw)
    except ValueError as e:
        raise CSRError(f"the CSR cannot be parsed as PKCS#10: {e}") from None
    try:
        valid = csr.is_signature_valid
    except (UnsupportedAlgorithm, ValueError) as e:
        raise CSRError(f"the CSR signature cannot be checked: {e}") from None
    if not valid:
        raise CSRError("the CSR signature is invalid: it was not signed by the key it carries")
    try:
        key = csr.public_key()
    except (UnsupportedAlgorithm, ValueError) as e:
        raise CSRError(f"the CSR public key is not supported: {e}") from None
    if isinstance(key, rsa.RSAPublicKey):
        if not MIN_RSA_KEY_BITS <= key.key_size <= MAX_RSA_KEY_BITS:
            raise CSRError(f"the CSR has an RSA key of {key.key_size} bits; "
                           f"{MIN_RSA_KEY_BITS} to {MAX_RSA_KEY_BITS} are accepted")
    elif isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name not in ("secp256r1", "secp384r1", "secp521r1"):
            raise CSRError(f"the CSR has an EC key on curve {key.curve.name}; P-256, P-384 and P-521 are accepted")
    elif not isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        raise CSRError(f"the CSR key type {type(key).__name__} is not accepted (RSA, EC or Ed25519)")
    return key


def _aki(issuer: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:
        ski = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
    except x509.ExtensionNotFound:
        # cryptography types a certificate's key as any key type, X25519/X448 included, which
        # cannot issue; an issuer's certificate holds a signing key.
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.public_key())  # type: ignore[arg-type]
