"""EnvoyFilter `targetRefs` (istiod's WorkloadPolicyMatcher: a Gateway API Gateway of the filter's
namespace selects that Gateway's proxies, nothing else), the kinds refused with the reason,
virtual host `domainName`, the fields istiod never reads refused saying so, and push scoping: a
change to a filter with targetRefs reaches the Gateway's proxies and no sidecar."""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2

from pilot.config.validation import parse_object
from pilot.features import Features
from pilot.model import dependencies as dep
from pilot.model import envoy_filters as ef
from pilot.model.store import ConfigKey
from pilot.xds.connection import Connection
from pilot.xds.discovery import DiscoveryServer
from pilot.xds.typeurls import CLUSTER
from tests.support.scoping import HandPushes, pushed, subscribe

from .helpers import World, endpoint_slice, proxy, service
from .test_envoy_filter import REVIEWS, REVIEWS_CLUSTER, envoy_filter, labelled

GW_LABEL = "gateway.networking.k8s.io/gateway-name"
API = "gateway.networking.k8s.io"


def targeting(name: str, patches: list[dict], refs: list[dict], namespace: str = "default") -> dict:
    doc = envoy_filter(name, patches, namespace=namespace)
    doc["spec"]["targetRefs"] = refs
    return doc


def gateway_ref(name: str) -> dict:
    return {"group": API, "kind": "Gateway", "name": name}


def timeout(seconds: str) -> dict:
    """A cluster MERGE of context ANY: istiod applies it to sidecars' outbound and gateways' clusters,
    so only selection decides who gets it."""
    return {"applyTo": "CLUSTER", "match": {"context": "ANY", "cluster": {"service": REVIEWS}},
            "patch": {"operation": "MERGE", "value": {"connect_timeout": seconds}}}


def gateway_proxy(gateway: str, namespace: str = "default", pod: str = "gw-1"):
    return labelled({GW_LABEL: gateway}, namespace=namespace, ptype="router", pod_name=pod)


def seconds(w: World, p, ctx=None) -> int:
    return w.cds(p, ctx)[REVIEWS_CLUSTER].message(cluster_pb2.Cluster).connect_timeout.seconds


@pytest.fixture
def world() -> World:
    w = World()
    w.apply(service("reviews", cluster_ip="10.96.0.20"), service("ratings", cluster_ip="10.96.0.21"),
            service("reviews", "other", cluster_ip="10.96.1.20"),
            endpoint_slice("reviews-1", "reviews", addresses=("10.1.0.1",)))
    return w


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("refs", "reason"), [
    ([{"kind": "Service", "name": "reviews"}],
     "targetRefs[0]: kind Service is not supported: istiod selects EnvoyFilters per proxy without its services"),
    ([gateway_ref("web"), {"group": "networking.istio.io", "kind": "ServiceEntry", "name": "db"}],
     "targetRefs[1]: kind ServiceEntry is not supported"),
    ([{"group": API, "kind": "GatewayClass", "name": "istio-waypoint"}],
     "targetRefs[0]: kind GatewayClass is not supported: istiod attaches it only to waypoints"),
    ([{"group": "apps", "kind": "Deployment", "name": "web"}], "targetRefs[0]: kind apps/Deployment is not supported"),
    ([{"kind": "Gateway", "name": "web"}], "targetRefs[0]: kind core/Gateway is not supported"),
    ([{**gateway_ref("web"), "namespace": "other"}],
     "targetRefs[0].namespace: cross namespace referencing is not currently supported"),
    ([{"group": API, "kind": "Gateway"}], "targetRefs[0].name: required"),
    ([gateway_ref(f"g{i}") for i in range(17)], "at most 16 items"),
])
def test_target_refs_istiod_never_attaches_are_refused_with_path_and_reason(refs, reason):
    with pytest.raises(Exception) as err:
        parse_object(targeting("bad", [timeout("3s")], refs))
    assert "spec.targetRefs" in str(err.value) and reason in str(err.value), str(err.value)


def test_target_refs_and_workload_selector_are_mutually_exclusive():
    doc = targeting("both", [timeout("3s")], [gateway_ref("web")])
    doc["spec"]["workloadSelector"] = {"labels": {"app": "a"}}
    with pytest.raises(Exception) as err:
        parse_object(doc)
    assert "only one of targetRefs or workloadSelector can be set" in str(err.value)


@pytest.mark.parametrize(("patch", "path", "reason"), [
    ({"applyTo": "LISTENER", "match": {"listener": {"portName": "http"}}, "patch": {"operation": "REMOVE"}},
     "spec.configPatches[0].match.listener.portName", "istiod does not implement it"),
    ({"applyTo": "HTTP_FILTER", "patch": {"operation": "ADD", "filterClass": "AUTHZ", "value": {"name": "x"}}},
     "spec.configPatches[0].patch.filterClass", "istiod never reads filterClass"),
])
def test_fields_istiod_never_reads_are_refused_saying_so(patch, path, reason):
    with pytest.raises(Exception) as err:
        parse_object(envoy_filter("bad", [patch]))
    assert f"{path}: " in str(err.value) and reason in str(err.value), str(err.value)


