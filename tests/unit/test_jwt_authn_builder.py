"""RequestAuthentication -> envoy.filters.http.jwt_authn, compared with istiod's shape, and the
inbound filter list the listener builder gets."""

from __future__ import annotations

import json

from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_pb2
from google.protobuf import json_format

from pilot.networking.jwt_authn import FAKE_JWKS, jwt_authn_config
from pilot.networking.policy_filters import inbound_http_filters, inbound_network_filters
from tests.support.policies import authz, request_authn, workload_policies

JWKS = json.dumps({"keys": [{"kty": "RSA", "e": "AQAB", "n": "sXch"}]})


def config(*docs: dict, jwks: dict | None = None) -> jwt_pb2.JwtAuthentication:
    got = jwt_authn_config(workload_policies(*docs, jwks=jwks))
    assert got is not None
    return got


def test_one_issuer_every_field() -> None:
    doc = request_authn("jwt", jwtRules=[{
        "issuer": "https://iss.example", "audiences": ["api", "web"], "jwks": JWKS,
        "fromHeaders": [{"name": "x-jwt", "prefix": "Bearer "}], "fromParams": ["token"], "fromCookies": ["session"],
        "outputPayloadToHeader": "x-jwt-payload", "forwardOriginalToken": True,
        "outputClaimToHeaders": [{"header": "x-sub", "claim": "sub"}], "spaceDelimitedClaims": ["roles"]}])
    expected = json_format.ParseDict({
        "providers": {"origins-0": {
            "issuer": "https://iss.example", "audiences": ["api", "web"], "forward": True,
            "forwardPayloadHeader": "x-jwt-payload", "payloadInMetadata": "payload",
            "normalizePayloadInMetadata": {"spaceDelimitedClaims": ["permission", "roles", "scope"]},
            "claimToHeaders": [{"headerName": "x-sub", "claimName": "sub"}],
            "fromHeaders": [{"name": "x-jwt", "valuePrefix": "Bearer "}], "fromParams": ["token"],
            "fromCookies": ["session"], "localJwks": {"inlineString": JWKS}}},
        "rules": [{"match": {"prefix": "/"}, "requires": {"requiresAny": {"requirements": [
            {"providerName": "origins-0"}, {"allowMissing": {}}]}}}],
        "bypassCorsPreflight": True}, jwt_pb2.JwtAuthentication())
    assert config(doc) == expected


def test_several_issuers_accept_any_valid_token_and_reject_any_invalid_one() -> None:
    docs = [request_authn("b", jwtRules=[{"issuer": "https://b", "jwks": JWKS}]),
            request_authn("a", jwtRules=[{"issuer": "https://a", "jwks": JWKS}, {"issuer": "https://c", "jwks": JWKS}])]
    got = config(*docs)
    assert [got.providers[f"origins-{i}"].issuer for i in range(3)] == ["https://a", "https://b", "https://c"]
    each = [{"requiresAny": {"requirements": [{"providerName": f"origins-{i}"}, {"allowMissing": {}}]}}
            for i in range(3)]
    assert got.rules[0].requires == json_format.ParseDict({"requiresAny": {"requirements": [
        {"providerName": "origins-0"}, {"providerName": "origins-1"}, {"providerName": "origins-2"},
        {"requiresAll": {"requirements": each}}]}}, jwt_pb2.JwtRequirement())


def test_keys_inline_then_fetched_then_a_jwks_no_token_matches() -> None:
    uri = "https://iss.example/keys"
    doc = request_authn("jwt", jwtRules=[{"issuer": "https://iss.example", "jwksUri": uri}])
    assert config(doc).providers["origins-0"].local_jwks.inline_string == FAKE_JWKS
    assert json.loads(FAKE_JWKS)["keys"][0]["kty"] == "RSA"
    fetched = config(doc, jwks={uri: JWKS})
    assert fetched.providers["origins-0"].local_jwks.inline_string == JWKS
    other = json.dumps({"keys": [{"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"}]})
    inline_wins = request_authn("jwt", jwtRules=[{"issuer": "https://iss.example", "jwksUri": uri, "jwks": other}])
    assert config(inline_wins, jwks={uri: JWKS}).providers["origins-0"].local_jwks.inline_string == other


def test_no_request_authentication_no_jwt_filter() -> None:
    assert jwt_authn_config(workload_policies(authz("a", rules=[{}]))) is None


def test_inbound_filters_put_authentication_before_authorization() -> None:
    docs = [request_authn("jwt", jwtRules=[{"issuer": "https://iss", "jwks": JWKS}]),
            authz("deny", action="DENY", rules=[{"to": [{"operation": {"paths": ["/admin"]}}]}]),
            authz("allow", rules=[{"from": [{"source": {"requestPrincipals": ["*"]}}]}])]
    policies = workload_policies(*docs)
    assert [f.name for f in inbound_http_filters(policies, "cluster.local")] == [
        "envoy.filters.http.jwt_authn", "envoy.filters.http.rbac", "envoy.filters.http.rbac"]
    assert [f.name for f in inbound_network_filters(policies, "cluster.local")] == [
        "envoy.filters.network.rbac", "envoy.filters.network.rbac"]
    assert inbound_http_filters(workload_policies(), "cluster.local") == []
    assert inbound_network_filters(workload_policies(), "cluster.local") == []
