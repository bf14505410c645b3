"""ztunnel's workload discovery (WDS) against the real control plane, with a client that speaks delta
xDS as ztunnel does (tests/support/ztunnel.py): workloads, services, ports and identities field by
field, removals, reconnects, on-demand lookups, and refusal when ambient mode is off."""

from __future__ import annotations

import ipaddress

import grpc
import pytest
import yaml

from pilot.gen.workloadapi import workload_pb2 as wapi
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for
from tests.support.ztunnel import ADDRESS, AUTHORIZATION, ZtunnelClient

pytestmark = pytest.mark.timeout(60)

CART_UID = "Kubernetes//Pod/shop/cart-6f9c7-x2x4z"
CART_SVC = "shop/cart.shop.svc.cluster.local"


def ip(b: bytes) -> str:
    return str(ipaddress.ip_address(b))


def pod(name: str, ip_: str, *, labels: dict, ns: str = "shop", sa: str = "cart", ready: bool = True,
        node: str = "node-1", owner: dict | None = None, ports: list | None = None) -> dict:
    meta: dict = {"name": name, "namespace": ns, "labels": labels}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"serviceAccountName": sa, "nodeName": node,
                     "containers": [{"name": "app", "ports": ports or []}]},
            "status": {"podIP": ip_, "phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


MESH = [
    {"apiVersion": "v1", "kind": "Namespace",
     "metadata": {"name": "shop", "labels": {"istio.io/dataplane-mode": "ambient"}}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "legacy"}},
    {"apiVersion": "v1", "kind": "Node",
     "metadata": {"name": "node-1", "labels": {"topology.kubernetes.io/region": "eu",
                                               "topology.kubernetes.io/zone": "eu-1a"}}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cart", "namespace": "shop"},
     "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "cart"},
              "ports": [{"name": "http", "port": 80, "targetPort": "web"},
                        {"name": "grpc", "port": 9090, "targetPort": 9091}]}},
    pod("cart-6f9c7-x2x4z", "10.1.0.11",
        labels={"app": "cart", "version": "v3", "pod-template-hash": "6f9c7"},
        owner={"kind": "ReplicaSet", "name": "cart-6f9c7", "controller": True},
        ports=[{"name": "web", "containerPort": 8080}]),
    pod("cart-6f9c7-b7b7b", "10.1.0.12", ready=False,
        labels={"app": "cart", "version": "v3", "pod-template-hash": "6f9c7"},
        owner={"kind": "ReplicaSet", "name": "cart-6f9c7", "controller": True},
        ports=[{"name": "web", "containerPort": 8081}]),
    # Outside ambient: still a workload (ztunnel may call it), but not reached over HBONE.
    pod("old-1", "10.1.0.30", ns="legacy", sa="old", labels={"app": "old"}),
    {"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry", "metadata": {"name": "vm-1", "namespace": "shop"},
     "spec": {"address": "192.168.7.7", "serviceAccount": "billing", "labels": {"app": "billing"},
              "ports": {"tcp": 7000}, "locality": "us/us-east1/a"}},
    {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry", "metadata": {"name": "billing", "namespace": "shop"},
     "spec": {"hosts": ["billing.example.internal"], "addresses": ["240.0.0.5"], "resolution": "STATIC",
              "ports": [{"number": 7443, "name": "tcp", "protocol": "TCP"}],
              "workloadSelector": {"labels": {"app": "billing"}}}},
]


def dump(*docs: dict) -> str:
    return yaml.safe_dump_all(docs)


@pytest.fixture
async def cp(tmp_path):
    plane = ControlPlane(tmp_path, env={"PILOT_ENABLE_AMBIENT": "true"})
    plane.write("mesh.yaml", dump(*MESH))
    async with plane:
        yield plane


@pytest.fixture
async def ztunnel(cp):
    client = ZtunnelClient(cp.xds_port)
    await client.connect()
    await client.wait(lambda: client.received(ADDRESS) and client.received(AUTHORIZATION),
                      message="first responses of both types")
    yield client
    await client.close()


