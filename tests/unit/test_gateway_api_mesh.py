"""GAMMA translation and status, pure: HTTPRoutes/GRPCRoutes whose parent is a Service become
`mesh` VirtualServices for that Service's host (producer routes exported everywhere, consumer
routes only to their namespace), and which one a sidecar gets for the host. The e2e test
proves the traffic."""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2 as rc_pb2

from pilot.config.mesh import MeshConfig
from pilot.model.push_context import PushContext
from pilot.model.store import ConfigKey
from pilot.model.traffic import TrafficIndex
from pilot.networking.routes import outbound_route_config
from tests.unit.test_gateway_api import conds, route, store_of

HOST = "reviews.default.svc.cluster.local"
SERVICES = """\
    apiVersion: v1
    kind: Service
    metadata: {name: reviews, namespace: default}
    spec: {ports: [{name: http, port: 9080}]}
    ---
    apiVersion: v1
    kind: Service
    metadata: {name: reviews-v2, namespace: default}
    spec: {ports: [{name: http, port: 9080}]}
    """
PRODUCER = route("split", """\
    parentRefs: [{group: "", kind: Service, name: reviews}]
    hostnames: [ignored.example.com]
    rules:
    - matches: [{headers: [{name: x-user, value: jason}]}]
      backendRefs: [{name: reviews-v2, port: 9080}]
    - backendRefs: [{name: reviews, port: 9080}]
    """, created="2024-01-01T00:00:00Z")


def _by_name(result) -> dict:
    return {(e.key.namespace, e.key.name): e for e in result.mesh_virtual_services}


