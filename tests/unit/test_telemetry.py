"""The Telemetry API and MeshConfig providers: validation, istiod's selection and precedence
(mesh, namespace, workload; CLIENT and SERVER), what is refused and why, and the listener bytes
(a Telemetry change rebuilds exactly the listeners it affects)."""

from __future__ import annotations

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.config.trace.v3 import zipkin_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2

from pilot.config.validation import InvalidObject, parse_object
from pilot.features import Features
from pilot.model.proxy import Proxy, parse_node_id
from pilot.model.push_context import PushContext
from pilot.networking.telemetry import JSON_FORMAT, TEXT_FORMAT
from pilot.xds.cache import CachedResource

from .helpers import DOMAIN, SYSTEM_NS, World, endpoint_slice, mesh_configmap, service

REVIEWS = "reviews.default.svc.cluster.local"
PROVIDERS = {"extensionProviders": [
    {"name": "json-file", "envoyFileAccessLog": {"path": "/tmp/json.log", "logFormat": {"labels": {"code": "%RESPONSE_CODE%"}}}},
    {"name": "zipkin", "zipkin": {"service": "zipkin.istio-system.svc.cluster.local", "port": 9411}},
    {"name": "authz", "envoyExtAuthzHttp": {"service": "authz", "port": 8000}},
    {"name": "als", "skywalking": {"service": "als", "port": 9000}},
]}


def telemetry(name: str, ns: str, spec: dict) -> dict:
    return {"apiVersion": "telemetry.istio.io/v1", "kind": "Telemetry", "metadata": {"name": name, "namespace": ns},
            "spec": spec}


def labelled(labels: dict[str, str], namespace: str = "default", ptype: str = "sidecar") -> Proxy:
    node_id = f"{ptype}~10.0.0.1~app-1.{namespace}~{namespace}.svc.{DOMAIN}"
    t, ips, pod_, ns, domain = parse_node_id(node_id)
    return Proxy(node_id, t, ips, pod_, ns, domain, f"app.{namespace}",
                 {"NAMESPACE": namespace, "INTERCEPTION_MODE": "REDIRECT", "LABELS": labels})


@pytest.fixture
def world() -> World:
    w = World()
    w.apply(service("reviews", ports=[{"name": "http", "port": 9080, "targetPort": 9080}]),
            endpoint_slice("reviews-1", "reviews", addresses=("10.1.0.1",), port=9080),
            service("zipkin", SYSTEM_NS, cluster_ip="10.96.0.99",
                    ports=[{"name": "http", "port": 9411, "targetPort": 9411}]),
            mesh_configmap({"accessLogFile": "/dev/stdout", **PROVIDERS}))
    return w


def hcm(world: World, p: Proxy, name: str = "0.0.0.0_9080") -> hcm_pb2.HttpConnectionManager:
    listener = listener_pb2.Listener.FromString(_value(world.lds(p)[name]))
    for chain in listener.filter_chains:
        for f in chain.filters:
            if f.name == "envoy.filters.network.http_connection_manager":
                out = hcm_pb2.HttpConnectionManager()
                f.typed_config.Unpack(out)
                return out
    raise AssertionError(f"no HCM in {name}")


def _value(res: CachedResource) -> bytes:
    a = any_pb2.Any()
    a.ParseFromString(res.any_bytes)
    return a.value


def file_logs(h: hcm_pb2.HttpConnectionManager) -> list[file_pb2.FileAccessLog]:
    out = []
    for al in h.access_log:
        f = file_pb2.FileAccessLog()
        assert al.typed_config.Unpack(f)
        out.append(f)
    return out


# --- validation --------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, reason", [
    ({"metrics": [{"overrides": [{"disabled": True}]}]}, "istio.stats filter, which upstream Envoy does not have"),
    ({"metrics": [{"reportingInterval": "10s"}]}, "istio.stats"),
    ({"accessLogging": [{"filter": {"expression": "response.code >="}}]}, "not a valid CEL expression"),
    ({"accessLogging": [{"filter": {"expression": "[1].exists(x, x > 0)"}}]}, "comprehensions"),
    ({"tracing": [{"providers": [{"name": "a"}, {"name": "b"}]}]}, "multiple tracing providers"),
    ({"tracing": [{"randomSamplingPercentage": 101}]}, "randomSamplingPercentage"),
    ({"tracing": [{"customTags": {"t": {"literal": {"value": "x"}, "header": {"name": "h"}}}}]}, "exactly one"),
    ({"selector": {"matchLabels": {"a": "b"}}, "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io",
                                                               "name": "g"}]}, "only one of"),
    ({"tracing": [{"sampling": 5}]}, "sampling"),
])
def test_what_cannot_be_applied_is_refused_naming_the_field(spec: dict, reason: str) -> None:
    with pytest.raises(InvalidObject) as e:
        parse_object(telemetry("t", "default", spec))
    assert reason in str(e.value)


