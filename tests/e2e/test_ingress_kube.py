"""Kubernetes Ingress in Kubernetes mode: the Ingress, its IngressClass and the ingress gateway
Service come from the (fake) apiserver through the real informers, a real gateway Envoy routes
the Ingress's traffic, and the leader writes status.loadBalancer from the gateway Service's
load balancer addresses (MeshConfig ingressService), following them when they change, without
rewriting an unchanged status and without a status write causing a push.
"""

from __future__ import annotations

import pytest

from tests.e2e.gateway_api_env import request
from tests.fakes.apiserver import FakeApiServer
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(120)
GW_NS = "istio-system"
ROUTER = f"router~127.0.0.1~ingress-1.{GW_NS}~{GW_NS}.svc.cluster.local"
SERVICE_PORT = 8000


def ingress(name: str, host: str, class_name: str) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"ingressClassName": class_name, "rules": [{"host": host, "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": "alpha", "port": {"number": SERVICE_PORT}}}}]}}]}}


def gateway_service(target: int, lb_ip: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "istio-ingressgateway", "namespace": GW_NS},
            "spec": {"type": "LoadBalancer", "selector": {"istio": "ingressgateway"},
                     "ports": [{"name": "http2", "port": 80, "targetPort": target}]},
            "status": {"loadBalancer": {"ingress": [{"ip": lb_ip}]}}}


def lb_of(fake: FakeApiServer, name: str) -> list:
    obj = fake.get("ingresses.networking.k8s.io", name, namespace="default") or {}
    return ((obj.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []


def ingress_status_writes(fake: FakeApiServer) -> list:
    return [r for r in fake.request_log if r.subresource == "status" and "/ingresses/" in r.path]


@pytest.fixture
async def cluster(tmp_path):
    fake = await FakeApiServer().start()
    fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GW_NS}})
    alpha = await HttpBackend("alpha").start()
    fake.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "alpha", "namespace": "default"},
                 "spec": {"ports": [{"name": "http", "port": SERVICE_PORT}]}})
    fake.create({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                 "metadata": {"name": "alpha-1", "namespace": "default",
                              "labels": {"kubernetes.io/service-name": "alpha"}},
                 "ports": [{"name": "http", "port": alpha.port}], "endpoints": [{"addresses": ["127.0.0.1"]}]})
    cp = ControlPlane(tmp_path, kubeconfig=fake.write_kubeconfig(tmp_path / "kubeconfig"),
                      env={"POD_NAME": "istiod-1", "CA_KEY_TYPE": "EC"})
    envoy = Envoy()
    try:
        await cp.start()
        yield fake, cp, envoy, tmp_path
    finally:
        await envoy.stop()
        await cp.stop()
        await alpha.stop()
        await fake.stop()


async def test_ingress_from_the_apiserver_routes_and_gets_the_gateway_address(cluster):
    fake, cp, envoy, tmp_path = cluster
    (target,) = free_ports(1)
    fake.create(gateway_service(target, "203.0.113.7"))
    fake.create({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "istio"},
                 "spec": {"controller": "istio.io/ingress-controller"}})
    fake.create(ingress("shop", "shop.example.com", "istio"))
    fake.create(ingress("other", "other.example.com", "nginx"))  # no such class, STRICT: not ours
    await envoy.start(Envoy.bootstrap(ROUTER, cp.xds_port, metadata={
        "NAMESPACE": GW_NS, "LABELS": {"istio": "ingressgateway"}}), tmp_path)

    async def served():
        return (await request(target, "shop.example.com", "/")).backend == "alpha"

    await wait_for(served, 20, message=f"the Ingress routes through the gateway\n{cp.log_tail(20)}")
    assert (await request(target, "other.example.com", "/")).status == 404

    await wait_for(lambda: lb_of(fake, "shop") == [{"ip": "203.0.113.7"}], 20,
                   message=f"status.loadBalancer written\n{cp.log_tail(20)}")
    assert lb_of(fake, "other") == []  # another controller's Ingress is not ours to report on
    writes = len(ingress_status_writes(fake))
    assert writes == 1

    # The gateway Service's address changes: the status follows, written once more.
    svc = fake.get("services", "istio-ingressgateway", namespace=GW_NS)
    svc["status"] = {"loadBalancer": {"ingress": [{"hostname": "lb.example.com"}]}}
    fake.update_status(svc)
    await wait_for(lambda: lb_of(fake, "shop") == [{"hostname": "lb.example.com"}], 20,
                   message="status follows the Service")
    # A marker Ingress, created after: once its push is seen, the status write before it has
    # reached the informer; the shop Ingress was in no push after the one that created it.
    fake.create(ingress("marker", "marker.example.com", "istio"))

    async def marker_pushed():
        keys = {k for p in (await cp.debug("/debug/push_status"))["pushes"] for k in p["config_keys"]}
        return "Ingress/default/marker" in keys

    await wait_for(marker_pushed, 20, message="the marker Ingress pushed")

    async def marker_served():  # an Ingress created while the gateway runs reaches it
        return (await request(target, "marker.example.com", "/")).backend == "alpha"

    await wait_for(marker_served, 20, message="the marker Ingress routes")
    await wait_for(lambda: lb_of(fake, "marker") == [{"hostname": "lb.example.com"}], 20, message="marker status")
    assert len(ingress_status_writes(fake)) == writes + 2, [r.path for r in ingress_status_writes(fake)]
    keys = [k for p in (await cp.debug("/debug/push_status"))["pushes"] for k in p["config_keys"]]
    assert keys.count("Ingress/default/shop") == 1, keys
