"""Locality load balancing: endpoint and client localities, istiod's priority and weight rules
(pure), and EDS per client locality only where a setting applies (shared bytes otherwise)."""

from __future__ import annotations

from dataclasses import replace

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.model.locality import LocalityLb, LocalitySetting
from pilot.model.services import EndpointAddress, Locality
from pilot.networking.endpoints import cluster_load_assignment
from pilot.xds.discovery import GENERATORS
from pilot.xds.generated import GenerationMemo
from pilot.xds.generators import eds
from pilot.xds.typeurls import ENDPOINT

from .helpers import World, proxy, service

CLUSTER = "outbound|9080||web.default.svc.cluster.local"
ZONE = "topology.kubernetes.io/zone"


def ep(addr: str, loc: str, weight: int = 1, **labels: str) -> EndpointAddress:
    locality = Locality.parse(loc)
    return EndpointAddress(addr, 80, locality, True, weight=weight,
                           labels=tuple(sorted({**labels, **dict(locality.topology_labels())}.items())))


def groups(cla: endpoint_pb2.ClusterLoadAssignment) -> list[tuple[str, int, int, tuple[str, ...]]]:
    """(locality, priority, weight, addresses) per LocalityLbEndpoints."""
    return [(f"{g.locality.region}/{g.locality.zone}/{g.locality.sub_zone}".rstrip("/"), g.priority,
             g.load_balancing_weight.value, tuple(e.endpoint.address.socket_address.address for e in g.lb_endpoints))
            for g in cla.endpoints]


EPS = (ep("1.0.0.1", "r1/z1/s1"), ep("1.0.0.2", "r1/z1/s2"), ep("1.0.0.3", "r1/z2"), ep("1.0.0.4", "r2/zx"),
       ep("1.0.0.5", "r3/zy"))


def test_failover_ranks_by_shared_region_zone_subzone():
    lb = LocalityLb(LocalitySetting(), Locality("r1", "z1", "s1"))
    assert [(loc, p) for loc, p, _, _ in groups(cluster_load_assignment("c", EPS, lb))] == [
        ("r1/z1/s1", 0), ("r1/z1/s2", 1), ("r1/z2", 2), ("r2/zx", 3), ("r3/zy", 3)]


def test_failover_from_region_prefers_the_named_region():
    lb = LocalityLb(LocalitySetting(failover=(("r1", "r3"),)), Locality("r1", "z1", "s1"))
    got = {loc: p for loc, p, _, _ in groups(cluster_load_assignment("c", EPS, lb))}
    assert got["r3/zy"] == 3 and got["r2/zx"] == 4  # other regions after the failover target
    # A client in a region no rule names keeps the plain ranking.
    other = LocalityLb(LocalitySetting(failover=(("r1", "r3"),)), Locality("r2", "zx"))
    got = {loc: p for loc, p, _, _ in groups(cluster_load_assignment("c", EPS, other))}
    assert got == {"r2/zx": 0, "r1/z1/s1": 1, "r1/z1/s2": 1, "r1/z2": 1, "r3/zy": 1}


def test_distribute_sets_weights_and_empties_unnamed_localities():
    eps = (ep("1.0.0.1", "r1/z1"), ep("1.0.0.2", "r1/z1"), ep("1.0.0.3", "r1/z2"), ep("1.0.0.4", "r2/zx"))
    setting = LocalitySetting(distribute=(("r1/z1/*", (("r1/z1/*", 80), ("r1/z2/*", 20))),))
    got = groups(cluster_load_assignment("c", eps, LocalityLb(setting, Locality("r1", "z1"))))
    assert got == [("r1/z1", 0, 80, ("1.0.0.1", "1.0.0.2")), ("r1/z2", 0, 20, ("1.0.0.3",)), ("r2/zx", 0, 1, ())]
    # A wildcard spanning several localities shares its weight by their own weights (rounded up).
    setting = LocalitySetting(distribute=(("r1/*", (("r1/*", 100),)),))
    got = groups(cluster_load_assignment("c", eps, LocalityLb(setting, Locality("r1", "z2"))))
    assert [(loc, w) for loc, _, w, _ in got] == [("r1/z1", 67), ("r1/z2", 34), ("r2/zx", 1)]
    # A client no rule names is left alone.
    got = groups(cluster_load_assignment("c", eps, LocalityLb(setting, Locality("r2", "zx"))))
    assert [(w, len(a)) for _, _, w, a in got] == [(2, 2), (1, 1), (1, 1)]


