"""WorkloadEntries are selected from a per-context label index (pilot/model/label_index.py), not
by scanning the namespace once per selector (issue 17: 1,000 Services selecting 1,000
WorkloadEntries in one namespace made a cold EDS generation quadratic). The bytes are those a
scan gives; the work is bounded by a count the index keeps, not by a timing."""

from __future__ import annotations

from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.config.networking import WorkloadEntry
from pilot.model.labels import selects
from pilot.xds.cache import CachedResource
from pilot.xds.generators import eds
from pilot.xds.typeurls import ENDPOINT

from .helpers import World, proxy
from .workload_entry_mesh import CLUSTERS, NS, mixed_mesh


def _scan(ctx, namespace, selector, require_labels):
    """What the selection was before the index: every entry of the namespace, tested in turn."""
    return tuple(e for e in ctx.workload_entries_by_ns.get(namespace, ())
                 if (e.obj.spec.labels or not require_labels) and selects(selector, e.obj.spec.labels))


def test_eds_bytes_are_those_of_a_scan_over_a_mixed_mesh():
    w = World()
    w.apply(*mixed_mesh())
    ctx = w.ctx()
    got = w.eds(proxy(NS), set(CLUSTERS), ctx)
    assert set(got) == CLUSTERS
    for name in sorted(CLUSTERS):
        _, port_number, subset, host = eds.names.parse_cluster_name(name)
        svc = ctx.service(host)
        port = svc.port(port_number)
        labels = ()
        if subset:
            dr = ctx.destination_rule(host, NS, NS, {})
            labels = tuple(sorted(next(s for s in dr.obj.spec.subsets if s.name == subset).labels.items()))
        if svc.kind == "ServiceEntry":
            se = ctx.service_entry(svc)
            # before: every WorkloadEntry of the namespace went in, the builder picked by selector
            cla = eds.build_service_entry_cla(name, port, se, ctx.workload_entries_by_ns[NS], labels)
        else:
            wes = _scan(ctx, NS, dict(svc.selector), require_labels=True)
            cla = eds.build_cla(name, port, ctx.service_slices(svc), labels, ctx.service_pods(svc),
                                ctx.service_nodes(svc), None, wes)
        want = CachedResource.from_message(name, cla, ENDPOINT)
        assert got[name].any_bytes == want.any_bytes, name
    # the mesh exercises the selection: entries picked by one and by several labels, subsets,
    # a named targetPort, the unhealthy and the other namespace's entry left out
    def addresses(name):
        cla = got[name].message(endpoint_pb2.ClusterLoadAssignment)
        return sorted((e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
                      for g in cla.endpoints for e in g.lb_endpoints)
    assert addresses(f"outbound|9080||ratings.{NS}.svc.cluster.local") == [
        ("10.1.0.5", 9081), ("10.2.0.1", 9081), ("10.2.0.2", 7070)]
    assert addresses(f"outbound|9080|v2|ratings.{NS}.svc.cluster.local") == [("10.2.0.2", 7070)]
    assert addresses(f"outbound|9080||reviews.{NS}.svc.cluster.local") == [("10.2.0.3", 7171)]
    assert addresses(f"outbound|9080||ghost.{NS}.svc.cluster.local") == []
    assert addresses("outbound|80||db.example.internal") == [("10.2.0.7", 8080)]
    assert len(addresses("outbound|80||every.example.internal")) == 7  # all but the unhealthy vm-6


def test_every_selector_picks_what_a_scan_picks_in_the_same_order():
    w = World()
    w.apply(*mixed_mesh())
    ctx = w.ctx()
    index = ctx.workload_entry_index(NS)
    for selector in ({}, {"app": "ratings"}, {"version": "v1"}, {"app": "reviews", "version": "v1"},
                     {"app": "db", "tier": "cache"}, {"app": "ghost"}, {"app": "ratings", "nope": "x"}):
        assert index.select(selector) == _scan(ctx, NS, selector, require_labels=False), selector


def _many(n: int) -> list[dict]:
    docs = []
    for i in range(n):
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc-{i}", "namespace": "vms"},
                     "spec": {"clusterIP": f"10.96.{i // 250}.{i % 250 + 1}", "selector": {"app": f"app-{i}"},
                              "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
        docs.append({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
                     "metadata": {"name": f"se-{i}", "namespace": "vms"},
                     "spec": {"hosts": [f"se-{i}.example.internal"], "location": "MESH_INTERNAL",
                              "resolution": "STATIC", "ports": [{"name": "http", "number": 80, "protocol": "HTTP"}],
                              "workloadSelector": {"labels": {"app": f"app-{i}", "role": "vm"}}}})
        docs.append({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
                     "metadata": {"name": f"vm-{i}", "namespace": "vms"},
                     "spec": {"address": f"10.2.{i // 250}.{i % 250 + 1}",
                              "labels": {"app": f"app-{i}", "role": "vm"}}})
    return docs


def test_a_cold_eds_tests_each_selector_against_its_own_entries_only():
    n = 200
    w = World()
    w.apply(*_many(n))
    ctx = w.ctx()
    names = {f"outbound|80||svc-{i}.vms.svc.cluster.local" for i in range(n)} | \
            {f"outbound|80||se-{i}.example.internal" for i in range(n)}
    out = w.eds(proxy(), names, ctx)
    assert len(out) == 2 * n
    assert all(len(r.message(endpoint_pb2.ClusterLoadAssignment).endpoints) == 1 for r in out.values())
    index = ctx.workload_entry_index("vms")
    assert index is ctx.workload_entry_index("vms")  # built once per context
    # One candidate per Service and per ServiceEntry (its own entry, found by its rarest label,
    # not the n entries every one carries "role: vm"); a scan per selector would test 2 * n * n.
    assert index.evaluations == 2 * n
    # A new context (the next push) builds its own, from that push's entries.
    w.store.delete(next(e.key for e in w.store.list(WorkloadEntry) if e.key.name == "vm-0"))
    assert len(w.ctx().workload_entry_index("vms").select({"role": "vm"})) == n - 1
