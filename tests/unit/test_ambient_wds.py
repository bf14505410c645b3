"""WDS derivation (Pods, WorkloadEntries, ServiceEntries -> Workloads and Services), its cache keys,
and which Store changes push ztunnels."""

from __future__ import annotations

import ipaddress
import json
import statistics
import time

import pytest

from pilot.gen.workloadapi import workload_pb2 as wapi
from pilot.model.ambient.index import ambient_index
from pilot.model.events import push_request_for
from pilot.model.store import ConfigKey, Event
from pilot.xds.generated import Generated, plan_response
from pilot.xds.generators import wds
from tests.support.policies import authz
from tests.unit.helpers import World, mesh_configmap, proxy

ZT = proxy("istio-system", pod_name="ztunnel-1", ptype="ztunnel")


def ns(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def pod(name: str, namespace: str = "shop", ip: str = "10.1.0.5", *, labels: dict | None = None,
        annotations: dict | None = None, owner: tuple[str, str] | None = None, phase: str = "Running",
        host_network: bool = False) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"serviceAccountName": "sa", "hostNetwork": host_network},
            "status": {"podIP": ip, "phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}}


def workloads(w: World) -> dict[str, wapi.Workload]:
    out = {}
    for r in wds.generate(w.ctx(), ZT, None, w.cache):
        m = r.message(wapi.Address)
        if m.HasField("workload"):
            out[m.workload.name] = m.workload
    return out


def test_which_pods_are_reached_over_hbone():
    w = World()
    w.apply(ns("shop", **{"istio.io/dataplane-mode": "ambient"}), ns("plain"),
            pod("in-ns", ip="10.1.0.1"),
            pod("opted-out", ip="10.1.0.2", labels={"istio.io/dataplane-mode": "none"}),
            pod("sidecar", ip="10.1.0.3", annotations={"sidecar.istio.io/status": "{}"}),
            pod("own-label", "plain", ip="10.1.0.4", labels={"istio.io/dataplane-mode": "ambient"}),
            pod("cni-marked", "plain", ip="10.1.0.5", annotations={"ambient.istio.io/redirection": "enabled"}),
            pod("native", "plain", ip="10.1.0.6", labels={"networking.istio.io/tunnel": "http"}),
            pod("outside", "plain", ip="10.1.0.7"))
    got = {n: (x.tunnel_protocol == wapi.HBONE, x.native_tunnel) for n, x in workloads(w).items()}
    assert got == {"in-ns": (True, False), "opted-out": (False, False), "sidecar": (False, False),
                   "own-label": (True, False), "cni-marked": (True, False), "native": (True, True),
                   "outside": (False, False)}


def test_unreachable_pods_are_not_workloads_and_owners_name_the_workload():
    w = World()
    w.apply(pod("done", ip="10.1.0.1", phase="Succeeded"), pod("host", ip="10.1.0.2", host_network=True),
            pod("no-ip", ip=""),
            pod("job-x", ip="10.1.0.3", owner=("Job", "backup")),
            pod("cron-x", ip="10.1.0.4", owner=("Job", "nightly-28901234")),
            pod("db-0", ip="10.1.0.5", owner=("StatefulSet", "db")),
            pod("web-abc12-zz", ip="10.1.0.6", owner=("ReplicaSet", "web-abc12"),
                labels={"pod-template-hash": "abc12", "app.kubernetes.io/name": "web-ui",
                        "app.kubernetes.io/version": "1.2"}))
    got = {n: (x.workload_type, x.workload_name, x.canonical_name, x.canonical_revision)
           for n, x in workloads(w).items()}
    assert got == {"job-x": (wapi.JOB, "backup", "backup", "latest"),
                   "cron-x": (wapi.CRONJOB, "nightly", "nightly", "latest"),
                   "db-0": (wapi.POD, "db-0", "db-0", "latest"),
                   "web-abc12-zz": (wapi.DEPLOYMENT, "web", "web-ui", "1.2")}


def test_service_entries_headless_services_and_trust_domain():
    w = World()
    w.apply(mesh_configmap({"trustDomain": "example.org"}),
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "shop"},
             "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"name": "tcp", "port": 5432}]}},
            pod("db-0", ip="10.1.0.9", labels={"app": "db"}),
            {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry", "metadata": {"name": "ext", "namespace": "shop"},
             "spec": {"hosts": ["api.example.com"], "resolution": "DNS", "ports": [{"number": 443, "name": "tls"}]}},
            {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry", "metadata": {"name": "vms", "namespace": "shop"},
             "spec": {"hosts": ["vms.internal"], "addresses": ["240.1.0.0/24"], "resolution": "STATIC",
                      "ports": [{"number": 80, "name": "http", "targetPort": 8080}],
                      "endpoints": [{"address": "192.168.0.1", "serviceAccount": "vm"}]}})
    ctx = w.ctx()
    index = ambient_index(ctx)
    assert index.services["shop/db.shop.svc.cluster.local"].addresses == ()  # headless: no VIP
    db = index.workloads["Kubernetes//Pod/shop/db-0"]
    assert db.trust_domain == "example.org" and db.services == (("shop/db.shop.svc.cluster.local", ((5432, 5432),)),)
    dns = index.workloads["Kubernetes/networking.istio.io/ServiceEntry/shop/ext/api.example.com"]
    assert (dns.hostname, dns.addresses) == ("api.example.com", ())
    assert dns.services == (("shop/api.example.com", ((443, 443),)),)
    # A CIDR wider than one address cannot be matched by ztunnel: the ServiceEntry gives no service.
    assert "shop/vms.internal" not in index.services
    vm = index.workloads["Kubernetes/networking.istio.io/ServiceEntry/shop/vms/192.168.0.1"]
    assert vm.addresses == ("192.168.0.1",) and vm.service_account == "vm" and vm.services == ()


