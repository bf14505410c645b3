"""Every shape the policy builders produce passes `envoy --mode validate`: the jwt_authn and RBAC
HTTP filters inside an HCM and the network RBAC filters in front of a tcp_proxy, in a static
bootstrap (tests/support/static_config.policy_bootstrap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pilot.networking.policy_filters import inbound_http_filters, inbound_network_filters
from tests.support.envoy import envoy_validate
from tests.support.policies import ROOT_NS, authz, request_authn, workload_policies
from tests.support.static_config import policy_bootstrap

from .test_authn import Issuer
from .test_security_config import FULL_RULE

pytestmark = pytest.mark.timeout(60)


def every_shape() -> list[dict]:
    rs, ec = Issuer("RS256", issuer="https://rs.example"), Issuer("ES256", issuer="https://ec.example")
    return [
        authz("full", rules=[FULL_RULE, {}]),
        authz("sa", rules=[{"from": [{"source": {"serviceAccounts": ["sleep", "other/bot"],
                                                 "notServiceAccounts": ["evil"]}}]}]),
        authz("td", rules=[{"from": [{"source": {"trustDomains": ["cluster.local", "*.corp", "td-*", "*"],
                                                 "notTrustDomains": ["old.td"]}}]}]),
        authz("deny", ROOT_NS, action="DENY", rules=[FULL_RULE]),
        authz("audit", action="AUDIT", rules=[{"to": [{"operation": {"paths": ["/audit/*"]}}]}]),
        authz("dry", annotations={"istio.io/dry-run": "true"}, rules=[{"when": [
            {"key": "request.auth.claims[scope]", "values": ["read"]}]}]),
        authz("dry-deny", annotations={"istio.io/dry-run": "true"}, action="DENY", rules=[{}]),
        authz("ext", action="CUSTOM", provider={"name": "opa"}, rules=[{"to": [{"operation": {"paths": ["/x"]}}]}]),
        request_authn("rs", jwtRules=[{"issuer": rs.issuer, "jwks": json.dumps(rs.jwks), "audiences": ["api"],
                                       "outputPayloadToHeader": "x-payload",
                                       "outputClaimToHeaders": [{"header": "x-sub", "claim": "sub"}],
                                       "fromHeaders": [{"name": "x-token", "prefix": "Bearer "}],
                                       "fromParams": ["token"], "fromCookies": ["session"]}]),
        request_authn("ec", jwtRules=[{"issuer": ec.issuer, "jwks": json.dumps(ec.jwks), "forwardOriginalToken": True},
                                      {"issuer": "https://remote.example", "jwksUri": "https://remote.example/keys"}]),
    ]


def bootstrap(docs: list[dict]) -> dict:
    policies = workload_policies(*docs)
    return policy_bootstrap(inbound_http_filters(policies, "cluster.local", ("old.td",)),
                            inbound_network_filters(policies, "cluster.local", ("old.td",)), 18080, 18081)


def test_every_policy_shape_passes_envoy_validate(tmp_path: Path) -> None:
    config = bootstrap(every_shape())
    http_filters = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "http_filters"]
    assert [f["name"] for f in http_filters] == ["envoy.filters.http.jwt_authn"] + ["envoy.filters.http.rbac"] * 4 + [
        "envoy.filters.http.router"]
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the policy filters:\n{output}"


def test_negative_control_an_empty_prefix_is_rejected(tmp_path: Path) -> None:
    config = bootstrap([authz("p", rules=[{"to": [{"operation": {"paths": ["/api/*"]}}]}])])
    text = json.dumps(config)
    assert '"prefix": "/api/"' in text
    ok, output = envoy_validate(json.loads(text.replace('"prefix": "/api/"', '"prefix": ""')), tmp_path)
    assert not ok, "envoy accepted an empty prefix matcher: the validation test cannot fail"
    assert "prefix" in output.lower(), output
