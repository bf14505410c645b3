"""SPIFFE identities as Istio uses them: ``spiffe://TRUSTDOMAIN/ns/NAMESPACE/sa/SERVICEACCOUNT``.

`validate_spiffe_id` checks any SPIFFE ID against the SPIFFE spec's syntax (what a certificate
URI SAN may hold); `parse`/`build` handle Istio's workload form on top of it. Every failure is a
`SpiffeIdError` naming the offending text and what is wrong with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEME = "spiffe://"
MAX_ID_LENGTH = 2048  # the SPIFFE spec's limit for an ID in an X.509 SVID

# SPIFFE ID spec: trust domain is lowercase letters, digits, '.', '-', '_'; path segments also
# allow uppercase. '.' and '..' segments, empty segments, query, fragment, port and userinfo
# are all forbidden.
_TRUST_DOMAIN = re.compile(r"[a-z0-9._-]+")
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")


class SpiffeIdError(ValueError):
    """A malformed SPIFFE ID or Istio identity; the message says which and why."""


@dataclass(frozen=True)
class Identity:
    """An Istio workload identity; ``str()`` is its SPIFFE URI."""

    trust_domain: str
    namespace: str
    service_account: str

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    def __str__(self) -> str:
        return self.uri


def validate_trust_domain(trust_domain: str) -> str:
    if not trust_domain:
        raise SpiffeIdError("trust domain is empty")
    if not _TRUST_DOMAIN.fullmatch(trust_domain):
        raise SpiffeIdError(
            f"trust domain {trust_domain!r} may only hold lowercase letters, digits, '.', '-' and '_'")
    return trust_domain


def _validate_segment(seg: str, what: str, full: str) -> None:
    if not seg:
        raise SpiffeIdError(f"SPIFFE ID {full!r}: empty {what}")
    if seg in (".", ".."):
        raise SpiffeIdError(f"SPIFFE ID {full!r}: {what} may not be '.' or '..'")
    if not _SEGMENT.fullmatch(seg):
        raise SpiffeIdError(
            f"SPIFFE ID {full!r}: {what} {seg!r} may only hold letters, digits, '.', '-' and '_'")


def validate_spiffe_id(uri: str) -> str:
    """Return `uri` unchanged if it is a syntactically valid SPIFFE ID (any path), else raise."""
    if not isinstance(uri, str):
        raise SpiffeIdError(f"SPIFFE ID must be a string, not {type(uri).__name__}")
    if len(uri) > MAX_ID_LENGTH:
        raise SpiffeIdError(f"SPIFFE ID is {len(uri)} characters long; the limit is {MAX_ID_LENGTH}")
    if not uri.startswith(SCHEME):
        raise SpiffeIdError(f"{uri!r} is not a SPIFFE ID: it must start with {SCHEME!r}")
    rest = uri[len(SCHEME):]
    if any(c in rest for c in "?#"):
        raise SpiffeIdError(f"SPIFFE ID {uri!r} may not hold a query or fragment")
    trust_domain, slash, path = rest.partition("/")
    if ":" in trust_domain or "@" in trust_domain:
        raise SpiffeIdError(f"SPIFFE ID {uri!r}: the trust domain may not hold a port or user info")
    try:
        validate_trust_domain(trust_domain)
    except SpiffeIdError as e:
        raise SpiffeIdError(f"SPIFFE ID {uri!r}: {e}") from None
    if slash and (not path or path.endswith("/")):
        raise SpiffeIdError(f"SPIFFE ID {uri!r} may not end with '/'")
    if path:
        for seg in path.split("/"):
            _validate_segment(seg, "path segment", uri)
    return uri


def build(trust_domain: str, namespace: str, service_account: str) -> str:
    """``spiffe://TRUSTDOMAIN/ns/NAMESPACE/sa/SERVICEACCOUNT``, each part validated."""
    return str(identity(trust_domain, namespace, service_account))


def identity(trust_domain: str, namespace: str, service_account: str) -> Identity:
    validate_trust_domain(trust_domain)
    ident = Identity(trust_domain, namespace, service_account)
    _validate_segment(namespace, "namespace", ident.uri)
    _validate_segment(service_account, "service account", ident.uri)
    return ident


def parse(uri: str) -> Identity:
    """Parse an Istio workload identity; anything but ``spiffe://TD/ns/NS/sa/SA`` is an error."""
    validate_spiffe_id(uri)
    trust_domain, _, path = uri[len(SCHEME):].partition("/")
    parts = path.split("/") if path else []
    if len(parts) != 4 or parts[0] != "ns" or parts[2] != "sa":
        raise SpiffeIdError(
            f"SPIFFE ID {uri!r} is not an Istio workload identity: expected "
            f"{SCHEME}TRUSTDOMAIN/ns/NAMESPACE/sa/SERVICEACCOUNT")
    return Identity(trust_domain, parts[1], parts[3])
