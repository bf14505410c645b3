"""The certificate authority: istiod's CA semantics, without the gRPC server.

Where the signing key comes from, in istiod's order:

1. **Plugged-in CA.** When ``ROOT_CA_DIR`` holds ``ca-key.pem`` (with ``ca-cert.pem``,
   ``root-cert.pem`` and optionally ``cert-chain.pem``, the layout of istio's ``cacerts`` Secret)
   those files are the CA. They are re-read by `CertificateAuthority.reload_if_changed` when their
   content changes (an operator rotating an intermediate); a broken update is reported once and
   the previous CA keeps signing.
2. **Self-signed root.** Otherwise a root is loaded from a `CAStorage` (the Secret
   ``istio-ca-secret`` in the system namespace, or a directory in file mode); only when the storage
   holds none is a root minted (RSA 2048 by default, EC P-256 with ``CA_KEY_TYPE=EC``, valid for
   ``CITADEL_SELF_SIGNED_CA_CERT_TTL``, organisation = trust domain, as istiod). Creation is
   create-if-absent: a replica that loses the race (HTTP 409) adopts the winner's root, and stored
   material that is present but incomplete or unreadable is an error, never a reason to mint a new
   root, so a restart or a second replica can never change the mesh's root behind its back.

`CertificateAuthority.sign` issues workload certificates: the CSR contributes its public key and
nothing else; the identities (SPIFFE URIs) come from the caller's authentication. Every refusal
is a `CAError` whose ``code`` names the gRPC status to answer with and whose message can be sent
to the client as is. Signing is synchronous CPU work (about a millisecond with an RSA CA key);
an asyncio server should run it in a thread.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import fcntl
import hashlib
import itertools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pilot import features
from pilot.security import spiffe
from pilot.sources.kube.rbac import Rule

# File and Secret key names, istiod's.
CA_CERT_FILE = "ca-cert.pem"
CA_KEY_FILE = "ca-key.pem"
CERT_CHAIN_FILE = "cert-chain.pem"
ROOT_CERT_FILE = "root-cert.pem"
PRIVATE_KEY_FILE = "key.pem"  # always empty in istio-ca-secret; kept for istiod compatibility
BUNDLE_FILES = (CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE)
CA_SECRET_NAME = "istio-ca-secret"
CA_SECRET_TYPE = "istio.io/ca-root"

# KubeSecrets reads and creates istio-ca-secret in the control plane's namespace (never updates
# or deletes it: a stored root is only ever adopted). See pilot/sources/kube/rbac.py.
RBAC = (Rule("namespace", "", "secrets", frozenset({"get", "create"})),)

MAX_CSR_BYTES = 16 * 1024
MIN_RSA_KEY_BITS = 2048
MAX_RSA_KEY_BITS = 8192
# Certificates start this far in the past so a node whose clock is slightly behind ours still
# accepts them. The TTL counts from now, not from not_before.
CLOCK_SKEW = dt.timedelta(minutes=1)

SELF_SIGNED = "self-signed"
PLUGGED_IN = "plugged-in"

PrivateKey = (rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
              | ed448.Ed448PrivateKey)


# ------------------------------------------------------------------------------------------ errors

class CAError(Exception):
    """A refusal or failure of the CA. ``code`` is the gRPC status code name to answer with."""

    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequestError(CAError):
    code = "INVALID_ARGUMENT"


class CSRError(InvalidRequestError):
    """The CSR is oversized, not PEM PKCS#10, badly signed or has an unacceptable key."""


class TTLError(InvalidRequestError):
    """The requested lifetime is above the maximum."""


class IdentityError(InvalidRequestError):
    """An identity to put in the certificate is not a valid SPIFFE ID."""


class CABundleError(CAError):
    """The CA's own material (plugged-in files or stored root) is unusable."""


class CAStorageError(CAError):
    """The root's storage could not be read or written."""

    code = "UNAVAILABLE"


# ----------------------------------------------------------------------------------------- options

