"""EnvoyFilter: validation (refused with path and reason), application per operation and context,
selection and order, and the shared-bytes cache (patched resources keyed by their patches, the
rest still shared)."""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from pilot.config.kinds import BY_NAME
from pilot.config.validation import parse_object
from pilot.features import Features
from pilot.model import dependencies as dep
from pilot.model.store import ConfigKey, Store
from pilot.sources.kube.client import Kube
from pilot.sources.kube.informer import Informer
from pilot.sources.kube.source import WATCHED_KINDS
from pilot.webhook.admission import review_bytes, rules
from pilot.xds.connection import Connection
from pilot.xds.discovery import GENERATORS, DiscoveryServer
from pilot.xds.generated import GenerationMemo
from pilot.xds.typeurls import CLUSTER, LISTENER
from tests.fakes.apiserver import FakeApiServer
from tests.support.scoping import HandPushes, subscribe
from tests.support.wait import wait_for

from .helpers import World, endpoint_slice, proxy, service

REVIEWS = "reviews.default.svc.cluster.local"
REVIEWS_CLUSTER = f"outbound|9080||{REVIEWS}"
RATINGS_CLUSTER = "outbound|9080||ratings.default.svc.cluster.local"
LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
HCM_NAME = "envoy.filters.network.http_connection_manager"
ROUTER = "envoy.filters.http.router"


def envoy_filter(name: str, patches: list[dict], namespace: str = "default", selector: dict | None = None,
                 priority: int | None = None, created: str = "2026-01-01T00:00:00Z") -> dict:
    spec: dict = {"configPatches": patches}
    if selector is not None:
        spec["workloadSelector"] = {"labels": selector}
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created}, "spec": spec}


def lua_before_router(code: str = "function envoy_on_response(h) h:headers():add('x-ef', '1') end",
                      context: str = "SIDECAR_OUTBOUND") -> dict:
    return {"applyTo": "HTTP_FILTER",
            "match": {"context": context, "listener": {"filterChain": {"filter": {
                "name": HCM_NAME, "subFilter": {"name": ROUTER}}}}},
            "patch": {"operation": "INSERT_BEFORE", "value": {
                "name": "envoy.filters.http.lua", "typed_config": {"@type": LUA, "inlineCode": code}}}}


def connect_timeout(seconds: str, service_host: str = REVIEWS) -> dict:
    return {"applyTo": "CLUSTER", "match": {"context": "SIDECAR_OUTBOUND", "cluster": {"service": service_host}},
            "patch": {"operation": "MERGE", "value": {"connect_timeout": seconds}}}


@pytest.fixture
def world() -> World:
    w = World()
    w.apply(service("reviews", cluster_ip="10.96.0.20"), service("ratings", cluster_ip="10.96.0.21"),
            endpoint_slice("reviews-1", "reviews", addresses=("10.1.0.1",)),
            endpoint_slice("ratings-1", "ratings", addresses=("10.1.0.2",)))
    return w


def labelled(labels: dict[str, str], **kw):
    p = proxy(**kw)
    p.metadata = {**p.metadata, "LABELS": labels}
    return p