def test_v1alpha1_is_served_with_the_same_schema() -> None:
    doc = telemetry("t", "default", {"accessLogging": [{"providers": [{"name": "envoy"}]}]})
    doc["apiVersion"] = "telemetry.istio.io/v1alpha1"
    assert parse_object(doc).spec.access_logging[0].providers[0].name == "envoy"


# --- MeshConfig alone ----------------------------------------------------------------------------

def test_mesh_access_log_in_istiods_text_then_json_format(world: World) -> None:
    p = labelled({"app": "client"})
    [log] = file_logs(hcm(world, p))
    assert log.path == "/dev/stdout" and log.log_format.text_format_source.inline_string == TEXT_FORMAT
    world.apply(mesh_configmap({"accessLogFile": "/dev/stdout", "accessLogEncoding": "JSON", **PROVIDERS}))
    [log] = file_logs(hcm(world, p))
    assert dict(log.log_format.json_format) == JSON_FORMAT
    world.apply(mesh_configmap({"accessLogFile": "/dev/stdout", "accessLogFormat": "%RESPONSE_CODE%", **PROVIDERS}))
    [log] = file_logs(hcm(world, p))
    assert log.log_format.text_format_source.inline_string == "%RESPONSE_CODE%\n"  # istiod appends the newline


# --- selection and precedence --------------------------------------------------------------------

def test_mesh_namespace_and_workload_levels_and_modes(world: World) -> None:
    client, reviews = labelled({"app": "client"}), labelled({"app": "reviews"})
    shop = labelled({"app": "cart"}, namespace="shop")
    # Mesh-wide: the JSON provider replaces the legacy accessLogFile everywhere.
    world.apply(telemetry("mesh", SYSTEM_NS, {"accessLogging": [{"providers": [{"name": "json-file"}]}]}))
    for p in (client, reviews, shop):
        assert [f.path for f in file_logs(hcm(world, p))] == ["/tmp/json.log"]
    # A namespace's own Telemetry wins over the mesh's for that namespace only.
    world.apply(telemetry("ns", "shop", {"accessLogging": [{"providers": [{"name": "envoy"}],
                                                            "filter": {"expression": "response.code >= 500"}}]}))
    [log] = hcm(world, shop).access_log
    assert file_pb2.FileAccessLog.FromString(log.typed_config.value).path == "/dev/stdout"
    expr = cel_pb2.ExpressionFilter()
    assert log.filter.extension_filter.typed_config.Unpack(expr) and expr.expression == "response.code >= 500"
    assert [f.path for f in file_logs(hcm(world, client))] == ["/tmp/json.log"]
    # A workload's Telemetry, SERVER mode only: reviews' inbound stops logging, its outbound does not.
    world.apply(telemetry("reviews", "default", {"selector": {"matchLabels": {"app": "reviews"}},
                                                 "accessLogging": [{"match": {"mode": "SERVER"}, "disabled": True}]}))
    assert [f.path for f in file_logs(hcm(world, reviews))] == ["/tmp/json.log"]
    assert [f.path for f in file_logs(hcm(world, client))] == ["/tmp/json.log"]
    ctx = world.ctx()
    plan, other = ctx.telemetry_plan(reviews), ctx.telemetry_plan(client)
    assert plan.server.access_logs == () and [a.provider for a in plan.client.access_logs] == ["json-file"]
    assert [a.provider for a in other.server.access_logs] == ["json-file"]
    assert plan.origins == ("Telemetry/istio-system/mesh", "Telemetry/default/reviews")


