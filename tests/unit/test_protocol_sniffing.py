"""Protocol sniffing for ports that name no protocol, and the knobs around it (istiod's shapes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import any_pb2

from pilot.features import Features
from pilot.model.mesh_settings import DEFAULT_KNOBS, GenerationKnobs
from pilot.model.proxy import Proxy, parse_node_id
from pilot.model.push_context import PushContext
from pilot.networking.sniffing import HTTP_INSPECTOR
from pilot.xds.cache import CachedResource
from tests.support.envoy import envoy_validate
from tests.support.static_config import static_bootstrap

from .helpers import DOMAIN, World, endpoint_slice, mesh_configmap, proxy, service

HCM = "envoy.filters.network.http_connection_manager"
TCP = "envoy.filters.network.tcp_proxy"
HOST = f"web.default.svc.{DOMAIN}"


def _unpack(res: CachedResource, cls):
    a = any_pb2.Any()
    a.ParseFromString(res.any_bytes)
    msg = cls()
    assert a.Unpack(msg)
    return msg


def world(*extra: dict) -> World:
    w = World()
    w.apply(service("web", ports=[{"name": "web", "port": 8000, "targetPort": 8000}]),
            endpoint_slice("web-1", "web", port=8000, port_name="web"), *extra)
    return w


def ctx_with(w: World, knobs: GenerationKnobs = DEFAULT_KNOBS) -> PushContext:
    w.mesh.refresh(w.store)
    w._seq += 1
    return PushContext.build(w.store, w.mesh.current, w.mesh.version, DOMAIN, f"v{w._seq}", knobs=knobs)


def listener(w: World, ctx: PushContext, name: str, interception: str = "NONE") -> listener_pb2.Listener:
    return _unpack(w.lds(proxy(interception=interception), ctx)[name], listener_pb2.Listener)


def filter_names(chain) -> list[str]:
    return [f.name for f in chain.filters]


def test_unnamed_port_sniffs_http_and_tcp_when_bound() -> None:
    w = world()
    lis = listener(w, ctx_with(w), "127.0.0.1_8000")
    assert [f.name for f in lis.listener_filters] == [HTTP_INSPECTOR]
    (http,) = lis.filter_chains
    assert list(http.filter_chain_match.application_protocols) == ["http/1.1", "h2c"]
    assert http.filter_chain_match.transport_protocol == "raw_buffer"
    assert filter_names(http) == [HCM]
    # Raw TCP takes the default chain: a chain with no match beside an ALPN chain would not be
    # reached (Envoy does not go back a level), so it must be the default one.
    assert filter_names(lis.default_filter_chain) == [TCP]
    assert lis.continue_on_listener_filters_timeout
    assert lis.listener_filters_timeout.ToTimedelta().total_seconds() == 0  # istiod's default: no timeout


def test_sniffing_off_keeps_plain_tcp_and_no_http_route() -> None:
    w = world()
    ctx = ctx_with(w, GenerationKnobs(sniff_outbound=False))
    lis = listener(w, ctx, "127.0.0.1_8000")
    assert not lis.listener_filters and not lis.HasField("default_filter_chain")
    assert [filter_names(c) for c in lis.filter_chains] == [[TCP]]
    rc = _unpack(w.rds(proxy(), {"8000"}, ctx)["8000"], route_pb2.RouteConfiguration)
    assert HOST not in {d for vh in rc.virtual_hosts for d in vh.domains}


def test_sniffed_port_gets_http_routes_and_downstream_protocol_cluster() -> None:
    w = world()
    ctx = ctx_with(w)
    rc = _unpack(w.rds(proxy(), {"8000"}, ctx)["8000"], route_pb2.RouteConfiguration)
    assert any(HOST in vh.domains for vh in rc.virtual_hosts)
    name = f"outbound|8000||{HOST}"
    c = _unpack(w.cds(proxy(), ctx)[name], cluster_pb2.Cluster)
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    c.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Unpack(opts)
    assert opts.HasField("use_downstream_protocol_config")
    router = _unpack(w.cds(proxy(ptype="router", interception=None), ctx)[name], cluster_pb2.Cluster)
    assert not router.typed_extension_protocol_options  # istiod does it for sidecars only


def test_iptables_shape_matches_http_per_cluster_ip_beside_tcp() -> None:
    w = world(service("db", cluster_ip="10.96.0.21", ports=[{"name": "tcp", "port": 8000}]))
    lis = listener(w, ctx_with(w), "0.0.0.0_8000", "REDIRECT")
    assert [f.name for f in lis.listener_filters] == [HTTP_INSPECTOR]
    shapes = [([p.address_prefix for p in c.filter_chain_match.prefix_ranges], c.filter_chain_match.transport_protocol,
               list(c.filter_chain_match.application_protocols), filter_names(c)) for c in lis.filter_chains]
    assert shapes == [
        (["10.96.0.20"], "raw_buffer", ["http/1.1", "h2c"], [HCM]),  # sniffed service: HTTP...
        ([], "raw_buffer", ["http/1.1", "h2c"], [HCM]),  # any other address: HTTP routes
        (["10.96.0.20"], "raw_buffer", [], [TCP]),  # ...and TCP at the same level
        (["10.96.0.21"], "raw_buffer", [], [TCP]),  # the TCP service shares the port
    ]


def test_http10_knob_accepts_and_sniffs_http10() -> None:
    w = world()
    lis = listener(w, ctx_with(w, GenerationKnobs(http10=True)), "127.0.0.1_8000")
    http = lis.filter_chains[0]
    assert list(http.filter_chain_match.application_protocols) == ["http/1.0", "http/1.1", "h2c"]
    hcm = hcm_pb2.HttpConnectionManager()
    http.filters[0].typed_config.Unpack(hcm)
    assert hcm.http_protocol_options.accept_http_10


def test_mesh_protocol_detection_timeout_and_inbound_override() -> None:
    sidecar = {"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
               "metadata": {"name": "s", "namespace": "default"},
               "spec": {"ingress": [{"port": {"number": 9000, "name": "web"}, "bind": "127.0.0.7",
                                     "defaultEndpoint": "127.0.0.1:9001", "captureMode": "NONE"}]}}
    w = world(mesh_configmap({"protocolDetectionTimeout": "250ms"}), sidecar)
    ctx = ctx_with(w, GenerationKnobs(inbound_detection_timeout_s=1.5))
    out = listener(w, ctx, "127.0.0.1_8000")
    assert out.listener_filters_timeout.ToTimedelta().total_seconds() == 0.25
    inbound = listener(w, ctx, "inbound_127.0.0.7_9000")
    assert inbound.listener_filters_timeout.ToTimedelta().total_seconds() == 1.5
    assert [f.name for f in inbound.listener_filters][-1] == HTTP_INSPECTOR
    chains = [(c.filter_chain_match.transport_protocol, list(c.filter_chain_match.application_protocols),
               filter_names(c)[-1]) for c in inbound.filter_chains]
    assert chains == [("raw_buffer", ["http/1.1", "h2c"], HCM), ("raw_buffer", [], TCP)]
    # Inbound sniffing off: the port is TCP, nothing waits for the client's bytes.
    off = listener(w, ctx_with(w, GenerationKnobs(sniff_inbound=False)), "inbound_127.0.0.7_9000")
    assert [filter_names(c)[-1] for c in off.filter_chains] == [TCP] and not off.listener_filters


def test_knobs_are_part_of_the_cache_key() -> None:
    """One shared cache, the same config: switching a knob never serves the other setting's bytes."""
    w = world()
    on = w.lds(proxy(), ctx_with(w))["127.0.0.1_8000"]
    off = w.lds(proxy(), ctx_with(w, GenerationKnobs(sniff_outbound=False)))["127.0.0.1_8000"]
    again = w.lds(proxy(), ctx_with(w))["127.0.0.1_8000"]
    assert on.version != off.version and again.version == on.version


