"""AuthorizationPolicy and PeerAuthentication as ztunnel's L4 Authorization, field by field, from
real validated objects through the real builder."""

from __future__ import annotations

import ipaddress

from google.protobuf import json_format

from pilot.gen.workloadapi.security import authorization_pb2 as sec
from pilot.model.ambient.index import ambient_index
from pilot.networking.ztunnel_authz import authorization
from tests.support.policies import authz, peer_authn
from tests.unit.helpers import World


def build(*docs: dict):
    w = World()
    w.apply(*docs)
    index = ambient_index(w.ctx())
    return index, {n: authorization(p) for n, p in index.policies.items()}


def cidr(a: sec.Address) -> str:
    return f"{ipaddress.ip_address(a.address)}/{a.length}"


def strings(ms) -> list[tuple[str, str]]:
    return [(m.WhichOneof("match_type"), getattr(m, m.WhichOneof("match_type")) if
             m.WhichOneof("match_type") != "presence" else "") for m in ms]


def test_l4_allow_policy_field_by_field():
    index, out = build(authz("cart-in", "shop", selector={"matchLabels": {"app": "cart"}}, rules=[{
        "from": [{"source": {"principals": ["cluster.local/ns/shop/sa/front", "cluster.local/ns/web/*", "*/sa/admin", "*"],
                             "notPrincipals": ["cluster.local/ns/shop/sa/evil"],
                             "namespaces": ["shop"], "notNamespaces": ["test-*"],
                             "ipBlocks": ["10.0.0.0/8", "192.168.1.7"], "notIpBlocks": ["10.9.0.0/16"]}},
                 {"source": {"serviceAccounts": ["front", "web/portal"], "notServiceAccounts": ["shop/robot"]}}],
        "to": [{"operation": {"ports": ["8080", "9090"], "notPorts": ["15021"]}}],
        "when": [{"key": "destination.ip", "values": ["10.1.0.0/24"], "notValues": ["10.1.0.9"]},
                 {"key": "source.namespace", "notValues": ["kube-system"]}]}]))
    p = out["shop/cart-in"]
    assert (p.name, p.namespace, p.scope, p.action) == ("cart-in", "shop", sec.WORKLOAD_SELECTOR, sec.ALLOW)
    [group] = p.groups
    to, frm, when_ip, when_ns = group.rules
    [op] = to.matches
    assert list(op.destination_ports) == [8080, 9090] and list(op.not_destination_ports) == [15021]
    src1, src2 = frm.matches
    assert strings(src1.principals) == [("exact", "cluster.local/ns/shop/sa/front"), ("prefix", "cluster.local/ns/web/"),
                                        ("suffix", "/sa/admin"), ("presence", "")]
    assert strings(src1.not_principals) == [("exact", "cluster.local/ns/shop/sa/evil")]
    assert strings(src1.namespaces) == [("exact", "shop")] and strings(src1.not_namespaces) == [("prefix", "test-")]
    assert [cidr(a) for a in src1.source_ips] == ["10.0.0.0/8", "192.168.1.7/32"]
    assert [cidr(a) for a in src1.not_source_ips] == ["10.9.0.0/16"]
    assert [(m.namespace, m.serviceAccount) for m in src2.service_accounts] == [("shop", "front"), ("web", "portal")]
    assert [(m.namespace, m.serviceAccount) for m in src2.not_service_accounts] == [("shop", "robot")]
    [m] = when_ip.matches
    assert [cidr(a) for a in m.destination_ips] == ["10.1.0.0/24"]
    assert [cidr(a) for a in m.not_destination_ips] == ["10.1.0.9/32"]
    [m] = when_ns.matches
    assert strings(m.not_namespaces) == [("exact", "kube-system")] and not m.namespaces
    assert index.statuses == ()


def test_scope_follows_selector_and_namespace_and_waypoint_policies_are_skipped():
    _, out = build(authz("ns-wide", "shop", rules=[{}]),
                   authz("mesh-wide", "istio-system", action="DENY", rules=[{"from": [{"source": {"namespaces": ["bad"]}}]}]),
                   authz("for-waypoint", "shop", targetRefs=[{"kind": "Service", "group": "", "name": "cart"}],
                         rules=[{}]))
    assert set(out) == {"shop/ns-wide", "istio-system/mesh-wide"}
    assert out["shop/ns-wide"].scope == sec.NAMESPACE
    # An empty rule matches everything: one group with no conditions.
    assert len(out["shop/ns-wide"].groups) == 1 and not out["shop/ns-wide"].groups[0].rules
    assert out["istio-system/mesh-wide"].scope == sec.GLOBAL and out["istio-system/mesh-wide"].action == sec.DENY