def http_filters(res) -> list[str]:
    listener = res.message(listener_pb2.Listener)
    hcm = hcm_pb2.HttpConnectionManager()
    for fc in listener.filter_chains:
        for f in fc.filters:
            if f.name == HCM_NAME:
                f.typed_config.Unpack(hcm)
                return [h.name for h in hcm.http_filters]
    raise AssertionError("no HTTP connection manager")


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("patch", "reason"), [
    ({"applyTo": "NOT_A_THING", "patch": {"operation": "MERGE", "value": {}}}, "applyTo"),
    ({"applyTo": "HTTP_FILTER", "patch": {"operation": "ADD", "value": {
        "name": "x", "typed_config": {"@type": "type.googleapis.com/envoy.nope.v3.Missing"}}}},
     "Can not find message descriptor by type_url: type.googleapis.com/envoy.nope.v3.Missing"),
    ({"applyTo": "HTTP_FILTER", "patch": {"operation": "ADD", "value": {
        "name": "x", "typed_config": {"@type": LUA, "inlineCod": "x"}}}}, 'has no field named "inlineCod"'),
    ({"applyTo": "CLUSTER", "patch": {"operation": "MERGE", "value": {"connect_timeout": "soon"}}},
     "invalid CLUSTER value"),
    ({"applyTo": "CLUSTER", "patch": {"operation": "INSERT_BEFORE", "value": {"name": "c"}}}, "INSERT_BEFORE"),
    ({"applyTo": "CLUSTER", "match": {"listener": {"portNumber": 80}},
      "patch": {"operation": "MERGE", "value": {}}}, "only a cluster match"),
    ({"applyTo": "HTTP_FILTER", "patch": {"operation": "ADD"}}, "missing patch value for non-remove operation"),
    ({"applyTo": "NETWORK_FILTER", "match": {"listener": {"filterChain": {"filter": {"subFilter": {"name": "x"}}}}},
      "patch": {"operation": "REMOVE"}}, "filter match has no name to match on"),
    ({"applyTo": "NETWORK_FILTER", "match": {"listener": {"filterChain": {"filter": {
        "name": HCM_NAME, "subFilter": {"name": "x"}}}}}, "patch": {"operation": "REMOVE"}},
     "subfilter match can be used with applyTo HTTP_FILTER only"),
    ({"applyTo": "HTTP_FILTER", "match": {"listener": {"filterChain": {"filter": {
        "name": "envoy.filters.network.tcp_proxy", "subFilter": {"name": "x"}}}}}, "patch": {"operation": "REMOVE"}},
     "subfilter match requires filter match with"),
    ({"applyTo": "HTTP_FILTER", "patch": {"operation": "ADD", "filterClass": "AUTHZ", "value": {"name": "x"}}},
     "filterClass is not supported"),
    ({"applyTo": "LISTENER", "match": {"proxy": {"proxyVersion": "1.2("}},
      "patch": {"operation": "MERGE", "value": {}}}, "proxy version"),
])
def test_bad_envoy_filters_are_refused_with_path_and_reason(patch, reason):
    with pytest.raises(Exception) as err:
        parse_object(envoy_filter("bad", [patch]))
    assert reason in str(err.value)
    assert "configPatches" in str(err.value)


def test_a_type_url_never_imports_a_module_outside_the_proto_packages():
    bad = envoy_filter("bad", [{"applyTo": "HTTP_FILTER", "patch": {"operation": "ADD", "value": {
        "name": "x", "typed_config": {"@type": "type.googleapis.com/this.Zen"}}}}])
    with pytest.raises(Exception) as err:
        parse_object(bad)
    assert "Can not find message descriptor" in str(err.value)
    assert "this" not in sys.modules  # (importing it would print the Zen of Python)


def test_extension_config_patches_are_add_only_and_need_a_name_and_a_typed_config():
    lua = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"

    def ef(patch: dict, match: dict | None = None) -> dict:
        return envoy_filter("x", [{"applyTo": "EXTENSION_CONFIG", "patch": patch, **({"match": match} if match else {})}])

    with pytest.raises(Exception, match="supports ADD only"):
        parse_object(ef({"operation": "MERGE", "value": {"name": "a"}}))
    with pytest.raises(Exception, match="needs a name"):
        parse_object(ef({"operation": "ADD", "value": {"typed_config": {"@type": lua}}}))
    with pytest.raises(Exception, match="needs a typed_config"):
        parse_object(ef({"operation": "ADD", "value": {"name": "a"}}))
    with pytest.raises(Exception, match="only a proxy match"):
        parse_object(ef({"operation": "ADD", "value": {"name": "a", "typed_config": {"@type": lua}}},
                        {"listener": {"portNumber": 80}}))
    ok = parse_object(ef({"operation": "ADD", "value": {"name": "a", "typed_config": {"@type": lua}}}))
    assert ok.spec.config_patches[0].message.name == "a"


