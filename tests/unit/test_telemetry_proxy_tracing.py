"""MeshConfig defaultConfig.tracing and a proxy's PROXY_CONFIG tracing, as istiod's
configureTracingFromTelemetry reads them; and the envoyHttpAls / envoyTcpAls access loggers."""

from __future__ import annotations

from envoy.extensions.access_loggers.grpc.v3 import als_pb2

from pilot.model.proxy import Proxy, parse_node_id

from . import test_telemetry
from .helpers import DOMAIN, SYSTEM_NS, World, mesh_configmap, service
from .test_telemetry import PROVIDERS, hcm, labelled, telemetry

world = test_telemetry.world  # the same mesh (reviews, a zipkin Service, the providers)

TRACING = {"sampling": 42.5, "max_path_tag_length": 64,
           "custom_tags": {"team": {"literal": {"value": "payments"}}, "who": {"header": {"name": "x-who"}}},
           "zipkin": {"address": "127.0.0.1:9411"}}


def with_proxy_config(pc: dict, namespace: str = "default") -> Proxy:
    node_id = f"sidecar~10.0.0.1~app-1.{namespace}~{namespace}.svc.{DOMAIN}"
    t, ips, pod_, ns, domain = parse_node_id(node_id)
    return Proxy(node_id, t, ips, pod_, ns, domain, f"app.{namespace}",
                 {"NAMESPACE": namespace, "INTERCEPTION_MODE": "REDIRECT", "LABELS": {"app": "client"},
                  "PROXY_CONFIG": pc})


def tags(h) -> dict[str, str]:
    out = {}
    for t in h.tracing.custom_tags:
        out[t.tag] = t.literal.value if t.HasField("literal") else f"header:{t.request_header.name}"
    return out


def test_without_a_tracing_section_no_listener_traces_and_bytes_stay_as_before(world: World) -> None:
    h = hcm(world, labelled({"app": "client"}))
    assert not h.HasField("tracing")


def test_default_config_tracing_without_telemetry_is_istiods_legacy_path(world: World) -> None:
    world.apply(mesh_configmap({"accessLogFile": "/dev/stdout", **PROVIDERS, "defaultConfig": {"tracing": TRACING}}))
    h = hcm(world, labelled({"app": "client"}))
    # No provider: Envoy uses the bootstrap's tracer (pilot-agent writes it from tracing.zipkin).
    assert not h.tracing.HasField("provider")
    assert h.tracing.random_sampling.value == 42.5 and h.tracing.max_path_tag_length.value == 64
    t = tags(h)
    assert t["team"] == "payments" and t["who"] == "header:x-who" and t["istio.namespace"] == "default"
    # enableTracing: false turns the legacy path off.
    world.apply(mesh_configmap({**PROVIDERS, "enableTracing": False, "defaultConfig": {"tracing": TRACING}}))
    assert not hcm(world, labelled({"app": "client"})).HasField("tracing")


def test_a_telemetry_provider_falls_back_to_proxy_config_sampling_tags_and_length(world: World) -> None:
    world.apply(mesh_configmap({**PROVIDERS, "defaultConfig": {"tracing": TRACING}}),
                telemetry("mesh", SYSTEM_NS, {"tracing": [{"providers": [{"name": "zipkin"}]}]}))
    h = hcm(world, labelled({"app": "client"}))
    assert h.tracing.provider.name == "envoy.tracers.zipkin"
    assert h.tracing.random_sampling.value == 42.5 and h.tracing.max_path_tag_length.value == 64
    assert tags(h)["team"] == "payments"
    # The Telemetry's own sampling and tags win.
    world.apply(telemetry("mesh", SYSTEM_NS, {"tracing": [{"providers": [{"name": "zipkin"}],
                                                           "randomSamplingPercentage": 7,
                                                           "customTags": {"own": {"literal": {"value": "v"}}}}]}))
    h = hcm(world, labelled({"app": "client"}))
    assert h.tracing.random_sampling.value == 7 and "team" not in tags(h) and tags(h)["own"] == "v"


def test_the_proxys_own_proxy_config_wins_over_the_mesh_default_and_is_part_of_the_cache_key(world: World) -> None:
    world.apply(mesh_configmap({**PROVIDERS, "defaultConfig": {"tracing": TRACING}}))
    a = hcm(world, with_proxy_config({"tracing": {**TRACING, "sampling": 3}}))
    b = hcm(world, with_proxy_config({"tracing": {**TRACING, "sampling": 9}}))
    assert (a.tracing.random_sampling.value, b.tracing.random_sampling.value) == (3, 9)
    # A PROXY_CONFIG without tracing: as istiod's ProxyConfigOrDefault, the proxy's config is used whole.
    assert not hcm(world, with_proxy_config({"concurrency": 1})).HasField("tracing")


def test_an_unusable_default_config_tracing_is_reported(world: World) -> None:
    world.apply(mesh_configmap({**PROVIDERS, "defaultConfig": {"tracing": {"datadog": {"address": "dd:8126"}}}}))
    ctx = world.ctx()
    assert any("defaultConfig.tracing" in p["reason"] and "datadog" in p["reason"] for p in ctx.telemetry_problems)
    assert not hcm(world, labelled({"app": "client"})).HasField("tracing")


def test_http_and_tcp_als_providers_become_envoys_grpc_access_loggers(world: World) -> None:
    world.apply(service("als", SYSTEM_NS, ports=[{"name": "grpc", "port": 9000, "targetPort": 9000}]),
                mesh_configmap({**PROVIDERS, "extensionProviders": [
                    {"name": "http-als", "envoyHttpAls": {"service": f"als.{SYSTEM_NS}.svc.{DOMAIN}", "port": 9000,
                                                          "logName": "mine", "additionalRequestHeadersToLog": ["x-a"]}},
                    {"name": "tcp-als", "envoyTcpAls": {"service": f"als.{SYSTEM_NS}.svc.{DOMAIN}", "port": 9000}}]}),
                telemetry("mesh", SYSTEM_NS, {"accessLogging": [{"providers": [{"name": "http-als"},
                                                                               {"name": "tcp-als"}]}]}))
    h = hcm(world, labelled({"app": "client"}))
    by_name = {al.name: al for al in h.access_log}
    http, tcp = als_pb2.HttpGrpcAccessLogConfig(), als_pb2.TcpGrpcAccessLogConfig()
    assert by_name["envoy.access_loggers.http_grpc"].typed_config.Unpack(http)
    assert by_name["envoy.tcp_grpc_access_log"].typed_config.Unpack(tcp)
    cluster = f"outbound|9000||als.{SYSTEM_NS}.svc.{DOMAIN}"
    assert http.common_config.log_name == "mine" and list(http.additional_request_headers_to_log) == ["x-a"]
    assert http.common_config.grpc_service.envoy_grpc.cluster_name == cluster
    assert tcp.common_config.log_name == "tcp_envoy_accesslog"
    assert list(tcp.common_config.filter_state_objects_to_log) == ["upstream_peer", "downstream_peer"]
