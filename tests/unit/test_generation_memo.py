"""The per-push generation memo shares one output between proxies only when the output cannot
differ between them: EDS without subsets is the same for every namespace; a subset is not
(which DestinationRule defines it depends on the client's namespace)."""

from __future__ import annotations

from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.xds.discovery import GENERATORS
from pilot.xds.generated import GenerationMemo
from pilot.xds.generators import eds
from pilot.xds.typeurls import ENDPOINT

from .helpers import World, proxy, service

HOST = "reviews.default.svc.cluster.local"
PLAIN = f"outbound|9080||{HOST}"
SUBSET = f"outbound|9080|v1|{HOST}"


def labelled_pod(name: str, ip: str, version: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                           "labels": {"app": "reviews", "version": version}},
            "status": {"podIP": ip, "phase": "Running"}}


def destination_rule(namespace: str, version: str) -> dict:
    """Subset v1 of reviews, as this namespace's DestinationRule defines it."""
    return {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": "reviews", "namespace": namespace},
            "spec": {"host": HOST, "subsets": [{"name": "v1", "labels": {"version": version}}]}}


def world() -> World:
    w = World()
    w.apply(service("reviews"), labelled_pod("reviews-a", "10.1.0.1", "a"), labelled_pod("reviews-b", "10.1.0.2", "b"),
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "reviews-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "reviews"}},
             "addressType": "IPv4", "ports": [{"name": "http", "port": 9080}],
             "endpoints": [{"addresses": [ip], "conditions": {"ready": True},
                            "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}}
                           for pod, ip in (("reviews-a", "10.1.0.1"), ("reviews-b", "10.1.0.2"))]},
            destination_rule("default", "a"), destination_rule("other", "b"))
    return w


def addresses(generated) -> list[str]:
    cla = generated.resources[0].message(endpoint_pb2.ClusterLoadAssignment)
    return [e.endpoint.address.socket_address.address for lo in cla.endpoints for e in lo.lb_endpoints]


def test_eds_without_subsets_is_shared_across_namespaces_and_subsets_are_not():
    w = world()
    memo = GenerationMemo(GENERATORS, w.cache, {ENDPOINT: eds.reads_no_proxy})
    ctx = w.ctx()
    here, there = proxy("default", pod_name="p1"), proxy("other", pod_name="p2", ip="10.0.0.2")
    plain = frozenset({PLAIN})
    assert memo.generate(ctx, ENDPOINT, here, plain) is memo.generate(ctx, ENDPOINT, there, plain)
    assert addresses(memo.generate(ctx, ENDPOINT, here, plain)) == ["10.1.0.1", "10.1.0.2"]
    subset = frozenset({SUBSET})
    assert addresses(memo.generate(ctx, ENDPOINT, here, subset)) == ["10.1.0.1"]  # default's rule
    assert addresses(memo.generate(ctx, ENDPOINT, there, subset)) == ["10.1.0.2"]  # its own namespace's
    both = frozenset({PLAIN, SUBSET})
    assert memo.generate(ctx, ENDPOINT, here, both) is not memo.generate(ctx, ENDPOINT, there, both)
