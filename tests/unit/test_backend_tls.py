"""BackendTLSPolicy, pure: parsing refusals, status reasons (istiod's), the upstream TLS it puts
on the clusters of the Service it targets (routers and sidecars alike), precedence under a
user's DestinationRule, and the cache keys / push scope a policy or ConfigMap change reaches.
tests/e2e/test_gateway_api_backend_tls.py proves the traffic through a real Envoy."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2

from pilot.config.validation import InvalidObject, parse_object
from pilot.model import dependencies
from pilot.model.gateway_api.conditions import merge_ancestors, stamp
from pilot.model.store import ConfigKey
from pilot.xds.generators import cds
from tests.support.certs import issue, make_ca

from .helpers import World, proxy

API = "gateway.networking.k8s.io"
HOST = "secure.default.svc.cluster.local"
CLUSTER = f"outbound|443||{HOST}"
CA = make_ca("backend CA")
OTHER_CA = make_ca("someone else's CA")


def docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(textwrap.dedent(text)) if d]


def policy(name: str = "tls", *, validation: str = "caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}]",
           targets: str = "[{group: '', kind: Service, name: secure}]", hostname: str = "secure.example.com",
           created: str = "2026-01-01T00:00:00Z", extra: str = "") -> dict:
    return docs(f"""\
        apiVersion: {API}/v1
        kind: BackendTLSPolicy
        metadata: {{name: {name}, namespace: default, generation: 2, creationTimestamp: '{created}'{extra}}}
        spec:
          targetRefs: {targets}
          validation: {{hostname: {hostname}, {validation}}}
        """)[0]


def config_map(pem: bytes | str, name: str = "ca", key: str = "ca.crt") -> dict:
    data = pem.decode() if isinstance(pem, bytes) else pem
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
            "data": {key: data}}


SERVICE = docs("""\
    apiVersion: v1
    kind: Service
    metadata: {name: secure, namespace: default}
    spec: {clusterIP: 10.96.0.50, ports: [{name: https, port: 443}, {name: admin, port: 8443}]}
    """)[0]


@pytest.fixture
def world() -> World:
    w = World()
    w.apply(SERVICE)
    return w


def status(w: World, name: str = "tls") -> list[dict]:
    return w.ctx().gateway_api.statuses[ConfigKey("BackendTLSPolicy", "default", name)]["ancestors"]


def conds(ancestor: dict) -> dict:
    return {c["type"]: (c["status"], c["reason"]) for c in ancestor["conditions"]}


def upstream_tls(w: World, name: str = CLUSTER, p=None) -> tls_pb2.UpstreamTlsContext | None:
    c = w.cds(p or proxy())[name].message(cluster_pb2.Cluster)
    if not c.HasField("transport_socket") or c.transport_socket.name != "envoy.transport_sockets.tls":
        return None
    ctx = tls_pb2.UpstreamTlsContext()
    assert c.transport_socket.typed_config.Unpack(ctx)
    return ctx


def sans(ctx: tls_pb2.UpstreamTlsContext) -> list[tuple[int, str]]:
    return [(m.san_type, m.matcher.exact) for m in ctx.common_tls_context.validation_context.match_typed_subject_alt_names]


# --- parsing ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, reason", [
    ({"spec.options": {"example.com/min-version": "1.3"}}, "spec.options: options is not supported"),
    ({"spec.validation.wellKnownCACertificates": "System"},
     "must not contain both CACertificateRefs and WellKnownCACertificates"),
    ({"spec.validation.caCertificateRefs": []}, "must specify either CACertificateRefs or WellKnownCACertificates"),
    ({"spec.validation.hostname": "*.example.com"}, "spec.validation.hostname"),
    ({"spec.validation.subjectAltNames": [{"type": "URI", "hostname": "a.example.com"}]},
     "must not contain Hostname, if Type is not set to Hostname"),
    ({"spec.validation.subjectAltNames": [{"type": "URI", "uri": "no-scheme"}]}, "is not an absolute URI"),
    ({"spec.targetRefs": []}, "spec.targetRefs"),
    ({"spec.targetRefs": [{"group": "", "kind": "Service", "name": "a"}, {"group": "", "kind": "Service",
                                                                          "name": "a", "sectionName": "x"}]},
     "sectionName must be specified when targetRefs includes 2 or more references to the same target"),
    ({"spec.validation.subjectAltNames": [{"type": "DNS", "hostname": "a"}]}, "spec.validation.subjectAltNames[0].type"),
    ({"spec.unknown": 1}, "spec.unknown"),
])
def test_invalid_policies_are_refused_with_their_path(change: dict, reason: str):
    doc = policy()
    for path, value in change.items():
        target = doc
        *parents, last = path.split(".")
        for p in parents:
            target = target[p]
        target[last] = value
    with pytest.raises(InvalidObject) as e:
        parse_object(doc)
    assert reason in e.value.reason


def test_only_v1_is_read():
    doc = policy()
    doc["apiVersion"] = f"{API}/v1alpha3"
    with pytest.raises(InvalidObject):
        parse_object(doc)


# --- what clusters get --------------------------------------------------------------------------------
def test_configmap_ca_hostname_and_sans_become_the_clusters_upstream_tls(world: World):
    assert upstream_tls(world) is None  # no policy: plaintext (no sidecar endpoints, no auto mTLS)
    world.apply(config_map(CA.cert_pem), policy())
    ctx = upstream_tls(world)
    assert ctx is not None and ctx.sni == "secure.example.com"
    v = ctx.common_tls_context.validation_context
    assert v.trusted_ca.inline_string == CA.cert_pem.decode()
    # no subjectAltNames: the hostname must be on the certificate
    assert sans(ctx) == [(common_pb2.SubjectAltNameMatcher.DNS, "secure.example.com")]
    # every port of the Service (no sectionName), for routers too
    router = proxy("infra", ptype="router", pod_name="gw-1")
    assert upstream_tls(world, f"outbound|8443||{HOST}", router).sni == "secure.example.com"

    world.apply(policy(validation="wellKnownCACertificates: System, subjectAltNames: "
                                  "[{type: Hostname, hostname: a.example.com}, {type: URI, uri: 'spiffe://td/ns/x'}]"))
    ctx = upstream_tls(world)
    assert ctx.common_tls_context.validation_context.trusted_ca.filename == "/etc/ssl/certs/ca-certificates.crt"
    assert sans(ctx) == [(common_pb2.SubjectAltNameMatcher.DNS, "a.example.com"),
                         (common_pb2.SubjectAltNameMatcher.URI, "spiffe://td/ns/x")]
    assert conds(status(world)[0]) == {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}


def test_section_name_limits_the_policy_to_that_port(world: World):
    world.apply(config_map(CA.cert_pem),
                policy(targets="[{group: '', kind: Service, name: secure, sectionName: admin}]"))
    assert upstream_tls(world) is None
    assert upstream_tls(world, f"outbound|8443||{HOST}").sni == "secure.example.com"
    assert status(world)[0]["ancestorRef"] == {"group": "", "kind": "Service", "name": "secure", "sectionName": "admin"}


@pytest.mark.parametrize("objects, accepted, resolved", [
    ([], ("False", "NoValidCACertificate"), ("False", "InvalidCACertificateRef")),
    ([config_map("")], ("False", "NoValidCACertificate"), ("False", "InvalidCACertificateRef")),
    ([config_map("Hello world")], ("False", "NoValidCACertificate"), ("False", "InvalidCACertificateRef")),
    ([config_map(CA.cert_pem, key="other")], ("False", "NoValidCACertificate"), ("False", "InvalidCACertificateRef")),
])
def test_a_ca_that_does_not_resolve_fails_closed(world: World, objects, accepted, resolved):
    world.apply(*objects, policy())
    assert conds(status(world)[0]) == {"Accepted": accepted, "ResolvedRefs": resolved}
    v = upstream_tls(world).common_tls_context.validation_context
    assert list(v.verify_certificate_hash) == ["00" * 32] and not v.HasField("trusted_ca")


def test_ca_reference_kinds_and_well_known_names(world: World):
    world.apply(policy(validation="caCertificateRefs: [{group: '', kind: Secret, name: ca}]"))
    assert conds(status(world)[0]) == {"Accepted": ("False", "NoValidCACertificate"),
                                       "ResolvedRefs": ("False", "InvalidKind")}
    world.apply(policy(validation="wellKnownCACertificates: example.com/roots"))
    assert conds(status(world)[0])["Accepted"] == ("False", "Invalid")
    assert list(upstream_tls(world).common_tls_context.validation_context.verify_certificate_hash) == ["00" * 32]
    world.apply(config_map(CA.cert_pem), config_map(OTHER_CA.cert_pem, name="ca2"),
                policy(validation="caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}, "
                                  "{group: '', kind: ConfigMap, name: ca2}]"))
    accepted = next(c for c in status(world)[0]["conditions"] if c["type"] == "Accepted")
    assert accepted["status"] == "True" and "only the first caCertificateRefs will be used" in accepted["message"]
    assert upstream_tls(world).common_tls_context.validation_context.trusted_ca.inline_string == CA.cert_pem.decode()


def test_targets_that_do_not_resolve_and_conflicts(world: World):
    world.apply(config_map(CA.cert_pem), policy(targets="[{group: '', kind: Service, name: missing}]"))
    assert conds(status(world)[0])["Accepted"] == ("False", "TargetNotFound")
    world.apply(policy(targets="[{group: '', kind: Service, name: secure, sectionName: nope}]"))
    assert conds(status(world)[0])["Accepted"] == ("False", "TargetNotFound")
    world.apply(policy(targets="[{group: apps, kind: Deployment, name: secure}]"))
    assert conds(status(world)[0])["Accepted"] == ("False", "TargetNotFound")
    assert upstream_tls(world) is None

    world.apply(policy("old", created="2025-01-01T00:00:00Z"),
                policy("new", hostname="other.example.com", created="2026-01-01T00:00:00Z"))
    world.store.delete(ConfigKey("BackendTLSPolicy", "default", "tls"))
    assert conds(status(world, "old")[0])["Accepted"] == ("True", "Accepted")
    new = next(c for c in status(world, "new")[0]["conditions"] if c["type"] == "Accepted")
    assert (new["status"], new["reason"]) == ("False", "Conflicted") and '"old"' in new["message"]
    assert upstream_tls(world).sni == "secure.example.com"  # the older policy's
    # a sectioned policy does not conflict with a whole-Service one; its port is its own
    world.apply(policy("new", hostname="other.example.com",
                       targets="[{group: '', kind: Service, name: secure, sectionName: admin}]"))
    assert conds(status(world, "new")[0])["Accepted"] == ("True", "Accepted")
    assert upstream_tls(world, f"outbound|8443||{HOST}").sni == "other.example.com"
    assert upstream_tls(world).sni == "secure.example.com"


def test_ignored_policies_apply_nothing(world: World):
    world.apply(config_map(CA.cert_pem), policy(extra=", annotations: {istio.io/ignore-policy-attachment: 'true'}"))
    assert conds(status(world)[0])["Accepted"] == ("False", "IgnoredByIstio")
    assert upstream_tls(world) is None


def test_a_users_destination_rule_wins_and_the_policy_fills_its_gaps(world: World):
    world.apply(config_map(CA.cert_pem), policy(), docs(f"""\
        apiVersion: networking.istio.io/v1
        kind: DestinationRule
        metadata: {{name: user, namespace: default, creationTimestamp: '2027-01-01T00:00:00Z'}}
        spec:
          host: {HOST}
          trafficPolicy:
            loadBalancer: {{simple: RANDOM}}
        """)[0])
    c = world.cds(proxy())[CLUSTER].message(cluster_pb2.Cluster)
    assert c.lb_policy == cluster_pb2.Cluster.RANDOM  # the user's
    assert upstream_tls(world).sni == "secure.example.com"  # the policy's, under it
    world.apply(docs(f"""\
        apiVersion: networking.istio.io/v1
        kind: DestinationRule
        metadata: {{name: user, namespace: default}}
        spec:
          host: {HOST}
          trafficPolicy:
            tls: {{mode: SIMPLE, sni: user.example.com}}
        """)[0])
    assert upstream_tls(world).sni == "user.example.com"  # the user's TLS, whatever the ages


# --- status shapes -------------------------------------------------------------------------------------
def test_gateways_routing_to_the_service_are_ancestors(world: World):
    world.apply(config_map(CA.cert_pem), policy(), *docs(f"""\
        apiVersion: {API}/v1
        kind: Gateway
        metadata: {{name: web, namespace: default}}
        spec:
          gatewayClassName: istio
          listeners: [{{name: http, port: 8080, protocol: HTTP}}]
        ---
        apiVersion: {API}/v1
        kind: HTTPRoute
        metadata: {{name: r, namespace: default}}
        spec:
          parentRefs: [{{name: web}}]
          rules: [{{backendRefs: [{{name: secure, port: 443}}]}}]
        """))
    ancestors = status(world)
    assert [(a["ancestorRef"], a["controllerName"]) for a in ancestors] == [
        ({"group": "", "kind": "Service", "name": "secure"}, "istio.io/mesh-controller"),
        ({"group": API, "kind": "Gateway", "name": "web"}, "istio.io/gateway-controller")]
    assert all(c["observedGeneration"] == 2 for a in ancestors for c in a["conditions"])
    stamped = stamp(None, {"ancestors": ancestors}, "T1")
    assert stamp(stamped, {"ancestors": ancestors}, "T2") == stamped  # unchanged: never rewritten
    foreign = {"ancestorRef": {"name": "x"}, "controllerName": "example.com/other", "conditions": []}
    stale = {"ancestorRef": {"name": "gone"}, "controllerName": "istio.io/gateway-controller", "conditions": []}
    merged = merge_ancestors([foreign, stale, stamped["ancestors"][1]], ancestors,
                             frozenset({"istio.io/gateway-controller", "istio.io/mesh-controller"}))
    assert merged == [foreign, ancestors[1], ancestors[0]]


# --- cache keys and push scope -----------------------------------------------------------------------
def _deps_and_bytes(world: World, p):
    ctx = world.ctx()
    with ctx.recording() as deps:
        out = {r.name: r.any_bytes for r in cds.generate(ctx, p, None, world.cache)}
    return ctx, deps, out


@pytest.mark.parametrize("mutate", [
    lambda w: w.apply(config_map(OTHER_CA.cert_pem)),  # the ConfigMap's content
    lambda w: w.apply(policy(hostname="renamed.example.com")),  # the policy
    lambda w: w.store.delete(ConfigKey("BackendTLSPolicy", "default", "tls")),
])
def test_a_policy_or_configmap_change_rebuilds_and_pushes_exactly_its_clusters(world: World, mutate):
    other = docs("""\
        apiVersion: v1
        kind: Service
        metadata: {name: plain, namespace: default}
        spec: {clusterIP: 10.96.0.51, ports: [{name: http, port: 80}]}
        """)[0]
    world.apply(other, config_map(CA.cert_pem), policy())
    p = proxy()
    before_ctx, deps, before = _deps_and_bytes(world, p)
    unrelated = config_map(CA.cert_pem, name="unrelated")
    world.apply(unrelated)
    ctx = world.ctx()
    change = dependencies.change_of({ConfigKey("ConfigMap", "default", "unrelated")}, before_ctx, ctx,
                                    mesh_changed=False, service_endpoints_kind="EndpointSlice",
                                    ambient_kinds=frozenset())
    assert not dependencies.Matcher(change).meets(deps), "an unreferenced ConfigMap pushed the clusters"
    mutate(world)
    after_ctx, _, after = _deps_and_bytes(world, p)
    assert after[CLUSTER] != before[CLUSTER] and after["outbound|80||plain.default.svc.cluster.local"] == \
        before["outbound|80||plain.default.svc.cluster.local"]
    keys = {ConfigKey("ConfigMap", "default", "ca"), ConfigKey("BackendTLSPolicy", "default", "tls")}
    change = dependencies.change_of(keys, ctx, after_ctx, mesh_changed=False, service_endpoints_kind="EndpointSlice",
                                    ambient_kinds=frozenset())
    assert dependencies.Matcher(change).meets(deps)
    assert ("dr", HOST) in change.facets and ("dr", "plain.default.svc.cluster.local") not in change.facets


def test_generated_tls_passes_envoy_validate(world: World, tmp_path):
    from tests.support.envoy import envoy_validate
    from tests.support.static_config import static_bootstrap

    leaf = issue(CA, ["secure.example.com"])
    assert leaf.cert_pem  # the CA really signs for the hostname the policy names
    world.apply(config_map(CA.cert_pem), policy(),
                policy("admin", targets="[{group: '', kind: Service, name: secure, sectionName: admin}]",
                       validation="caCertificateRefs: [{group: '', kind: ConfigMap, name: missing}]"))
    ok, output = envoy_validate(static_bootstrap(world.ctx(), proxy()), tmp_path)
    assert ok, output


def test_only_configmaps_holding_a_ca_bundle_cause_a_push():
    from pilot.model.events import push_request_for
    from pilot.model.store import Entry, Event

    mesh = ConfigKey("ConfigMap", "istio-system", "istio")

    def event(data: dict | None, old: dict | None = None) -> Event:
        def entry(d):
            return None if d is None else Entry(ConfigKey("ConfigMap", "default", "ca"),
                                                parse_object({**config_map(""), "data": d}), 1, "test")
        return Event("update" if old else "add", ConfigKey("ConfigMap", "default", "ca"), entry(old), entry(data))

    assert push_request_for([event({"ca.crt": CA.cert_pem.decode()})], mesh).full
    assert push_request_for([event({"ca.crt": ""}, old={"ca.crt": "x"})], mesh).full  # emptied: still a push
    assert push_request_for([event({"root-cert.pem": CA.cert_pem.decode()})], mesh) is None


def test_the_generated_rule_is_istiods_and_names_its_policies(world: World):
    from pilot.model.gateways import config_origins

    world.apply(config_map(CA.cert_pem), policy(), policy("admin", hostname="admin.example.com",
                targets="[{group: '', kind: Service, name: secure, sectionName: admin}]"))
    (rule,) = world.ctx().gateway_api.destination_rules
    assert (rule.key.namespace, rule.key.name) == ("default", "secure~istio-autogenerated-k8s-gateway")
    assert rule.obj.spec.host == HOST
    assert config_origins(rule) == ("BackendTLSPolicy/default/admin", "BackendTLSPolicy/default/tls")


def test_a_service_entry_target_gets_tls_per_host(world: World):
    world.apply(config_map(CA.cert_pem), docs("""\
        apiVersion: networking.istio.io/v1
        kind: ServiceEntry
        metadata: {name: ext, namespace: default}
        spec:
          hosts: [api.example.com]
          location: MESH_EXTERNAL
          resolution: DNS
          ports: [{number: 443, name: https, protocol: TLS}]
        """)[0], policy(targets="[{group: networking.istio.io, kind: ServiceEntry, name: ext, sectionName: https}]",
                        hostname="api.example.com"))
    assert conds(status(world)[0])["Accepted"] == ("True", "Accepted")
    (rule,) = world.ctx().gateway_api.destination_rules
    assert rule.key.name == "ext~api-example-com~istio-autogenerated-k8s-gateway"
    assert upstream_tls(world, "outbound|443||api.example.com").sni == "api.example.com"