def test_failover_priority_ranks_endpoints_by_shared_labels():
    eps = (ep("1.0.0.1", "r1/z1", version="v1"), ep("1.0.0.2", "r1/z1", version="v2"),
           ep("1.0.0.3", "r1/z2", version="v1"))
    setting = LocalitySetting(failover_priority=(ZONE, "version"))
    labels = (("topology.kubernetes.io/region", "r1"), (ZONE, "z1"), ("version", "v1"))
    got = groups(cluster_load_assignment("c", eps, LocalityLb(setting, Locality("r1", "z1"), labels)))
    # same zone and version: 0; same zone only: 1; another zone: 2 (each its own group).
    assert [(loc, p, a) for loc, p, _, a in got] == [("r1/z1", 0, ("1.0.0.1",)), ("r1/z1", 1, ("1.0.0.2",)),
                                                     ("r1/z2", 2, ("1.0.0.3",))]
    # `label=value` compares with the given value instead of the client's.
    setting = LocalitySetting(failover_priority=("version=v2",))
    got = groups(cluster_load_assignment("c", eps, LocalityLb(setting, Locality("r1", "z1"), labels)))
    assert {a: p for _, p, _, a in got} == {("1.0.0.2",): 0, ("1.0.0.1",): 1, ("1.0.0.3",): 1}


# --- through the generators ---------------------------------------------------------------------

def node(name: str, region: str, zone: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "topology.kubernetes.io/region": region, "topology.kubernetes.io/zone": zone}}}


def web_slice() -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.1.0.1"], "nodeName": "node-a", "zone": "stale"},
                          {"addresses": ["10.1.0.2"], "nodeName": "node-b"},
                          {"addresses": ["10.1.0.3"], "targetRef": {"kind": "Pod", "name": "labelled"}}]}


LABELLED_POD = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "labelled", "namespace": "default", "labels": {"istio-locality": "r2.zc.sc"}},
                "spec": {"serviceAccountName": "default", "nodeName": "node-a"},
                "status": {"podIP": "10.1.0.3", "phase": "Running"}}