async def test_workloads_services_ports_and_identities(ztunnel: ZtunnelClient):
    wls = ztunnel.workloads()
    assert set(wls) == {CART_UID, "Kubernetes//Pod/shop/cart-6f9c7-b7b7b", "Kubernetes//Pod/legacy/old-1",
                        "Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"}
    cart = wls[CART_UID]
    assert (cart.uid, cart.name, cart.namespace) == (CART_UID, "cart-6f9c7-x2x4z", "shop")
    assert [ip(a) for a in cart.addresses] == ["10.1.0.11"]
    assert cart.network == "" and cart.cluster_id == "Kubernetes"
    assert cart.tunnel_protocol == wapi.HBONE and not cart.native_tunnel
    assert (cart.trust_domain, cart.service_account) == ("", "cart")  # default trust domain is left out
    assert cart.node == "node-1"
    assert (cart.locality.region, cart.locality.zone, cart.locality.subzone) == ("eu", "eu-1a", "")
    assert (cart.workload_type, cart.workload_name) == (wapi.DEPLOYMENT, "cart")
    assert (cart.canonical_name, cart.canonical_revision) == ("cart", "v3")
    assert cart.status == wapi.HEALTHY
    assert not cart.HasField("waypoint")
    # Named targetPort "web" resolves per pod; numeric ones pass through.
    assert {k: [(p.service_port, p.target_port) for p in v.ports] for k, v in cart.services.items()} == {
        CART_SVC: [(80, 8080), (9090, 9091)]}
    other = wls["Kubernetes//Pod/shop/cart-6f9c7-b7b7b"]
    assert other.status == wapi.UNHEALTHY
    assert [(p.service_port, p.target_port) for p in other.services[CART_SVC].ports] == [(80, 8081), (9090, 9091)]

    old = wls["Kubernetes//Pod/legacy/old-1"]
    assert old.tunnel_protocol == wapi.NONE and old.service_account == "old" and not old.services

    vm = wls["Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"]
    assert [ip(a) for a in vm.addresses] == ["192.168.7.7"] and vm.service_account == "billing"
    assert (vm.workload_type, vm.workload_name, vm.canonical_name) == (wapi.POD, "vm-1", "billing")
    assert (vm.locality.region, vm.locality.zone, vm.locality.subzone) == ("us", "us-east1", "a")
    # The ServiceEntry port is named "tcp", and so is the WorkloadEntry's override.
    assert [(p.service_port, p.target_port) for p in vm.services["shop/billing.example.internal"].ports] == [(7443, 7000)]

    svcs = ztunnel.services()
    assert set(svcs) == {CART_SVC, "shop/billing.example.internal"}
    svc = svcs[CART_SVC]
    assert (svc.name, svc.namespace, svc.hostname) == ("cart", "shop", "cart.shop.svc.cluster.local")
    assert [(a.network, ip(a.address)) for a in svc.addresses] == [("", "10.96.0.10")]
    assert [(p.service_port, p.target_port) for p in svc.ports] == [(80, 0), (9090, 9091)]
    se = svcs["shop/billing.example.internal"]
    assert [ip(a.address) for a in se.addresses] == ["240.0.0.5"]
    assert [(p.service_port, p.target_port) for p in se.ports] == [(7443, 7443)]

    # Each resource carries its "network/IP" aliases, and a content version.
    [first] = ztunnel.received(ADDRESS)[:1]
    assert first.aliases[CART_UID] == ("/10.1.0.11",)
    assert first.aliases[CART_SVC] == ("/10.96.0.10",)
    assert all(first.versions.values())
    assert not ztunnel.nacks


async def test_pod_change_pushes_only_that_workload_and_deletion_removes_exactly_it(cp, ztunnel: ZtunnelClient):
    before = ztunnel.versions()
    seen = len(ztunnel.received(ADDRESS))
    docs = [d for d in MESH if d["metadata"].get("name") != "cart-6f9c7-b7b7b"]
    ready = pod("cart-6f9c7-b7b7b", "10.1.0.12", labels={"app": "cart", "version": "v3", "pod-template-hash": "6f9c7"},
                owner={"kind": "ReplicaSet", "name": "cart-6f9c7", "controller": True},
                ports=[{"name": "web", "containerPort": 8081}])
    cp.write("mesh.yaml", dump(*docs, ready))
    update = await ztunnel.wait(lambda: next((r for r in ztunnel.received(ADDRESS)[seen:] if r.resources), None),
                                message="the readiness change is pushed")
    assert list(update.resources) == ["Kubernetes//Pod/shop/cart-6f9c7-b7b7b"] and not update.removed
    assert update.resources["Kubernetes//Pod/shop/cart-6f9c7-b7b7b"].workload.status == wapi.HEALTHY
    after = ztunnel.versions()
    assert {n for n in after if after[n] != before.get(n)} == {"Kubernetes//Pod/shop/cart-6f9c7-b7b7b"}

    seen = len(ztunnel.received(ADDRESS))
    cp.write("mesh.yaml", dump(*docs))
    removal = await ztunnel.wait(lambda: next((r for r in ztunnel.received(ADDRESS)[seen:] if r.removed), None),
                                 message="the deleted pod is removed")
    assert removal.removed == ("Kubernetes//Pod/shop/cart-6f9c7-b7b7b",) and not removal.resources
    assert "Kubernetes//Pod/shop/cart-6f9c7-b7b7b" not in ztunnel.workloads() and CART_UID in ztunnel.workloads()
    assert not ztunnel.received(AUTHORIZATION)[1:], "a pod change sends no authorization"


