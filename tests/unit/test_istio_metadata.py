"""`metadata.filter_metadata.istio` on generated clusters and routes, in istiod's shape (what
istioctl proxy-config's DESTINATION RULE / VIRTUAL SERVICE columns and pilotctl read), and the
cache: the rule's name and namespace are inputs, so renaming or moving a rule changes the bytes."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import json_format

from pilot.config.mesh import MeshConfig
from pilot.model.push_context import PushContext
from pilot.networking.metadata import config_path, kebab
from pilot.networking.routes import outbound_route_config
from tests.unit.test_gateway_api import route, store_of
from tests.unit.test_mtls_generation import mesh_proxy, reviews_service, reviews_slice

from .helpers import World, proxy, service

REVIEWS = "reviews.default.svc.cluster.local"


def _dr(name: str = "reviews", namespace: str = "default", tls: str | None = None) -> dict:
    spec: dict = {"host": REVIEWS, "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}
    if tls:
        spec["trafficPolicy"] = {"tls": {"mode": tls}}
    return {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def _vs(name: str = "reviews-route") -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"hosts": ["reviews"], "http": [
                {"name": "to-v1", "match": [{"uri": {"prefix": "/v1"}}],
                 "route": [{"destination": {"host": "reviews", "subset": "v1"}}]},
                {"route": [{"destination": {"host": "reviews"}}]}]}}


def _istio(msg) -> dict:
    return json_format.MessageToDict(msg.metadata)["filterMetadata"]["istio"]


def _clusters(w: World) -> dict[str, cluster_pb2.Cluster]:
    return {n: r.message(cluster_pb2.Cluster) for n, r in w.cds(proxy()).items()}


def test_kebab_kinds_match_istiod():
    assert [kebab(k) for k in ("DestinationRule", "VirtualService", "HTTPRoute", "GRPCRoute")] == \
        ["destination-rule", "virtual-service", "http-route", "grpc-route"]
    assert config_path("DestinationRule", "ns", "n") == "/apis/networking.istio.io/v1/namespaces/ns/destination-rule/n"


def test_clusters_name_their_service_rule_and_subset():
    w = World()
    w.apply(service("reviews"))
    plain = _clusters(w)[f"outbound|9080||{REVIEWS}"]
    # Without a DestinationRule: only the service, as istiod.
    assert _istio(plain) == {"services": [{"host": REVIEWS, "name": "reviews", "namespace": "default"}]}
    w.apply(_dr(tls="SIMPLE"))
    got = _clusters(w)
    dr_path = "/apis/networking.istio.io/v1/namespaces/default/destination-rule/reviews"
    assert _istio(got[f"outbound|9080||{REVIEWS}"]) == {
        "services": [{"host": REVIEWS, "name": "reviews", "namespace": "default"}],
        "config": dr_path, "alpn_override": "false"}
    assert _istio(got[f"outbound|9080|v1|{REVIEWS}"]) == {
        "services": [{"host": REVIEWS, "name": "reviews", "namespace": "default"}],
        "config": dr_path, "subset": "v1", "alpn_override": "false"}
    # Catch-alls carry none (istiod neither).
    assert not got["BlackHoleCluster"].HasField("metadata")


def test_rule_name_and_namespace_are_cache_inputs():
    """The same spec under another name, or in another namespace that still applies (the root
    namespace), must not be served from the cache with the old name."""
    w = World()
    w.apply(service("reviews"), _dr("first"))
    name = f"outbound|9080||{REVIEWS}"
    assert _istio(_clusters(w)[name])["config"].endswith("/default/destination-rule/first")
    w.store.delete(w.store.list("DestinationRule")[0].key)
    w.apply(_dr("second"))
    assert _istio(_clusters(w)[name])["config"].endswith("/default/destination-rule/second")
    w.store.delete(w.store.list("DestinationRule")[0].key)
    w.apply(_dr("second", namespace="istio-system"))
    assert _istio(_clusters(w)[name])["config"] == \
        "/apis/networking.istio.io/v1/namespaces/istio-system/destination-rule/second"


def test_virtual_service_routes_name_the_virtual_service():
    w = World()
    w.apply(service("reviews"), _dr(), _vs())
    rc = w.rds(proxy(), {"9080"})["9080"].message(route_pb2.RouteConfiguration)
    [vh] = [v for v in rc.virtual_hosts if REVIEWS in v.domains]
    path = "/apis/networking.istio.io/v1/namespaces/default/virtual-service/reviews-route"
    assert [(r.name, _istio(r)) for r in vh.routes] == [("to-v1", {"config": path}), ("rule-1", {"config": path})]
    # A service without a VirtualService keeps its default route, without metadata (as istiod).
    w.apply(service("ratings", cluster_ip="10.96.0.21"))
    rc = w.rds(proxy(), {"9080"})["9080"].message(route_pb2.RouteConfiguration)
    [vh] = [v for v in rc.virtual_hosts if "ratings.default.svc.cluster.local" in v.domains]
    assert not vh.routes[0].HasField("metadata")
    # Renaming the VirtualService changes the bytes (its key is a cache input).
    w.store.delete(w.store.list("VirtualService")[0].key)
    w.apply(_vs("renamed"))
    rc = w.rds(proxy(), {"9080"})["9080"].message(route_pb2.RouteConfiguration)
    [vh] = [v for v in rc.virtual_hosts if REVIEWS in v.domains]
    assert _istio(vh.routes[0])["config"].endswith("/virtual-service/renamed")


def test_gateway_api_routes_name_their_http_route():
    services = """\
        apiVersion: v1
        kind: Service
        metadata: {name: reviews, namespace: default}
        spec: {ports: [{name: http, port: 9080}]}
        """
    split = route("split", """\
        parentRefs: [{group: "", kind: Service, name: reviews}]
        rules: [{backendRefs: [{name: reviews, port: 9080}]}]
        """, created="2024-01-01T00:00:00Z")
    ctx = PushContext.build(store_of(services, split), MeshConfig(), "m", "cluster.local", "1")
    [vs] = ctx.gateway_api.mesh_virtual_services
    rc = outbound_route_config(9080, (ctx.by_host[REVIEWS],), "default", ctx.settings.routes, (vs,), ctx.services,
                               "cluster.local")
    [vh] = [v for v in rc.virtual_hosts if REVIEWS in v.domains]
    assert [_istio(r) for r in vh.routes] == [
        {"config": "/apis/gateway.networking.k8s.io/v1/namespaces/default/http-route/split"}]


def test_inbound_clusters_name_every_service_that_targets_the_port():
    w = World()
    w.apply(reviews_service(), reviews_slice())
    inbound = w.cds(mesh_proxy())["inbound|9080||"].message(cluster_pb2.Cluster)
    assert _istio(inbound) == {"services": [{"host": REVIEWS, "name": "reviews", "namespace": "default"}]}
    # A second Service selecting the same pods on the same target port: both are named.
    alias = reviews_service()
    alias["metadata"] = {"name": "reviews-alias", "namespace": "default"}
    w.apply(alias)
    inbound = w.cds(mesh_proxy())["inbound|9080||"].message(cluster_pb2.Cluster)
    assert sorted(s["name"] for s in _istio(inbound)["services"]) == ["reviews", "reviews-alias"]


def test_tcp_and_tls_filter_chains_name_their_virtual_service():
    """As istiod's BuildConfigInfoMetadata on the filter chains a `tcp` or `tls` rule makes; the
    service's own default chain (no rule) carries none."""
    from envoy.config.listener.v3 import listener_pb2

    w = World()
    w.apply(service("db", ports=[{"name": "tcp-db", "port": 5432}]),
            service("tls", cluster_ip="10.96.0.21", ports=[{"name": "tls-web", "port": 8443}]))
    w.apply({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
             "metadata": {"name": "db-route", "namespace": "default"},
             "spec": {"hosts": ["db"], "tcp": [{"route": [{"destination": {"host": "db"}}]}]}},
            {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
             "metadata": {"name": "tls-route", "namespace": "default"},
             "spec": {"hosts": ["tls"], "tls": [{"match": [{"sniHosts": ["tls"]}],
                                                  "route": [{"destination": {"host": "tls"}}]}]}})
    listeners = [r.message(listener_pb2.Listener) for r in w.lds(proxy()).values()]
    chains = [c for listener in listeners for c in listener.filter_chains if c.HasField("metadata")]
    paths = sorted(_istio(c)["config"] for c in chains)
    assert paths == ["/apis/networking.istio.io/v1/namespaces/default/virtual-service/db-route",
                     "/apis/networking.istio.io/v1/namespaces/default/virtual-service/tls-route"]