def test_features_read_the_knobs() -> None:
    f = Features.from_env({"PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_OUTBOUND": "false", "PILOT_HTTP10": "1",
                           "PILOT_INBOUND_PROTOCOL_DETECTION_TIMEOUT": "2s", "PILOT_SEND_UNHEALTHY_ENDPOINTS": "true",
                           "CLUSTER_ID": "east"})
    assert f.generation_knobs() == GenerationKnobs(sniff_outbound=False, sniff_inbound=True, http10=True,
                                                   inbound_detection_timeout_s=2.0, send_unhealthy_endpoints=True,
                                                   cluster_id="east")
    d = Features.from_env({}).generation_knobs()
    assert (d.sniff_outbound, d.sniff_inbound, d.http10, d.inbound_detection_timeout_s,
            d.send_unhealthy_endpoints, d.cluster_id) == (True, True, False, None, False, "Kubernetes")


def test_send_unhealthy_endpoints_marks_them_unhealthy() -> None:
    w = World()
    w.apply(service("web"), endpoint_slice("web-1", "web", addresses=("10.1.0.1",)),
            endpoint_slice("web-2", "web", addresses=("10.1.0.2",), ready=False))
    name = f"outbound|9080||{HOST}"

    def health(knobs: GenerationKnobs) -> dict[str, int]:
        cla = _unpack(w.eds(proxy(), {name}, ctx_with(w, knobs))[name], endpoint_pb2.ClusterLoadAssignment)
        return {e.endpoint.address.socket_address.address: e.health_status
                for group in cla.endpoints for e in group.lb_endpoints}

    assert health(GenerationKnobs()) == {"10.1.0.1": 1}  # HEALTHY only
    assert health(GenerationKnobs(send_unhealthy_endpoints=True)) == {"10.1.0.1": 1, "10.1.0.2": 2}  # + UNHEALTHY