def test_tracing_provider_sampling_and_tags_with_later_levels_overriding(world: World) -> None:
    reviews, client = labelled({"app": "reviews", "service.istio.io/canonical-name": "reviews"}), labelled({"app": "c"})
    world.apply(telemetry("mesh", SYSTEM_NS, {"tracing": [{"providers": [{"name": "zipkin"}],
                                                           "randomSamplingPercentage": 10}]}))
    world.apply(telemetry("reviews", "default", {"selector": {"matchLabels": {"app": "reviews"}},
                                                 "tracing": [{"randomSamplingPercentage": 50,
                                                              "customTags": {"team": {"literal": {"value": "a"}}}}]}))
    t = hcm(world, reviews).tracing
    assert t.provider.name == "envoy.tracers.zipkin" and t.random_sampling.value == 50
    zc = zipkin_pb2.ZipkinConfig()
    assert t.provider.typed_config.Unpack(zc)
    assert zc.collector_service.http_uri.cluster == "outbound|9411||zipkin.istio-system.svc.cluster.local"
    assert zc.collector_service.http_uri.uri == "http://zipkin.istio-system.svc.cluster.local/api/v2/spans"
    tags = {tag.tag: tag for tag in t.custom_tags}
    assert tags["team"].literal.value == "a" and tags["istio.canonical_service"].literal.value == "reviews"
    assert hcm(world, client).tracing.random_sampling.value == 10
    # disableSpanReporting at the workload level: no tracing there, the rest unchanged.
    world.apply(telemetry("reviews", "default", {"selector": {"matchLabels": {"app": "reviews"}},
                                                 "tracing": [{"disableSpanReporting": True}]}))
    assert not hcm(world, reviews).HasField("tracing")
    assert hcm(world, client).tracing.random_sampling.value == 10


# --- refused at apply time -----------------------------------------------------------------------

@pytest.mark.parametrize("spec, reason", [
    ({"accessLogging": [{"providers": [{"name": "nowhere"}]}]}, "'nowhere' is not defined"),
    ({"accessLogging": [{"providers": [{"name": "zipkin"}]}]}, "cannot be used for accessLogging"),
    ({"tracing": [{"providers": [{"name": "json-file"}]}]}, "cannot be used for tracing"),
    ({"accessLogging": [{"providers": [{"name": "als"}]}]}, "skywalking provider is not supported"),
    ({"tracing": [{"providers": [{"name": "authz"}]}]}, "AuthorizationPolicy CUSTOM"),
])
def test_a_telemetry_that_names_an_unusable_provider_is_reported_and_changes_nothing(
        world: World, spec: dict, reason: str) -> None:
    p = labelled({"app": "client"})
    before = world.lds(p)
    world.apply(telemetry("bad", "default", spec))
    ctx = world.ctx()
    after = world.lds(p, ctx)
    assert {n: r.any_bytes for n, r in after.items()} == {n: r.any_bytes for n, r in before.items()}
    [problem] = [x for x in ctx.telemetry_problems if x["kind"] == "Telemetry"]
    assert problem["name"] == "bad" and reason in problem["reason"] and "not applied" in problem["reason"]


def test_default_providers_apply_without_a_telemetry_and_unusable_ones_are_reported(world: World) -> None:
    world.apply(mesh_configmap({**PROVIDERS, "defaultProviders": {"accessLogging": ["json-file", "nope"],
                                                                  "tracing": ["zipkin"]}}))
    ctx = world.ctx()
    h = hcm(world, labelled({"app": "client"}))
    assert [f.path for f in file_logs(h)] == ["/tmp/json.log"] and h.tracing.random_sampling.value == 1.0
    assert any("defaultProviders.accessLogging[1]" in x["reason"] and "'nope'" in x["reason"]
               for x in ctx.telemetry_problems)


def test_a_provider_service_missing_from_the_registry_is_reported(world: World) -> None:
    world.apply(mesh_configmap({"extensionProviders": [
        {"name": "zipkin", "zipkin": {"service": "gone.istio-system.svc.cluster.local", "port": 9411}}]}))
    world.apply(telemetry("mesh", SYSTEM_NS, {"tracing": [{"providers": [{"name": "zipkin"}]}]}))
    ctx = world.ctx()
    assert not hcm(world, labelled({"app": "client"})).HasField("tracing")
    assert any("gone.istio-system.svc.cluster.local is not in the registry" in x["reason"]
               for x in ctx.telemetry_problems)


# --- cache keys and sharing ----------------------------------------------------------------------

def test_a_workload_telemetry_rebuilds_only_the_workloads_it_selects(world: World) -> None:
    reviews, client = labelled({"app": "reviews"}), labelled({"app": "client"})
    r0, c0 = world.lds(reviews), world.lds(client)
    assert r0["0.0.0.0_9080"].any_bytes == c0["0.0.0.0_9080"].any_bytes  # shared while inputs agree
    world.apply(telemetry("reviews", "default", {"selector": {"matchLabels": {"app": "reviews"}},
                                                 "accessLogging": [{"providers": [{"name": "json-file"}]}]}))
    ctx = world.ctx()
    r1, c1 = world.lds(reviews, ctx), world.lds(client, ctx)
    assert r1["0.0.0.0_9080"].any_bytes != r0["0.0.0.0_9080"].any_bytes
    assert c1["0.0.0.0_9080"] is c0["0.0.0.0_9080"]  # served from the cache, not rebuilt