async def test_reconnect_with_current_versions_sends_nothing(cp, ztunnel: ZtunnelClient):
    held = ztunnel.versions()
    await ztunnel.close()
    await ztunnel.connect(versions=True)
    await ztunnel.wait(lambda: ztunnel.received(ADDRESS) and ztunnel.received(AUTHORIZATION))
    [addr] = ztunnel.received(ADDRESS)
    assert not addr.resources and not addr.removed
    assert ztunnel.versions() == held

    # As ztunnel does (names without versions), everything is sent again; what went away while
    # disconnected is removed.
    await ztunnel.close()
    cp.write("mesh.yaml", dump(*[d for d in MESH if d["kind"] != "WorkloadEntry"]))

    async def gone() -> bool:
        reg = await cp.debug("/debug/ambientz")
        return all(w["uid"] != "Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1" for w in reg["workloads"])

    await wait_for(gone, message="the WorkloadEntry is gone from the control plane")
    await ztunnel.connect(versions=False)
    await ztunnel.wait(lambda: ztunnel.received(ADDRESS))
    [addr] = ztunnel.received(ADDRESS)
    assert addr.removed == ("Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1",)
    assert set(addr.resources) == set(held) - {"Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"}


async def test_on_demand_by_address(cp):
    client = ZtunnelClient(cp.xds_port, on_demand=True)
    await client.connect()
    try:
        await client.wait(lambda: client.received(ADDRESS) and client.received(AUTHORIZATION))
        [first] = client.received(ADDRESS)
        assert not first.resources, "subscribing to nothing gets nothing"
        assert client.policies() == {}  # Authorization stays wildcard: none defined yet

        await client.demand("/10.1.0.11")
        got = await client.wait(lambda: next((r for r in client.received(ADDRESS) if r.resources), None))
        assert list(got.resources) == [CART_UID] and got.aliases[CART_UID] == ("/10.1.0.11",)

        # A service VIP brings the service and its workloads; an unknown address comes back removed.
        n = len(client.received(ADDRESS))
        await client.demand("/10.96.0.10", "/10.9.9.9")
        got = await client.wait(lambda: next((r for r in client.received(ADDRESS)[n:]), None))
        assert set(got.resources) == {CART_SVC, "Kubernetes//Pod/shop/cart-6f9c7-b7b7b"}  # CART_UID already held
        assert got.removed == ("/10.9.9.9",)
        assert set(client.workloads()) == {CART_UID, "Kubernetes//Pod/shop/cart-6f9c7-b7b7b"}
        assert "Kubernetes//Pod/legacy/old-1" not in client.workloads()

        # Later changes to what was looked up are pushed.
        n = len(client.received(ADDRESS))
        cp.write("mesh.yaml", dump(*[d for d in MESH if d["metadata"].get("name") != "cart-6f9c7-b7b7b"]))
        removal = await client.wait(lambda: next((r for r in client.received(ADDRESS)[n:] if r.removed), None))
        assert removal.removed == ("Kubernetes//Pod/shop/cart-6f9c7-b7b7b",)
    finally:
        await client.close()


async def test_refused_when_ambient_is_off(tmp_path):
    """One request, then the refusal (a client writing more after the refusal would see its own
    write fail instead of the server's status)."""
    from envoy.service.discovery.v3 import discovery_pb2

    from tests.support.ztunnel import ztunnel_node
    async with ControlPlane(tmp_path) as cp:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}")
        call = channel.stream_stream(
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
            request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        try:
            await call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=ADDRESS, node=ztunnel_node()))
            with pytest.raises(grpc.RpcError) as err:
                await call.read()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert err.value.details() == "ztunnel requires PILOT_ENABLE_AMBIENT=true"
        finally:
            call.cancel()
            await channel.close()


async def test_state_of_the_world_is_refused_for_ztunnel_types(cp):
    from envoy.service.discovery.v3 import discovery_pb2

    from tests.support.ztunnel import ztunnel_node
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}")
    call = channel.stream_stream("/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
                                 request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                 response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
    try:
        await call.write(discovery_pb2.DiscoveryRequest(type_url=ADDRESS, node=ztunnel_node()))
        with pytest.raises(grpc.RpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "delta xDS only" in err.value.details()
    finally:
        call.cancel()
        await channel.close()
