"""The workload certificate: first fetch, renewal at the grace period, and change notification.

istio-agent's schedule: renew when `SECRET_GRACE_PERIOD_RATIO` (0.5) of the lifetime remains,
the ratio moved by a random +/- `SECRET_GRACE_PERIOD_RATIO_JITTER` (0.01) so proxies started
together do not all renew together. The lifetime counts from when the certificate arrived, not
from its notBefore (CAs backdate that for clock skew). A failed renewal keeps the current
certificate and retries with exponential backoff.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from pilot import logging as plog
from pilot.agent.ca_client import CAClient, CertificateError, new_key_and_csr

log = plog.get("cache")

RETRY_INITIAL = 1.0
RETRY_MAX = 60.0


@dataclass(frozen=True)
class WorkloadSecret:
    key_pem: str
    chain_pem: str  # leaf first, as the CA returned it
    root_pem: str  # the last certificate of the chain: the mesh root
    identity: str  # the URI SAN the CA put in the leaf
    serial: int
    issued_at: float  # unix time it arrived
    not_after: float

    @property
    def version(self) -> str:
        """The SDS version of `default`: one per issued certificate."""
        return f"{self.serial:x}"

    @property
    def root_version(self) -> str:
        """The SDS version of `ROOTCA`: changes only when the root does."""
        return hashlib.sha256(self.root_pem.encode()).hexdigest()[:16]


def parse_chain(chain: list[str], key_pem: str, issued_at: float, fallback_root_pem: str = "") -> WorkloadSecret:
    """Raises CertificateError when the chain is not what a CA should return."""
    try:
        certs = [c for pem in chain for c in x509.load_pem_x509_certificates(pem.encode())]
    except ValueError as e:
        raise CertificateError(f"the CA returned a certificate chain that is not PEM: {e}", transient=True) from None
    leaf = certs[0]
    try:
        uris = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    # A CA that leaves the root out of the chain: the mounted root is the trust anchor.
    root_pem = (certs[-1].public_bytes(serialization.Encoding.PEM).decode() if len(certs) > 1
                else fallback_root_pem)
    return WorkloadSecret(
        key_pem=key_pem,
        chain_pem="".join(c if c.endswith("\n") else c + "\n" for c in chain),
        root_pem=root_pem,
        identity=uris[0] if uris else "",
        serial=leaf.serial_number,
        issued_at=issued_at,
        not_after=leaf.not_valid_after_utc.timestamp(),
    )


def renewal_delay(secret: WorkloadSecret, ratio: float, jitter: float, now: float,
                  rand: Callable[[], float] = random.random) -> float:
    """Seconds from `now` until the certificate should be renewed (never negative)."""
    lifetime = max(secret.not_after - secret.issued_at, 0.0)
    grace_ratio = min(max(ratio + jitter * (2 * rand() - 1), 0.0), 1.0)
    return max(secret.not_after - grace_ratio * lifetime - now, 0.0)


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds")


class SecretManager:
    """Holds the current `WorkloadSecret`; `changed(seen)` wakes watchers when it is replaced."""

    def __init__(self, ca: CAClient, spiffe_id: str, ttl: float, *, grace_ratio: float = 0.5,
                 grace_jitter: float = 0.01, clock: Callable[[], float] = time.time) -> None:
        self.ca = ca
        self.spiffe_id = spiffe_id
        self.ttl = ttl
        self.grace_ratio = grace_ratio
        self.grace_jitter = grace_jitter
        self.clock = clock
        self.current: WorkloadSecret | None = None
        self.generation = 0
        self.renewals = 0
        self.failures = 0
        self._changed = asyncio.Event()

    async def fetch(self) -> WorkloadSecret:
        """One CSR round trip; the current certificate (if still valid) is offered for renewal."""
        kc = await asyncio.to_thread(new_key_and_csr, self.spiffe_id)
        held = self.current
        client = (held.key_pem, held.chain_pem) if held and held.not_after > self.clock() + 1 else None
        chain = await self.ca.sign(kc.csr_pem, self.ttl, client_cert=client)
        secret = parse_chain(chain, kc.key_pem, self.clock(), fallback_root_pem=self.ca.root_pem())
        if secret.identity != self.spiffe_id:
            log.warning("the CA issued a certificate for another identity than requested "
                        "(is TRUST_DOMAIN the mesh's trust domain?)", requested=self.spiffe_id,
                        issued=secret.identity)
        return secret

    def publish(self, secret: WorkloadSecret) -> None:
        """Make `secret` current and wake the watchers (SDS streams)."""
        self.current = secret
        self.generation += 1
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def changed(self, seen_generation: int) -> int:
        """Wait until the secret is newer than `seen_generation`; return the new generation."""
        while self.generation == seen_generation:
            await self._changed.wait()
        return self.generation

    async def start(self) -> WorkloadSecret:
        """The first certificate. Transient failures (CA unreachable or starting) are retried with
        backoff, logging each; anything else raises CertificateError at once."""
        delay = RETRY_INITIAL
        attempt = 0
        while True:
            attempt += 1
            try:
                secret = await self.fetch()
                break
            except CertificateError as e:
                if not e.transient:
                    raise
                log.warning("cannot get the workload certificate yet; retrying", attempt=attempt,
                            retry_in=f"{delay:.1f}s", error=str(e))
                await asyncio.sleep(delay * (0.9 + 0.2 * random.random()))
                delay = min(delay * 2, RETRY_MAX)
        self.publish(secret)
        log.info("workload certificate issued", identity=secret.identity, serial=secret.version,
                 expires=_iso(secret.not_after))
        return secret

    async def rotate_forever(self) -> None:
        """Renew at the grace period; on failure retry with backoff until it works."""
        while True:
            secret = self.current
            assert secret is not None, "start() first"
            wait = renewal_delay(secret, self.grace_ratio, self.grace_jitter, self.clock())
            log.debug("next certificate renewal", at=_iso(self.clock() + wait))
            await asyncio.sleep(wait)
            delay = RETRY_INITIAL
            while True:
                try:
                    new = await self.fetch()
                    break
                except CertificateError as e:
                    self.failures += 1
                    left = secret.not_after - self.clock()
                    # Never back off past the expiry (while it is ahead) so the gap stays short.
                    sleep = min(delay, max(left / 4, 0.5)) if left > 0 else delay
                    log.error("workload certificate renewal failed; retrying",
                              retry_in=f"{sleep:.1f}s", error=str(e),
                              **({"expires_in": f"{left:.0f}s"} if left > 0 else
                                 {"expired_at": _iso(secret.not_after)}))
                    await asyncio.sleep(sleep)
                    delay = min(delay * 2, RETRY_MAX)
            self.renewals += 1
            self.publish(new)
            log.info("workload certificate renewed", identity=new.identity, serial=new.version,
                     expires=_iso(new.not_after), renewal=self.renewals)