def test_a_gateway_targetref_names_a_gateway_of_the_telemetrys_own_namespace_only(world: World) -> None:
    """istiod's ShouldAttachPolicy: a targetRef names a Gateway of the Telemetry's namespace; the
    root namespace's Telemetry naming `ingress` does not reach another namespace's `ingress`."""
    gw = {"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "ingress"}
    label = {"gateway.networking.k8s.io/gateway-name": "ingress"}
    in_root, in_shop = labelled(label, namespace=SYSTEM_NS, ptype="router"), labelled(label, namespace="shop",
                                                                                     ptype="router")
    world.apply(telemetry("root-gw", SYSTEM_NS, {"targetRefs": [gw], "accessLogging": [{"disabled": True}]}))
    ctx = world.ctx()
    assert ctx.telemetry_plan(in_root).origins == ("Telemetry/istio-system/root-gw",)
    assert ctx.telemetry_plan(in_shop).origins == ()
    world.apply(telemetry("shop-gw", "shop", {"targetRefs": [gw], "accessLogging": [{"disabled": True}]}))
    assert world.ctx().telemetry_plan(in_shop).origins == ("Telemetry/shop/shop-gw",)
    assert world.ctx().telemetry_plan(labelled({"app": "ingress"}, namespace="shop")).origins == ()


def test_a_telemetry_for_waypoints_is_reported_not_dropped(world: World) -> None:
    world.apply(telemetry("wp", "default", {"targetRefs": [{"kind": "Service", "group": "", "name": "reviews"}],
                                            "accessLogging": [{"providers": [{"name": "envoy"}]}]}))
    [problem] = [x for x in world.ctx().telemetry_problems if x["kind"] == "Telemetry"]
    assert "Service/reviews" in problem["reason"] and "waypoints is not supported" in problem["reason"]


def test_a_gateway_logs_and_traces_in_client_mode_with_a_child_span(world: World) -> None:
    """A router's listeners are CLIENT mode (istiod's workloadMode for gateways), and routers
    start a child span for the upstream call."""
    from tests.unit.test_gateway_config import gateway, listeners, router, virtual_service
    world.apply(gateway(), virtual_service(dest="reviews"))
    world.apply(telemetry("gw", SYSTEM_NS, {"selector": {"matchLabels": {"istio": "ingressgateway"}},
                                            "accessLogging": [{"match": {"mode": "CLIENT"},
                                                               "providers": [{"name": "json-file"}]}],
                                            "tracing": [{"providers": [{"name": "zipkin"}]}]}))
    [listener] = listeners(world, router()).values()
    h = hcm_pb2.HttpConnectionManager.FromString(listener.filter_chains[0].filters[0].typed_config.value)
    assert [f.path for f in file_logs(h)] == ["/tmp/json.log"]
    assert h.tracing.provider.name == "envoy.tracers.zipkin" and h.tracing.spawn_upstream_span.value



def test_pilot_trace_sampling_is_the_default_a_telemetry_overrides(world: World) -> None:
    world.apply(mesh_configmap({**PROVIDERS, "defaultProviders": {"tracing": ["zipkin"]}}))
    knobs = Features.from_env({"PILOT_TRACE_SAMPLING": "12.5"}).generation_knobs()
    client = labelled({"app": "client"})

    def sampling(with_knob: bool) -> float:
        world.mesh.refresh(world.store)
        ctx = PushContext.build(world.store, world.mesh.current, world.mesh.version, DOMAIN, "v",
                                **({"knobs": knobs} if with_knob else {}))
        listener = listener_pb2.Listener.FromString(_value(world.lds(client, ctx)["0.0.0.0_9080"]))
        out = hcm_pb2.HttpConnectionManager()
        next(f for c in listener.filter_chains for f in c.filters
             if f.name == "envoy.filters.network.http_connection_manager").typed_config.Unpack(out)
        return out.tracing.random_sampling.value

    assert sampling(True) == 12.5
    assert sampling(False) == 1.0  # istiod's default
    world.apply(telemetry("t", "default", {"tracing": [{"randomSamplingPercentage": 40}]}))
    assert sampling(True) == 40  # a Telemetry's own percentage wins
    assert Features.from_env({"PILOT_TRACE_SAMPLING": "150"}).trace_sampling == 1.0  # out of range: default