@dataclass(frozen=True)
class CAOptions:
    trust_domain: str = "cluster.local"  # organisation of the self-signed root, as istiod
    key_type: str = "RSA"  # RSA | EC: the self-signed root and sign_server_cert's keys
    rsa_key_size: int = 2048
    root_cert_ttl: float = 10 * 365 * 86400.0
    default_cert_ttl: float = 86400.0
    max_cert_ttl: float = 90 * 86400.0
    root_ca_dir: str | None = "./etc/cacerts"  # plugged-in CA; None disables

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, *,
                 trust_domain: str = "cluster.local") -> CAOptions:
        return cls(
            trust_domain=trust_domain,
            key_type=features.CA_KEY_TYPE.get(environ),
            rsa_key_size=features.SELF_SIGNED_CA_RSA_KEY_SIZE.get(environ),
            root_cert_ttl=features.SELF_SIGNED_CA_CERT_TTL.get(environ),
            default_cert_ttl=features.DEFAULT_WORKLOAD_CERT_TTL.get(environ),
            max_cert_ttl=features.MAX_WORKLOAD_CERT_TTL.get(environ),
            root_ca_dir=features.ROOT_CA_DIR.get(environ) or None,
        )


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


def _hash_for(key: Any) -> hashes.HashAlgorithm | None:
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
    intermediates = []
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


def read_bundle_dir(directory: str | os.PathLike) -> dict[str, str]:
    """The bundle files present in `directory` (absent ones are left out)."""
    out = {}
    for name in BUNDLE_FILES:
        p = Path(directory, name)
        try:
            out[name] = p.read_text()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise CAStorageError(f"cannot read {p}: {e}") from None
    return out


