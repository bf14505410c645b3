"""Who is calling the CA (and secure xDS): istiod's authenticators, tried in istiod's order.

1. `ClientCertAuthenticator`: the caller's TLS client certificate, verified against the mesh
   roots during the handshake on 15012, names a SPIFFE identity in a URI SAN (a workload
   renewing with the certificate it was issued, or a VM with a provisioned one).
2. `KubeJWTAuthenticator` (Kubernetes mode): a service-account token sent as
   ``authorization: Bearer <jwt>`` is checked by the apiserver with a TokenReview for the
   audiences ``TOKEN_AUDIENCES`` (``istio-ca``); the identity is the reviewed
   ``system:serviceaccount:NS:SA``.
3. `JwtAuthenticator`, one per rule in ``JWT_RULE``: a JWT from a trusted issuer, verified here
   (RS256/384/512, PS256/384/512, ES256/384/512 with `cryptography`), with ``exp``/``nbf``,
   issuer and audience checked; the identity comes from the ``kubernetes.io`` claims
   (``namespace``, ``serviceaccount.name``) or a ``sub`` of ``system:serviceaccount:NS:SA``.

The first authenticator that accepts the credentials decides the `Caller` (namespace and service
account, never a full SPIFFE URI: the CA builds the URI with the mesh's current trust domain).
When none does, `AuthenticationError` carries every authenticator's reason.

``JWT_RULE`` (istiod's knob; here also a list) is JSON::

    {"issuer": "https://issuer.example", "audiences": ["istio-ca"],
     "jwks": "{\\"keys\\": [...]}"}            # the JWKS inline (a JSON string or an object)
    {"issuer": ..., "audiences": [...], "jwks_uri": "https://issuer.example/jwks.json"}
    {"issuer": ..., "audiences": [...]}      # OIDC discovery: ISSUER/.well-known/openid-configuration

``audiences`` is required and non-empty: a CA that accepted an issuer's tokens for any audience
would sign for tokens minted for unrelated services.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from pilot import logging as plog
from pilot.security import spiffe
from pilot.sources.kube.rbac import Rule

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

# `cryptography` (~10 MB of RSS) is imported by the functions that read certificates and keys or
# check signatures, not here: file mode needs it only with the secure port, JWT_RULE or a JWKS
# to read (docs/performance.md, Round 7); imported once, it costs a dictionary lookup per call.

log = plog.get("authn")

# KubeJWTAuthenticator creates TokenReviews (cluster-scoped, never stored). See rbac.py.
RBAC = (Rule("cluster", "authentication.k8s.io", "tokenreviews", frozenset({"create"})),)

TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
MAX_TOKEN_BYTES = 16 * 1024
CLOCK_LEEWAY = 60.0  # seconds of clock skew tolerated on exp and nbf
SA_PREFIX = "system:serviceaccount:"
JWKS_REFRESH = 20 * 60.0  # seconds a fetched JWKS is trusted before it is fetched again
JWKS_MIN_REFETCH = 30.0  # an unknown kid triggers at most one fetch per this many seconds

CLIENT_CERT = "ClientCertAuthenticator"
KUBE_JWT = "KubeJWTAuthenticator"
JWT = "JwtAuthenticator"


class AuthenticationError(Exception):
    """No authenticator accepted the credentials (answer UNAUTHENTICATED)."""


class JwtRuleError(ValueError):
    """JWT_RULE is malformed; the message says where and why."""


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: an Istio workload identity without its trust domain."""

    authenticator: str
    namespace: str
    service_account: str
    detail: str = ""  # the issuer or token review that vouched for it, for logs
    # The pod a bound service-account token was issued to, when the token says (node proxies
    # impersonating workloads are checked against it).
    pod_name: str = ""
    pod_uid: str = ""

    @property
    def account(self) -> str:
        return f"{self.namespace}/{self.service_account}"

    def spiffe_id(self, trust_domain: str) -> str:
        return spiffe.build(trust_domain, self.namespace, self.service_account)