def test_http_attributes_drop_allow_rules_and_widen_deny_rules_with_a_status():
    index, out = build(
        authz("get-only", "shop", rules=[{"to": [{"operation": {"methods": ["GET"]}}]},
                                         {"from": [{"source": {"namespaces": ["shop"]}}]}]),
        authz("no-admin", "shop", action="DENY", rules=[{
            "from": [{"source": {"requestPrincipals": ["*"]}}],
            "to": [{"operation": {"paths": ["/admin"], "ports": ["8080"]}}]}]),
        authz("audit", "shop", action="AUDIT", rules=[{}]))
    allow = out["shop/get-only"]
    # The GET rule can never match at L4: only the namespace rule is left.
    [group] = allow.groups
    [[m]] = [r.matches for r in group.rules]
    assert strings(m.namespaces) == [("exact", "shop")]
    deny = out["shop/no-admin"]
    [group] = deny.groups
    to, frm = group.rules
    assert list(to.matches[0].destination_ports) == [8080]
    assert json_format.MessageToDict(frm.matches[0]) == {}  # requestPrincipals dropped: matches anyone
    assert "shop/audit" not in out
    status = {s.name: s for s in index.statuses}
    assert status["get-only"].sent and "found: methods" in status["get-only"].message
    assert "rules matching HTTP attributes are omitted" in status["get-only"].message
    assert status["no-admin"].sent and "found: paths, requestPrincipals" in status["no-admin"].message
    assert "enforced without the HTTP rules" in status["no-admin"].message
    assert not status["audit"].sent and status["audit"].message == "ztunnel does not support the AUDIT action"


def test_trust_domains_ztunnel_cannot_check_never_widen_an_allow():
    """ztunnel's Match has no trust domain: istiod 1.30 drops the field there, so
    `{namespaces: [shop], trustDomains: [other]}` would allow all of `shop`. Here the ALLOW rule
    is omitted (allows nothing at L4) and a DENY rule denies whatever the trust domain."""
    index, out = build(
        authz("from-other", "shop", rules=[{"from": [{"source": {"namespaces": ["shop"],
                                                                 "trustDomains": ["other.domain"]}}]}]),
        authz("deny-other", "shop", action="DENY",
              rules=[{"from": [{"source": {"namespaces": ["x"], "notTrustDomains": ["td"]}}]}]))
    assert list(out["shop/from-other"].groups) == []
    [group] = out["shop/deny-other"].groups
    [[m]] = [r.matches for r in group.rules]
    assert strings(m.namespaces) == [("exact", "x")]
    status = {s.name: s for s in index.statuses}
    assert "found: trustDomains" in status["from-other"].message
    assert "found: notTrustDomains" in status["deny-other"].message


def test_peer_authentication_strict_and_port_exceptions():
    index, out = build(
        peer_authn("strict", "shop", mtls={"mode": "STRICT"}),
        peer_authn("db-plain-port", "shop", selector={"matchLabels": {"app": "db"}},
                   mtls={"mode": "STRICT"}, portLevelMtls={"5432": {"mode": "PERMISSIVE"}}),
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-0", "namespace": "shop", "labels": {"app": "db"}},
         "status": {"podIP": "10.1.0.5", "phase": "Running"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": "shop", "labels": {"app": "web"}},
         "status": {"podIP": "10.1.0.6", "phase": "Running"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x-0", "namespace": "other"},
         "status": {"podIP": "10.1.0.7", "phase": "Running"}})
    static = out["istio-system/istio_converted_static_strict"]
    assert (static.scope, static.action) == (sec.WORKLOAD_SELECTOR, sec.DENY)
    assert strings(static.groups[0].rules[0].matches[0].not_principals) == [("presence", "")]
    db = out["shop/converted_peer_authentication_db-plain-port"]
    # Deny callers without identity unless they come to 5432.
    [group] = db.groups
    assert [json_format.MessageToDict(r.matches[0]) for r in group.rules] == [
        {"notPrincipals": [{"presence": {}}]}, {"notDestinationPorts": [5432]}]
    wls = {w.name: w for w in index.workloads.values()}
    assert wls["web-0"].authorization_policies == ("istio-system/istio_converted_static_strict",)
    assert wls["db-0"].authorization_policies == ("shop/converted_peer_authentication_db-plain-port",)
    assert wls["x-0"].authorization_policies == ()


def test_workloads_list_only_the_selector_policies_that_select_them():
    w = World()
    w.apply(authz("cart-only", "shop", selector={"matchLabels": {"app": "cart"}}, rules=[{}]),
            authz("everyone", "shop", rules=[{}]),
            authz("mesh-carts", "istio-system", selector={"matchLabels": {"app": "cart"}}, rules=[{}]),
            authz("ext", "shop", action="CUSTOM", provider={"name": "opa"}, selector={"matchLabels": {"app": "cart"}},
                  rules=[{}]),
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cart-0", "namespace": "shop",
                                                              "labels": {"app": "cart"}},
             "status": {"podIP": "10.1.0.5", "phase": "Running"}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": "shop",
                                                              "labels": {"app": "web"}},
             "status": {"podIP": "10.1.0.6", "phase": "Running"}})
    index = ambient_index(w.ctx())
    wls = {x.name: x for x in index.workloads.values()}
    # Namespace- and mesh-scoped ones apply by scope; CUSTOM is never sent.
    assert wls["cart-0"].authorization_policies == ("istio-system/mesh-carts", "shop/cart-only")
    assert wls["web-0"].authorization_policies == ()