def _content_hash(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name in BUNDLE_FILES:
        v = files.get(name)
        h.update(name.encode() + (b"\x00" if v is None else b"\x01" + v.encode()) + b"\x02")
    return h.hexdigest()


# ----------------------------------------------------------------------------------------- storage

class CAStorage(Protocol):
    """Where the self-signed root lives between restarts and is shared between replicas."""

    description: str

    async def load(self) -> dict[str, str] | None:
        """The stored files, or None when nothing is stored. Incomplete material raises."""

    async def create(self, files: dict[str, str]) -> dict[str, str]:
        """Store `files` unless a CA is stored already; return what is stored afterwards (ours,
        or the one another writer stored first)."""


class DirectoryStorage:
    """Files in a directory (file mode). An advisory lock serialises processes on one host."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.description = f"directory {self.directory}"

    async def load(self) -> dict[str, str] | None:
        return await asyncio.to_thread(self._locked, fcntl.LOCK_SH, self._load)

    async def create(self, files: dict[str, str]) -> dict[str, str]:
        return await asyncio.to_thread(self._create, files)

    def _locked(self, mode: int, fn: Any, *args: Any) -> Any:
        try:
            fd = os.open(self.directory / ".ca.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            return fn(*args)  # no directory: nothing stored, nothing to lock
        except OSError:
            return fn(*args)  # read-only mount: nobody can be writing here either
        try:
            fcntl.flock(fd, mode)
            return fn(*args)
        finally:
            os.close(fd)

    def _load(self) -> dict[str, str] | None:
        files = read_bundle_dir(self.directory)
        has_cert, has_key = CA_CERT_FILE in files, CA_KEY_FILE in files
        if not has_cert and not has_key:
            return None
        if not (has_cert and has_key):
            missing = CA_KEY_FILE if has_cert else CA_CERT_FILE
            raise CAStorageError(f"{self.description} holds a partial CA ({missing} is missing); "
                                 "refusing to mint a new root over it: restore or remove the files")
        return files

    def _create(self, files: dict[str, str]) -> dict[str, str]:
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise CAStorageError(f"cannot create {self.directory}: {e}") from None
        return self._locked(fcntl.LOCK_EX, self._create_locked, files)

    def _create_locked(self, files: dict[str, str]) -> dict[str, str]:
        existing = self._load()
        if existing is not None:
            return existing
        # Each file is replaced atomically and the key is written last; readers take the lock, so
        # none sees a partial set (a crash midway leaves one that load() reports, not overwrites).
        order = [n for n in BUNDLE_FILES if n != CA_KEY_FILE] + [CA_KEY_FILE]
        try:
            for name in order:
                target = self.directory / name
                tmp = self.directory / f".{name}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                             0o600 if name == CA_KEY_FILE else 0o644)
                with os.fdopen(fd, "w") as f:
                    f.write(files.get(name, ""))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
        except OSError as e:
            raise CAStorageError(f"cannot write the CA to {self.description}: {e}") from None
        return {n: files.get(n, "") for n in BUNDLE_FILES}


class SecretsClient(Protocol):
    """What KubeSecretStorage needs from Kubernetes. `create_secret` raises on conflict with an
    exception whose ``status`` is 409 (ApiError does), or `SecretExistsError`."""

    async def get_secret(self, namespace: str, name: str) -> dict[str, str | bytes] | None: ...

    async def create_secret(self, namespace: str, name: str, data: dict[str, str]) -> None: ...


class SecretExistsError(Exception):
    pass


class KubeSecrets:
    """`SecretsClient` over the apiserver through `pilot.sources.kube.client.Kube`."""

    def __init__(self, kube: Any, secret_type: str = CA_SECRET_TYPE) -> None:
        self.kube = kube
        self.secret_type = secret_type

    async def get_secret(self, namespace: str, name: str) -> dict[str, str | bytes] | None:
        from pilot.sources.kube.client import ApiError

        try:
            obj = await self.kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return {k: base64.b64decode(v) for k, v in ((obj or {}).get("data") or {}).items()}

    async def create_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "type": self.secret_type,
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
        await self.kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body=body)


def _is_conflict(e: BaseException) -> bool:
    return isinstance(e, SecretExistsError) or getattr(e, "status", None) == 409


class KubeSecretStorage:
    """The Secret ``istio-ca-secret`` in the system namespace, with istiod's keys."""

    def __init__(self, client: SecretsClient, namespace: str, name: str = CA_SECRET_NAME) -> None:
        self.client, self.namespace, self.name = client, namespace, name
        self.description = f"secret {namespace}/{name}"

    async def load(self) -> dict[str, str] | None:
        try:
            data = await self.client.get_secret(self.namespace, self.name)
        except Exception as e:  # noqa: BLE001 - any client failure: transport, auth, ApiError
            raise CAStorageError(f"cannot read {self.description}: {e}") from None
        if data is None:
            return None
        files = {k: _text(v) for k, v in data.items()}
        missing = [k for k in (CA_CERT_FILE, CA_KEY_FILE) if not files.get(k, "").strip()]
        if missing:
            raise CAStorageError(f"{self.description} exists but {', '.join(missing)} is empty or missing; "
                                 "refusing to mint a new root over it: fix or delete the Secret")
        return files

    async def create(self, files: dict[str, str]) -> dict[str, str]:
        data = {n: files.get(n, "") for n in BUNDLE_FILES}
        data[PRIVATE_KEY_FILE] = ""
        try:
            await self.client.create_secret(self.namespace, self.name, data)
            return data
        except Exception as e:  # noqa: BLE001 - any client failure; 409 is the expected race
            if not _is_conflict(e):
                raise CAStorageError(f"cannot create {self.description}: {e}") from None
        # Another replica created it between our read and our write: theirs is the root.
        existing = await self.load()
        if existing is None:
            raise CAStorageError(f"{self.description}: create conflicted (409) but the Secret is gone; retry")
        return existing


# -------------------------------------------------------------------------------------- the CA

@dataclass(frozen=True)
class ServerCertificate:
    cert_chain: list[str]  # PEMs, leaf first, root last
    key_pem: str
    not_after: dt.datetime


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
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.public_key())  # type: ignore[arg-type]