@dataclass(frozen=True)
class Credentials:
    """What a call presents: the bearer token of its metadata and the TLS client certificate (DER)
    of its connection, each None when absent."""

    bearer_token: str | None = None
    peer_cert_der: bytes | None = None


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """``authorization: Bearer <token>`` from gRPC invocation metadata."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


class Authenticator(Protocol):
    name: str

    async def authenticate(self, creds: Credentials) -> Caller: ...


def _workload(namespace: Any, service_account: Any, what: str) -> tuple[str, str]:
    if not isinstance(namespace, str) or not isinstance(service_account, str):
        raise AuthenticationError(f"{what}: namespace and service account must be strings")
    try:
        spiffe.identity("cluster.local", namespace, service_account)
    except spiffe.SpiffeIdError as e:
        raise AuthenticationError(f"{what}: not a valid workload identity ({e})") from None
    return namespace, service_account


def _split_sa_username(username: Any, what: str) -> tuple[str, str]:
    if not isinstance(username, str) or not username.startswith(SA_PREFIX):
        raise AuthenticationError(f"{what}: {username!r} is not a service account "
                                  f"(expected {SA_PREFIX}NAMESPACE:NAME)")
    parts = username[len(SA_PREFIX):].split(":")
    if len(parts) != 2:
        raise AuthenticationError(f"{what}: {username!r} is not {SA_PREFIX}NAMESPACE:NAME")
    return _workload(parts[0], parts[1], what)


# --------------------------------------------------------------------------- client certificates

class ClientCertAuthenticator:
    """The identity in the verified client certificate of the TLS connection."""

    name = CLIENT_CERT

    async def authenticate(self, creds: Credentials) -> Caller:
        return self.from_der(creds.peer_cert_der)

    def from_der(self, der: bytes | None, now: float | None = None) -> Caller:
        if not der:
            raise AuthenticationError("no client certificate was presented")
        from cryptography import x509

        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError as e:
            raise AuthenticationError(f"the client certificate cannot be parsed: {e}") from None
        # The handshake checked it; a long-lived connection may outlive it.
        if cert.not_valid_after_utc.timestamp() <= (time.time() if now is None else now):
            raise AuthenticationError("the client certificate has expired")
        try:
            uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
                .get_values_for_type(x509.UniformResourceIdentifier)
        except x509.ExtensionNotFound:
            uris = []
        problems = []
        for uri in uris:
            if not uri.startswith(spiffe.SCHEME):
                continue
            try:
                ident = spiffe.parse(uri)
            except spiffe.SpiffeIdError as e:
                problems.append(str(e))
                continue
            return Caller(self.name, ident.namespace, ident.service_account, detail=uri)
        raise AuthenticationError("the client certificate holds no Istio SPIFFE identity"
                                  + (f" ({'; '.join(problems)})" if problems else ""))


# ------------------------------------------------------------------------ Kubernetes TokenReview

# What a TokenReview says about the pod a bound token belongs to (user.extra, lists of strings).
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


def _first(values: Any) -> str:
    if isinstance(values, list) and values and isinstance(values[0], str):
        return values[0]
    return ""


class KubeJWTAuthenticator:
    """A service-account token reviewed by the apiserver (istiod's kube JWT authenticator)."""

    name = KUBE_JWT

    def __init__(self, kube: Any, audiences: Sequence[str] = ("istio-ca",)) -> None:
        self.kube = kube
        self.audiences = list(audiences)

    async def authenticate(self, creds: Credentials) -> Caller:
        token = creds.bearer_token
        if not token:
            raise AuthenticationError("no bearer token in the request metadata")
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthenticationError(f"the bearer token is longer than {MAX_TOKEN_BYTES} bytes")
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": self.audiences}}
        try:
            review = await self.kube.request("POST", TOKEN_REVIEW_PATH, body=body, timeout=10.0)
        except Exception as e:  # noqa: BLE001 - apiserver down, RBAC missing...: not authenticated
            raise AuthenticationError(f"the token review failed: {e}") from None
        status = (review or {}).get("status") or {}
        if status.get("error"):
            raise AuthenticationError(f"the token review failed: {status['error']}")
        if not status.get("authenticated"):
            raise AuthenticationError("the token is not authenticated (TokenReview)")
        reviewed_aud = status.get("audiences") or []
        if reviewed_aud and self.audiences and not set(reviewed_aud) & set(self.audiences):
            raise AuthenticationError(f"the token is not for audience {', '.join(self.audiences)}")
        user = status.get("user") or {}
        groups = user.get("groups")
        if groups is not None and "system:serviceaccounts" not in groups:
            raise AuthenticationError("the token does not belong to a service account")
        ns, sa = _split_sa_username(user.get("username"), "token review")
        extra = user.get("extra") or {}
        return Caller(self.name, ns, sa, detail="TokenReview", pod_name=_first(extra.get(POD_NAME_EXTRA)),
                      pod_uid=_first(extra.get(POD_UID_EXTRA)))


# ---------------------------------------------------------------------------------------- JWTs

# By name in cryptography's `hashes` and `ec` modules, looked up once they are imported.
_HASHES = {"256": "SHA256", "384": "SHA384", "512": "SHA512"}
_EC_CURVES = {"ES256": ("P-256", "SECP256R1"), "ES384": ("P-384", "SECP384R1"), "ES512": ("P-521", "SECP521R1")}
_CURVE_BY_NAME = {crv: cls for crv, cls in _EC_CURVES.values()}
SUPPORTED_ALGS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"})


def _b64url(text: str, what: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{what} is not a string")  # noqa: TRY004 - reported as a bad JWKS/JWT
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64url") from None


def _b64url_int(text: Any, what: str) -> int:
    raw = _b64url(text, what)
    if not raw:
        raise ValueError(f"{what} is empty")
    return int.from_bytes(raw, "big")


@dataclass(frozen=True)
class Jwk:
    kid: str | None
    alg: str | None
    key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey

    def accepts(self, alg: str) -> bool:
        from cryptography.hazmat.primitives.asymmetric import ec, rsa

        if self.alg and self.alg != alg:
            return False
        if alg[:2] in ("RS", "PS"):
            return isinstance(self.key, rsa.RSAPublicKey)
        _crv, cls = _EC_CURVES[alg]
        return isinstance(self.key, ec.EllipticCurvePublicKey) and isinstance(self.key.curve, getattr(ec, cls))


def parse_jwks(doc: Any, what: str = "JWKS") -> list[Jwk]:
    """The signature keys of a JWKS document (dict or JSON text). Keys of other types or uses
    (symmetric, encryption) are skipped; a document with no usable key is an error."""
    if isinstance(doc, (str, bytes)):
        try:
            doc = json.loads(doc)
        except ValueError as e:
            raise ValueError(f"{what} is not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError(f'{what} must be an object with a "keys" list')  # noqa: TRY004
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    out = []
    for i, k in enumerate(doc["keys"]):
        where = f"{what} key {i}" + (f" (kid {k.get('kid')!r})" if isinstance(k, dict) and k.get("kid") else "")
        if not isinstance(k, dict):
            raise ValueError(f"{where} is not an object")  # noqa: TRY004
        if k.get("use", "sig") != "sig":
            continue
        kty = k.get("kty")
        try:
            if kty == "RSA":
                key: Any = rsa.RSAPublicNumbers(_b64url_int(k.get("e"), "e"), _b64url_int(k.get("n"), "n")).public_key()
                if key.key_size < 2048:
                    raise ValueError(f"an RSA key of {key.key_size} bits is too weak (2048 minimum)")
            elif kty == "EC":
                curve = _CURVE_BY_NAME.get(str(k.get("crv")))
                if curve is None:
                    raise ValueError(f"unsupported curve {k.get('crv')!r} (P-256, P-384, P-521)")
                key = ec.EllipticCurvePublicNumbers(_b64url_int(k.get("x"), "x"), _b64url_int(k.get("y"), "y"),
                                                    getattr(ec, curve)()).public_key()
            else:
                continue  # oct, OKP...: not accepted for signatures here
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        alg = k.get("alg")
        if alg is not None and alg not in SUPPORTED_ALGS:
            continue
        out.append(Jwk(k.get("kid") if isinstance(k.get("kid"), str) else None, alg, key))
    if not out:
        raise ValueError(f"{what} holds no RSA or EC signature key")
    return out


@dataclass(frozen=True)
class JwtRule:
    issuer: str
    audiences: tuple[str, ...]
    jwks: tuple[Jwk, ...] | None = None  # inline
    jwks_uri: str | None = None  # None with no inline jwks: OIDC discovery from the issuer


def parse_jwt_rules(text: str) -> list[JwtRule]:
    """``JWT_RULE``: one rule object (istiod's form) or a list of them. Empty means none."""
    if not text or not text.strip():
        return []
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise JwtRuleError(f"JWT_RULE is not JSON: {e}") from None
    rules = doc if isinstance(doc, list) else [doc]
    out = []
    issuers = set()
    for i, r in enumerate(rules):
        where = f"JWT_RULE[{i}]" if isinstance(doc, list) else "JWT_RULE"
        if not isinstance(r, dict):
            raise JwtRuleError(f"{where} must be an object with issuer, audiences and jwks or jwks_uri")
        unknown = set(r) - {"issuer", "audiences", "jwks", "jwks_uri", "jwksUri"}
        if unknown:
            raise JwtRuleError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} "
                               "(expected issuer, audiences, jwks or jwks_uri)")
        issuer = r.get("issuer")
        if not isinstance(issuer, str) or not issuer.strip():
            raise JwtRuleError(f"{where}: issuer is required")
        where = f"{where} (issuer {issuer})"
        if issuer in issuers:
            raise JwtRuleError(f"{where}: issuer listed twice")
        issuers.add(issuer)
        aud = r.get("audiences")
        if (not isinstance(aud, list) or not aud
                or not all(isinstance(a, str) and a for a in aud)):
            raise JwtRuleError(f"{where}: audiences must be a non-empty list of strings "
                               "(tokens for any audience are never accepted)")
        uri = r.get("jwks_uri", r.get("jwksUri"))
        jwks_doc = r.get("jwks")
        if jwks_doc not in (None, "") and uri:
            raise JwtRuleError(f"{where}: give jwks or jwks_uri, not both")
        jwks = None
        if jwks_doc not in (None, ""):
            try:
                jwks = tuple(parse_jwks(jwks_doc, "jwks"))
            except ValueError as e:
                raise JwtRuleError(f"{where}: {e}") from None
        elif uri is not None:
            if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
                raise JwtRuleError(f"{where}: jwks_uri must be an http(s) URL")
        elif not issuer.startswith(("https://", "http://")):
            raise JwtRuleError(f"{where}: without jwks or jwks_uri the issuer must be an https URL "
                               "(its keys are found by OIDC discovery)")
        out.append(JwtRule(issuer, tuple(aud), jwks, uri or None))
    return out


@dataclass
class Jwt:
    header: dict
    claims: dict
    signing_input: bytes
    signature: bytes


def decode_jwt(token: str) -> Jwt:
    """Split and decode a compact JWS (no verification)."""
    if len(token) > MAX_TOKEN_BYTES:
        raise AuthenticationError(f"the token is longer than {MAX_TOKEN_BYTES} bytes")
    parts = token.split(".")
    if len(parts) != 3:
        raise AuthenticationError("the token is not a JWT (expected three dot-separated parts)")
    try:
        header = json.loads(_b64url(parts[0], "JWT header"))
        claims = json.loads(_b64url(parts[1], "JWT payload"))
        signature = _b64url(parts[2], "JWT signature")
    except ValueError as e:
        raise AuthenticationError(f"the token is not a JWT: {e}") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise AuthenticationError("the token is not a JWT: header and payload must be JSON objects")
    return Jwt(header, claims, f"{parts[0]}.{parts[1]}".encode(), signature)


def verify_signature(jwt: Jwt, keys: Sequence[Jwk]) -> None:
    alg = jwt.header.get("alg")
    if alg not in SUPPORTED_ALGS:
        raise AuthenticationError(f"the token's algorithm {alg!r} is not accepted "
                                  f"({', '.join(sorted(SUPPORTED_ALGS))})")
    if "crit" in jwt.header:
        raise AuthenticationError("the token has critical header parameters, which are not supported")
    kid = jwt.header.get("kid")
    candidates = [k for k in keys if k.accepts(alg) and (kid is None or k.kid is None or k.kid == kid)]
    if not candidates:
        raise AuthenticationError(f"no key of the issuer matches the token (kid {kid!r}, alg {alg})")
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    h = getattr(hashes, _HASHES[alg[2:]])()
    sig = jwt.signature
    for k in candidates:
        key = k.key  # of the algorithm's family (k.accepts(alg))
        try:
            if isinstance(key, rsa.RSAPublicKey):
                pad = padding.PKCS1v15() if alg.startswith("RS") else \
                    padding.PSS(mgf=padding.MGF1(h), salt_length=h.digest_size)
                key.verify(sig, jwt.signing_input, pad, h)
            else:
                size = (key.curve.key_size + 7) // 8
                if len(sig) != 2 * size:
                    continue
                der = encode_dss_signature(int.from_bytes(sig[:size], "big"), int.from_bytes(sig[size:], "big"))
                key.verify(der, jwt.signing_input, ec.ECDSA(h))
            return
        except InvalidSignature:
            continue
    raise AuthenticationError("the token's signature does not verify with the issuer's keys")


def _numeric(claims: Mapping[str, Any], name: str) -> float | None:
    v = claims.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise AuthenticationError(f"the token's {name} claim is not a number")
    return float(v)


def check_claims(claims: Mapping[str, Any], rule: JwtRule, now: float | None = None) -> None:
    now = time.time() if now is None else now
    if claims.get("iss") != rule.issuer:
        raise AuthenticationError(f"the token's issuer {claims.get('iss')!r} is not {rule.issuer!r}")
    exp = _numeric(claims, "exp")
    if exp is None:
        raise AuthenticationError("the token has no exp claim")
    if now >= exp + CLOCK_LEEWAY:
        raise AuthenticationError("the token has expired")
    nbf = _numeric(claims, "nbf")
    if nbf is not None and now + CLOCK_LEEWAY < nbf:
        raise AuthenticationError("the token is not valid yet (nbf)")
    aud = claims.get("aud")
    auds = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if not {a for a in auds if isinstance(a, str)} & set(rule.audiences):
        raise AuthenticationError(f"the token's audience {aud!r} is not one of {', '.join(rule.audiences)}")


def identity_from_claims(claims: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, service account) from ``kubernetes.io`` claims, else a service-account ``sub``."""
    k8s = claims.get("kubernetes.io")
    if isinstance(k8s, dict) and k8s.get("namespace") is not None:
        sa = k8s.get("serviceaccount")
        name = sa.get("name") if isinstance(sa, dict) else None
        if name is not None:
            return _workload(k8s.get("namespace"), name, "the token's kubernetes.io claims")
    sub = claims.get("sub")
    if isinstance(sub, str) and sub.startswith(SA_PREFIX):
        return _split_sa_username(sub, "the token's sub")
    raise AuthenticationError("the token names no workload: expected kubernetes.io namespace and "
                              f"serviceaccount.name claims or a sub of {SA_PREFIX}NAMESPACE:NAME")


Fetcher = Callable[[str], Awaitable[Any]]


async def _http_get_json(url: str) -> Any:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
        if r.status != 200:
            raise ValueError(f"GET {url}: HTTP {r.status}")
        return await r.json(content_type=None)


@dataclass
class _RemoteKeys:
    keys: list[Jwk] = field(default_factory=list)
    fetched_at: float = 0.0
    attempted_at: float = float("-inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _pod_from_claims(claims: dict) -> tuple[str, str]:
    """A projected service-account token names its pod under `kubernetes.io.pod`."""
    k8s = claims.get("kubernetes.io")
    pod = k8s.get("pod") if isinstance(k8s, dict) else None
    if not isinstance(pod, dict):
        return "", ""
    return str(pod.get("name") or ""), str(pod.get("uid") or "")


class JwtAuthenticator:
    """Tokens of one trusted issuer (one JWT_RULE entry)."""

    name = JWT

    def __init__(self, rule: JwtRule, fetch: Fetcher = _http_get_json,
                 clock: Callable[[], float] = time.time) -> None:
        self.rule = rule
        self._fetch = fetch
        self._clock = clock
        self._remote = _RemoteKeys()

    async def authenticate(self, creds: Credentials) -> Caller:
        if not creds.bearer_token:
            raise AuthenticationError("no bearer token in the request metadata")
        jwt = decode_jwt(creds.bearer_token)
        if jwt.claims.get("iss") != self.rule.issuer:  # cheap: skip the signature for other issuers
            raise AuthenticationError(f"the token's issuer {jwt.claims.get('iss')!r} is not {self.rule.issuer!r}")
        keys = await self._keys(refresh=False)
        try:
            verify_signature(jwt, keys)
        except AuthenticationError:
            if self.rule.jwks is not None:
                raise
            # A rotated issuer key: fetch the JWKS again (rate-limited) and retry once.
            fresh = await self._keys(refresh=True)
            if fresh is keys:
                raise
            verify_signature(jwt, fresh)
        check_claims(jwt.claims, self.rule, self._clock())
        ns, sa = identity_from_claims(jwt.claims)
        pod_name, pod_uid = _pod_from_claims(jwt.claims)
        return Caller(self.name, ns, sa, detail=self.rule.issuer, pod_name=pod_name, pod_uid=pod_uid)

    async def _keys(self, refresh: bool) -> Sequence[Jwk]:
        if self.rule.jwks is not None:
            return self.rule.jwks
        r = self._remote
        now = self._clock()
        due = not r.keys or refresh or now - r.fetched_at > JWKS_REFRESH
        if due and now - r.attempted_at >= JWKS_MIN_REFETCH:
            async with r.lock:
                if r.attempted_at < now:  # nobody fetched while we waited for the lock
                    r.attempted_at = self._clock()
                    try:
                        uri = self.rule.jwks_uri or await self._discover()
                        r.keys = parse_jwks(await self._fetch(uri), f"JWKS of {self.rule.issuer}")
                        r.fetched_at = self._clock()
                    except Exception as e:  # noqa: BLE001 - network, JSON, bad keys: keep the old keys
                        log.warning("cannot fetch the issuer's JWKS", issuer=self.rule.issuer, error=str(e))
                        if not r.keys:
                            raise AuthenticationError(
                                f"the keys of issuer {self.rule.issuer} cannot be fetched: {e}") from None
        if not r.keys:
            raise AuthenticationError(f"the keys of issuer {self.rule.issuer} are not available yet")
        return r.keys

    async def _discover(self) -> str:
        url = self.rule.issuer.rstrip("/") + "/.well-known/openid-configuration"
        doc = await self._fetch(url)
        uri = doc.get("jwks_uri") if isinstance(doc, dict) else None
        if not isinstance(uri, str) or not uri:
            raise ValueError(f"{url} has no jwks_uri")
        return uri


# -------------------------------------------------------------------------------------- the chain

class Authenticators:
    """Try each authenticator in order; the first acceptance wins."""

    def __init__(self, authenticators: Sequence[Authenticator]) -> None:
        self.authenticators = list(authenticators)

    async def authenticate(self, creds: Credentials) -> Caller:
        reasons = []
        for a in self.authenticators:
            try:
                return await a.authenticate(creds)
            except AuthenticationError as e:
                reasons.append(f"{a.name}: {e}")
        raise AuthenticationError("authentication failed: " + ("; ".join(reasons) or "no authenticator"))


def build(*, jwt_rules: Sequence[JwtRule], kube: Any | None = None,
          token_audiences: Sequence[str] = ("istio-ca",)) -> Authenticators:
    """istiod's order: client certificate, Kubernetes token (when there is a cluster), JWT_RULE."""
    chain: list[Authenticator] = [ClientCertAuthenticator()]
    if kube is not None:
        chain.append(KubeJWTAuthenticator(kube, token_audiences))
    chain += [JwtAuthenticator(r) for r in jwt_rules]
    return Authenticators(chain)