def test_an_extension_config_reaches_the_proxies_of_its_context(world):
    from pilot.xds.cache import XdsCache
    from pilot.xds.generators import ecds
    lua = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
    world.apply(envoy_filter("ec", [
        {"applyTo": "EXTENSION_CONFIG", "match": {"context": c},
         "patch": {"operation": "ADD", "value": {"name": n, "typed_config": {"@type": lua, "inlineCode": n}}}}
        for n, c in (("any", "ANY"), ("gw", "GATEWAY"), ("in", "SIDECAR_INBOUND"))]))
    names = frozenset({"any", "gw", "in"})

    def served(p) -> set[str]:
        return {r.name for r in ecds.generate(world.ctx(), p, names, XdsCache(100))}

    assert served(proxy()) == {"any", "in"}
    assert served(proxy(ptype="router", pod_name="gw-1")) == {"any", "gw"}


def test_the_value_is_converted_once_per_revision():
    obj = parse_object(envoy_filter("ef", [lua_before_router()]))
    p = obj.spec.config_patches[0]
    assert p.message is p.message and p.message.typed_config.type_url == LUA


# --- application --------------------------------------------------------------------------------
def test_insert_before_router_adds_the_lua_filter_to_outbound_http_listeners(world):
    p = proxy()
    before = world.lds(p)
    name = next(n for n in before if n.endswith("_9080"))
    assert "envoy.filters.http.lua" not in http_filters(before[name])
    world.apply(envoy_filter("lua", [lua_before_router()]))
    after = world.lds(p)
    filters = http_filters(after[name])
    assert filters.index("envoy.filters.http.lua") == filters.index(ROUTER) - 1
    assert "EnvoyFilter/default/lua" in after[name].origins