def test_unchanged_workloads_share_bytes_and_an_input_change_changes_only_its_workloads():
    w = World()
    w.apply(ns("shop"), ns("other"), pod("a", ip="10.1.0.1"), pod("b", "other", ip="10.1.0.2"))
    first = {r.name: r for r in wds.generate(w.ctx(), ZT, None, w.cache)}
    again = {r.name: r for r in wds.generate(w.ctx(), ZT, None, w.cache)}
    assert all(again[n] is first[n] for n in first)  # new context, same inputs: the cached objects
    w.apply(ns("shop", **{"istio.io/dataplane-mode": "ambient"}))
    after = {r.name: r for r in wds.generate(w.ctx(), ZT, None, w.cache)}
    changed = {n for n in first if after[n].version != first[n].version}
    assert changed == {"Kubernetes//Pod/shop/a"}
    assert after["Kubernetes//Pod/shop/a"].message(wapi.Address).workload.tunnel_protocol == wapi.HBONE


def test_on_demand_names_resolve_and_unknown_ones_are_absent():
    w = World()
    w.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
             "spec": {"clusterIP": "10.96.0.9", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]}},
            pod("web-1", ip="10.1.0.1", labels={"app": "web"}), pod("web-2", ip="10.1.0.2", labels={"app": "web"}),
            pod("lone", ip="10.1.0.3"))
    ctx = w.ctx()
    out = wds.generate(ctx, ZT, frozenset({"/10.96.0.9", "/10.1.0.3", "Kubernetes//Pod/shop/web-1", "/8.8.8.8"}),
                       w.cache)
    by_name = {r.name: r for r in out}
    assert len(by_name) == len(out) and set(by_name) == {
        "shop/web.shop.svc.cluster.local", "Kubernetes//Pod/shop/web-1", "Kubernetes//Pod/shop/web-2",
        "Kubernetes//Pod/shop/lone"}
    assert out.absent == ("/8.8.8.8",)
    # The delta framing carries the aliases; the Any is the same bytes as without them.
    lone = by_name["Kubernetes//Pod/shop/lone"]
    assert b"/10.1.0.3" in lone.delta_field and b"/10.1.0.3" not in lone.any_bytes
    addr = lone.message(wapi.Address).workload.addresses[0]
    assert str(ipaddress.ip_address(addr)) == "10.1.0.3"


def test_ztunnel_only_changes_map_to_endpoint_class_pushes():
    """Pods and Nodes refresh the endpoint indexes only (no full rebuild); which proxies they
    reach is the dependency matcher's decision (tests/unit/test_push_oracle.py)."""
    def ev(kind: str, name: str, namespace: str = "") -> Event:
        return Event("update", ConfigKey(kind, namespace, name), None, None)

    mesh = ConfigKey("ConfigMap", "istio-system", "istio")
    req = push_request_for([ev("Pod", "a", "shop"), ev("Node", "n1")], mesh)
    assert req is not None and not req.full
    assert req.config_keys == {ConfigKey("Pod", "shop", "a"), ConfigKey("Node", "", "n1")}
    gw = push_request_for([ev("KubernetesGateway", "waypoint", "shop"), ev("Namespace", "shop")], mesh)
    assert gw is not None and gw.full
    assert push_request_for([ev("ConfigMap", "x", "shop")], mesh) is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_figures_wds_push_cost_for_a_pod_change():
    """1,000 pods (100 services, 100 selector policies, 10 ambient namespaces): the ztunnel push of
    one pod's move, from index to the planned delta response."""
    w = World()
    docs = []
    for n in range(10):
        docs.append(ns(f"ns{n}", **{"istio.io/dataplane-mode": "ambient"}))
        for s in range(10):
            docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc{s}", "namespace": f"ns{n}"},
                         "spec": {"clusterIP": f"10.96.{n}.{s + 1}", "selector": {"app": f"svc{s}"},
                                  "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
            docs.append(authz(f"p{s}", f"ns{n}", selector={"matchLabels": {"app": f"svc{s}"}},
                              rules=[{"from": [{"source": {"namespaces": [f"ns{n}"]}}]}]))
            docs += [pod(f"svc{s}-{p}", f"ns{n}", ip=f"10.{n + 1}.{s}.{p + 1}", labels={"app": f"svc{s}"})
                     for p in range(10)]
    w.apply(*docs)
    t0 = time.perf_counter()
    held = Generated(tuple(wds.generate(w.ctx(), ZT, None, w.cache))).versions()
    cold_ms = (time.perf_counter() - t0) * 1000
    samples, sent = [], []
    for k in range(5):
        w.apply(pod("svc3-4", "ns2", ip=f"10.200.0.{k + 1}", labels={"app": "svc3"}))
        ctx = w.ctx()
        t0 = time.perf_counter()
        plan = plan_response(held, Generated(tuple(wds.generate(ctx, ZT, None, w.cache))), frozenset(),
                             delta=True, complete=False, partial=False, always=False)
        samples.append((time.perf_counter() - t0) * 1000)
        sent.append(len(plan.out))
        held = plan.held_after
    figures = {"addresses": len(held), "cold_ms": round(cold_ms, 1),
               "pod_change_ms_median": round(statistics.median(samples), 1), "resources_sent": sent}
    print("\nFIGURES " + json.dumps({"ambient_wds_1000_pods": figures}))
    assert sent == [1] * 5
