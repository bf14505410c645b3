"""ztunnel's L4 authorization over the wire: policies decoded from the real stream, their status when
they use HTTP attributes, and what a policy change (or a pod change) pushes, and to whom."""

from __future__ import annotations

import grpc
import pytest
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from pilot.gen.workloadapi.security import authorization_pb2 as sec
from tests.support.control_plane import ControlPlane
from tests.support.policies import authz
from tests.support.wait import wait_for
from tests.support.ztunnel import ADDRESS, AUTHORIZATION, ZtunnelClient

pytestmark = pytest.mark.timeout(60)
SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"

BASE = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop", "labels": {"istio.io/dataplane-mode": "ambient"}}},
    {"apiVersion": "v1", "kind": "Pod",
     "metadata": {"name": "cart-0", "namespace": "shop", "labels": {"app": "cart"}},
     "spec": {"serviceAccountName": "cart"},
     "status": {"podIP": "10.1.0.11", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
    authz("cart-from-front", "shop", selector={"matchLabels": {"app": "cart"}}, rules=[{
        "from": [{"source": {"principals": ["cluster.local/ns/shop/sa/front"], "notNamespaces": ["dev"]}}],
        "to": [{"operation": {"ports": ["8080"]}}]}]),
    authz("no-posts", "shop", action="DENY", rules=[{"to": [{"operation": {"methods": ["POST"], "ports": ["8080"]}}]}]),
]


def dump(*docs: dict) -> str:
    return yaml.safe_dump_all(docs)


async def test_policies_status_and_what_changes_push(tmp_path):
    cp = ControlPlane(tmp_path, env={"PILOT_ENABLE_AMBIENT": "true"})
    cp.write("mesh.yaml", dump(*BASE))
    async with cp:
        z = ZtunnelClient(cp.xds_port)
        await z.connect()
        try:
            await z.wait(lambda: z.received(ADDRESS) and z.received(AUTHORIZATION))
            pols = z.policies()
            assert set(pols) == {"shop/cart-from-front", "shop/no-posts"}
            allow = pols["shop/cart-from-front"]
            assert (allow.scope, allow.action) == (sec.WORKLOAD_SELECTOR, sec.ALLOW)
            [group] = allow.groups
            to, frm = group.rules
            assert list(to.matches[0].destination_ports) == [8080]
            assert frm.matches[0].principals[0].exact == "cluster.local/ns/shop/sa/front"
            assert frm.matches[0].not_namespaces[0].exact == "dev"
            deny = pols["shop/no-posts"]
            assert (deny.scope, deny.action) == (sec.NAMESPACE, sec.DENY)
            assert list(deny.groups[0].rules[0].matches[0].destination_ports) == [8080]
            assert z.workloads()["Kubernetes//Pod/shop/cart-0"].authorization_policies == ["shop/cart-from-front"]

            ambientz = await cp.debug("/debug/ambientz")
            [status] = ambientz["policy_status"]
            assert status["name"] == "no-posts" and status["sent_to_ztunnel"] is True
            assert "ztunnel does not support HTTP attributes (found: methods)" in status["message"]
            [mine] = ambientz["ztunnels"]
            assert set(mine["types"]["wads"]["sent"]) == {"shop/cart-from-front", "shop/no-posts"}
            assert mine["types"]["wds"]["nonce_acked"] == mine["types"]["wds"]["nonce_sent"]

            # Deleting a selector policy: the policy is removed and the workload no longer lists it.
            n_auth, n_addr = len(z.received(AUTHORIZATION)), len(z.received(ADDRESS))
            cp.write("mesh.yaml", dump(*[d for d in BASE if d["metadata"]["name"] != "cart-from-front"]))
            removal = await z.wait(lambda: next((r for r in z.received(AUTHORIZATION)[n_auth:] if r.removed), None))
            assert removal.removed == ("shop/cart-from-front",) and not removal.resources
            update = await z.wait(lambda: next((r for r in z.received(ADDRESS)[n_addr:] if r.resources), None))
            assert list(update.resources) == ["Kubernetes//Pod/shop/cart-0"]
            assert not update.resources["Kubernetes//Pod/shop/cart-0"].workload.authorization_policies
        finally:
            await z.close()


async def test_pod_changes_push_ztunnels_not_sidecars(tmp_path):
    cp = ControlPlane(tmp_path, env={"PILOT_ENABLE_AMBIENT": "true"})
    cp.write("mesh.yaml", dump(*BASE))
    async with cp:
        z = ZtunnelClient(cp.xds_port)
        await z.connect()
        sidecar = grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}")
        sotw = sidecar.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                     response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
        try:
            md = struct_pb2.Struct()
            md.update({"NAMESPACE": "shop"})
            await sotw.write(discovery_pb2.DiscoveryRequest(
                type_url=CDS, node=base_pb2.Node(id="sidecar~10.1.0.50~web-0.shop~shop.svc.cluster.local", metadata=md)))
            await sotw.read()
            await z.wait(lambda: z.received(ADDRESS))
            assert len(await cp.debug("/debug/connections")) == 2

            async def loaded() -> set[str] | None:
                # The initial load reaches the pushes too (debounced): wait for it, so it is not
                # mistaken for the push of the change below.
                pushes = (await cp.debug("/debug/push_status"))["pushes"]
                if any("Namespace/shop" in p["config_keys"] for p in pushes):
                    return {p["version"] for p in pushes}
                return None

            before = await wait_for(loaded, message="the initial load was pushed")
            moved = dict(BASE[1], status={"podIP": "10.1.0.99", "phase": "Running",
                                          "conditions": [{"type": "Ready", "status": "True"}]})
            cp.write("mesh.yaml", dump(BASE[0], moved, *BASE[2:]))

            async def pushed() -> dict | None:
                status = await cp.debug("/debug/push_status")
                return next((p for p in status["pushes"]
                             if p["version"] not in before and "Pod/shop/cart-0" in p["config_keys"]), None)

            push = await wait_for(pushed, message="the pod change is pushed")
            assert push["full"] is False and push["proxies"] == 1, push  # the ztunnel, not the sidecar
            await z.wait(lambda: z.workloads()["Kubernetes//Pod/shop/cart-0"].addresses == [bytes([10, 1, 0, 99])])
        finally:
            sotw.cancel()
            await sidecar.close()
            await z.close()
