"""security.istio.io validation: what istiod's webhook rejects is rejected with a reason naming
the field, in both served versions, through the file source as through parse_object."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pilot.config.validation import InvalidObject, parse_object
from pilot.model.store import Store
from pilot.sources.files import FileSource
from tests.support.policies import authz, peer_authn, request_authn

JWKS = '{"keys": [{"kty": "RSA", "e": "AQAB", "n": "sXch"}]}'


def rejected(doc: dict) -> str:
    with pytest.raises(InvalidObject) as e:
        parse_object(doc)
    return e.value.reason


# --- accepted --------------------------------------------------------------------------------------
FULL_RULE = {
    "from": [{"source": {"principals": ["cluster.local/ns/a/sa/b", "*"], "notPrincipals": ["x*"],
                         "requestPrincipals": ["https://iss/sub"], "notRequestPrincipals": ["*"],
                         "namespaces": ["a", "b-*"], "notNamespaces": ["c"],
                         "ipBlocks": ["10.0.0.1", "10.1.0.0/16", "fd00::/8"], "notIpBlocks": ["10.1.2.3"],
                         "remoteIpBlocks": ["1.2.3.4"], "notRemoteIpBlocks": ["5.6.7.0/24"]}}],
    "to": [{"operation": {"hosts": ["example.com", "*.example.com"], "notHosts": ["a.example.com"],
                          "ports": ["8080"], "notPorts": ["9090"], "methods": ["GET"], "notMethods": ["DELETE"],
                          "paths": ["/api/*", "/v1/{*}/x", "/files/{**}"], "notPaths": ["/admin"]}}],
    "when": [{"key": "request.headers[x-token]", "values": ["a"]},
             {"key": "source.ip", "values": ["10.0.0.0/8"], "notValues": ["10.9.9.9"]},
             {"key": "remote.ip", "values": ["1.1.1.1"]}, {"key": "source.namespace", "values": ["ns"]},
             {"key": "source.principal", "values": ["td/ns/a/sa/b"]},
             {"key": "source.serviceAccount", "values": ["sleep", "ns/sleep"]},
             {"key": "source.trustDomain", "values": ["td", "*.corp", "*"]},
             {"key": "request.auth.principal", "values": ["iss/sub"]},
             {"key": "request.auth.audiences", "values": ["aud"]},
             {"key": "request.auth.presenter", "values": ["azp"]},
             {"key": "request.auth.claims[groups]", "values": ["g"]},
             {"key": "request.auth.claims[nested][key]", "values": ["v"]},
             {"key": "destination.ip", "values": ["10.0.0.1"]}, {"key": "destination.port", "values": ["80"]},
             {"key": "connection.sni", "values": ["*.example.com"]},
             {"key": "experimental.envoy.filters.network.mysql_proxy[db.table]", "values": ["[update]"]}],
}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_full_policies_are_accepted_in_both_versions(version: str) -> None:
    docs = [authz("all", rules=[FULL_RULE]),
            authz("deny", action="DENY", rules=[{}]),
            authz("audit", action="AUDIT", rules=[{"to": [{"operation": {"paths": ["/x"]}}]}]),
            authz("custom", action="CUSTOM", provider={"name": "ext"}, rules=[{"to": [{"operation": {"paths": ["/x"]}}]}]),
            authz("allow-nothing"),
            authz("sa", rules=[{"from": [{"source": {
                "serviceAccounts": ["sleep", "other/sleep"], "trustDomains": ["td", "*.corp"],
                "notTrustDomains": ["x*"]}}]}]),
            authz("gw", targetRefs=[{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"}]),
            peer_authn("strict", mtls={"mode": "STRICT"}),
            peer_authn("ports", selector={"matchLabels": {"app": "web"}}, portLevelMtls={8080: {"mode": "DISABLE"}}),
            request_authn("jwt", selector={"matchLabels": {"app": "web"}}, jwtRules=[{
                "issuer": "https://iss", "audiences": ["a"], "jwks": JWKS,
                "fromHeaders": [{"name": "x-jwt", "prefix": "Bearer "}], "fromParams": ["tok"],
                "fromCookies": ["session"], "outputPayloadToHeader": "x-payload", "forwardOriginalToken": True,
                "outputClaimToHeaders": [{"header": "x-sub", "claim": "sub"}], "timeout": "5s"}]),
            request_authn("uri", jwtRules=[{"issuer": "https://iss", "jwksUri": "https://iss:8443/keys"}])]
    for doc in docs:
        doc["apiVersion"] = f"security.istio.io/{version}"
        obj = parse_object(doc)
        assert obj.kind == doc["kind"] and obj.metadata.name == doc["metadata"]["name"]
    pa = parse_object(docs[8])
    assert pa.spec.port_modes() == {8080: "DISABLE"} and pa.spec.mode == "UNSET"
    rule = parse_object(docs[0]).spec.rules[0]
    assert rule.from_[0].source.not_remote_ip_blocks == ["5.6.7.0/24"]
    assert rule.to[0].operation.not_paths == ["/admin"]


def test_unknown_version_names_the_ones_served() -> None:
    doc = authz("x")
    doc["apiVersion"] = "security.istio.io/v1alpha1"
    assert "want security.istio.io/v1, security.istio.io/v1beta1" in rejected(doc)


# --- rejected -------------------------------------------------------------------------------------
def rule(**kw) -> list[dict]:
    return [kw]


REJECTIONS = [
    (authz("x", action="DENY"), "DENY action without `rules` is meaningless"),
    (authz("x", action="DENY", rules=[]), "DENY action without `rules` is meaningless"),
    (authz("x", action="CUSTOM", rules=[{}]), "`provider.name` must not be empty"),
    (authz("x", action="CUSTOM", provider={"name": "p"}), "CUSTOM action without `rules` is meaningless"),
    (authz("x", action="CUSTOM", provider={"name": "p"},
           rules=rule(**{"from": [{"source": {"principals": ["a"]}}]})),
     "From.Principals is currently not supported with CUSTOM action"),
    (authz("x", action="CUSTOM", provider={"name": "p"},
           rules=rule(when=[{"key": "request.auth.claims[a]", "values": ["b"]}])),
     "request.auth.claims[a] is currently not supported with CUSTOM action"),
    (authz("x", provider={"name": "p"}, rules=[{}]), "`provider` must not be with non CUSTOM action, found ALLOW"),
    (authz("x", action="BLOCK"), "action"),
    (authz("x", rules=[None]), "`rule` must not be nil, found at rule 0"),
    (authz("x", rules=rule(**{"from": []})), "`from` must not be empty, found at rule 0"),
    (authz("x", rules=rule(**{"from": [{}]})), "`from.source` must not be nil, found at rule 0"),
    (authz("x", rules=rule(**{"from": [{"source": {}}]})), "`from.source` must not be empty, found at rule 0"),
    (authz("x", rules=rule(to=[])), "`to` must not be empty, found at rule 0"),
    (authz("x", rules=rule(to=[{}])), "`to.operation` must not be nil, found at rule 0"),
    (authz("x", rules=rule(to=[{"operation": {}}])), "`to.operation` must not be empty, found at rule 0"),
    (authz("x", rules=rule(**{"from": [{"source": {"ipBlocks": ["10.0.0.0/33"]}}]})), "bad CIDR range (10.0.0.0/33)"),
    (authz("x", rules=rule(**{"from": [{"source": {"notRemoteIpBlocks": ["nope"]}}]})), "bad IP address (nope)"),
    (authz("x", rules=rule(**{"from": [{"source": {"principals": [""]}}]})), "empty value not allowed, found in Principals"),
    (authz("x", rules=rule(**{"from": [{"source": {"namespaces": ["a"], "serviceAccounts": ["b"]}}]})),
     "cannot set serviceAccounts with namespaces or principals"),
    (authz("x", rules=rule(to=[{"operation": {"ports": ["http"]}}])), "bad port (http)"),
    (authz("x", rules=rule(to=[{"operation": {"notPorts": ["70000"]}}])), "bad port (70000)"),
    (authz("x", rules=rule(to=[{"operation": {"methods": [""]}}])), "empty value not allowed, found in Methods"),
    (authz("x", rules=rule(to=[{"operation": {"paths": ["/{name}/{*}"]}}])),
     "invalid or unsupported path template, found in Paths"),
    (authz("x", rules=rule(when=[{"key": "", "values": ["a"]}])), "`key` must not be empty"),
    (authz("x", rules=rule(when=[{"key": "source.ip"}])),
     "at least one of `values` or `notValues` must be set for key source.ip"),
    (authz("x", rules=rule(when=[{"key": "request.foo", "values": ["a"]}])),
     "invalid `value` for `key` request.foo: unknown attribute: request.foo"),
    (authz("x", rules=rule(when=[{"key": "request.headers", "values": ["a"]}])),
     "bad key (request.headers): should have format a[b]"),
    (authz("x", rules=rule(when=[{"key": "destination.port", "values": ["99999"]}])), "bad port (99999)"),
    (authz("x", rules=rule(when=[{"key": "source.ip", "notValues": ["1.2.3"]}])),
     "invalid `notValue` for `key` source.ip: bad IP address (1.2.3)"),
    (authz("x", rules=rule(when=[{"key": "destination.namespace", "values": ["a"]}])),
     "attribute destination.namespace is replaced by the metadata.namespace"),
    (authz("x", rules=rule(when=[{"key": "destination.labels[app]", "values": ["a"]}])),
     "is replaced by the workload selector"),
    (authz("x", selector={"matchLabels": {"app": "a"}}, targetRef={"kind": "Service", "name": "a"}),
     "only one of targetRefs or workloadSelector can be set"),
    (authz("x", targetRef={"kind": "Pod", "name": "a"}), "targetRef must be to one of"),
    (authz("x", targetRefs=[{"kind": "Service", "name": "a", "namespace": "other"}]),
     "cross namespace referencing is not supported"),
    (authz("x", targetRefs=[{"kind": "Service"}]), "targetRef name must be set"),
    (authz("x", selector={"matchLabels": {"app": "*"}}), "wildcard is not supported in selector"),
    (peer_authn("x", portLevelMtls={8080: {"mode": "STRICT"}}),
     "portLevelMtls: mesh/namespace peer authentication cannot have port level mTLS"),
    (peer_authn("x", selector={"matchLabels": {"app": "a"}}, portLevelMtls={}),
     "port level mTLS, if defined, must have at least one element"),
    (peer_authn("x", selector={"matchLabels": {"app": "a"}}, portLevelMtls={0: {"mode": "STRICT"}}),
     "portLevelMtls: port 0 must be in range 1..65535"),
    (peer_authn("x", mtls={"mode": "MUTUAL"}), "mtls.mode"),
    (request_authn("x", jwtRules=[{"audiences": ["a"]}]), "jwtRules[0]: issuer or jwksUri must be non-empty string"),
    (request_authn("x", jwtRules=[{"issuer": "i", "audiences": [""]}]), "audience must be non-empty string"),
    (request_authn("x", jwtRules=[{"issuer": "i", "jwksUri": "ftp://keys"}]), "URI scheme 'ftp' is not supported"),
    (request_authn("x", jwtRules=[{"issuer": "i", "jwksUri": "https://h:port/"}]), "jwksUri 'https://h:port/'"),
    (request_authn("x", jwtRules=[{"issuer": "i", "jwks": "{not json"}]), "jwks parse error: not JSON"),
    (request_authn("x", jwtRules=[{"issuer": "i", "jwks": '{"keys": [{"n": "x"}]}'}]),
     'jwks parse error: key 0 has no "kty"'),
    (request_authn("x", jwtRules=[{"issuer": "i", "fromHeaders": [{"prefix": "Bearer "}]}]),
     "location header name must be non-empty string"),
    (request_authn("x", jwtRules=[{"issuer": "i", "fromParams": [""]}]), "location query must be non-empty string"),
    (request_authn("x", jwtRules=[{"issuer": "i", "fromCookies": [""]}]), "cookie name must be non-empty string"),
    (request_authn("x", jwtRules=[{"issuer": "i", "outputClaimToHeaders": [{"header": "x"}]}]),
     "outputClaimToHeaders header and claim value must be non-empty string"),
    (request_authn("x", jwtRules=[{"issuer": "i", "outputClaimToHeaders": [{"header": "x y", "claim": "c"}]}]),
     "header name x y is not a valid header name"),
    (request_authn("x", jwtRules=[{"issuer": "i", "timeout": "0.5ms"}]), "must be greater than 1ms"),
    # trust domains and the keys istiod 1.30 added (pkg/config/security CheckTrustDomainValues,
    # CheckWildcardValues, CheckServiceAccount)
    (authz("x", rules=rule(**{"from": [{"source": {"trustDomains": ["a/b"]}}]})),
     "trust domain must not contain '/', found in TrustDomains"),
    (authz("x", rules=rule(**{"from": [{"source": {"notTrustDomains": ["a*b"]}}]})),
     "wildcard is only allowed at the start or end, found in NotTrustDomains"),
    (authz("x", rules=rule(**{"from": [{"source": {"trustDomains": ["*a*"]}}]})),
     "at most one wildcard is allowed"),
    (authz("x", rules=rule(**{"from": [{"source": {"trustDomains": [""]}}]})),
     "empty value not allowed, found in TrustDomains"),
    (authz("x", rules=rule(**{"from": [{"source": {"serviceAccounts": ["a/b/c"]}}]})),
     "expected format 'serviceAccount' or 'namespace/serviceAccount', found 'a/b/c' in ServiceAccounts"),
    (authz("x", rules=rule(**{"from": [{"source": {"serviceAccounts": ["ns/*"]}}]})),
     "wildcard not allowed, found in ServiceAccounts"),
    (authz("x", rules=rule(when=[{"key": "source.trustDomain", "values": ["a*b"]}])),
     "invalid `value` for `key` source.trustDomain: wildcard is only allowed at the start or end"),
    (authz("x", rules=rule(when=[{"key": "source.serviceAccount", "notValues": ["/sa"]}])),
     "invalid `notValue` for `key` source.serviceAccount: expected format"),
    (authz("x", action="CUSTOM", provider={"name": "p"},
           rules=rule(**{"from": [{"source": {"trustDomains": ["td"]}}]})),
     "From.TrustDomains is currently not supported with CUSTOM action"),
    (authz("x", action="CUSTOM", provider={"name": "p"},
           rules=rule(when=[{"key": "source.trustDomain", "values": ["td"]}])),
     "source.trustDomain is currently not supported with CUSTOM action"),
    # strict: what the API does not have is refused with its path, never dropped
    (authz("x", rules=rule(**{"from": [{"source": {"namespaces": ["foo"],
                                                   "trustDomain": ["other.domain"]}}]})),
     "spec.rules[0].from[0].source.trustDomain: unknown field"),
    (authz("x", rules=rule(to=[{"operation": {"method": ["GET"]}}])),
     "spec.rules[0].to[0].operation.method: unknown field"),
    (authz("x", rules=rule(when=[{"key": "source.ip", "value": ["1.2.3.4"]}])),
     "spec.rules[0].when[0].value: unknown field"),
    (authz("x", selector={"matchLabel": {"app": "a"}}), "spec.selector.matchLabel: unknown field"),
    (authz("x", rulez=[{}]), "spec.rulez: unknown field"),
    (authz("x", provider={"name": "p", "port": 9}, action="CUSTOM", rules=[{}]),
     "spec.provider.port: unknown field"),
    (authz("x", targetRefs=[{"kind": "Service", "name": "a", "sectionName": "http"}]),
     "spec.targetRefs[0].sectionName: unknown field"),
    (peer_authn("x", mtls={"mode": "STRICT", "strict": True}), "spec.mtls.strict: unknown field"),
    (peer_authn("x", portLevelMTLS={8080: {"mode": "STRICT"}}), "spec.portLevelMTLS: unknown field"),
    (request_authn("x", jwtRules=[{"issuer": "i", "jwksURI": "https://k"}]),
     "spec.jwtRules[0].jwksURI: unknown field"),
    (request_authn("x", jwtRules=[{"issuer": "i", "fromHeaders": [{"name": "a", "prefx": "B"}]}]),
     "spec.jwtRules[0].fromHeaders[0].prefx: unknown field"),
]


@pytest.mark.parametrize(("doc", "reason"), REJECTIONS,
                         ids=[f"{d['kind']}-{r[:40]}" for d, r in REJECTIONS])
def test_rejections_name_the_field_and_reason(doc: dict, reason: str) -> None:
    assert reason in rejected(doc)


def test_proto_field_names_and_top_level_status_are_accepted() -> None:
    """istiod decodes the proto (snake_case) names too, and Kubernetes objects carry `status`."""
    doc = authz("x", rules=[{"from": [{"source": {"not_trust_domains": ["td"],
                                                  "ip_blocks": ["10.0.0.0/8"]}}]}])
    doc["status"] = {"conditions": [{"type": "Accepted", "status": "True"}]}
    obj = parse_object(doc)
    src = obj.spec.rules[0].from_[0].source
    assert src.not_trust_domains == ["td"] and src.ip_blocks == ["10.0.0.0/8"]
    pa = peer_authn("p", selector={"matchLabels": {"app": "a"}}, port_level_mtls={80: {"mode": "DISABLE"}})
    assert parse_object(pa).spec.port_modes() == {80: "DISABLE"}


def test_a_misspelt_spec_is_refused_not_read_as_an_empty_one() -> None:
    """`specs:` would otherwise give a PeerAuthentication that enforces nothing."""
    doc = peer_authn("x", mtls={"mode": "STRICT"})
    doc["specs"] = doc.pop("spec")
    assert rejected(doc) == "specs: unknown field"
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r"},
             "sepc": {"rules": [{}]}}
    assert "sepc: unknown field" in rejected(route)


def test_the_file_source_loads_policies_and_rejects_bad_ones_precisely(tmp_path: Path) -> None:
    good = [authz("allow-get", "shop", rules=[{"to": [{"operation": {"methods": ["GET"]}}]}]),
            peer_authn("strict", "shop", mtls={"mode": "STRICT"}),
            request_authn("jwt", "shop", jwtRules=[{"issuer": "https://iss", "jwks": JWKS}])]
    bad = authz("broken", "shop", action="DENY")
    (tmp_path / "policies.yaml").write_text(yaml.safe_dump_all([*good, bad]))
    store = Store()
    FileSource(tmp_path, store).load()
    assert {(k, e.key.name) for k in ("AuthorizationPolicy", "PeerAuthentication", "RequestAuthentication")
            for e in store.list(k)} == {("AuthorizationPolicy", "allow-get"), ("PeerAuthentication", "strict"),
                                        ("RequestAuthentication", "jwt")}
    [rejection] = store.rejections()
    assert (rejection.kind, rejection.namespace, rejection.name) == ("AuthorizationPolicy", "shop", "broken")
    assert "DENY action without `rules`" in rejection.reason and "policies.yaml" in rejection.source
