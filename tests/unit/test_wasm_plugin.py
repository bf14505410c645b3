"""WasmPlugin: what is refused (with the field's path) and how plugins are picked and ordered."""

from __future__ import annotations

import pytest

from pilot.config.validation import InvalidObject, parse_object
from pilot.model.store import ConfigKey, Entry
from pilot.model.wasm import plan_for


def doc(spec: dict, name: str = "p", namespace: str = "default", created: str = "") -> dict:
    return {"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created}, "spec": spec}


@pytest.mark.parametrize(("spec", "reason"), [
    ({"url": "oci://"}, "needs a registry and repository"),
    ({"url": "oci://ghcr.io/x/y:1", "verificationKey": "-----BEGIN PUBLIC KEY-----"},
     "istio-agent verifies no image signature"),
    ({"url": "https:///p.wasm"}, "https:// needs a host"),
    ({"url": "https://example.com/p.wasm", "imagePullSecret": "creds"}, "imagePullSecret: only used to pull OCI"),
    ({"url": "file://relative.wasm"}, "absolute path"),
    ({"url": "file:///p.wasm", "sha256": "ab" * 32}, "sha256: not supported"),
    ({"url": "file:///p.wasm", "type": "NETWORK"}, "NETWORK is not supported"),
    ({"url": "file:///p.wasm", "imagePullPolicy": "Always"}, "imagePullPolicy: only applies to modules the agent fetches"),
    ({"url": "file:///p.wasm", "phase": "LATE"}, "phase"),
    ({"url": "file:///p.wasm", "vmConfig": {"env": [{"name": "A", "valueFrom": "HOST", "value": "x"}]}},
     "only be set when valueFrom is INLINE"),
    ({"url": "file:///p.wasm", "matches": []}, "matches"),
])
def test_what_cannot_be_applied_is_refused_naming_the_field(spec, reason):
    with pytest.raises(InvalidObject) as e:
        parse_object(doc(spec))
    assert reason in str(e.value)


def test_an_http_module_is_handed_to_the_agent_as_istiod_does():
    from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
    from envoy.extensions.wasm.v3 import wasm_pb2

    from pilot.networking.wasm import extension_config
    sha = "ab" * 32
    e = entry({"url": "https://example.com/p.wasm", "sha256": sha, "imagePullPolicy": "Always",
               "failStrategy": "FAIL_OPEN"}, "p", "default", "", 1)
    (f,) = plan_for({"default": (e,)}, "istio-system", "default", {}).client
    tec = extension_config(f)
    wasm = http_wasm_pb2.Wasm()
    assert tec.typed_config.Unpack(wasm)
    vm = wasm.config.vm_config
    assert vm.code.remote.http_uri.uri == "https://example.com/p.wasm" and vm.code.remote.sha256 == sha
    # The pull policy, and for Always the plugin's revision, which the agent re-fetches on.
    assert dict(vm.environment_variables.key_values) == {"ISTIO_META_WASM_IMAGE_PULL_POLICY": "Always",
                                                         "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1"}
    assert wasm.config.failure_policy == wasm_pb2.FAIL_OPEN


def entry(spec: dict, name: str, namespace: str, created: str, revision: int) -> Entry:
    obj = parse_object(doc(spec, name, namespace, created))
    return Entry(ConfigKey("WasmPlugin", namespace, name), obj, revision, "test")


def test_selection_by_namespace_and_selector_and_order_by_priority_then_age():
    root_wide = entry({"url": "file:///a.wasm"}, "a", "istio-system", "2026-01-02T00:00:00Z", 1)
    older = entry({"url": "file:///b.wasm"}, "b", "default", "2026-01-01T00:00:00Z", 2)
    urgent = entry({"url": "file:///c.wasm", "priority": 5, "selector": {"matchLabels": {"app": "x"}}},
                   "c", "default", "2026-01-03T00:00:00Z", 3)
    elsewhere = entry({"url": "file:///d.wasm"}, "d", "other", "2026-01-01T00:00:00Z", 4)
    server_only = entry({"url": "file:///e.wasm", "match": [{"mode": "SERVER", "ports": [{"number": 8080}]}]},
                        "e", "default", "2026-01-04T00:00:00Z", 5)
    index = {"istio-system": (root_wide,), "default": (older, urgent, server_only), "other": (elsewhere,)}
    plan = plan_for(index, "istio-system", "default", {"app": "x"})
    assert [f.name for f in plan.client] == ["default.c", "default.b", "istio-system.a"]
    assert [f.name for f in plan.server] == ["default.c", "default.b", "istio-system.a", "default.e"]
    assert plan.server[-1].ports == frozenset({8080}) and plan.client[0].ports == frozenset()
    assert [f.name for f in plan_for(index, "istio-system", "default", {"app": "y"}).client] == [
        "default.b", "istio-system.a"]


def test_phases_take_istiods_slots_around_authentication_and_authorization():
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )

    from pilot.networking.wasm import insert

    phases = {"AUTHN": "authn", "AUTHZ": "authz", "STATS": "stats", "UNSPECIFIED_PHASE": "late"}
    index = {"default": tuple(entry({"url": "file:///m.wasm", "phase": phase}, name, "default", "", i)
                              for i, (phase, name) in enumerate(phases.items()))}
    plan = plan_for(index, "istio-system", "default", {})
    chain = [hcm_pb2.HttpFilter(name=n) for n in ("envoy.filters.http.jwt_authn", "envoy.filters.http.rbac",
                                                  "envoy.filters.http.router")]
    assert [f.name for f in insert(chain, plan.server, 8080)] == [
        "default.authn", "envoy.filters.http.jwt_authn", "default.authz", "envoy.filters.http.rbac",
        "default.stats", "default.late", "envoy.filters.http.router"]