def test_producer_route_becomes_a_mesh_virtual_service_for_the_service_host():
    ctx = PushContext.build(store_of(SERVICES, PRODUCER), MeshConfig(), "m", "cluster.local", "1")
    result = ctx.gateway_api
    assert result.gateways == () and result.virtual_services == ()  # no Gateway: nothing for routers
    [vs] = result.mesh_virtual_services
    spec = vs.obj.spec
    assert (vs.key.namespace, spec.hosts, spec.gateways, spec.export_to) == ("default", [HOST], ["mesh"], ["*"])
    # The header match (more specific) first, whatever the rule order; hostnames play no part.
    assert [r.route[0].destination.host for r in spec.http] == ["reviews-v2.default.svc.cluster.local", HOST]
    status = result.statuses[ConfigKey("HTTPRoute", "default", "split")]
    [parent] = status["parents"]
    assert parent["parentRef"] == {"group": "", "kind": "Service", "name": "reviews"}
    assert parent["controllerName"] == "istio.io/gateway-controller"
    assert conds(parent) == {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    # Every client namespace's sidecar gets it, with gateway semantics (500 for a missing backend).
    for ns in ("default", "other"):
        assert ctx.traffic.virtual_service(HOST, ns) is vs
    rc = outbound_route_config(9080, (ctx.by_host[HOST],), "other", ctx.settings.routes, (vs,), ctx.services,
                               "cluster.local")
    [vh] = [v for v in rc.virtual_hosts if HOST in v.domains]
    assert [r.route.cluster for r in vh.routes] == ["outbound|9080||reviews-v2.default.svc.cluster.local",
                                                   f"outbound|9080||{HOST}"]
    assert vh.routes[0].route.cluster_not_found_response_code == rc_pb2.RouteAction.INTERNAL_SERVER_ERROR


def test_consumer_route_applies_only_in_its_namespace_and_beats_other_rules_there():
    consumer = route("mine", """\
        parentRefs: [{group: "", kind: Service, name: reviews, namespace: default}]
        rules: [{backendRefs: [{name: reviews-v2, namespace: default, port: 9080}]}]
        """, namespace="frontend", created="2025-01-01T00:00:00Z")
    grant = """\
        apiVersion: gateway.networking.k8s.io/v1beta1
        kind: ReferenceGrant
        metadata: {name: frontend, namespace: default}
        spec:
          from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: frontend}]
          to: [{group: "", kind: Service}]
        """
    ctx = PushContext.build(store_of(SERVICES, PRODUCER, consumer, grant), MeshConfig(), "m", "cluster.local", "1")
    vss = _by_name(ctx.gateway_api)
    mine = next(e for (ns, _), e in vss.items() if ns == "frontend")
    producer = next(e for (ns, _), e in vss.items() if ns == "default")
    assert mine.obj.spec.export_to == ["."] and mine.obj.spec.hosts == [HOST]
    assert ctx.traffic.virtual_service(HOST, "frontend") is mine  # newer, but the consumer's own
    assert ctx.traffic.virtual_service(HOST, "default") is producer
    assert ctx.traffic.virtual_service(HOST, "elsewhere") is producer


def test_producer_route_and_virtual_service_for_one_host_oldest_wins():
    vs = """\
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {name: reviews, namespace: default, creationTimestamp: '2023-06-01T00:00:00Z'}
        spec:
          hosts: [reviews]
          http: [{route: [{destination: {host: reviews}}]}]
        """
    store = store_of(SERVICES, PRODUCER, vs)
    index = TrafficIndex.build(store, "cluster.local", "istio-system",
                               PushContext.build(store, MeshConfig(), "m", "cluster.local", "1")
                               .gateway_api.mesh_virtual_services)
    assert index.virtual_service(HOST, "default").key == ConfigKey("VirtualService", "default", "reviews")
    assert any("is already claimed by default/reviews" in c for c in index.conflicts)


def test_missing_parent_service_is_not_accepted_and_routes_nothing_but_its_port_is_not_checked():
    missing = route("lost", """\
        parentRefs: [{group: "", kind: Service, name: ratings}]
        rules: [{backendRefs: [{name: reviews-v2, port: 9080}]}]
        """, kind="GRPCRoute")
    result = PushContext.build(store_of(SERVICES, missing), MeshConfig(), "m", "cluster.local", "1").gateway_api
    assert result.mesh_virtual_services == ()
    (parent,) = result.statuses[ConfigKey("GRPCRoute", "default", "lost")]["parents"]
    assert conds(parent)["Accepted"] == ("False", "NoMatchingParent")
    assert parent["conditions"][0]["message"] == 'parent service: "ratings" not found'
    # istiod does not check a Service parent's port against the Service: accepted, and the
    # rules are for that port only (a port the Service lacks simply never matches).
    other_port = route("other-port", """\
        parentRefs: [{group: "", kind: Service, name: reviews, port: 81}]
        rules: [{backendRefs: [{name: reviews-v2, port: 9080}]}]
        """, kind="GRPCRoute")
    result = PushContext.build(store_of(SERVICES, other_port), MeshConfig(), "m", "cluster.local", "1").gateway_api
    (parent,) = result.statuses[ConfigKey("GRPCRoute", "default", "other-port")]["parents"]
    assert conds(parent)["Accepted"] == ("True", "Accepted")
    [vs] = result.mesh_virtual_services
    assert {m.port for rule in vs.obj.spec.http for m in rule.match} == {81}


def test_parent_port_limits_the_route_to_that_port_and_bad_backends_are_reported():
    on_port = route("port", """\
        parentRefs: [{group: "", kind: Service, name: reviews, port: 9080}]
        rules: [{backendRefs: [{name: nowhere, port: 9080}, {name: reviews-v2, port: 9080}]}]
        """)
    result = PushContext.build(store_of(SERVICES, on_port), MeshConfig(), "m", "cluster.local", "1").gateway_api
    [vs] = result.mesh_virtual_services
    assert [m.port for r in vs.obj.spec.http for m in r.match] == [9080]
    [parent] = result.statuses[ConfigKey("HTTPRoute", "default", "port")]["parents"]
    assert conds(parent) == {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("False", "BackendNotFound")}
