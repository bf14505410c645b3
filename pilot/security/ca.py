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
import datetime as dt
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pilot import features
from pilot.security import spiffe

# Split for size; everything below is re-exported so `from pilot.security.ca import ...` keeps
# working: errors in ca_errors.py, key material and CSR checks in pki.py, root storage (and its
# RBAC) in ca_storage.py.
from pilot.security.ca_errors import (  # noqa: F401
    CABundleError,
    CAError,
    CAStorageError,
    CSRError,
    IdentityError,
    InvalidRequestError,
    TTLError,
)
from pilot.security.ca_storage import (  # noqa: F401
    CA_SECRET_NAME,
    CA_SECRET_TYPE,
    PRIVATE_KEY_FILE,
    RBAC,
    CAStorage,
    DirectoryStorage,
    KubeSecrets,
    KubeSecretStorage,
    SecretExistsError,
    SecretsClient,
    _is_conflict,
    read_bundle_dir,
)
from pilot.security.pki import (  # noqa: F401
    BUNDLE_FILES,
    CA_CERT_FILE,
    CA_KEY_FILE,
    CERT_CHAIN_FILE,
    CLOCK_SKEW,
    MAX_CSR_BYTES,
    MAX_RSA_KEY_BITS,
    MIN_RSA_KEY_BITS,
    ROOT_CERT_FILE,
    KeyCertBundle,
    PrivateKey,
    _aki,
    _content_hash,
    _csr_public_key,
    _der,
    _describe,
    _hash_for,
    _is_ca,
    _issued_by,
    _load_certs,
    _now,
    _pem,
    _spki,
    _text,
    generate_key,
    generate_root,
    human_duration,
    key_to_pem,
    load_bundle,
)

SELF_SIGNED = "self-signed"
PLUGGED_IN = "plugged-in"


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


# -------------------------------------------------------------------------------------- the CA

@dataclass(frozen=True)
class ServerCertificate:
    cert_chain: list[str]  # PEMs, leaf first, root last
    key_pem: str
    not_after: dt.datetime


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
        return root_ca_dir is not None and bool(root_ca_dir) and Path(root_ca_dir, CA_KEY_FILE).is_file()

    @classmethod
    def from_plugged_in_dir(cls, directory: str | os.PathLike, options: CAOptions) -> CertificateAuthority:
        files = read_bundle_dir(directory)
        bundle = load_bundle(files, source=f"plugged-in CA {directory}")
        return cls(bundle, PLUGGED_IN, options, plugged_dir=Path(directory), loaded_hash=_content_hash(files))

    @classmethod
    async def create(cls, options: CAOptions, storage: CAStorage | None) -> CertificateAuthority:
        """The plugged-in CA if ROOT_CA_DIR holds one, else the stored root, else a new root
        stored create-if-absent (so concurrent replicas converge on one root)."""
        if options.root_ca_dir is not None and cls.plugged_in_files_present(options.root_ca_dir):
            return await asyncio.to_thread(cls.from_plugged_in_dir, options.root_ca_dir, options)
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

    def _issue(self, bundle: KeyCertBundle, public_key: Any, sans: Sequence[x509.GeneralName],
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
