"""AuthorizationPolicy -> Envoy RBAC, compared proto by proto with what istiod generates for each
attribute and action (expected values written as Envoy JSON and parsed into the same messages)."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as network_rbac_pb2
from google.protobuf import json_format

from pilot.networking.authz import http_rbac_filters, network_rbac_filters, with_trust_domains
from tests.support.policies import ROOT_NS, authz, workload_policies

TD = "td.example"
JWT = "envoy.filters.http.jwt_authn"


def http_rbac(*docs: dict, trust_domain: str = TD, aliases: tuple[str, ...] = ()) -> list[http_rbac_pb2.RBAC]:
    out = []
    for f in http_rbac_filters(workload_policies(*docs), trust_domain, aliases):
        assert f.name == "envoy.filters.http.rbac"
        msg = http_rbac_pb2.RBAC()
        assert f.typed_config.Unpack(msg)
        out.append(msg)
    return out


def tcp_rbac(*docs: dict) -> list[network_rbac_pb2.RBAC]:
    out = []
    for f in network_rbac_filters(workload_policies(*docs), TD):
        assert f.name == "envoy.filters.network.rbac"
        msg = network_rbac_pb2.RBAC()
        assert f.typed_config.Unpack(msg)
        assert msg.stat_prefix == "tcp."
        out.append(msg)
    return out


def only_policy(rbac: Any) -> tuple[str, rbac_pb2.Policy]:
    [(name, policy)] = rbac.rules.policies.items()
    return name, policy


def policy(expected: dict) -> rbac_pb2.Policy:
    return json_format.ParseDict(expected, rbac_pb2.Policy())


ANY_PERMISSION = [{"andRules": {"rules": [{"any": True}]}}]
ANY_PRINCIPAL = [{"andIds": {"ids": [{"any": True}]}}]


def with_principal(*terms: dict) -> dict:
    return {"permissions": ANY_PERMISSION, "principals": [{"andIds": {"ids": list(terms)}}]}


def with_permission(*terms: dict) -> dict:
    return {"permissions": [{"andRules": {"rules": list(terms)}}], "principals": ANY_PRINCIPAL}


def or_ids(*ids: dict) -> dict:
    return {"orIds": {"ids": list(ids)}}


def or_rules(*rules: dict) -> dict:
    return {"orRules": {"rules": list(rules)}}


def authn(m: dict) -> dict:
    return {"authenticated": {"principalName": m}}


def rx(expr: str) -> dict:
    return {"safeRegex": {"regex": expr}}


def jwt_claim(path: list[str], string: dict) -> dict:
    return {"metadata": {"filter": JWT, "path": [{"key": k} for k in ["payload", *path]],
                         "value": {"stringMatch": string}}}


def claim_either(path: list[str], string: dict) -> dict:
    one = {"stringMatch": string}
    return {"metadata": {"filter": JWT, "path": [{"key": k} for k in ["payload", *path]],
                         "value": {"orMatch": {"valueMatchers": [{"listMatch": {"oneOf": one}}, one]}}}}


def cidr(prefix: str, length: int) -> dict:
    return {"addressPrefix": prefix, "prefixLen": length}


def allow_from(**source: Any) -> dict:
    return authz("p", rules=[{"from": [{"source": source}]}])


def allow_to(**operation: Any) -> dict:
    return authz("p", rules=[{"to": [{"operation": operation}]}])


def allow_when(key: str, values: list[str], not_values: list[str] | None = None) -> dict:
    cond: dict[str, Any] = {"key": key, "values": values}
    if not_values:
        cond["notValues"] = not_values
    return authz("p", rules=[{"when": [cond]}])


# --- each source attribute --------------------------------------------------------------------------
SOURCE_CASES = [
    ("principals", ["cluster.local/ns/a/sa/b", "*", "pre*", "*-suf"],
     or_ids(authn({"exact": f"spiffe://{TD}/ns/a/sa/b"}), authn(rx(".+")), authn({"prefix": "spiffe://pre"}),
            authn(rx(r"spiffe://.*-suf")))),
    ("namespaces", ["shop", "team-*", "*"],
     or_ids(authn(rx(".*/ns/shop/.*")), authn(rx(".*/ns/team-.*/.*")), authn(rx(".*/ns/.*/.*")))),
    ("ipBlocks", ["10.0.0.1", "10.1.0.0/16", "fd00::1"],
     or_ids({"directRemoteIp": cidr("10.0.0.1", 32)}, {"directRemoteIp": cidr("10.1.0.0", 16)},
            {"directRemoteIp": cidr("fd00::1", 128)})),
    ("remoteIpBlocks", ["1.2.3.0/24"], or_ids({"remoteIp": cidr("1.2.3.0", 24)})),
    ("serviceAccounts", ["sleep", "other/bot.v2"],
     or_ids(authn(rx(r"spiffe://.+/ns/default/(.+/|)sa/sleep(/.+)?")),
            authn(rx(r"spiffe://.+/ns/other/(.+/|)sa/bot\.v2(/.+)?")))),
    ("requestPrincipals", ["https://iss.example/sub-1"],
     or_ids({"andIds": {"ids": [jwt_claim(["iss"], {"exact": "https://iss.example"}),
                                jwt_claim(["sub"], {"exact": "sub-1"})]}})),
    # istiod's srcTrustDomainGenerator: exact is a prefix ending in '/', wildcards stay inside the
    # trust domain ([^/]*), `*` is any SPIFFE peer.
    ("trustDomains", ["other.domain", "*.corp.example", "td-*", "*"],
     or_ids(authn({"prefix": "spiffe://other.domain/"}), authn(rx(r"spiffe://[^/]*\.corp\.example/.*")),
            authn(rx(r"spiffe://td-[^/]*/.*")), authn({"prefix": "spiffe://"}))),
]


@pytest.mark.parametrize(("field", "values", "expected"), SOURCE_CASES, ids=[c[0] for c in SOURCE_CASES])
def test_source_attribute(field: str, values: list[str], expected: dict) -> None:
    [rbac] = http_rbac(allow_from(**{field: values}))
    assert rbac.rules.action == rbac_pb2.RBAC.ALLOW
    name, got = only_policy(rbac)
    assert name == "ns[default]-policy[p]-rule[0]"
    assert got == policy(with_principal(expected))
    # notX is the negation of the same matchers.
    not_field = "not" + field[0].upper() + field[1:]
    [rbac] = http_rbac(allow_from(**{not_field: values}))
    assert only_policy(rbac)[1] == policy(with_principal({"notId": expected}))


REQUEST_PRINCIPALS = [
    ("*", rx(".+"), rx(".+")),
    ("https://iss/*", {"exact": "https://iss"}, rx(".+")),
    ("https://iss/team-*", {"exact": "https://iss"}, {"prefix": "team-"}),
    ("*/bob", rx(".+"), {"exact": "bob"}),
    ("*.example.com/bob", {"suffix": ".example.com"}, {"exact": "bob"}),
    ("*-suffix", rx(".+"), {"suffix": "-suffix"}),
    ("prefix-*", {"prefix": "prefix-"}, rx(".+")),
    ("https://a.example/path/sub", {"exact": "https://a.example/path"}, {"exact": "sub"}),
]


@pytest.mark.parametrize(("value", "iss", "sub"), REQUEST_PRINCIPALS, ids=[c[0] for c in REQUEST_PRINCIPALS])
def test_request_principal_splits_at_the_last_slash(value: str, iss: dict, sub: dict) -> None:
    [rbac] = http_rbac(allow_from(requestPrincipals=[value]))
    expected = or_ids({"andIds": {"ids": [jwt_claim(["iss"], iss), jwt_claim(["sub"], sub)]}})
    assert only_policy(rbac)[1] == policy(with_principal(expected))


def test_source_attributes_are_anded_in_istiods_order() -> None:
    [rbac] = http_rbac(allow_from(ipBlocks=["10.0.0.0/8"], namespaces=["shop"], principals=["*"]))
    assert only_policy(rbac)[1] == policy(with_principal(
        or_ids(authn(rx(".+"))), or_ids(authn(rx(".*/ns/shop/.*"))), or_ids({"directRemoteIp": cidr("10.0.0.0", 8)})))


# --- each operation attribute -----------------------------------------------------------------------
def host(m: dict) -> dict:
    return {"header": {"name": ":authority", **m}}


OPERATION_CASES = [
    ("hosts", ["example.com", "*.example.com", "api.*", "*"],
     or_rules(host({"stringMatch": {"exact": "example.com", "ignoreCase": True}}),
              host({"stringMatch": {"suffix": ".example.com", "ignoreCase": True}}),
              host({"stringMatch": {"prefix": "api.", "ignoreCase": True}}), host({"presentMatch": True}))),
    ("methods", ["GET", "P*", "*"],
     or_rules({"header": {"name": ":method", "stringMatch": {"exact": "GET"}}},
              {"header": {"name": ":method", "stringMatch": {"prefix": "P"}}},
              {"header": {"name": ":method", "presentMatch": True}})),
    ("paths", ["/exact", "/api/*", "*.png", "*"],
     or_rules({"urlPath": {"path": {"exact": "/exact"}}}, {"urlPath": {"path": {"prefix": "/api/"}}},
              {"urlPath": {"path": {"suffix": ".png"}}}, {"urlPath": {"path": rx(".+")}})),
    ("ports", ["8080", "9090"], or_rules({"destinationPort": 8080}, {"destinationPort": 9090})),
]


@pytest.mark.parametrize(("field", "values", "expected"), OPERATION_CASES, ids=[c[0] for c in OPERATION_CASES])
def test_operation_attribute(field: str, values: list[str], expected: dict) -> None:
    [rbac] = http_rbac(allow_to(**{field: values}))
    assert only_policy(rbac)[1] == policy(with_permission(expected))
    not_field = "not" + field[0].upper() + field[1:]
    [rbac] = http_rbac(allow_to(**{not_field: values}))
    assert only_policy(rbac)[1] == policy(with_permission({"notRule": expected}))


def test_path_templates_become_uri_template_matchers() -> None:
    [rbac] = http_rbac(allow_to(paths=["/v1/{*}/items/{**}"]))
    [term] = only_policy(rbac)[1].permissions[0].and_rules.rules[0].or_rules.rules
    assert term.uri_template.name == "uri-template"
    from envoy.extensions.path.match.uri_template.v3 import uri_template_match_pb2
    config = uri_template_match_pb2.UriTemplateMatchConfig()
    assert term.uri_template.typed_config.Unpack(config)
    assert config.path_template == "/v1/*/items/**"


# --- each `when` condition ---------------------------------------------------------------------------
WHEN_PRINCIPAL_CASES = [
    ("source.ip", ["10.0.0.0/8"], or_ids({"directRemoteIp": cidr("10.0.0.0", 8)})),
    ("remote.ip", ["1.2.3.4"], or_ids({"remoteIp": cidr("1.2.3.4", 32)})),
    ("source.namespace", ["shop"], or_ids(authn(rx(".*/ns/shop/.*")))),
    ("source.principal", ["cluster.local/ns/a/sa/b"], or_ids(authn({"exact": f"spiffe://{TD}/ns/a/sa/b"}))),
    ("source.serviceAccount", ["sleep", "other/bot"],
     or_ids(authn(rx(r"spiffe://.+/ns/default/(.+/|)sa/sleep(/.+)?")),
            authn(rx(r"spiffe://.+/ns/other/(.+/|)sa/bot(/.+)?")))),
    ("source.trustDomain", ["other.domain", "*.corp"],
     or_ids(authn({"prefix": "spiffe://other.domain/"}), authn(rx(r"spiffe://[^/]*\.corp/.*")))),
    ("request.auth.principal", ["iss/sub"],
     or_ids({"andIds": {"ids": [jwt_claim(["iss"], {"exact": "iss"}), jwt_claim(["sub"], {"exact": "sub"})]}})),
    ("request.auth.audiences", ["api", "web-*"],
     or_ids(claim_either(["aud"], {"exact": "api"}), claim_either(["aud"], {"prefix": "web-"}))),
    ("request.auth.presenter", ["cli"], or_ids(claim_either(["azp"], {"exact": "cli"}))),
    ("request.auth.claims[groups]", ["admin"], or_ids(claim_either(["groups"], {"exact": "admin"}))),
    ("request.auth.claims[realm][role]", ["ops"], or_ids(claim_either(["realm", "role"], {"exact": "ops"}))),
    ("request.auth.claims[a.b]", ["x"], or_ids(claim_either(["a.b"], {"exact": "x"}))),
    ("request.headers[x-user]", ["alice", "*"],
     or_ids({"header": {"name": "x-user", "stringMatch": {"exact": "alice"}}},
            {"header": {"name": "x-user", "presentMatch": True}})),
]


@pytest.mark.parametrize(("key", "values", "expected"), WHEN_PRINCIPAL_CASES, ids=[c[0] for c in WHEN_PRINCIPAL_CASES])
def test_when_condition_on_the_source(key: str, values: list[str], expected: dict) -> None:
    [rbac] = http_rbac(allow_when(key, values))
    assert only_policy(rbac)[1] == policy(with_principal(expected))
    [rbac] = http_rbac(allow_when(key, values, values))
    assert only_policy(rbac)[1] == policy(with_principal(expected, {"notId": expected}))


WHEN_PERMISSION_CASES = [
    ("destination.ip", ["10.0.0.1"], or_rules({"destinationIp": cidr("10.0.0.1", 32)})),
    ("destination.port", ["8080"], or_rules({"destinationPort": 8080})),
    ("connection.sni", ["*.example.com"], or_rules({"requestedServerName": {"suffix": ".example.com"}})),
    ("experimental.envoy.filters.network.mysql_proxy[db.table]", ["[update]", "plain"],
     or_rules({"metadata": {"filter": "envoy.filters.network.mysql_proxy", "path": [{"key": "db.table"}],
                            "value": {"listMatch": {"oneOf": {"stringMatch": {"exact": "update"}}}}}},
              {"metadata": {"filter": "envoy.filters.network.mysql_proxy", "path": [{"key": "db.table"}],
                            "value": {"stringMatch": {"exact": "plain"}}}})),
]


@pytest.mark.parametrize(("key", "values", "expected"), WHEN_PERMISSION_CASES,
                         ids=[c[0] for c in WHEN_PERMISSION_CASES])
def test_when_condition_on_the_destination(key: str, values: list[str], expected: dict) -> None:
    [rbac] = http_rbac(allow_when(key, values))
    assert only_policy(rbac)[1] == policy(with_permission(expected))


def test_when_conditions_join_every_from_and_to_entry() -> None:
    doc = authz("p", rules=[{"from": [{"source": {"namespaces": ["a"]}}, {"source": {"namespaces": ["b"]}}],
                             "to": [{"operation": {"methods": ["GET"]}}],
                             "when": [{"key": "source.ip", "values": ["10.0.0.0/8"]},
                                      {"key": "destination.port", "values": ["80"]}]}])
    [rbac] = http_rbac(doc)
    got = only_policy(rbac)[1]
    ip = or_ids({"directRemoteIp": cidr("10.0.0.0", 8)})
    assert got == policy({
        "permissions": [{"andRules": {"rules": [
            or_rules({"header": {"name": ":method", "stringMatch": {"exact": "GET"}}}),
            or_rules({"destinationPort": 80})]}}],
        "principals": [{"andIds": {"ids": [or_ids(authn(rx(".*/ns/a/.*"))), ip]}},
                       {"andIds": {"ids": [or_ids(authn(rx(".*/ns/b/.*"))), ip]}}]})


# --- actions, filters and names -------------------------------------------------------------------------
def test_one_filter_per_action_in_istiods_order_with_rule_names() -> None:
    docs = [authz("allow-get", rules=[{"to": [{"operation": {"methods": ["GET"]}}]}, {}]),
            authz("deny-admin", ROOT_NS, action="DENY", rules=[{"to": [{"operation": {"paths": ["/admin"]}}]}]),
            authz("log-all", action="AUDIT", rules=[{}])]
    audit, deny, allow = http_rbac(*docs)
    assert (audit.rules.action, deny.rules.action, allow.rules.action) == (
        rbac_pb2.RBAC.LOG, rbac_pb2.RBAC.DENY, rbac_pb2.RBAC.ALLOW)
    assert set(allow.rules.policies) == {"ns[default]-policy[allow-get]-rule[0]", "ns[default]-policy[allow-get]-rule[1]"}
    assert set(deny.rules.policies) == {f"ns[{ROOT_NS}]-policy[deny-admin]-rule[0]"}
    assert allow.rules.policies["ns[default]-policy[allow-get]-rule[1]"] == policy(
        {"permissions": ANY_PERMISSION, "principals": ANY_PRINCIPAL})
    assert not any(r.HasField("shadow_rules") for r in (audit, deny, allow))


def test_no_policy_no_filter_and_an_allow_policy_without_rules_allows_nothing() -> None:
    assert http_rbac() == [] and tcp_rbac() == []
    [rbac] = http_rbac(authz("allow-nothing"))
    name, got = only_policy(rbac)
    assert name == "ns[default]-policy[allow-nothing]-rule[0]" and rbac.rules.action == rbac_pb2.RBAC.ALLOW
    assert got == policy({"permissions": [{"notRule": {"any": True}}], "principals": [{"notId": {"any": True}}]})


def test_dry_run_policies_become_shadow_rules() -> None:
    dry = authz("dry", annotations={"istio.io/dry-run": "true"}, action="DENY", rules=[{}])
    enforced = authz("real", action="DENY", rules=[{"to": [{"operation": {"paths": ["/x"]}}]}])
    [rbac] = http_rbac(dry)
    assert not rbac.HasField("rules") and rbac.shadow_rules_stat_prefix == "istio_dry_run_deny_"
    assert set(rbac.shadow_rules.policies) == {"ns[default]-policy[dry]-rule[0]"}
    [rbac] = http_rbac(dry, enforced)
    assert set(rbac.rules.policies) == {"ns[default]-policy[real]-rule[0]"}
    assert set(rbac.shadow_rules.policies) == {"ns[default]-policy[dry]-rule[0]"}
    not_dry = authz("dry", annotations={"istio.io/dry-run": "yes"}, rules=[{}])  # not a Go bool: enforced
    [rbac] = http_rbac(not_dry)
    assert set(rbac.rules.policies) == {"ns[default]-policy[dry]-rule[0]"} and not rbac.HasField("shadow_rules")


def test_custom_action_fails_closed_with_istiods_deny_all() -> None:
    custom = authz("ext", action="CUSTOM", provider={"name": "opa"}, rules=[{"to": [{"operation": {"paths": ["/x"]}}]}])
    allow = authz("allow", rules=[{}])
    custom_rbac, allow_rbac = http_rbac(custom, allow)
    assert custom_rbac.rules == json_format.ParseDict({"action": "DENY", "policies": {
        "default-deny-all-due-to-bad-CUSTOM-action": {"permissions": [{"any": True}], "principals": [{"any": True}]}}},
        rbac_pb2.RBAC())
    assert allow_rbac.rules.action == rbac_pb2.RBAC.ALLOW
    [tcp] = tcp_rbac(custom)
    assert tcp.rules == custom_rbac.rules


def test_trust_domain_aliases_expand_local_principals_only() -> None:
    assert with_trust_domains(["cluster.local/ns/a/sa/b", "old.td/ns/a/sa/b", "other.td/ns/a/sa/b", "*/ns/a/sa/b",
                               "*", "ns/a/sa/b"], ("new.td", "old.td")) == [
        "new.td/ns/a/sa/b", "old.td/ns/a/sa/b", "other.td/ns/a/sa/b", "*/ns/a/sa/b", "*", "ns/a/sa/b"]
    [rbac] = http_rbac(allow_from(principals=["cluster.local/ns/a/sa/b"]), trust_domain="new.td", aliases=("old.td",))
    assert only_policy(rbac)[1] == policy(with_principal(or_ids(
        authn({"exact": "spiffe://new.td/ns/a/sa/b"}), authn({"exact": "spiffe://old.td/ns/a/sa/b"}))))


def test_namespaces_and_trust_domains_of_one_source_must_both_match() -> None:
    """The user's report: `{namespaces: [foo], trustDomains: [other.domain]}` must not become
    "anyone in namespace foo"."""
    [rbac] = http_rbac(allow_from(namespaces=["foo"], trustDomains=["other.domain"]))
    assert only_policy(rbac)[1] == policy(with_principal(
        or_ids(authn({"prefix": "spiffe://other.domain/"})), or_ids(authn(rx(".*/ns/foo/.*")))))
    [rbac] = http_rbac(allow_from(notTrustDomains=["other.domain"]))
    other = or_ids(authn({"prefix": "spiffe://other.domain/"}))
    assert only_policy(rbac)[1] == policy(with_principal({"notId": other}))


def test_trust_domains_on_tcp_are_enforced() -> None:
    """A trust domain comes from the peer certificate: the network filter checks it too."""
    [tcp] = tcp_rbac(allow_from(trustDomains=["other.domain"]))
    assert only_policy(tcp)[1] == policy(with_principal(or_ids(authn({"prefix": "spiffe://other.domain/"}))))


def test_trust_domain_values_naming_the_mesh_expand_to_its_aliases() -> None:
    """istiod's ExpandTrustDomainAliases: the mesh's trust domain or an alias stands for all of
    them; another value (and `cluster.local`, unlike principals) is kept as written."""
    [rbac] = http_rbac(allow_from(trustDomains=["old.td", "elsewhere"]), trust_domain="new.td",
                       aliases=("old.td",))
    assert only_policy(rbac)[1] == policy(with_principal(or_ids(
        authn({"prefix": "spiffe://new.td/"}), authn({"prefix": "spiffe://old.td/"}),
        authn({"prefix": "spiffe://elsewhere/"}))))
    [rbac] = http_rbac(allow_when("source.trustDomain", ["new.td"]), trust_domain="new.td",
                       aliases=("old.td",))
    assert only_policy(rbac)[1] == policy(with_principal(or_ids(
        authn({"prefix": "spiffe://new.td/"}), authn({"prefix": "spiffe://old.td/"}))))


# --- TCP: HTTP-only attributes ------------------------------------------------------------------------------
def test_tcp_allow_rule_with_an_http_attribute_is_dropped_so_it_allows_nothing() -> None:
    doc = authz("p", rules=[{"to": [{"operation": {"methods": ["GET"]}}]},
                            {"from": [{"source": {"namespaces": ["shop"]}}], "to": [{"operation": {"ports": ["5432"]}}]},
                            {"from": [{"source": {"requestPrincipals": ["*"]}}]}])
    [rbac] = tcp_rbac(doc)
    assert rbac.rules.action == rbac_pb2.RBAC.ALLOW
    assert set(rbac.rules.policies) == {"ns[default]-policy[p]-rule[1]"}
    assert rbac.rules.policies["ns[default]-policy[p]-rule[1]"] == policy({
        "permissions": [{"andRules": {"rules": [or_rules({"destinationPort": 5432})]}}],
        "principals": [{"andIds": {"ids": [or_ids(authn(rx(".*/ns/shop/.*")))]}}]})
    # Only HTTP rules: an ALLOW filter with no policy at all, which denies every connection.
    [rbac] = tcp_rbac(authz("p", rules=[{"to": [{"operation": {"paths": ["/x"]}}]}]))
    assert rbac.rules.action == rbac_pb2.RBAC.ALLOW and not rbac.rules.policies


def test_tcp_deny_rule_drops_http_values_so_it_denies_more() -> None:
    only_http = authz("p", action="DENY", rules=[{"to": [{"operation": {"paths": ["/admin"], "methods": ["POST"]}}],
                                                  "when": [{"key": "request.headers[x]", "values": ["1"]}]}])
    [rbac] = tcp_rbac(only_http)
    assert only_policy(rbac)[1] == policy({"permissions": ANY_PERMISSION, "principals": ANY_PRINCIPAL})
    mixed = authz("p", action="DENY", rules=[{"from": [{"source": {"namespaces": ["evil"],
                                                                    "notRequestPrincipals": ["*"]}}],
                                              "to": [{"operation": {"ports": ["5432"], "paths": ["/x"]}}]}])
    [rbac] = tcp_rbac(mixed)
    assert only_policy(rbac)[1] == policy({
        "permissions": [{"andRules": {"rules": [or_rules({"destinationPort": 5432})]}}],
        "principals": [{"andIds": {"ids": [or_ids(authn(rx(".*/ns/evil/.*")))]}}]})
    # The same policy keeps every attribute on HTTP.
    [http] = http_rbac(mixed)
    assert len(only_policy(http)[1].principals[0].and_ids.ids) == 2
    assert len(only_policy(http)[1].permissions[0].and_rules.rules) == 2