class CertificateAuthority:
    """Build with `await CertificateAuthority.create(options, storage)`."""

    def __init__(self, bundle: KeyCertBundle, mode: str, options: CAOptions, *,
                 plugged_dir: Path | None = None, loaded_hash: str | None = None) -> None:
        self._bundle = bundle
        self.mode = mode
        self.options = options
        self._plugged_dir = plugged_dir
        self._loaded_hash = loaded_hash
        self._failed_hash: str | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def plugged_in_files_present(cls, root_ca_dir: str | os.PathLike | None) -> bool:
        """istiod's test: a ``ca-key.pem`` in ROOT_CA_DIR means a plugged-in CA."""
        return bool(root_ca_dir) and Path(root_ca_dir, CA_KEY_FILE).is_file()  # type: ignore[arg-type]

    @classmethod
    def from_plugged_in_dir(cls, directory: str | os.PathLike, options: CAOptions) -> CertificateAuthority:
        files = read_bundle_dir(directory)
        bundle = load_bundle(files, source=f"plugged-in CA {directory}")
        return cls(bundle, PLUGGED_IN, options, plugged_dir=Path(directory), loaded_hash=_content_hash(files))

    @classmethod
    async def create(cls, options: CAOptions, storage: CAStorage | None) -> CertificateAuthority:
        """The plugged-in CA if ROOT_CA_DIR holds one, else the stored root, else a new root
        stored create-if-absent (so concurrent replicas converge on one root)."""
        if cls.plugged_in_files_present(options.root_ca_dir):
            return await asyncio.to_thread(cls.from_plugged_in_dir, options.root_ca_dir, options)  # type: ignore[arg-type]
        if storage is None:
            raise CAError(f"no plugged-in CA in {options.root_ca_dir} and no storage for a self-signed root")
        files = await storage.load()
        if files is None:
            new = await asyncio.to_thread(
                generate_root, org=options.trust_domain, key_type=options.key_type,
                rsa_key_size=options.rsa_key_size, ttl_seconds=options.root_cert_ttl)
            files = await storage.create(new)
        bundle = load_bundle(files, source=f"self-signed CA in {storage.description}")
        return cls(bundle, SELF_SIGNED, options)

    # ------------------------------------------------------------------ state

    @property
    def bundle(self) -> KeyCertBundle:
        return self._bundle

    @property
    def root_cert_pem(self) -> str:
        """The trust bundle to distribute (istio-ca-root-cert ConfigMap, agents' root-cert.pem)."""
        return self._bundle.roots_pem

    @property
    def cert_chain_pem(self) -> list[str]:
        """What follows every issued leaf: the CA cert, intermediates, the root."""
        return list(self._bundle.chain_pem)

    @property
    def root_expiry(self) -> dt.datetime:
        return min(r.not_valid_after_utc for r in self._bundle.roots)

    @property
    def cert_chain_expiry(self) -> dt.datetime:
        return self._bundle.not_after

    def reload_if_changed(self) -> bool:
        """Re-read a plugged-in CA whose files changed. True when a new bundle is now in use.

        A change that does not load (half-copied files, a key that does not match) raises
        `CABundleError` once for that content and keeps the previous CA signing; the same broken
        content is not reported again. A self-signed CA never reloads (its root rotation is not
        file-driven), nor does a CA switch modes at runtime.
        """
        if self.mode != PLUGGED_IN or self._plugged_dir is None:
            return False
        files = read_bundle_dir(self._plugged_dir)
        h = _content_hash(files)
        if h == self._loaded_hash or h == self._failed_hash:
            return False
        try:
            bundle = load_bundle(files, source=f"plugged-in CA {self._plugged_dir}")
        except CAError:
            self._failed_hash = h
            raise
        self._bundle, self._loaded_hash, self._failed_hash = bundle, h, None
        return True

    # ------------------------------------------------------------------ signing

    def _lifetime(self, ttl_seconds: float | None, bundle: KeyCertBundle,
                  now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
        if ttl_seconds is None or ttl_seconds <= 0:
            ttl = self.options.default_cert_ttl
        else:
            ttl = float(ttl_seconds)
            if ttl > self.options.max_cert_ttl:
                raise TTLError(f"requested certificate TTL {human_duration(ttl)} exceeds the maximum "
                               f"{human_duration(self.options.max_cert_ttl)} (MAX_WORKLOAD_CERT_TTL)")
        if bundle.not_after <= now:
            raise CAError(f"the CA certificate chain expired at {bundle.not_after.isoformat()}")
        not_after = min(now + dt.timedelta(seconds=ttl), bundle.not_after)
        return now - CLOCK_SKEW, not_after

    def _issue(self, bundle: KeyCertBundle, public_key: Any, sans: list[x509.GeneralName],
               subject: x509.Name, not_before: dt.datetime, not_after: dt.datetime) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(subject).issuer_name(bundle.ca_cert.subject).public_key(public_key)
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(max(not_before, bundle.ca_cert.not_valid_before_utc))
                   .not_valid_after(not_after)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True,
                                                content_commitment=False, data_encipherment=False,
                                                key_agreement=False, key_cert_sign=False, crl_sign=False,
                                                encipher_only=False, decipher_only=False), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(_aki(bundle.ca_cert), critical=False)
                   # RFC 5280 4.2.1.6: with an empty subject the SAN extension must be critical.
                   .add_extension(x509.SubjectAlternativeName(sans), critical=len(subject) == 0))
        return builder.sign(bundle.ca_key, _hash_for(bundle.ca_key))

    def sign(self, csr_pem: str | bytes, identities: Sequence[str] | str,
             ttl_seconds: float | None = None) -> list[str]:
        """Issue a workload certificate for the CSR's key. Returns PEMs, leaf first, root last.

        The leaf holds exactly `identities` as URI SANs (whatever the CSR asked for is ignored),
        an empty subject, digitalSignature+keyEncipherment, serverAuth+clientAuth and CA:FALSE.
        `ttl_seconds` None or <= 0 means DEFAULT_WORKLOAD_CERT_TTL; above MAX_WORKLOAD_CERT_TTL
        is refused; the leaf never outlives the CA chain.
        """
        bundle = self._bundle  # one consistent bundle even if a reload swaps it meanwhile
        public_key = _csr_public_key(csr_pem)
        ids = _check_identities(identities)
        not_before, not_after = self._lifetime(ttl_seconds, bundle, _now())
        cert = self._issue(bundle, public_key, [x509.UniformResourceIdentifier(i) for i in ids],
                           x509.Name([]), not_before, not_after)
        return [_pem(cert), *bundle.chain_pem]

    def sign_server_cert(self, dns_names: Sequence[str], ttl_seconds: float | None = None, *,
                         key_type: str | None = None) -> ServerCertificate:
        """A serving certificate (istiod's own, e.g. ``istiod.istio-system.svc``) with a key made
        here. TTL as `sign` (default DEFAULT_WORKLOAD_CERT_TTL, clamped to the chain) but not
        capped by MAX_WORKLOAD_CERT_TTL: the caller is the control plane, which must re-issue it
        before `not_after` and whenever the CA changes."""
        names = [n.strip() for n in ([dns_names] if isinstance(dns_names, str) else dns_names) if n.strip()]
        if not names:
            raise InvalidRequestError("a server certificate needs at least one DNS name")
        bundle = self._bundle
        now = _now()
        if bundle.not_after <= now:
            raise CAError(f"the CA certificate chain expired at {bundle.not_after.isoformat()}")
        ttl = self.options.default_cert_ttl if ttl_seconds is None or ttl_seconds <= 0 else float(ttl_seconds)
        not_after = min(now + dt.timedelta(seconds=ttl), bundle.not_after)
        key = generate_key(key_type or self.options.key_type, self.options.rsa_key_size)
        subject = (x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
                   if len(names[0]) <= 64 else x509.Name([]))
        try:
            sans = [x509.DNSName(n) for n in dict.fromkeys(names)]
        except ValueError as e:
            raise InvalidRequestError(f"invalid DNS name: {e}") from None
        cert = self._issue(bundle, key.public_key(), sans, subject, now - CLOCK_SKEW, not_after)
        return ServerCertificate([_pem(cert), *bundle.chain_pem], key_to_pem(key), cert.not_valid_after_utc)


def _check_identities(identities: Iterable[str] | str) -> list[str]:
    ids = [identities] if isinstance(identities, str) else list(identities)
    if not ids:
        raise IdentityError("no identity to put in the certificate")
    for i in ids:
        try:
            spiffe.validate_spiffe_id(i)
        except spiffe.SpiffeIdError as e:
            raise IdentityError(str(e)) from None
    return list(dict.fromkeys(ids))