def test_cluster_merge_changes_connect_timeout_of_the_matched_cluster_only(world):
    p = proxy()
    before = world.cds(p)
    world.apply(envoy_filter("timeout", [connect_timeout("7s")]))
    after = world.cds(p)
    assert after[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 7
    # Untouched clusters are the same shared objects as before.
    assert after[RATINGS_CLUSTER] is before[RATINGS_CLUSTER]


def test_remove_add_and_replace(world):
    p = proxy()
    world.apply(envoy_filter("ops", [
        {"applyTo": "CLUSTER", "match": {"cluster": {"name": RATINGS_CLUSTER}}, "patch": {"operation": "REMOVE"}},
        {"applyTo": "CLUSTER", "match": {"context": "SIDECAR_OUTBOUND"},
         "patch": {"operation": "ADD", "value": {"name": "extra", "type": "STATIC", "connect_timeout": "1s"}}},
        {"applyTo": "HTTP_FILTER", "match": {"listener": {"filterChain": {"filter": {
            "name": HCM_NAME, "subFilter": {"name": ROUTER}}}}},
         "patch": {"operation": "INSERT_FIRST", "value": {"name": "envoy.filters.http.cors", "typed_config": {
             "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}}}},
        {"applyTo": "HTTP_FILTER", "match": {"listener": {"filterChain": {"filter": {
            "name": HCM_NAME, "subFilter": {"name": "envoy.filters.http.cors"}}}}},
         "patch": {"operation": "REMOVE"}},
    ]))
    clusters = world.cds(p)
    assert RATINGS_CLUSTER not in clusters and "extra" in clusters
    name = next(n for n in world.lds(p) if n.endswith("_9080"))
    assert "envoy.filters.http.cors" not in http_filters(world.lds(p)[name])


def test_insert_after_and_replace_keep_the_order_they_name(world):
    """INSERT_AFTER goes right after the filter it names, REPLACE takes that filter's place, and
    neither happens when the named filter is absent (istiod's insertAfterFunc / replaceFunc)."""
    p = proxy()

    def at(sub: str, op: str, name: str, type_url: str) -> dict:
        return {"applyTo": "HTTP_FILTER", "match": {"listener": {"filterChain": {"filter": {
            "name": HCM_NAME, "subFilter": {"name": sub}}}}},
            "patch": {"operation": op, "value": {"name": name, "typed_config": {"@type": type_url}}}}

    cors = "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"
    fault = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"
    world.apply(envoy_filter("ops", [
        {"applyTo": "HTTP_FILTER", "match": {"listener": {"filterChain": {"filter": {"name": HCM_NAME}}}},
         "patch": {"operation": "INSERT_FIRST", "value": {"name": "first.cors", "typed_config": {"@type": cors}}}},
        at("first.cors", "INSERT_AFTER", "after.fault", fault),
        at("first.cors", "REPLACE", "replaced.cors", cors),
        at("not.there", "INSERT_AFTER", "never.inserted", fault),
        at("not.there", "REPLACE", "never.replaced", cors),
    ]))
    name = next(n for n in world.lds(p) if n.endswith("_9080"))
    filters = http_filters(world.lds(p)[name])
    assert filters[:2] == ["replaced.cors", "after.fault"], filters
    assert "first.cors" not in filters and filters[-1] == ROUTER
    assert not {"never.inserted", "never.replaced"} & set(filters)


def test_route_configuration_virtual_host_and_route_patches(world):
    p = proxy()
    world.apply(envoy_filter("routes", [
        {"applyTo": "ROUTE_CONFIGURATION", "match": {"routeConfiguration": {"portNumber": 9080}},
         "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [
             {"header": {"key": "x-rc", "value": "1"}}]}}},
        {"applyTo": "VIRTUAL_HOST", "match": {"routeConfiguration": {"portNumber": 9080}},
         "patch": {"operation": "ADD", "value": {"name": "added", "domains": ["added.example"],
                                                   "routes": [{"match": {"prefix": "/"},
                                                               "direct_response": {"status": 204}}]}}},
        {"applyTo": "HTTP_ROUTE", "match": {"routeConfiguration": {"vhost": {"name": f"{REVIEWS}:9080"}}},
         "patch": {"operation": "INSERT_FIRST", "value": {"name": "first", "match": {"prefix": "/x"},
                                                          "direct_response": {"status": 418}}}},
    ]))
    rc = world.rds(p, {"9080"})["9080"].message(route_pb2.RouteConfiguration)
    assert rc.response_headers_to_add[0].header.key == "x-rc"
    assert any(v.name == "added" for v in rc.virtual_hosts)
    reviews = next(v for v in rc.virtual_hosts if v.name == f"{REVIEWS}:9080")
    assert reviews.routes[0].name == "first" and len(reviews.routes) > 1
    # As in istiod, route patches apply to the virtual hosts generated, not to ones a patch adds.
    assert all(r.name != "first" for r in next(v for v in rc.virtual_hosts if v.name == "added").routes)


def test_context_inbound_does_not_touch_outbound(world):
    p = proxy()
    world.apply(envoy_filter("in", [lua_before_router(context="SIDECAR_INBOUND"),
                                    {**connect_timeout("9s"), "match": {"context": "SIDECAR_INBOUND"}}]))
    ctx = world.ctx()
    clusters = world.cds(p, ctx)
    assert clusters[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds != 9
    name = next(n for n in world.lds(p, ctx) if n.endswith("_9080"))
    assert "envoy.filters.http.lua" not in http_filters(world.lds(p, ctx)[name])


# --- selection, order, proxy match --------------------------------------------------------------
def test_workload_selector_namespace_and_root_namespace(world):
    world.apply(service("reviews", "other", cluster_ip="10.96.1.20"))
    a, b = labelled({"app": "a"}), labelled({"app": "b"})
    elsewhere = labelled({"app": "a"}, namespace="other")
    world.apply(envoy_filter("sel", [connect_timeout("3s")], selector={"app": "a"}))
    ctx = world.ctx()
    assert world.cds(a, ctx)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 3
    assert world.cds(b, ctx)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds != 3
    assert world.cds(elsewhere, ctx)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds != 3
    world.apply(envoy_filter("mesh", [connect_timeout("4s")], namespace="istio-system", priority=10))
    ctx = world.ctx()
    # Root namespace: everywhere; priority 10 applies after the namespace's priority 0 filter.
    assert world.cds(elsewhere, ctx)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 4
    assert world.cds(a, ctx)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 4


def test_priority_then_age_orders_merges(world):
    p = proxy()
    world.apply(envoy_filter("old", [connect_timeout("5s")], created="2026-01-01T00:00:00Z"),
                envoy_filter("new", [connect_timeout("6s")], created="2026-02-01T00:00:00Z"))
    assert world.cds(p)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 6
    world.apply(envoy_filter("new", [connect_timeout("6s")], created="2026-02-01T00:00:00Z", priority=-1))
    assert world.cds(p)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 5


def test_at_equal_priority_the_root_namespace_applies_first_whatever_the_age(world):
    p = proxy()
    world.apply(envoy_filter("ns", [connect_timeout("5s")], created="2026-01-01T00:00:00Z"),
                envoy_filter("root", [connect_timeout("6s")], namespace="istio-system",
                             created="2026-02-01T00:00:00Z"))
    # The root namespace's is younger but applies first: the namespace's MERGE has the last word.
    assert world.cds(p)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 5


def test_proxy_version_and_metadata_match(world):
    p = proxy()
    p.metadata = {**p.metadata, "ISTIO_VERSION": "1.30.1", "ROLE": "edge"}
    patch = connect_timeout("8s")
    patch["match"]["proxy"] = {"proxyVersion": r"^1\.29", "metadata": {"ROLE": "edge"}}
    world.apply(envoy_filter("v", [patch]))
    assert world.cds(p)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds != 8
    patch["match"]["proxy"]["proxyVersion"] = r"^1\.30"
    world.apply(envoy_filter("v", [patch]))
    assert world.cds(p)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 8
    # No ISTIO_VERSION: a version regex, even ".*", does not match.
    patch["match"]["proxy"] = {"proxyVersion": ".*"}
    world.apply(envoy_filter("v", [patch]))
    assert world.cds(proxy())[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds != 8
    assert world.cds(p)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 8


# --- cache ------------------------------------------------------------------------------------------
def test_patched_bytes_are_shared_by_proxies_with_the_same_patches_and_keyed_by_revision(world):
    world.apply(envoy_filter("sel", [connect_timeout("3s")], selector={"app": "a"}))
    ctx = world.ctx()
    a1, a2 = labelled({"app": "a"}, pod_name="a1"), labelled({"app": "a"}, pod_name="a2")
    b = labelled({"app": "b"}, pod_name="b1")
    ca1, ca2, cb = world.cds(a1, ctx), world.cds(a2, ctx), world.cds(b, ctx)
    assert ca1[REVIEWS_CLUSTER] is ca2[REVIEWS_CLUSTER]
    assert ca1[REVIEWS_CLUSTER].version != cb[REVIEWS_CLUSTER].version
    assert ca1[RATINGS_CLUSTER] is cb[RATINGS_CLUSTER]  # no filter touches it: one object for all
    builds = world.cache.misses
    world.ctx()
    assert world.cds(a1)[REVIEWS_CLUSTER] is ca1[REVIEWS_CLUSTER]  # a new push, same inputs: cached
    assert world.cache.misses == builds
    world.apply(envoy_filter("sel", [connect_timeout("4s")], selector={"app": "a"}))
    assert world.cds(a1)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds == 4


def test_an_envoy_filter_change_meets_the_proxies_of_its_namespace_and_root_only(world):
    p, elsewhere = proxy(), proxy("other")
    ctx = world.ctx()
    with ctx.recording() as d_here:
        world.cds(p, ctx)
    with ctx.recording() as d_there:
        world.cds(elsewhere, ctx)
    world.apply(envoy_filter("ef", [connect_timeout("3s")]))
    new = world.ctx()
    change = dep.change_of([ConfigKey("EnvoyFilter", "default", "ef")], ctx, new, mesh_changed=False,
                           service_endpoints_kind="EndpointSlice", ambient_kinds=frozenset())
    m = dep.Matcher(change)
    assert m.meets(d_here) and not m.meets(d_there)
    root = dep.change_of([ConfigKey("EnvoyFilter", "istio-system", "ef")], ctx, new, mesh_changed=False,
                         service_endpoints_kind="EndpointSlice", ambient_kinds=frozenset())
    assert dep.Matcher(root).meets(d_there)



# --- contexts: inbound, gateway; listener-level operations ---------------------------------------
def inbound_world() -> tuple[World, object]:
    w = World()
    s = service("reviews", cluster_ip="10.96.0.20")
    s["spec"]["selector"] = {"app": "reviews"}
    w.apply(s, endpoint_slice("reviews-1", "reviews", addresses=("10.0.0.1",), port=9080))
    p = labelled({"app": "reviews"}, interception="REDIRECT")
    p.identity = "spiffe://cluster.local/ns/default/sa/reviews"
    return w, p


def test_inbound_context_patches_inbound_listeners_clusters_and_their_inline_routes():
    w, p = inbound_world()
    w.apply(envoy_filter("in", [
        lua_before_router(context="SIDECAR_INBOUND"),
        {"applyTo": "CLUSTER", "match": {"context": "SIDECAR_INBOUND", "cluster": {"portNumber": 9080}},
         "patch": {"operation": "MERGE", "value": {"connect_timeout": "2s"}}},
        {"applyTo": "VIRTUAL_HOST", "match": {"context": "SIDECAR_INBOUND",
                                              "routeConfiguration": {"portNumber": 9080}},
         "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [
             {"header": {"key": "x-inbound", "value": "1"}}]}}},
    ]))
    ctx = w.ctx()
    listeners = w.lds(p, ctx)
    assert "envoy.filters.http.lua" in http_filters(listeners["virtualInbound"])
    outbound = next(n for n in listeners if n.endswith("_9080"))
    assert "envoy.filters.http.lua" not in http_filters(listeners[outbound])
    clusters = w.cds(p, ctx)
    assert clusters["inbound|9080||"].message(cluster_pb2.Cluster).connect_timeout.seconds == 2
    assert clusters[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds != 2
    vi = listeners["virtualInbound"].message(listener_pb2.Listener)
    hosts = []
    for fc in vi.filter_chains:
        for f in fc.filters:
            if f.name == HCM_NAME:
                hcm = hcm_pb2.HttpConnectionManager()
                f.typed_config.Unpack(hcm)
                hosts.extend(h.key for vh in hcm.route_config.virtual_hosts for h in
                             [x.header for x in vh.response_headers_to_add])
    assert "x-inbound" in hosts


def test_gateway_context_and_listener_add_and_listener_filter():
    w = World()
    w.apply(service("reviews", cluster_ip="10.96.0.20"),
            {"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
             "metadata": {"name": "gw", "namespace": "istio-system"},
             "spec": {"selector": {"istio": "ingressgateway"},
                      "servers": [{"port": {"number": 8080, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}},
            envoy_filter("gw", [
                {"applyTo": "LISTENER", "match": {"context": "GATEWAY", "listener": {"portNumber": 8080}},
                 "patch": {"operation": "MERGE", "value": {"per_connection_buffer_limit_bytes": 32768}}},
                {"applyTo": "LISTENER_FILTER", "match": {"context": "GATEWAY", "listener": {"portNumber": 8080}},
                 "patch": {"operation": "INSERT_FIRST", "value": {
                     "name": "envoy.filters.listener.tls_inspector", "typed_config": {
                         "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"}}}},
                {"applyTo": "LISTENER", "match": {"context": "GATEWAY"},
                 "patch": {"operation": "ADD", "value": {
                     "name": "extra", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9999}}}}},
                {"applyTo": "ROUTE_CONFIGURATION", "match": {"context": "GATEWAY",
                                                             "routeConfiguration": {"portNumber": 8080}},
                 "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [
                     {"header": {"key": "x-gw", "value": "1"}}]}}},
            ], namespace="istio-system", selector={"istio": "ingressgateway"}))
    gw = labelled({"istio": "ingressgateway"}, namespace="istio-system", ptype="router", pod_name="gw-1")
    ctx = w.ctx()
    listeners = w.lds(gw, ctx)
    main = listeners["0.0.0.0_8080"].message(listener_pb2.Listener)
    assert main.per_connection_buffer_limit_bytes.value == 32768
    assert main.listener_filters[0].name == "envoy.filters.listener.tls_inspector"
    assert "extra" in listeners
    rc = w.rds(gw, {"http.8080"}, ctx)["http.8080"].message(route_pb2.RouteConfiguration)
    assert rc.response_headers_to_add[0].header.key == "x-gw"
    # A sidecar in the root namespace is not a gateway: none of this applies to it.
    side = labelled({"istio": "ingressgateway"}, namespace="istio-system", pod_name="side-1")
    assert "extra" not in w.lds(side, ctx)


