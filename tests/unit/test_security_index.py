"""The SecurityIndex: istiod's mTLS precedence and which policies select a workload, as hashable
values that can key the resource cache."""

from __future__ import annotations

from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from pilot.model.security_policies import MtlsPolicy, WorkloadPolicies
from pilot.networking.policy_filters import inbound_http_filters
from pilot.xds.typeurls import LISTENER
from tests.support.policies import ROOT_NS, authz, index_of, peer_authn, request_authn

from .helpers import World

WEB = {"app": "web", "version": "v1"}
T1, T2, T3 = "2024-01-01T00:00:00Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"


def web(labels: dict | None = None) -> dict:
    return {"matchLabels": labels or {"app": "web"}}


# --- mutual TLS -----------------------------------------------------------------------------------
def test_no_peer_authentication_means_permissive() -> None:
    assert index_of().mtls_policy("default", WEB) == MtlsPolicy("PERMISSIVE", ())
    assert index_of().mtls_mode("default", WEB, 8080) == "PERMISSIVE"


def test_narrowest_level_wins_and_unset_inherits() -> None:
    mesh = peer_authn("mesh", ROOT_NS, mtls={"mode": "STRICT"})
    ns = peer_authn("ns", "default", mtls={"mode": "PERMISSIVE"})
    wl = peer_authn("wl", "default", selector=web(), mtls={"mode": "DISABLE"})
    assert index_of(mesh).mtls_mode("default", WEB, 80) == "STRICT"
    assert index_of(mesh).mtls_mode(ROOT_NS, WEB, 80) == "STRICT"
    assert index_of(mesh, ns).mtls_mode("default", WEB, 80) == "PERMISSIVE"
    assert index_of(mesh, ns).mtls_mode("other", WEB, 80) == "STRICT"
    assert index_of(mesh, ns, wl).mtls_mode("default", WEB, 80) == "DISABLE"
    assert index_of(mesh, ns, wl).mtls_mode("default", {"app": "db"}, 80) == "PERMISSIVE"
    # UNSET (or no mtls at all) at a level defers to the level above.
    unset_ns = peer_authn("ns", "default", mtls={"mode": "UNSET"})
    bare_wl = peer_authn("wl", "default", selector=web())
    assert index_of(mesh, unset_ns, bare_wl).mtls_mode("default", WEB, 80) == "STRICT"


def test_port_level_modes_override_and_inherit_the_workload_mode() -> None:
    ns = peer_authn("ns", "default", mtls={"mode": "STRICT"})
    wl = peer_authn("wl", "default", selector=web(), mtls={"mode": "UNSET"},
                    portLevelMtls={"8080": {"mode": "DISABLE"}, "9090": {"mode": "UNSET"}, "7070": {}})
    policy = index_of(ns, wl).mtls_policy("default", WEB)
    assert policy == MtlsPolicy("STRICT", ((7070, "STRICT"), (8080, "DISABLE"), (9090, "STRICT")))
    assert policy.for_port(8080) == "DISABLE" and policy.for_port(80) == "STRICT"
    assert hash(policy) == hash(index_of(ns, wl).mtls_policy("default", WEB))


def test_the_oldest_policy_wins_at_each_level() -> None:
    newer = peer_authn("a-newer", "default", created=T2, mtls={"mode": "DISABLE"})
    older = peer_authn("z-older", "default", created=T1, mtls={"mode": "STRICT"})
    assert index_of(newer, older).mtls_mode("default", WEB, 80) == "STRICT"
    wl_new = peer_authn("a", "default", created=T3, selector=web(), mtls={"mode": "DISABLE"})
    wl_old = peer_authn("b", "default", created=T2, selector=web({"version": "v1"}), mtls={"mode": "PERMISSIVE"})
    assert index_of(older, wl_new, wl_old).mtls_mode("default", WEB, 80) == "PERMISSIVE"
    # Without timestamps (file mode) the name decides.
    assert index_of(peer_authn("b", mtls={"mode": "DISABLE"}),
                    peer_authn("a", mtls={"mode": "STRICT"})).mtls_mode("default", WEB, 80) == "STRICT"


def test_a_workload_policy_in_the_root_namespace_is_ignored_as_in_istiod() -> None:
    root_wl = peer_authn("root-wl", ROOT_NS, selector=web(), mtls={"mode": "DISABLE"})
    assert index_of(root_wl).mtls_mode("default", WEB, 80) == "PERMISSIVE"
    assert index_of(root_wl).mtls_mode(ROOT_NS, WEB, 80) == "PERMISSIVE"


# --- which policies select a workload -------------------------------------------------------------------
def names(p: WorkloadPolicies) -> set[str]:
    return {o.rsplit("/", 2)[-2] + "/" + o.rsplit("/", 1)[-1] for o in p.origins}