OUTLIER_DR = {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
              "metadata": {"name": "web", "namespace": "default"},
              "spec": {"host": "web", "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 1}}}}


def world() -> World:
    w = World()
    w.apply(service("web"), node("node-a", "r1", "za"), node("node-b", "r1", "zb"), web_slice(), LABELLED_POD)
    return w


def located(namespace: str = "default", *, pod_name: str, region: str = "", zone: str = "", label: str = ""):
    p = proxy(namespace, pod_name=pod_name)
    if label:
        p.metadata = {**p.metadata, "LABELS": {"istio-locality": label}}
    return replace(p, node_locality=Locality(region, zone))


def cla_of(res) -> endpoint_pb2.ClusterLoadAssignment:
    return res.message(endpoint_pb2.ClusterLoadAssignment)


def test_endpoint_locality_from_pod_label_then_node_labels_then_slice_zone():
    w = world()
    got = {a: loc for loc, _, _, addrs in groups(cla_of(w.eds(proxy(), {CLUSTER})[CLUSTER])) for a in addrs}
    assert got == {"10.1.0.1": "r1/za", "10.1.0.2": "r1/zb", "10.1.0.3": "r2/zc/sc"}


def test_without_a_setting_in_force_every_locality_shares_one_output():
    w = world()
    ctx = w.ctx()
    a, b = located(pod_name="a", region="r1", zone="za"), located(pod_name="b", region="r1", zone="zb")
    assert w.eds(a, {CLUSTER}, ctx)[CLUSTER] is w.eds(b, {CLUSTER}, ctx)[CLUSTER]
    assert eds.proxy_inputs(ctx, a) is None  # the generation memo keeps sharing across proxies too


def test_outlier_detection_makes_priorities_per_client_locality():
    w = world()
    w.apply(OUTLIER_DR)
    ctx = w.ctx()
    a, b = located(pod_name="a", region="r1", zone="za"), located(pod_name="b", region="r1", zone="zb")
    by_label = located(pod_name="c", label="r1.zb")  # no node locality: the istio-locality label
    prio = {}
    for p in (a, b, by_label):
        prio[p.pod_name] = {addr: pr for _, pr, _, addrs in groups(cla_of(w.eds(p, {CLUSTER}, ctx)[CLUSTER]))
                            for addr in addrs}
    assert prio["a"] == {"10.1.0.1": 0, "10.1.0.2": 1, "10.1.0.3": 2}
    assert prio["b"] == prio["c"] == {"10.1.0.2": 0, "10.1.0.1": 1, "10.1.0.3": 2}
    # Same locality, same bytes: the cache key holds the locality, not the proxy.
    again = located(pod_name="d", region="r1", zone="za")
    assert w.eds(again, {CLUSTER}, ctx)[CLUSTER] is w.eds(a, {CLUSTER}, ctx)[CLUSTER]
    # The generation memo tells them apart even for names that read no other proxy trait.
    memo = GenerationMemo(GENERATORS, w.cache, {ENDPOINT: eds.reads_no_proxy},
                          proxy_inputs={ENDPOINT: eds.proxy_inputs})
    names = frozenset({CLUSTER})
    assert memo.generate(ctx, ENDPOINT, a, names) is not memo.generate(ctx, ENDPOINT, b, names)
    assert memo.generate(ctx, ENDPOINT, a, names) is memo.generate(ctx, ENDPOINT, again, names)


def test_enabled_false_or_a_disabled_mesh_turns_it_off():
    w = world()
    dr = {**OUTLIER_DR, "spec": {"host": "web", "trafficPolicy": {
        "outlierDetection": {"consecutive5xxErrors": 1}, "loadBalancer": {"localityLbSetting": {"enabled": False}}}}}
    w.apply(dr)
    a = located(pod_name="a", region="r1", zone="za")
    assert {g.priority for g in cla_of(w.eds(a, {CLUSTER})[CLUSTER]).endpoints} == {0}


def test_distribute_turns_on_locality_weighted_lb_in_cds():
    w = world()
    dr = {**OUTLIER_DR, "spec": {"host": "web", "trafficPolicy": {"loadBalancer": {"localityLbSetting": {
        "distribute": [{"from": "r1/za/*", "to": {"r1/za/*": 70, "r1/zb/*": 30}}]}}}}}
    w.apply(dr)
    a = located(pod_name="a", region="r1", zone="za")
    c = w.cds(a)[CLUSTER].message(cluster_pb2.Cluster)
    assert c.common_lb_config.HasField("locality_weighted_lb_config")
    got = {loc: (wt, len(addrs)) for loc, _, wt, addrs in groups(cla_of(w.eds(a, {CLUSTER})[CLUSTER]))}
    assert got == {"r1/za": (70, 1), "r1/zb": (30, 1), "r2/zc/sc": (1, 0)}
    plain = World()
    plain.apply(service("web"))
    assert not plain.cds(a)[CLUSTER].message(cluster_pb2.Cluster).common_lb_config.HasField(
        "locality_weighted_lb_config")


def test_mesh_distribute_applies_to_services_without_a_rule():
    from pilot.config.mesh import MeshConfig
    mesh = MeshConfig.model_validate({"localityLbSetting": {
        "distribute": [{"from": "r1/*", "to": {"r1/zb": 100}}]}})
    w = World(mesh)
    w.apply(service("web"), node("node-a", "r1", "za"), node("node-b", "r1", "zb"), web_slice(), LABELLED_POD)
    a = located(pod_name="a", region="r1", zone="za")
    got = {loc: (wt, len(addrs)) for loc, _, wt, addrs in groups(cla_of(w.eds(a, {CLUSTER})[CLUSTER]))}
    assert got == {"r1/za": (1, 0), "r1/zb": (100, 1), "r2/zc/sc": (1, 0)}
    assert w.cds(a)[CLUSTER].message(cluster_pb2.Cluster).common_lb_config.HasField("locality_weighted_lb_config")


def test_workload_entry_locality_and_weight_reach_eds():
    w = World()
    w.apply({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
             "metadata": {"name": "vm", "namespace": "default"},
             "spec": {"hosts": ["vm.example.com"], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                      "resolution": "STATIC", "workloadSelector": {"labels": {"app": "vm"}}}},
            {"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
             "metadata": {"name": "vm-1", "namespace": "default"},
             "spec": {"address": "10.2.0.1", "labels": {"app": "vm"}, "locality": "r1/za/s1", "weight": 7}})
    name = "outbound|80||vm.example.com"
    cla = cla_of(w.eds(proxy(), {name})[name])
    g = cla.endpoints[0]
    assert (g.locality.region, g.locality.zone, g.locality.sub_zone) == ("r1", "za", "s1")
    assert g.lb_endpoints[0].load_balancing_weight.value == 7 and g.load_balancing_weight.value == 7


def test_a_proxy_without_a_locality_gets_its_pods_node():
    w = world()
    w.apply(OUTLIER_DR, {"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "client-1", "namespace": "default"},
                         "spec": {"serviceAccountName": "default", "nodeName": "node-b"},
                         "status": {"podIP": "10.0.0.1", "phase": "Running"}})
    got = {addr: pr for _, pr, _, addrs in groups(cla_of(w.eds(proxy(pod_name="client-1"), {CLUSTER})[CLUSTER]))
           for addr in addrs}
    assert got == {"10.1.0.2": 0, "10.1.0.1": 1, "10.1.0.3": 2}


def test_a_dns_cluster_orders_its_own_endpoints_by_client_locality():
    w = World()
    w.apply({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
             "metadata": {"name": "ext", "namespace": "default"},
             "spec": {"hosts": ["ext.example.com"], "resolution": "DNS", "location": "MESH_EXTERNAL",
                      "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                      "endpoints": [{"address": "a.ext.example.com", "locality": "r1/za"},
                                    {"address": "b.ext.example.com", "locality": "r1/zb"}]}},
            {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
             "metadata": {"name": "ext", "namespace": "default"},
             "spec": {"host": "ext.example.com", "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 1}}}})
    name = "outbound|80||ext.example.com"
    ctx = w.ctx()

    def prio(p) -> dict[str, int]:
        c = w.cds(p, ctx)[name].message(cluster_pb2.Cluster)
        return {a: pr for _, pr, _, addrs in groups(c.load_assignment) for a in addrs}

    a, b = located(pod_name="a", region="r1", zone="za"), located(pod_name="b", region="r1", zone="zb")
    assert prio(a) == {"a.ext.example.com": 0, "b.ext.example.com": 1}
    assert prio(b) == {"a.ext.example.com": 1, "b.ext.example.com": 0}
    assert eds.cds_proxy_inputs(ctx, a) != eds.cds_proxy_inputs(ctx, b)  # the CDS memo tells them apart
    # Default failover (no failover list) leaves locality-weighted LB off, as istiod does.
    assert not w.cds(a, ctx)[name].message(cluster_pb2.Cluster).common_lb_config.HasField(
        "locality_weighted_lb_config")
    # Without localities on DNS endpoints CDS stays shared whatever the client's locality.
    assert eds.cds_proxy_inputs(world().ctx(), a) is None