def test_listener_remove_and_filter_chain_match_by_name():
    w, p = inbound_world()
    w.apply(envoy_filter("rm", [
        {"applyTo": "LISTENER", "match": {"context": "SIDECAR_OUTBOUND", "listener": {"portNumber": 9080}},
         "patch": {"operation": "REMOVE"}},
        {"applyTo": "FILTER_CHAIN", "match": {"context": "SIDECAR_INBOUND", "listener": {
            "filterChain": {"name": "inbound|9080||-mtls"}}}, "patch": {"operation": "REMOVE"}},
    ]))
    listeners = w.lds(p)
    assert not any(n.endswith("_9080") and n.startswith("0.0.0.0") for n in listeners)
    chains = [fc.name for fc in listeners["virtualInbound"].message(listener_pb2.Listener).filter_chains]
    assert "inbound|9080||-mtls" not in chains and "inbound|9080||" in chains, chains


# --- Kubernetes mode ---------------------------------------------------------------------------
async def test_envoy_filters_are_watched_in_kubernetes_mode_and_bad_ones_refused_with_reason():
    assert "EnvoyFilter" in WATCHED_KINDS
    kind = BY_NAME["EnvoyFilter"]
    async with FakeApiServer() as fake:
        fake.register_crd("networking.istio.io", "v1alpha3", kind.plural, "EnvoyFilter")
        good = envoy_filter("good", [lua_before_router()])
        good["metadata"].pop("creationTimestamp")
        bad = envoy_filter("bad", [{"applyTo": "HTTP_FILTER", "patch": {"operation": "ADD", "value": {
            "name": "x", "typed_config": {"@type": "type.googleapis.com/envoy.nope.v3.Missing"}}}}])
        bad["metadata"].pop("creationTimestamp")
        fake.create(good)
        fake.create(bad)
        store = Store()
        kube = Kube(fake.api_client())
        informer = Informer(kube, kind, store)
        task = asyncio.create_task(informer.run())
        try:
            await wait_for(lambda: informer.synced.is_set(), timeout=10)
            assert [e.key.name for e in store.list("EnvoyFilter")] == ["good"]
            reasons = {r.name: r.reason for r in store.rejections()}
            assert "Can not find message descriptor by type_url" in reasons["bad"]
            assert reasons["bad"].startswith("spec.configPatches[0]")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await kube.close()


