"""Waypoints end to end: a Gateway of class istio-waypoint appears, and ztunnel is told to send the
services that use it through its address."""

from __future__ import annotations

import pytest
import yaml

from tests.support.control_plane import ControlPlane
from tests.support.ztunnel import ADDRESS, ZtunnelClient

pytestmark = pytest.mark.timeout(60)

NAMESPACE = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "shop", "labels": {"istio.io/dataplane-mode": "ambient",
                                                     "istio.io/use-waypoint": "waypoint"}}}
CART = [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cart", "namespace": "shop"},
         "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "cart"}, "ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cart-0", "namespace": "shop", "labels": {"app": "cart"}},
         "spec": {"serviceAccountName": "cart"},
         "status": {"podIP": "10.1.0.11", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}]
WAYPOINT = [{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
             "metadata": {"name": "waypoint", "namespace": "shop"},
             "spec": {"gatewayClassName": "istio-waypoint",
                      "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "waypoint", "namespace": "shop",
                          "labels": {"gateway.istio.io/managed": "istio.io-mesh-controller"}},
             "spec": {"clusterIP": "10.96.0.99", "selector": {"gateway.networking.k8s.io/gateway-name": "waypoint"},
                      "ports": [{"name": "mesh", "port": 15008}]}}]
SVC = "shop/cart.shop.svc.cluster.local"


def dump(*docs: dict) -> str:
    return yaml.safe_dump_all(docs)


async def test_a_new_waypoint_is_assigned_to_the_services_that_use_it(tmp_path):
    cp = ControlPlane(tmp_path, env={"PILOT_ENABLE_AMBIENT": "true"})
    cp.write("mesh.yaml", dump(NAMESPACE, *CART))
    async with cp:
        z = ZtunnelClient(cp.xds_port)
        await z.connect()
        try:
            await z.wait(lambda: SVC in z.services())
            assert not z.services()[SVC].HasField("waypoint")  # named, but no such waypoint yet

            n = len(z.received(ADDRESS))
            cp.write("waypoint.yaml", dump(*WAYPOINT))
            await z.wait(lambda: z.services()[SVC].HasField("waypoint"), message="the waypoint is assigned")
            wp = z.services()[SVC].waypoint
            assert (wp.hostname.namespace, wp.hostname.hostname, wp.hbone_mtls_port) == (
                "shop", "waypoint.shop.svc.cluster.local", 15008)
            assert not z.workloads()["Kubernetes//Pod/shop/cart-0"].HasField("waypoint")  # service traffic only
            changed = {name for r in z.received(ADDRESS)[n:] for name in r.resources}
            # The cart service gets the waypoint; the waypoint's own service is new; nothing else moves.
            assert changed == {SVC, "shop/waypoint.shop.svc.cluster.local"}

            ambientz = await cp.debug("/debug/ambientz")
            assert ambientz["waypoints"] == [{"namespace": "shop", "name": "waypoint", "traffic_type": "service",
                                              "address": "waypoint.shop.svc.cluster.local", "service_accounts": []}]
        finally:
            await z.close()