# --- selection ----------------------------------------------------------------------------------
def test_a_gateway_target_selects_that_gateways_proxies_of_the_namespace_only(world):
    web, other_gw = gateway_proxy("web"), gateway_proxy("shop", pod="shop-1")
    web_elsewhere = gateway_proxy("web", namespace="other", pod="gw-2")
    sidecar = labelled({"app": "reviews"})
    sidecar_of_gw_ns = proxy()
    before = {p.id: seconds(world, p) for p in (web, other_gw, web_elsewhere, sidecar)}
    assert 3 not in before.values()
    world.apply(targeting("gw", [timeout("3s")], [gateway_ref("web")]))
    ctx = world.ctx()
    assert seconds(world, web, ctx) == 3
    for p in (other_gw, web_elsewhere, sidecar, sidecar_of_gw_ns):
        assert seconds(world, p, ctx) == before.get(p.id, before[sidecar.id]), p.id
    # Several refs: either Gateway's proxies.
    world.apply(targeting("gw", [timeout("3s")], [gateway_ref("nope"), gateway_ref("shop")]))
    ctx = world.ctx()
    assert seconds(world, other_gw, ctx) == 3 and seconds(world, web, ctx) != 3


def test_a_root_namespace_filter_with_target_refs_selects_only_its_own_namespaces_gateway(world):
    """istiod's matcher requires the policy's namespace to be the proxy's for a Gateway target,
    the root namespace included (it is not mesh-wide then)."""
    root_web = gateway_proxy("web", namespace="istio-system", pod="gw-root")
    web = gateway_proxy("web")
    world.apply(targeting("gw", [timeout("4s")], [gateway_ref("web")], namespace="istio-system"))
    ctx = world.ctx()
    assert seconds(world, root_web, ctx) == 4
    assert seconds(world, web, ctx) != 4
    assert seconds(world, proxy(), ctx) != 4


def test_without_target_refs_a_gateway_api_proxy_still_takes_selector_filters(world):
    """istiod's ENABLE_SELECTOR_BASED_K8S_GATEWAY_POLICY (default on): a Gateway API Gateway's
    proxy is selected by workloadSelector and namespace-wide filters too."""
    web = gateway_proxy("web")
    world.apply(envoy_filter("sel", [timeout("5s")], selector={GW_LABEL: "web"}))
    assert seconds(world, web) == 5


# --- virtual host domainName --------------------------------------------------------------------
def test_virtual_host_domain_name_matches_a_domain_the_virtual_host_lists(world):
    p = proxy()
    header = {"response_headers_to_add": [{"header": {"key": "x-vh", "value": "1"}}]}
    world.apply(envoy_filter("vh", [
        {"applyTo": "VIRTUAL_HOST", "match": {"routeConfiguration": {"vhost": {"domainName": "reviews.default"}}},
         "patch": {"operation": "MERGE", "value": header}},
        # Not a domain any virtual host lists (istiod compares exactly, no wildcard matching).
        {"applyTo": "VIRTUAL_HOST", "match": {"routeConfiguration": {"vhost": {"domainName": "*.default"}}},
         "patch": {"operation": "REMOVE"}},
        {"applyTo": "HTTP_ROUTE", "match": {"routeConfiguration": {"vhost": {
            "domainName": "ratings", "route": {"action": "ROUTE"}}}},
         "patch": {"operation": "INSERT_FIRST", "value": {"name": "teapot", "match": {"prefix": "/tea"},
                                                          "direct_response": {"status": 418}}}},
    ]))
    rc = world.rds(p, {"9080"})["9080"].message(route_pb2.RouteConfiguration)
    by_name = {v.name: v for v in rc.virtual_hosts}
    reviews, ratings = by_name[f"{REVIEWS}:9080"], by_name["ratings.default.svc.cluster.local:9080"]
    assert "reviews.default" in reviews.domains
    assert [h.header.key for h in reviews.response_headers_to_add] == ["x-vh"]
    assert not ratings.response_headers_to_add
    assert ratings.routes[0].name == "teapot" and reviews.routes[0].name != "teapot"


# --- push scoping -------------------------------------------------------------------------------
def test_a_target_refs_filter_change_meets_only_its_gateways_recorded_reads(world):
    web, sidecar, shop = gateway_proxy("web"), proxy(), gateway_proxy("shop", pod="shop-1")
    ctx = world.ctx()
    reads = {}
    for name, p in (("web", web), ("sidecar", sidecar), ("shop", shop)):
        with ctx.recording() as d:
            world.cds(p, ctx)
        reads[name] = d
    world.apply(targeting("gw", [timeout("3s")], [gateway_ref("web")]))
    new = world.ctx()
    change = dep.change_of([ConfigKey("EnvoyFilter", "default", "gw")], ctx, new, mesh_changed=False,
                           service_endpoints_kind="EndpointSlice", ambient_kinds=frozenset())
    assert ("envoyfilters-gateway", "default", "web") in change.facets
    m = dep.Matcher(change)
    assert {n for n, d in reads.items() if m.meets(d)} == {"web"}