def test_the_webhook_refuses_a_bad_envoy_filter_with_the_file_mode_reason():
    bad = envoy_filter("bad", [{"applyTo": "HTTP_FILTER", "patch": {"operation": "ADD", "value": {
        "name": "x", "typed_config": {"@type": LUA, "inlineCod": "x"}}}}])
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE", "namespace": "default", "object": bad}}
    out = json.loads(review_bytes(json.dumps(body).encode(), "application/json").body)["response"]
    with pytest.raises(Exception) as err:
        parse_object(bad)
    assert out["allowed"] is False
    assert out["status"]["message"] == f"configuration is invalid: {err.value.reason}"
    assert 'has no field named "inlineCod"' in out["status"]["message"]
    good = {**body, "request": {**body["request"], "object": envoy_filter("good", [lua_before_router()])}}
    assert json.loads(review_bytes(json.dumps(good).encode(), "application/json").body)["response"]["allowed"]
    assert any("envoyfilters" in r["resources"] for r in rules())


def test_a_listener_filter_does_not_split_the_clusters_proxies_share(world):
    """The generation memo keys each type by that type's patches only: a workload given a Lua
    filter still shares its CDS output (one generation for both) with its unselected peers."""
    world.apply(envoy_filter("lua", [lua_before_router()], selector={"app": "a"}))
    ctx = world.ctx()
    memo = GenerationMemo(GENERATORS, world.cache)
    a, b = labelled({"app": "a"}, pod_name="a1"), labelled({"app": "b"}, pod_name="b1")
    assert memo.generate(ctx, CLUSTER, a, None) is memo.generate(ctx, CLUSTER, b, None)
    la, lb = memo.generate(ctx, LISTENER, a, None), memo.generate(ctx, LISTENER, b, None)
    assert la is not lb
    name = next(r.name for r in la.resources if r.name.endswith("_9080"))
    assert "envoy.filters.http.lua" in http_filters(next(r for r in la.resources if r.name == name))
    assert "envoy.filters.http.lua" not in http_filters(next(r for r in lb.resources if r.name == name))