def test_a_pull_secret_reaches_only_proven_proxies_of_the_plugins_namespace():
    import base64
    import dataclasses

    from envoy.config.core.v3 import extension_pb2
    from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
    from google.protobuf import any_pb2

    from pilot.xds.generators import ecds
    from tests.unit.helpers import World, proxy

    config = '{"auths": {"registry.example.com": {"auth": "cHVsbGVyOnMzY3JldA=="}}}'

    def secret(namespace: str, stype: str = "kubernetes.io/dockerconfigjson") -> dict:
        return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred", "namespace": namespace},
                "type": stype, "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()}}

    w = World()
    w.apply(doc({"url": "registry.example.com/wasm/p:1", "imagePullSecret": "regcred"}, "p", "shop"),
            doc({"url": "oci://registry.example.com/wasm/q:1", "imagePullSecret": "regcred"}, "q", "istio-system"),
            secret("shop"), secret("istio-system"))

    def env(p, name: str) -> dict[str, str]:
        (res,) = ecds.generate(w.ctx(), p, frozenset({name}), w.cache)
        tec = extension_pb2.TypedExtensionConfig.FromString(any_pb2.Any.FromString(res.any_bytes).value)
        filt = http_wasm_pb2.Wasm()
        tec.typed_config.Unpack(filt)
        assert filt.config.vm_config.code.remote.http_uri.uri.startswith("oci://registry.example.com/wasm/")
        return dict(filt.config.vm_config.environment_variables.key_values)

    proven = dataclasses.replace(proxy("shop"), identity="spiffe://cluster.local/ns/shop/sa/default")
    assert env(proven, "shop.p")["ISTIO_META_WASM_IMAGE_PULL_SECRET"] == config
    # Not proven (plaintext xDS): the variable is there, empty, so the agent fails the pull.
    assert env(proxy("shop"), "shop.p")["ISTIO_META_WASM_IMAGE_PULL_SECRET"] == ""
    # A root-namespace plugin reaches every proxy; its Secret does not leave istio-system.
    assert env(proven, "istio-system.q")["ISTIO_META_WASM_IMAGE_PULL_SECRET"] == ""
    gateway = dataclasses.replace(proxy("istio-system", ptype="router"),
                                  identity="spiffe://cluster.local/ns/istio-system/sa/gw")
    assert env(gateway, "istio-system.q")["ISTIO_META_WASM_IMAGE_PULL_SECRET"] == config
    # Only a docker config Secret is one (another type keeps no such key at all).
    w.apply(secret("shop", "Opaque"))
    assert env(proven, "shop.p")["ISTIO_META_WASM_IMAGE_PULL_SECRET"] == ""


def test_a_gateway_targetref_names_a_gateway_of_the_plugins_own_namespace_only():
    """istiod's ShouldAttachPolicy: a targetRef has no namespace of its own, so a root namespace
    plugin naming Gateway `ingress` is for the root namespace's `ingress`, not every namespace's."""
    gw = {"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "ingress"}
    root = entry({"url": "file:///r.wasm", "targetRefs": [gw]}, "r", "istio-system", "2026-01-01T00:00:00Z", 1)
    local = entry({"url": "file:///l.wasm", "targetRefs": [gw]}, "l", "shop", "2026-01-02T00:00:00Z", 2)
    index = {"istio-system": (root,), "shop": (local,)}
    ingress = {"gateway.networking.k8s.io/gateway-name": "ingress"}
    assert [f.name for f in plan_for(index, "istio-system", "shop", ingress).client] == ["shop.l"]
    assert [f.name for f in plan_for(index, "istio-system", "istio-system", ingress).client] == ["istio-system.r"]
    assert plan_for(index, "istio-system", "other", ingress).client == ()
    # Nor does a targetRef ever select a sidecar that merely shares the namespace.
    assert plan_for(index, "istio-system", "shop", {"app": "ingress"}).client == ()
