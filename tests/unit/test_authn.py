"""The CA's authenticators: JWT verification (JWT_RULE), Kubernetes TokenReview, client certificates."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from pilot.security import authn
from pilot.security.authn import (
    AuthenticationError,
    Caller,
    ClientCertAuthenticator,
    Credentials,
    JwtAuthenticator,
    JwtRuleError,
    KubeJWTAuthenticator,
    parse_jwt_rules,
)

ISSUER = "https://issuer.test"
AUDIENCE = "istio-ca"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int_b64(n: int, length: int | None = None) -> str:
    return _b64(n.to_bytes(length or (n.bit_length() + 7) // 8, "big"))


class Issuer:
    """A test JWT issuer: a key, its JWKS, and tokens signed by hand (no JWT library needed)."""

    def __init__(self, alg: str = "RS256", kid: str = "k1", issuer: str = ISSUER) -> None:
        self.alg, self.kid, self.issuer = alg, kid, issuer
        if alg.startswith(("RS", "PS")):
            self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pub = self.key.public_key().public_numbers()
            self.jwk = {"kty": "RSA", "kid": kid, "use": "sig", "alg": alg, "n": _int_b64(pub.n), "e": _int_b64(pub.e)}
        else:
            curve = {"ES256": ec.SECP256R1(), "ES384": ec.SECP384R1()}[alg]
            self.key = ec.generate_private_key(curve)
            pub = self.key.public_key().public_numbers()
            size = (curve.key_size + 7) // 8
            self.jwk = {"kty": "EC", "kid": kid, "crv": {"ES256": "P-256", "ES384": "P-384"}[alg],
                        "x": _int_b64(pub.x, size), "y": _int_b64(pub.y, size)}

    @property
    def jwks(self) -> dict:
        return {"keys": [self.jwk]}

    def rule(self, audiences=(AUDIENCE,)) -> str:
        return json.dumps({"issuer": self.issuer, "audiences": list(audiences), "jwks": json.dumps(self.jwks)})

    def token(self, claims: dict | None = None, *, namespace: str = "default", sa: str = "sleep",
              lifetime: float = 600, header: dict | None = None, **overrides) -> str:
        now = time.time()
        body = {"iss": self.issuer, "aud": [AUDIENCE], "iat": int(now), "exp": int(now + lifetime),
                "sub": f"system:serviceaccount:{namespace}:{sa}",
                "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": sa, "uid": "u-1"}}}
        body.update(claims or {})
        body.update(overrides)
        body = {k: v for k, v in body.items() if v is not None}
        head = {"alg": self.alg, "typ": "JWT", "kid": self.kid, **(header or {})}
        signing_input = f"{_b64(json.dumps(head).encode())}.{_b64(json.dumps(body).encode())}".encode()
        return signing_input.decode() + "." + _b64(self.sign(signing_input))

    def sign(self, data: bytes) -> bytes:
        h = {"256": hashes.SHA256(), "384": hashes.SHA384(), "512": hashes.SHA512()}[self.alg[2:]]
        if self.alg.startswith("RS"):
            return self.key.sign(data, padding.PKCS1v15(), h)
        if self.alg.startswith("PS"):
            return self.key.sign(data, padding.PSS(mgf=padding.MGF1(h), salt_length=h.digest_size), h)
        r, s = decode_dss_signature(self.key.sign(data, ec.ECDSA(h)))
        size = (self.key.curve.key_size + 7) // 8
        return r.to_bytes(size, "big") + s.to_bytes(size, "big")


@pytest.fixture(scope="module")
def rs() -> Issuer:
    return Issuer("RS256")


def authenticate(issuer: Issuer, token: str, rule_text: str | None = None) -> Caller:
    rule = parse_jwt_rules(rule_text or issuer.rule())[0]
    return asyncio.run(JwtAuthenticator(rule).authenticate(Credentials(bearer_token=token)))


def refused(issuer: Issuer, token: str, rule_text: str | None = None) -> str:
    with pytest.raises(AuthenticationError) as e:
        authenticate(issuer, token, rule_text)
    return str(e.value)


# --- JWT verification ---------------------------------------------------------------------------
@pytest.mark.parametrize("alg", ["RS256", "PS256", "ES256", "ES384"])
def test_a_good_token_names_its_service_account(alg):
    issuer = Issuer(alg)
    caller = authenticate(issuer, issuer.token(namespace="bookinfo", sa="reviews"))
    assert (caller.namespace, caller.service_account, caller.authenticator) == ("bookinfo", "reviews", "JwtAuthenticator")
    assert caller.spiffe_id("example.org") == "spiffe://example.org/ns/bookinfo/sa/reviews"


def test_identity_from_kubernetes_io_claims_or_sub(rs):
    # kubernetes.io claims win over sub
    token = rs.token({"sub": "system:serviceaccount:other:x"}, namespace="ns1", sa="sa1")
    assert authenticate(rs, token).account == "ns1/sa1"
    # only sub
    token = rs.token({"kubernetes.io": None, "sub": "system:serviceaccount:ns2:sa2"})
    assert authenticate(rs, token).account == "ns2/sa2"
    # neither
    assert "names no workload" in refused(rs, rs.token({"kubernetes.io": None, "sub": "alice"}))
    assert "not system:serviceaccount" in refused(rs, rs.token({"kubernetes.io": None,
                                                                "sub": "system:serviceaccount:a:b:c"}))
    assert "not a valid workload identity" in refused(rs, rs.token(namespace="Bad/ns"))


def test_expired_and_not_yet_valid_tokens_are_refused(rs):
    assert "expired" in refused(rs, rs.token(lifetime=-600))
    assert "no exp" in refused(rs, rs.token(exp=None))
    assert "not valid yet" in refused(rs, rs.token(nbf=int(time.time()) + 3600))
    # within the clock leeway is fine
    assert authenticate(rs, rs.token(lifetime=-10)).account == "default/sleep"
    assert authenticate(rs, rs.token(nbf=int(time.time()) + 10)).account == "default/sleep"


def test_wrong_audience_and_issuer_are_refused(rs):
    assert "audience" in refused(rs, rs.token(aud="someone-else"))
    assert "audience" in refused(rs, rs.token(aud=None))
    assert authenticate(rs, rs.token(aud=AUDIENCE)).account == "default/sleep"  # a string aud is fine
    assert authenticate(rs, rs.token(aud=["x", AUDIENCE])).account == "default/sleep"
    assert "issuer" in refused(rs, rs.token(iss="https://evil.test"))


def test_bad_signatures_are_refused(rs):
    good = rs.token()
    head, body, sig = good.split(".")
    forged_body = _b64(json.dumps({**json.loads(base64.urlsafe_b64decode(body + "==")),
                                   "kubernetes.io": {"namespace": "istio-system",
                                                     "serviceaccount": {"name": "ztunnel"}}}).encode())
    assert "signature" in refused(rs, f"{head}.{forged_body}.{sig}")
    other = Issuer("RS256")  # same kid, another key
    assert "signature" in refused(rs, other.token())
    assert "signature" in refused(rs, f"{head}.{body}.{_b64(b'x' * 256)}")


def test_algorithms_and_keys_must_match(rs):
    # alg none / HMAC never verify, whatever the key
    head = _b64(json.dumps({"alg": "none", "kid": "k1"}).encode())
    body = rs.token().split(".")[1]
    assert "algorithm 'none'" in refused(rs, f"{head}.{body}.")
    head = _b64(json.dumps({"alg": "HS256", "kid": "k1"}).encode())
    assert "HS256" in refused(rs, f"{head}.{body}.{_b64(b'mac')}")
    # an RSA key never verifies an ES256 token, an unknown kid matches nothing
    es = Issuer("ES256")
    assert "no key" in refused(rs, es.token())
    assert "no key" in refused(rs, rs.token(header={"kid": "rotated-away"}))
    assert "critical" in refused(rs, rs.token(header={"crit": ["exp"]}))


def test_malformed_tokens(rs):
    for token, why in [("abc", "three dot-separated"), ("a.b.c", "not a JWT"), ("x" * 20000, "longer than")]:
        assert why in refused(rs, token)


# --- JWT_RULE -----------------------------------------------------------------------------------
def test_jwt_rule_forms(rs):
    assert parse_jwt_rules("") == [] and parse_jwt_rules("  ") == []
    one = parse_jwt_rules(rs.rule())
    assert one[0].issuer == ISSUER and one[0].audiences == (AUDIENCE,) and one[0].jwks
    es = Issuer("ES256", issuer="https://other.test")
    both = parse_jwt_rules(json.dumps([json.loads(rs.rule()),
                                       {"issuer": es.issuer, "audiences": ["a"], "jwks": es.jwks}]))
    assert [r.issuer for r in both] == [ISSUER, "https://other.test"]
    remote = parse_jwt_rules(json.dumps({"issuer": ISSUER, "audiences": ["a"], "jwks_uri": "https://k/jwks"}))
    assert remote[0].jwks is None and remote[0].jwks_uri == "https://k/jwks"
    discovery = parse_jwt_rules(json.dumps({"issuer": ISSUER, "audiences": ["a"]}))
    assert discovery[0].jwks is None and discovery[0].jwks_uri is None


@pytest.mark.parametrize("text,message", [
    ("{not json", "JWT_RULE is not JSON"),
    ("42", "JWT_RULE must be an object"),
    ('{"audiences": ["a"], "jwks": "{}"}', "issuer is required"),
    ('{"issuer": "https://i"}', "audiences must be a non-empty list"),
    ('{"issuer": "https://i", "audiences": []}', "audiences must be a non-empty list"),
    ('{"issuer": "https://i", "audiences": "istio-ca"}', "audiences must be a non-empty list"),
    ('{"issuer": "https://i", "audiences": ["a"], "jwks": "{}", "jwks_uri": "https://k"}', "not both"),
    ('{"issuer": "https://i", "audiences": ["a"], "jwks": "nope"}', "jwks is not JSON"),
    ('{"issuer": "https://i", "audiences": ["a"], "jwks": {"keys": []}}', "no RSA or EC signature key"),
    ('{"issuer": "https://i", "audiences": ["a"], "jwks": {"keys": [{"kty": "RSA", "n": "!!", "e": "AQAB"}]}}',
     "jwks key 0: n is not base64url"),
    ('{"issuer": "https://i", "audiences": ["a"], "jwks_uri": "file:///etc/keys"}', "jwks_uri must be an http"),
    ('{"issuer": "issuer-name", "audiences": ["a"]}', "OIDC discovery"),
    ('{"issuer": "https://i", "audiences": ["a"], "jwksUri": "https://k", "fromHeaders": []}',
     "unknown field(s) fromHeaders"),
    ('[{"issuer": "https://i", "audiences": ["a"]}, {"issuer": "https://i", "audiences": ["b"]}]',
     "JWT_RULE[1] (issuer https://i): issuer listed twice"),
])
def test_jwt_rule_errors_are_clear(text, message):
    with pytest.raises(JwtRuleError) as e:
        parse_jwt_rules(text)
    assert message in str(e.value)


def test_weak_rsa_keys_are_refused():
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    pub = key.public_key().public_numbers()
    jwks = {"keys": [{"kty": "RSA", "n": _int_b64(pub.n), "e": _int_b64(pub.e)}]}
    with pytest.raises(JwtRuleError, match="too weak"):
        parse_jwt_rules(json.dumps({"issuer": "https://i", "audiences": ["a"], "jwks": jwks}))


# --- remote keys --------------------------------------------------------------------------------
def test_jwks_uri_is_fetched_cached_and_refetched_for_a_new_key():
    old, new = Issuer("RS256", kid="old"), Issuer("ES256", kid="new")
    served = {"jwks": old.jwks}
    fetched = []
    clock = [1000.0]

    async def fetch(url):
        fetched.append(url)
        return served["jwks"]

    rule = parse_jwt_rules(json.dumps({"issuer": ISSUER, "audiences": [AUDIENCE], "jwks_uri": "https://k/jwks"}))[0]
    a = JwtAuthenticator(rule, fetch=fetch, clock=lambda: clock[0])

    async def run(token):
        return await a.authenticate(Credentials(bearer_token=token))

    async def scenario():
        clock[0] = time.time()
        assert (await run(old.token())).account == "default/sleep"
        assert (await run(old.token())).account == "default/sleep"
        assert fetched == ["https://k/jwks"]  # cached
        served["jwks"] = {"keys": [old.jwk, new.jwk]}
        # The issuer rotated: an unknown kid refetches, but not more than once per interval.
        with pytest.raises(AuthenticationError):
            await run(new.token())  # within JWKS_MIN_REFETCH of the first fetch: no refetch yet
        clock[0] += authn.JWKS_MIN_REFETCH + 1
        assert (await run(new.token())).account == "default/sleep"
        assert len(fetched) == 2
        with pytest.raises(AuthenticationError, match="signature"):
            await run(Issuer("RS256", kid="old").token())  # same kid, wrong key: refetch throttled
        assert len(fetched) == 2

    asyncio.run(scenario())


def test_oidc_discovery_and_fetch_failures():
    issuer = Issuer("ES256")
    docs = {f"{ISSUER}/.well-known/openid-configuration": {"jwks_uri": "https://issuer.test/keys"},
            "https://issuer.test/keys": issuer.jwks}
    rule = parse_jwt_rules(json.dumps({"issuer": ISSUER, "audiences": [AUDIENCE]}))[0]

    async def fetch(url):
        return docs[url]

    async def failing(url):
        raise OSError("connection refused")

    caller = asyncio.run(JwtAuthenticator(rule, fetch=fetch).authenticate(Credentials(issuer.token())))
    assert caller.account == "default/sleep"
    with pytest.raises(AuthenticationError, match="cannot be fetched: connection refused"):
        asyncio.run(JwtAuthenticator(rule, fetch=failing).authenticate(Credentials(issuer.token())))


# --- Kubernetes TokenReview -----------------------------------------------------------------------
class FakeKube:
    def __init__(self, status=None, error: Exception | None = None) -> None:
        self.status, self.error, self.calls = status, error, []

    async def request(self, method, path, *, body=None, **_):
        self.calls.append((method, path, body))
        if self.error:
            raise self.error
        return {"kind": "TokenReview", "status": self.status}


def review(kube, token="tok") -> Caller:
    return asyncio.run(KubeJWTAuthenticator(kube, ["istio-ca"]).authenticate(Credentials(bearer_token=token)))


def test_token_review_names_the_service_account():
    kube = FakeKube({"authenticated": True, "audiences": ["istio-ca"],
                     "user": {"username": "system:serviceaccount:bookinfo:reviews",
                              "groups": ["system:serviceaccounts", "system:serviceaccounts:bookinfo"]}})
    caller = review(kube)
    assert (caller.account, caller.authenticator) == ("bookinfo/reviews", "KubeJWTAuthenticator")
    method, path, body = kube.calls[0]
    assert (method, path) == ("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
    assert body["spec"] == {"token": "tok", "audiences": ["istio-ca"]}


@pytest.mark.parametrize("status,error,message", [
    ({"authenticated": False}, None, "not authenticated"),
    ({"authenticated": False, "error": "token expired"}, None, "token expired"),
    ({"authenticated": True, "user": {"username": "alice", "groups": ["system:serviceaccounts"]}}, None,
     "not a service account"),
    ({"authenticated": True, "user": {"username": "system:serviceaccount:a:b", "groups": ["system:nodes"]}}, None,
     "does not belong to a service account"),
    ({"authenticated": True, "audiences": ["other"], "user": {"username": "system:serviceaccount:a:b"}}, None,
     "not for audience istio-ca"),
    (None, OSError("connection refused"), "token review failed: connection refused"),
])
def test_token_review_refusals(status, error, message):
    with pytest.raises(AuthenticationError, match=message):
        review(FakeKube(status, error))


def test_no_token_means_no_review():
    kube = FakeKube({"authenticated": True})
    with pytest.raises(AuthenticationError, match="no bearer token"):
        asyncio.run(KubeJWTAuthenticator(kube).authenticate(Credentials()))
    assert kube.calls == []


# --- client certificates and the chain ----------------------------------------------------------------
def _cert(uris: list[str], *, days: float = 1) -> bytes:
    import datetime as dt

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    b = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(x509.Name([]))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(days=2)).not_valid_after(now + dt.timedelta(days=days)))
    if uris:
        b = b.add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]), True)
    return b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def test_client_certificate_identity():
    a = ClientCertAuthenticator()
    caller = a.from_der(_cert(["https://not-spiffe", "spiffe://cluster.local/ns/foo/sa/bar"]))
    assert (caller.account, caller.authenticator) == ("foo/bar", "ClientCertAuthenticator")
    with pytest.raises(AuthenticationError, match="no client certificate"):
        a.from_der(None)
    with pytest.raises(AuthenticationError, match="no Istio SPIFFE identity"):
        a.from_der(_cert([]))
    with pytest.raises(AuthenticationError, match="not an Istio workload identity"):
        a.from_der(_cert(["spiffe://cluster.local/some/path"]))
    with pytest.raises(AuthenticationError, match="expired"):
        a.from_der(_cert(["spiffe://cluster.local/ns/foo/sa/bar"], days=-1))


def test_bearer_token_metadata():
    assert authn.bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert authn.bearer_token((("x", "y"), ("Authorization", b"bearer  abc "))) == "abc"
    assert authn.bearer_token([("authorization", "Basic abc")]) is None
    assert authn.bearer_token(None) is None


def test_the_chain_tries_in_order_and_reports_every_reason(rs):
    chain = authn.build(jwt_rules=parse_jwt_rules(rs.rule()))
    assert [a.name for a in chain.authenticators] == ["ClientCertAuthenticator", "JwtAuthenticator"]
    kube_chain = authn.build(jwt_rules=parse_jwt_rules(rs.rule()), kube=FakeKube({"authenticated": False}))
    assert [a.name for a in kube_chain.authenticators] == ["ClientCertAuthenticator", "KubeJWTAuthenticator",
                                                           "JwtAuthenticator"]
    # The client certificate wins over the token.
    creds = Credentials(bearer_token=rs.token(namespace="jwt-ns"),
                        peer_cert_der=_cert(["spiffe://cluster.local/ns/cert-ns/sa/x"]))
    assert asyncio.run(kube_chain.authenticate(creds)).namespace == "cert-ns"
    # TokenReview says no, the JWT_RULE issuer says yes.
    assert asyncio.run(kube_chain.authenticate(Credentials(rs.token(namespace="jwt-ns")))).namespace == "jwt-ns"
    with pytest.raises(AuthenticationError) as e:
        asyncio.run(kube_chain.authenticate(Credentials(rs.token(lifetime=-600))))
    msg = str(e.value)
    assert "ClientCertAuthenticator: no client certificate" in msg
    assert "KubeJWTAuthenticator: the token is not authenticated" in msg
    assert "JwtAuthenticator: the token has expired" in msg