def test_an_envoy_filter_without_patches_is_valid_and_changes_nothing(world):
    p = proxy()
    before = world.cds(p)
    world.apply(envoy_filter("empty", []))
    after = world.cds(p)
    assert all(after[n] is before[n] for n in before)


# --- pushes: who is regenerated, who is sent something -----------------------------------------
async def test_an_envoy_filter_change_is_sent_exactly_to_the_proxies_it_selects_or_selected(world):
    """The push scope of a namespace's EnvoyFilter is its namespace (the root namespace's: every
    proxy); of those, only the proxies whose bytes change get a response."""
    world.mesh.refresh(world.store)
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))
    hand = HandPushes(server)
    server.rebuild()
    a = labelled({"app": "a"}, pod_name="a1")
    b = labelled({"app": "b"}, pod_name="b1")
    other = labelled({"app": "a"}, namespace="other", pod_name="o1")
    conns = [Connection(p, "test", delta=False) for p in (a, b, other)]
    for conn in conns:
        server.register(conn)
        await subscribe(server, conn, {CLUSTER: None})
    hand.requests.clear()

    async def step(*docs):
        world.apply(*docs)
        return await hand.push(conns)

    scoped, got = await step(envoy_filter("sel", [connect_timeout("3s")], selector={"app": "a"}))
    assert scoped == {"a1", "b1"} and got == {"a1"}
    # Now selecting b instead: a loses the patch, b gains it; the other namespace is untouched.
    scoped, got = await step(envoy_filter("sel", [connect_timeout("3s")], selector={"app": "b"}))
    assert scoped == {"a1", "b1"} and got == {"a1", "b1"}
    # The root namespace's reaches every proxy's scope; b's own filter applies after it (root
    # first at equal priority) and keeps its 3 s, so b's bytes do not change and it is sent nothing.
    scoped, got = await step(envoy_filter("mesh", [connect_timeout("4s")], namespace="istio-system"))
    assert scoped == {"a1", "b1", "o1"} and got == {"a1", "o1"}


