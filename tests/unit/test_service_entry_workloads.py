"""ServiceEntry and WorkloadEntry endpoints as istiod makes them: a workloadSelector picks
Pods as well as WorkloadEntries; WorkloadEntry and inline endpoint weights become EDS
load_balancing_weight."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from .helpers import World, proxy

NAME = "outbound|80||db.internal"


def service_entry(**extra) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"hosts": ["db.internal"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                     "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}], **extra}}


def pod(name: str, ip: str, labels: dict, *, ready: bool = True, sa: str = "db") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"serviceAccountName": sa},
            "status": {"podIP": ip, "phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def workload_entry(name: str, address: str, labels: dict, weight: int | None = None) -> dict:
    spec = {"address": address, "labels": labels, "serviceAccount": "db-vm"}
    if weight is not None:
        spec["weight"] = weight
    return {"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def endpoints(w: World, name: str = NAME) -> dict[tuple[str, int], int]:
    res = w.eds(proxy(), {name}).get(name)
    assert res is not None
    cla = res.message(endpoint_pb2.ClusterLoadAssignment)
    return {(e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value):
            e.load_balancing_weight.value for g in cla.endpoints for e in g.lb_endpoints}


def test_workload_selector_picks_ready_pods_and_workload_entries():
    w = World()
    w.apply(service_entry(workloadSelector={"labels": {"app": "db"}}),
            pod("db-1", "10.1.0.1", {"app": "db"}), pod("db-2", "10.1.0.2", {"app": "db"}, ready=False),
            pod("web-1", "10.1.0.3", {"app": "web"}), workload_entry("vm-1", "10.2.0.1", {"app": "db"}, weight=5))
    # A Pod serves on the port's targetPort; a WorkloadEntry without ports too.
    assert endpoints(w) == {("10.1.0.1", 8080): 1, ("10.2.0.1", 8080): 5}
    # The Pods' identities are the service's too (what mTLS clients verify).
    sans = w.ctx().service_accounts(w.ctx().service("db.internal"))
    assert sans == ("spiffe://cluster.local/ns/default/sa/db", "spiffe://cluster.local/ns/default/sa/db-vm")
    # A Pod that starts matching later is picked up.
    w.apply(pod("web-1", "10.1.0.3", {"app": "db"}))
    assert ("10.1.0.3", 8080) in endpoints(w)


def test_a_pod_in_another_namespace_is_not_selected():
    w = World()
    other = pod("db-9", "10.1.0.9", {"app": "db"})
    other["metadata"]["namespace"] = "other"
    w.apply(service_entry(workloadSelector={"labels": {"app": "db"}}), other)
    assert endpoints(w) == {}


def test_subsets_select_among_pods_by_label():
    w = World()
    w.apply(service_entry(workloadSelector={"labels": {"app": "db"}}),
            pod("db-1", "10.1.0.1", {"app": "db", "version": "v1"}),
            pod("db-2", "10.1.0.2", {"app": "db", "version": "v2"}),
            {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
             "metadata": {"name": "db", "namespace": "default"},
             "spec": {"host": "db.internal", "subsets": [{"name": "v2", "labels": {"version": "v2"}}]}})
    assert endpoints(w, "outbound|80|v2|db.internal") == {("10.1.0.2", 8080): 1}


def test_inline_endpoint_weight_is_the_lb_weight():
    w = World()
    w.apply(service_entry(endpoints=[{"address": "10.3.0.1", "weight": 3}, {"address": "10.3.0.2"}]))
    assert endpoints(w) == {("10.3.0.1", 8080): 3, ("10.3.0.2", 8080): 1}
    # The cluster is EDS, so the weights are what Envoy balances by.
    assert w.cds(proxy())[NAME].message(cluster_pb2.Cluster).type == cluster_pb2.Cluster.EDS


# --- Kubernetes Services selecting WorkloadEntries ---------------------------------------------

def kube_service(target_port) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ratings", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.30", "selector": {"app": "ratings"},
                     "ports": [{"name": "http", "port": 9080, "targetPort": target_port}]}}


def vm(name: str, address: str, labels: dict, ports: dict | None = None, sa: str = "ratings-vm") -> dict:
    spec = {"address": address, "labels": labels, "serviceAccount": sa, "weight": 2}
    if ports:
        spec["ports"] = ports
    return {"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


RATINGS = "outbound|9080||ratings.default.svc.cluster.local"


def test_a_kubernetes_service_selects_workload_entries():
    w = World()
    w.apply(kube_service(9081), vm("vm-1", "10.2.0.1", {"app": "ratings"}),
            vm("vm-2", "10.2.0.2", {"app": "ratings"}, {"http": 7070}), vm("vm-3", "10.2.0.3", {"app": "other"}))
    # the numeric targetPort, or the entry's port named like the service port
    assert endpoints(w, RATINGS) == {("10.2.0.1", 9081): 2, ("10.2.0.2", 7070): 2}
    ctx = w.ctx()
    assert "spiffe://cluster.local/ns/default/sa/ratings-vm" in ctx.service_accounts(ctx.service(
        "ratings.default.svc.cluster.local"))


def test_a_named_target_port_the_entry_lacks_leaves_it_out():
    w = World()
    w.apply(kube_service("web"), vm("vm-1", "10.2.0.1", {"app": "ratings"}),
            vm("vm-2", "10.2.0.2", {"app": "ratings"}, {"web": 7171}))
    assert endpoints(w, RATINGS) == {("10.2.0.2", 7171): 2}


def test_the_knob_turns_it_off():
    from pilot.features import Features
    from pilot.model.push_context import PushContext
    assert Features.from_env({}).k8s_select_workload_entries is True
    assert Features.from_env({"PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES": "false"}).k8s_select_workload_entries is False
    w = World()
    w.apply(kube_service(9081), vm("vm-1", "10.2.0.1", {"app": "ratings"}))
    w.mesh.refresh(w.store)
    ctx = PushContext.build(w.store, w.mesh.current, w.mesh.version, "cluster.local", "off",
                            k8s_select_workload_entries=False)
    res = w.eds(proxy(), {RATINGS}, ctx)[RATINGS]
    assert not res.message(endpoint_pb2.ClusterLoadAssignment).endpoints
