"""Waypoint assignment in WDS: which services and workloads get which waypoint's address."""

from __future__ import annotations

from pilot.model.ambient.index import ambient_index
from pilot.model.ambient.types import GatewayAddr
from tests.unit.helpers import World

WP_HOST = GatewayAddr(namespace="shop", hostname="waypoint.shop.svc.cluster.local")


def ns(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def waypoint(name: str = "waypoint", namespace: str = "shop", *, labels: dict | None = None,
             addresses: list | None = None, allowed_from: str | None = None) -> dict:
    listener: dict = {"name": "mesh", "port": 15008, "protocol": "HBONE"}
    if allowed_from:
        listener["allowedRoutes"] = {"namespaces": {"from": allowed_from}}
    spec: dict = {"gatewayClassName": "istio-waypoint", "listeners": [listener]}
    if addresses:
        spec["addresses"] = addresses
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}}, "spec": spec}


def svc(name: str, namespace: str = "shop", ip: str = "10.96.0.1", labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"clusterIP": ip, "selector": {"app": name}, "ports": [{"name": "http", "port": 80}]}}


def pod(name: str, namespace: str = "shop", ip: str = "10.1.0.1", labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                           "labels": labels or {"app": name}},
            "spec": {"serviceAccountName": name}, "status": {"podIP": ip, "phase": "Running"}}


# The waypoint's own Service, as istiod's deployment controller would have created it.
WP_SERVICE = svc("waypoint", ip="10.96.0.99", labels={"gateway.istio.io/managed": "istio.io-mesh-controller"})


def index(*docs: dict):
    w = World()
    w.apply(*docs)
    return ambient_index(w.ctx())


def test_namespace_waypoint_serves_services_by_default_not_workloads():
    idx = index(ns("shop", **{"istio.io/use-waypoint": "waypoint"}), waypoint(), WP_SERVICE,
                svc("cart"), pod("cart"),
                svc("public", ip="10.96.0.2", labels={"istio.io/use-waypoint": "none"}),
                pod("waypoint-5d8f", ip="10.1.0.50",
                    labels={"gateway.networking.k8s.io/gateway-name": "waypoint"}))
    assert idx.services["shop/cart.shop.svc.cluster.local"].waypoint == WP_HOST
    assert idx.services["shop/public.shop.svc.cluster.local"].waypoint is None  # opted out
    assert idx.services["shop/waypoint.shop.svc.cluster.local"].waypoint is None  # its own Service
    assert idx.workloads["Kubernetes//Pod/shop/cart"].waypoint is None  # waypoint-for: service
    [wp] = idx.waypoints.by_name.values()
    assert (wp.traffic_type, wp.service_accounts) == ("service", ("waypoint-5d8f",))


def test_waypoint_for_all_and_workload_labels():
    idx = index(ns("shop"), waypoint(labels={"istio.io/waypoint-for": "all"}), WP_SERVICE,
                svc("cart"), pod("cart", labels={"app": "cart", "istio.io/use-waypoint": "waypoint"}),
                pod("waypoint-1", ip="10.1.0.50", labels={"gateway.networking.k8s.io/gateway-name": "waypoint",
                                                          "istio.io/use-waypoint": "waypoint"}))
    assert idx.workloads["Kubernetes//Pod/shop/cart"].waypoint == WP_HOST
    assert idx.workloads["Kubernetes//Pod/shop/waypoint-1"].waypoint is None  # an instance never loops
    assert idx.services["shop/cart.shop.svc.cluster.local"].waypoint is None  # no label on the Service


def test_addresses_readiness_and_cross_namespace_attachment():
    # Not ready: no addresses and no Service yet.
    assert index(ns("shop", **{"istio.io/use-waypoint": "waypoint"}), waypoint(),
                 svc("cart")).services["shop/cart.shop.svc.cluster.local"].waypoint is None
    # spec.addresses (IP) wins over the Service.
    idx = index(ns("shop", **{"istio.io/use-waypoint": "waypoint"}), WP_SERVICE, svc("cart"),
                waypoint(addresses=[{"type": "IPAddress", "value": "10.96.0.77"}]))
    assert idx.services["shop/cart.shop.svc.cluster.local"].waypoint == GatewayAddr(ip="10.96.0.77")
    # Another namespace may use it only when the HBONE listener allows it.
    other = svc("api", "other", ip="10.96.1.1",
                labels={"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "shop"})
    same_only = index(ns("shop"), ns("other"), waypoint(), WP_SERVICE, other)
    assert same_only.services["other/api.other.svc.cluster.local"].waypoint is None
    allowed = index(ns("shop"), ns("other"), waypoint(allowed_from="All"), WP_SERVICE, other)
    assert allowed.services["other/api.other.svc.cluster.local"].waypoint == WP_HOST
    # A Gateway of another class is no waypoint.
    ingress = dict(waypoint(), spec={"gatewayClassName": "istio", "listeners": [
        {"name": "http", "port": 80, "protocol": "HTTP"}]})
    assert index(ns("shop", **{"istio.io/use-waypoint": "waypoint"}), ingress, WP_SERVICE,
                 svc("cart")).services["shop/cart.shop.svc.cluster.local"].waypoint is None