def test_an_envoy_filter_parsed_in_another_process_makes_its_types_known_here(tmp_path):
    """The file source parses in a worker process and pickles the objects back: the process that
    unpickles one (and renders config dumps as JSON) must know the Envoy types its values name."""
    path = tmp_path / "ef.pickle"
    path.write_bytes(pickle.dumps(parse_object(envoy_filter("lua", [lua_before_router()]))))
    code = ("import pickle, sys\n"
            "from google.protobuf import descriptor_pool\n"
            "pool = descriptor_pool.Default()\n"
            "name = 'envoy.extensions.filters.http.lua.v3.Lua'\n"
            "try:\n    pool.FindMessageTypeByName(name); sys.exit('known before unpickling')\n"
            "except KeyError:\n    pass\n"
            "pickle.loads(open(sys.argv[1], 'rb').read())\n"
            "pool.FindMessageTypeByName(name)\n")
    run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2], check=False)
    assert run.returncode == 0, run.stderr or run.stdout


def test_a_port_on_virtual_inbound_matches_the_filter_chains_destination_port():
    for port, applied in ((9080, True), (9081, False)):
        w, p = inbound_world()
        patch = lua_before_router(context="SIDECAR_INBOUND")
        patch["match"]["listener"]["portNumber"] = port
        w.apply(envoy_filter("in", [patch]))
        assert ("envoy.filters.http.lua" in http_filters(w.lds(p)["virtualInbound"])) is applied