def _service_entry(name: str, location: str) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"hosts": [f"{name}.example.com"], "location": location, "resolution": "DNS",
                     "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}}


def test_mesh_external_hosts_mark_their_default_cluster_external():
    """istiod's applyDestinationRule: `istio.external: true` on the default cluster of a
    MeshExternal service (ServiceEntry MESH_EXTERNAL, ExternalName Service), never its subsets
    and never a MESH_INTERNAL entry."""
    w = World()
    ext_name = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "legacy", "namespace": "default"},
                "spec": {"type": "ExternalName", "externalName": "db.example.com",
                         "ports": [{"name": "tcp", "port": 5432}]}}
    w.apply(_service_entry("api", "MESH_EXTERNAL"), _service_entry("inside", "MESH_INTERNAL"), ext_name,
            {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
             "metadata": {"name": "api", "namespace": "default"},
             "spec": {"host": "api.example.com", "subsets": [{"name": "v1", "labels": {"v": "1"}}]}})
    got = _clusters(w)
    assert _istio(got["outbound|443||api.example.com"])["external"] is True
    assert "external" not in _istio(got["outbound|443|v1|api.example.com"])
    assert "external" not in _istio(got["outbound|443||inside.example.com"])
    assert _istio(got["outbound|5432||legacy.default.svc.cluster.local"])["external"] is True