async def test_a_target_refs_filter_change_is_pushed_to_exactly_the_gateways_it_selects_or_selected(world):
    world.mesh.refresh(world.store)
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))
    hand = HandPushes(server)
    server.rebuild()
    proxies = [gateway_proxy("web", pod="web-1"), gateway_proxy("shop", pod="shop-1"),
               gateway_proxy("web", namespace="other", pod="web-other"), labelled({"app": "a"}, pod_name="a1")]
    conns = [Connection(p, "test", delta=False) for p in proxies]
    for conn in conns:
        server.register(conn)
        await subscribe(server, conn, {CLUSTER: None})
    hand.requests.clear()

    async def step(*docs, remove: ConfigKey | None = None):
        if remove is not None:
            world.store.delete(remove)
        world.apply(*docs)
        return await hand.push(conns)

    # Exactly the Gateway's proxies: not the sidecar, the other Gateway, nor web of another namespace.
    assert await step(targeting("gw", [timeout("3s")], [gateway_ref("web")])) == ({"web-1"}, {"web-1"})
    # Retargeted: the Gateway it selected and the one it selects now.
    assert await step(targeting("gw", [timeout("3s")], [gateway_ref("shop")])) == ({"web-1", "shop-1"},
                                                                                 {"web-1", "shop-1"})
    # To a workloadSelector: every proxy of the namespace may be selected now (scope), a1 is.
    scoped, got = await step(envoy_filter("gw", [timeout("3s")], selector={"app": "a"}))
    assert scoped == {"web-1", "shop-1", "a1"} and got == {"shop-1", "a1"}
    # Back to a Gateway target (leaving the selector: the namespace), then deleted: its proxies.
    await step(targeting("gw", [timeout("3s")], [gateway_ref("web")]))
    assert await step(remove=ConfigKey("EnvoyFilter", "default", "gw")) == ({"web-1"}, {"web-1"})


# --- waypoints ----------------------------------------------------------------------------------
def test_a_gateway_target_naming_a_waypoint_is_reported_and_patches_no_waypoint(world):
    """istiod would patch the waypoint; here waypoints take no EnvoyFilter patches, so the filter
    is listed under envoyFilterProblems in /debug/push_status instead of being silently inert."""
    hbone = [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]
    world.apply({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                 "metadata": {"name": "waypoint", "namespace": "default"},
                 "spec": {"gatewayClassName": "istio-waypoint", "listeners": hbone,
                          "addresses": [{"type": "IPAddress", "value": "10.96.9.9"}]}},
                targeting("wp", [timeout("3s")], [gateway_ref("waypoint"), gateway_ref("web")]))
    ctx = world.ctx()
    waypoints = [(e.key.namespace, e.key.name) for e in ctx.waypoint_gateways()
                 if e.obj.spec.gateway_class_name == "istio-waypoint"]
    problems = ef.waypoint_target_problems(ctx.envoy_filters, waypoints)
    assert [(p["envoyFilter"], p["gateway"]) for p in problems] == [("EnvoyFilter/default/wp", "default/waypoint")]
    assert "not applied to waypoints" in problems[0]["reason"]
    # The Gateway that is not a waypoint still gets the patch.
    assert seconds(world, gateway_proxy("web"), ctx) == 3


async def test_proxies_of_two_gateways_never_share_what_they_read(world):
    """istiod reads the gateway-name label on any proxy (a sidecar carrying it is a Gateway API
    proxy to its policy attachment). Proxies that differ only in that label must not share one
    generated result: its recorded reads name one Gateway, and a filter targeting the other must
    still reach that other's proxy."""
    world.mesh.refresh(world.store)
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))
    requests: list = []
    server.debouncer.enqueue = lambda req: requests.append(req)
    server.rebuild()
    a = labelled({GW_LABEL: "a"}, pod_name="a1")
    b = labelled({GW_LABEL: "b"}, pod_name="b1")
    conns = [Connection(p, "test", delta=False) for p in (a, b)]
    for conn in conns:
        server.register(conn)
        await subscribe(server, conn, {CLUSTER: None})
    requests.clear()
    world.apply(targeting("gw", [timeout("3s")], [gateway_ref("b")]))
    server.push(requests[0])
    assert {c.proxy.pod_name for c in conns if pushed(server, c) != {}} == {"b1"}
    assert seconds(world, b) == 3 and seconds(world, a) != 3
