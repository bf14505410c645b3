"""The Pods a ServiceEntry's workloadSelector picks come from a per-context label index of the
namespace's ready Pods (PushContext.pod_index), not from a sort and scan of every Pod of the mesh
per selector (issue 17: N ServiceEntries selecting N Pods made a cold EDS generation quadratic).
The bytes are those a scan gives; the work is bounded by a count the index keeps, not a timing."""

from __future__ import annotations

from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.config.core import Pod
from pilot.model.labels import selects
from pilot.xds.cache import CachedResource
from pilot.xds.generators import eds
from pilot.xds.typeurls import ENDPOINT

from .helpers import World, proxy

NS = "shop"


def _pod(name: str, ip: str, labels: dict, ns: str = NS, ready: bool = True, node: str = "") -> dict:
    status: dict = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"serviceAccountName": f"sa-{name}", "nodeName": node}, "status": status}


def _se(name: str, selector: dict, ns: str = NS) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry", "metadata": {"name": name, "namespace": ns},
            "spec": {"hosts": [f"{name}.example.internal"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                     "ports": [{"name": "http", "number": 80, "protocol": "HTTP", "targetPort": 8080}],
                     "workloadSelector": {"labels": selector}}}


def _mesh() -> list[dict]:
    return [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {
            "topology.kubernetes.io/region": "r1", "topology.kubernetes.io/zone": "z1"}}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2", "labels": {
            "topology.kubernetes.io/region": "r1", "topology.kubernetes.io/zone": "z2"}}},
        # names out of address order, so the result's order (by name) is visible
        _pod("web-b", "10.1.0.2", {"app": "web", "version": "v1"}, node="n2"),
        _pod("web-a", "10.1.0.9", {"app": "web", "version": "v2"}, node="n1"),
        _pod("web-c", "10.1.0.3", {"app": "web", "version": "v1"}),
        _pod("web-unready", "10.1.0.4", {"app": "web", "version": "v1"}, ready=False),
        _pod("web-pending", "", {"app": "web", "version": "v1"}),
        _pod("db-1", "10.1.0.5", {"app": "db", "tier": "data"}),
        _pod("bare", "10.1.0.6", {}),
        _pod("web-other", "10.9.0.1", {"app": "web", "version": "v1"}, ns="other"),
        _se("web", {"app": "web"}),
        _se("web-v1", {"app": "web", "version": "v1"}),
        _se("db", {"app": "db", "tier": "data"}),
        _se("ghost", {"app": "ghost"}),
        _se("mixed", {"app": "db", "version": "v1"}),
        _se("every", {}),
        _se("web-elsewhere", {"app": "web"}, ns="other"),
    ]


HOSTS = {"web": NS, "web-v1": NS, "db": NS, "ghost": NS, "mixed": NS, "every": NS, "web-elsewhere": "other"}


def _scan(ctx, namespace, selector):
    """What the selection was before the index: every Pod of the mesh, sorted, tested in turn."""
    return tuple(p for (ns, _), p in sorted(ctx.pods.items())
                 if ns == namespace and p.obj.status.pod_ip and p.obj.status.ready
                 and selects(selector, p.obj.metadata.labels))


def test_eds_bytes_are_those_of_a_scan():
    w = World()
    w.apply(*_mesh())
    ctx = w.ctx()
    names = {f"outbound|80||{h}.example.internal" for h in HOSTS}
    got = w.eds(proxy(NS), names, ctx)
    assert set(got) == names
    for name in sorted(names):
        svc = ctx.service(name.split("||")[1])
        se = ctx.service_entry(svc)
        pods = _scan(ctx, svc.namespace, se.obj.spec.workload_selector.match_labels)
        cla = eds.build_service_entry_cla(name, svc.port(80), se, (), (), None, pods, ctx.nodes_of(pods))
        assert got[name].any_bytes == CachedResource.from_message(name, cla, ENDPOINT).any_bytes, name

    def addresses(host):
        cla = got[f"outbound|80||{host}.example.internal"].message(endpoint_pb2.ClusterLoadAssignment)
        return sorted(e.endpoint.address.socket_address.address for g in cla.endpoints for e in g.lb_endpoints)
    # the mesh exercises the selection: one label and several, the unready, the IP-less and the
    # other namespace's Pod left out, no match, a label pair no Pod holds together, the empty selector
    assert addresses("web") == ["10.1.0.2", "10.1.0.3", "10.1.0.9"]
    assert addresses("web-v1") == ["10.1.0.2", "10.1.0.3"]
    assert addresses("db") == ["10.1.0.5"]
    assert addresses("ghost") == [] and addresses("mixed") == []
    assert addresses("every") == ["10.1.0.2", "10.1.0.3", "10.1.0.5", "10.1.0.6", "10.1.0.9"]
    assert addresses("web-elsewhere") == ["10.9.0.1"]


def test_every_selector_picks_what_a_scan_picks_in_the_same_order():
    w = World()
    w.apply(*_mesh())
    ctx = w.ctx()
    for ns in (NS, "other", "empty"):
        for selector in ({}, {"app": "web"}, {"version": "v1"}, {"app": "web", "version": "v2"},
                         {"app": "db", "tier": "data"}, {"app": "ghost"}, {"app": "web", "nope": "x"}):
            want = _scan(ctx, ns, selector)
            assert ctx.selected_pods(ns, selector) == want, (ns, selector)
    assert [p.key.name for p in ctx.selected_pods(NS, {"app": "web"})] == ["web-a", "web-b", "web-c"]


def _many(n: int) -> list[dict]:
    docs = []
    for i in range(n):
        docs.append(_se(f"se-{i}", {"app": f"app-{i}", "role": "pod"}))
        docs.append(_pod(f"pod-{i}", f"10.2.{i // 250}.{i % 250 + 1}", {"app": f"app-{i}", "role": "pod"}))
    return docs


def test_a_cold_eds_tests_each_selector_against_its_own_pods_only():
    n = 200
    w = World()
    w.apply(*_many(n))
    ctx = w.ctx()
    names = {f"outbound|80||se-{i}.example.internal" for i in range(n)}
    out = w.eds(proxy(), names, ctx)
    assert len(out) == n
    assert all(len(r.message(endpoint_pb2.ClusterLoadAssignment).endpoints) == 1 for r in out.values())
    index = ctx.pod_index(NS)
    assert index is ctx.pod_index(NS)  # built once per context
    # One candidate per ServiceEntry (its own Pod, found by its rarest label, not the n Pods every
    # one carries "role: pod"); a scan per selector would test n * n.
    assert index.evaluations == n
    # A new context (the next push) builds its own, from that push's Pods.
    w.store.delete(next(e.key for e in w.store.list(Pod) if e.key.name == "pod-0"))
    assert len(w.ctx().selected_pods(NS, {"role": "pod"})) == n - 1