@pytest.mark.timeout(60)
@pytest.mark.parametrize("interception", ["NONE", "REDIRECT"])
def test_sniffed_listeners_pass_envoy_validate(interception: str, tmp_path: Path) -> None:
    sidecar = {"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
               "metadata": {"name": "s", "namespace": "default"},
               "spec": {"ingress": [{"port": {"number": 9000, "name": "web"}, "defaultEndpoint": "127.0.0.1:9001",
                                     **({"bind": "127.0.0.7", "captureMode": "NONE"} if interception == "NONE" else {})}]}}
    w = world(service("db", cluster_ip="10.96.0.21", ports=[{"name": "tcp", "port": 8000}]),
              service("api", cluster_ip="10.96.0.22", ports=[{"name": "8000", "port": 8000}]), sidecar)
    config = static_bootstrap(ctx_with(w, GenerationKnobs(http10=True)), proxy(interception=interception))
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated config:\n{output}"


def test_scope_gateway_to_namespace_knob() -> None:
    """A Gateway of another namespace configures the router by default (istiod's default), not
    with PILOT_SCOPE_GATEWAY_TO_NAMESPACE."""
    gateway = {"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
               "metadata": {"name": "web", "namespace": "apps"},
               "spec": {"selector": {"istio": "ingressgateway"},
                        "servers": [{"port": {"number": 8080, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}}
    w = World()
    w.apply(gateway)
    router = _router()
    shared = w.lds(router, ctx_with(w))
    scoped = w.lds(router, ctx_with(w, GenerationKnobs(scope_gateway_to_namespace=True)))
    assert "0.0.0.0_8080" in shared
    assert "0.0.0.0_8080" not in scoped


def _router(namespace: str = "istio-system") -> Proxy:
    node_id = f"router~10.0.0.3~gw-1.{namespace}~{namespace}.svc.{DOMAIN}"
    t, ips, pod_, ns, domain = parse_node_id(node_id)
    return Proxy(node_id, t, ips, pod_, ns, domain, f"gw.{namespace}",
                 {"NAMESPACE": ns, "LABELS": {"istio": "ingressgateway"}})


def test_filter_gateway_cluster_config_knob() -> None:
    """With PILOT_FILTER_GATEWAY_CLUSTER_CONFIG a gateway gets the clusters its routes use only."""
    gateway = {"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
               "metadata": {"name": "web", "namespace": "istio-system"},
               "spec": {"selector": {"istio": "ingressgateway"},
                        "servers": [{"port": {"number": 8080, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}}
    vs = {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
          "metadata": {"name": "web", "namespace": "default"},
          "spec": {"hosts": ["*"], "gateways": ["istio-system/web"],
                   "http": [{"route": [{"destination": {"host": "web"}}]}]}}
    w = world(service("other", cluster_ip="10.96.0.30"), gateway, vs)
    all_clusters = set(w.cds(_router(), ctx_with(w)))
    only = set(w.cds(_router(), ctx_with(w, GenerationKnobs(filter_gateway_clusters=True))))
    assert {f"outbound|8000||{HOST}", f"outbound|9080||other.default.svc.{DOMAIN}"} <= all_clusters
    assert f"outbound|8000||{HOST}" in only and f"outbound|9080||other.default.svc.{DOMAIN}" not in only
    assert "BlackHoleCluster" in only
