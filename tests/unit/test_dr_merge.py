"""Several DestinationRules for one host, consolidated as istiod's mergeDestinationRule, and
ENABLE_ENHANCED_DESTINATIONRULE_MERGE keeping rules with different exportTo apart."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2

from pilot.features import Features
from pilot.model.push_context import PushContext

from .helpers import DOMAIN, World, endpoint_slice, proxy, service

HOST = f"reviews.default.svc.{DOMAIN}"


def dr(name: str, subsets: list[str], lb: str | None = None, export_to: list[str] | None = None,
       created: str = "2026-01-01T00:00:00Z", selector: dict | None = None) -> dict:
    spec: dict = {"host": "reviews", "subsets": [{"name": s, "labels": {"version": s}} for s in subsets]}
    if lb:
        spec["trafficPolicy"] = {"loadBalancer": {"simple": lb}}
    if export_to is not None:
        spec["exportTo"] = export_to
    if selector is not None:
        spec["workloadSelector"] = {"matchLabels": selector}
    return {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": created}, "spec": spec}


def clusters(w: World, env: dict[str, str] | None = None) -> dict[str, cluster_pb2.Cluster]:
    w.mesh.refresh(w.store)
    ctx = PushContext.build(w.store, w.mesh.current, w.mesh.version, DOMAIN, "v",
                            knobs=Features.from_env(env or {}).generation_knobs())
    return {n: r.message(cluster_pb2.Cluster) for n, r in w.cds(proxy(), ctx).items() if HOST in n}


def world(*docs: dict) -> World:
    w = World()
    w.apply(service("reviews"), endpoint_slice("reviews-1", "reviews"), *docs)
    return w


def test_rules_of_one_host_merge_subsets_and_the_first_policy_wins():
    got = clusters(world(dr("a", ["v1"], "ROUND_ROBIN"),
                         dr("b", ["v2", "v1"], "RANDOM", created="2026-01-02T00:00:00Z")))
    assert {n.split("|")[2] for n in got} == {"", "v1", "v2"}
    assert all(c.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN for c in got.values())
    # The first has no policy: the later one's is taken.
    got = clusters(world(dr("a", ["v1"]), dr("b", ["v2"], "RANDOM", created="2026-01-02T00:00:00Z")))
    assert got[f"outbound|9080||{HOST}"].lb_policy == cluster_pb2.Cluster.RANDOM


def test_enhanced_merge_keeps_rules_with_different_export_to_apart():
    docs = (dr("a", ["v1"], "ROUND_ROBIN"), dr("b", ["v2"], export_to=["."], created="2026-01-02T00:00:00Z"))
    assert {n.split("|")[2] for n in clusters(world(*docs))} == {"", "v1"}  # istiod's default: not merged
    off = clusters(world(*docs), {"ENABLE_ENHANCED_DESTINATIONRULE_MERGE": "false"})
    assert {n.split("|")[2] for n in off} == {"", "v1", "v2"}


def test_a_change_to_the_second_rule_changes_the_merged_clusters():
    w = world(dr("a", ["v1"]), dr("b", ["v2"], created="2026-01-02T00:00:00Z"))
    before = set(clusters(w))
    w.apply(dr("b", ["v3"], created="2026-01-02T00:00:00Z"))
    after = set(clusters(w))
    assert f"outbound|9080|v2|{HOST}" in before and f"outbound|9080|v3|{HOST}" in after - before