def test_selection_by_namespace_root_namespace_selector_and_target_ref() -> None:
    docs = [
        authz("mesh-deny", ROOT_NS, action="DENY", rules=[{"to": [{"operation": {"paths": ["/admin"]}}]}]),
        authz("mesh-web", ROOT_NS, selector=web(), rules=[{}]),
        authz("ns-wide", "default", action="AUDIT", rules=[{}]),
        authz("web-only", "default", selector=web(), rules=[{"to": [{"operation": {"methods": ["GET"]}}]}]),
        authz("db-only", "default", selector=web({"app": "db"}), rules=[{}]),
        authz("other-ns", "other", rules=[{}]),
        authz("svc-target", "default", targetRefs=[{"kind": "Service", "name": "web"}], rules=[{}]),
        authz("gw-target", "default", targetRef={"kind": "Gateway", "group": "gateway.networking.k8s.io",
                                                 "name": "edge"}, rules=[{}]),
        request_authn("jwt", "default", selector=web(), jwtRules=[{"issuer": "https://iss"}]),
        request_authn("mesh-jwt", ROOT_NS, jwtRules=[{"issuer": "https://mesh"}]),
    ]
    idx = index_of(*docs)
    p = idx.for_workload("default", WEB)
    assert names(p) == {f"{ROOT_NS}/mesh-deny", f"{ROOT_NS}/mesh-web", "default/ns-wide", "default/web-only",
                        "default/jwt", f"{ROOT_NS}/mesh-jwt"}
    assert [e.key.name for e in p.deny] == ["mesh-deny"] and [e.key.name for e in p.audit] == ["ns-wide"]
    assert {e.key.name for e in p.allow} == {"mesh-web", "web-only"} and not p.custom
    assert "AuthorizationPolicy/default/web-only" in p.origins and "RequestAuthentication/default/jwt" in p.origins
    # A root-namespace selector reaches matching workloads in every namespace.
    assert names(idx.for_workload("other", WEB)) == {f"{ROOT_NS}/mesh-deny", f"{ROOT_NS}/mesh-web",
                                                     "other/other-ns", f"{ROOT_NS}/mesh-jwt"}
    # A Kubernetes Gateway's proxy is picked by its gateway-name label, and only in its namespace.
    gw = idx.for_workload("default", {"gateway.networking.k8s.io/gateway-name": "edge"})
    assert "default/gw-target" in names(gw) and "default/svc-target" not in names(gw)
    assert "default/gw-target" not in names(idx.for_workload("other", {"gateway.networking.k8s.io/gateway-name":
                                                                        "edge"}))


def test_workload_policies_are_equal_values_that_change_with_any_policy() -> None:
    allow = authz("allow", selector=web(), rules=[{"to": [{"operation": {"methods": ["GET"]}}]}])
    unrelated = authz("db", selector=web({"app": "db"}), rules=[{}])
    a = index_of(allow).for_workload("default", WEB)
    assert a == index_of(allow, unrelated).for_workload("default", WEB)  # same inputs, same value
    assert hash(a) == hash(index_of(allow).for_workload("default", WEB))
    assert not index_of(unrelated).for_workload("default", WEB).authorization_policies
    assert index_of().for_workload("default", WEB).empty


def test_a_policy_edit_changes_the_cache_key_and_the_built_filters() -> None:
    """WorkloadPolicies as a builder argument: an edit rebuilds, an unrelated change does not."""
    world = World()
    world.apply(authz("allow", selector=web(), rules=[{"to": [{"operation": {"methods": ["GET"]}}]}]))

    def filters():
        ctx = world.ctx()
        policies = ctx.security.for_workload("default", WEB)
        return world.cache.resource(LISTENER, "inbound-test", _hcm, policies, ctx.mesh.trust_domain,
                                    origins=policies.origins)

    first = filters()
    world.apply(authz("db", selector=web({"app": "db"}), rules=[{}]))
    assert filters() is first  # served from the cache
    world.apply(authz("allow", selector=web(), rules=[{"to": [{"operation": {"methods": ["POST"]}}]}]))
    edited = filters()
    assert edited.version != first.version and b"POST" in edited.any_bytes and b"POST" not in first.any_bytes
    assert edited.origins == ("AuthorizationPolicy/default/allow",)


def _hcm(policies: WorkloadPolicies, trust_domain: str) -> hcm_pb2.HttpConnectionManager:
    return hcm_pb2.HttpConnectionManager(stat_prefix="t", http_filters=inbound_http_filters(policies, trust_domain))


def test_problems_report_custom_actions_and_unfetched_jwks() -> None:
    idx = index_of(authz("ext", action="CUSTOM", provider={"name": "opa"}, rules=[{}]),
                   request_authn("jwt", jwtRules=[{"issuer": "https://iss", "jwksUri": "https://iss/keys"}]))
    reasons = {(p["kind"], p["name"]): p["reason"] for p in idx.problems}
    assert "available providers are [] but found 'opa'" in reasons[("AuthorizationPolicy", "ext")]
    assert "jwksUri https://iss/keys are not fetched" in reasons[("RequestAuthentication", "jwt")]
    fetched = index_of(request_authn("jwt", jwtRules=[{"issuer": "https://iss", "jwksUri": "https://iss/keys"}]),
                       jwks={"https://iss/keys": '{"keys": []}'})
    assert fetched.problems == ()
    assert fetched.for_workload("default", WEB).jwks == (("https://iss/keys", '{"keys": []}'),)
