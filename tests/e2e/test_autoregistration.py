"""WorkloadEntry auto-registration in file mode: a VM-style xDS client (grpcio, the node metadata
istio-agent sends with ISTIO_META_AUTO_REGISTER_GROUP) connects, and the control plane creates its
WorkloadEntry from the WorkloadGroup, in /debug/configz and as an endpoint of the ServiceEntry that
selects it in /debug/endpointz; after the stream closes it is removed once the grace period passed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from tests.fakes.apiserver import FakeApiServer
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(120)

SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
VM_IP = "10.9.8.7"
GROUP = {"apiVersion": "networking.istio.io/v1", "kind": "WorkloadGroup",
         "metadata": {"name": "billing-vm", "namespace": "vms"},
         "spec": {"metadata": {"labels": {"app": "billing"}, "annotations": {"team": "pay"}},
                  "template": {"ports": {"http": 8080}, "serviceAccount": "billing"}}}
SERVICE = {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
           "metadata": {"name": "billing", "namespace": "vms"},
           "spec": {"hosts": ["billing.vms.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                    "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}],
                    "workloadSelector": {"labels": {"app": "billing"}}}}


def vm_node() -> base_pb2.Node:
    meta = struct_pb2.Struct()
    meta.update({"NAMESPACE": "vms", "AUTO_REGISTER_GROUP": "billing-vm", "LABELS": {"version": "v2"},
                 "SERVICE_ACCOUNT": "billing"})
    return base_pb2.Node(id=f"sidecar~{VM_IP}~billing-vm.vms~vms.svc.cluster.local", metadata=meta)


async def registered(cp: ControlPlane) -> dict | None:
    for c in (await cp.debug("/debug/configz"))["configs"]:
        if c["kind"] == "WorkloadEntry" and c["name"] == f"billing-vm-{VM_IP}":
            return c
    return None


async def endpoints(cp: ControlPlane) -> list[tuple[str, int]]:
    return [(e["address"], e["port"]) for row in await cp.debug("/debug/endpointz")
            if row["service"] == "billing.vms.svc.cluster.local" for e in row["endpoints"]]


async def test_a_connecting_vm_is_registered_and_removed_after_the_grace_period(tmp_path):
    async with ControlPlane(tmp_path, env={"PILOT_WORKLOAD_ENTRY_GRACE_PERIOD": "2s"}) as cp:
        cp.write("vm.yaml", yaml.safe_dump_all([GROUP, SERVICE]))

        async def loaded() -> bool:
            kinds = [c["kind"] for c in (await cp.debug("/debug/configz"))["configs"]]
            return "WorkloadGroup" in kinds and "ServiceEntry" in kinds

        await wait_for(loaded, timeout=20, message="the WorkloadGroup and ServiceEntry are loaded")
        assert await registered(cp) is None

        async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
            call = ch.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                    response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
            await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=vm_node()))
            assert (await call.read()).type_url == CDS  # served while registered

            entry = await wait_for(lambda: registered(cp), timeout=20, message="the WorkloadEntry is created")
            assert entry["source"] == "autoregistration"
            obj = entry["object"]
            assert obj["spec"]["address"] == VM_IP and obj["spec"]["serviceAccount"] == "billing"
            assert obj["spec"]["labels"] == {"app": "billing", "version": "v2"}  # group's, then the proxy's
            assert obj["metadata"]["annotations"]["istio.io/autoRegistrationGroup"] == "billing-vm"
            assert obj["metadata"]["annotations"]["team"] == "pay"
            await wait_for(lambda: endpoints_are(cp, [(VM_IP, 8080)]), timeout=20,
                           message="the VM is an endpoint of the ServiceEntry")
            call.cancel()

        # Within the grace period the entry stays (marked disconnected), then it goes.
        async def disconnected() -> bool:
            entry = await registered(cp)
            return entry is not None and "istio.io/disconnectedAt" in entry["object"]["metadata"]["annotations"]

        await wait_for(disconnected, timeout=20, message="the entry is marked disconnected")
        await wait_for(lambda: gone(cp), timeout=30, message="the entry is removed after the grace period")
        await wait_for(lambda: endpoints_are(cp, []), timeout=20, message="the endpoint goes with it")


async def endpoints_are(cp: ControlPlane, want: list[tuple[str, int]]) -> bool:
    return await endpoints(cp) == want


async def gone(cp: ControlPlane) -> bool:
    return await registered(cp) is None


@contextlib.asynccontextmanager
async def apiserver_with_group() -> AsyncIterator[FakeApiServer]:
    """An apiserver serving the WorkloadGroup/WorkloadEntry CRDs, holding GROUP."""
    async with FakeApiServer() as fake:
        for plural, kind in (("workloadgroups", "WorkloadGroup"), ("workloadentries", "WorkloadEntry")):
            fake.register_crd("networking.istio.io", "v1", plural, kind)
        for ns in ("istio-system", "vms"):
            fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        fake.create(GROUP)
        yield fake


async def test_kubernetes_mode_writes_the_entry_to_the_apiserver(tmp_path):
    async with apiserver_with_group() as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        async with ControlPlane(tmp_path, kubeconfig=kubeconfig, env={"PILOT_WORKLOAD_ENTRY_GRACE_PERIOD": "1s"}) as cp:
            name = f"billing-vm-{VM_IP}"

            def stored() -> dict | None:
                return fake.get("workloadentries.networking.istio.io", name, namespace="vms")

            async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
                call = ch.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                        response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
                await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=vm_node()))
                assert (await call.read()).type_url == CDS
                entry = await wait_for(stored, timeout=20, message=f"the entry is written\n{cp.log_tail()}")
                assert entry["spec"]["address"] == VM_IP
                assert entry["spec"]["labels"] == {"app": "billing", "version": "v2"}
                assert entry["metadata"]["annotations"]["istio.io/autoRegistrationGroup"] == "billing-vm"
                # ... and read back through the informer like any WorkloadEntry.
                await wait_for(lambda: registered(cp), timeout=20, message="the informer has it")
                call.cancel()
            await wait_for(lambda: stored() is None, timeout=30,
                           message=f"deleted after the grace period\n{cp.log_tail()}")


async def test_kubernetes_mode_writes_the_healthy_condition_through_the_status_subresource(tmp_path):
    """What pilot-agent sends (tests/e2e/test_workload_health.py runs the agent): a node whose
    PROXY_CONFIG has a readinessProbe, then istio.io/health requests; the apiserver's entry gets
    the annotation and its status the Healthy condition, False with the probe's message."""
    from google.rpc import status_pb2  # type: ignore[import-untyped]

    async with apiserver_with_group() as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        async with ControlPlane(tmp_path, kubeconfig=kubeconfig) as cp:
            node = vm_node()
            node.metadata.update({"PROXY_CONFIG": {"readinessProbe": {"tcpSocket": {"port": 8080}}}})

            def healthy() -> str | None:
                entry = fake.get("workloadentries.networking.istio.io", f"billing-vm-{VM_IP}", namespace="vms")
                conds = ((entry or {}).get("status") or {}).get("conditions") or []
                return next((c["status"] + ":" + c.get("message", "") for c in conds if c["type"] == "Healthy"), None)

            async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
                call = ch.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                        response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
                await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=node))
                assert (await call.read()).type_url == CDS
                # Read back through the informer: health reports apply to the entry the store holds.
                await wait_for(lambda: registered(cp), timeout=20, message=f"the entry is registered\n{cp.log_tail()}")
                entry = fake.get("workloadentries.networking.istio.io", f"billing-vm-{VM_IP}", namespace="vms")
                assert entry["metadata"]["annotations"]["proxy.istio.io/health-checks-enabled"] == "true"
                await call.write(discovery_pb2.DiscoveryRequest(type_url="istio.io/health"))
                await wait_for(lambda: healthy() == "True:", timeout=20, message=f"Healthy=True\n{cp.log_tail()}")
                await call.write(discovery_pb2.DiscoveryRequest(
                    type_url="istio.io/health", error_detail=status_pb2.Status(code=500, message="connection refused")))
                await wait_for(lambda: healthy() == "False:connection refused", timeout=20,
                               message=f"Healthy=False\n{cp.log_tail()}")
                call.cancel()
