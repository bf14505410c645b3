"""Two replicas against one apiserver: exactly one leader writes istio-ca-root-cert ConfigMaps,
the other takes over when the leader goes, and both serve xDS all along."""

from __future__ import annotations

import asyncio
import base64

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from tests.fakes.apiserver import FakeApiServer
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)
LEASE = "istio-namespace-controller-election"
LEASE_SECONDS = 3.0
FAST_LEASES = {"PILOT_LEADER_LEASE_DURATION": f"{LEASE_SECONDS:.0f}s", "PILOT_LEADER_RENEW_DEADLINE": "2s",
               "PILOT_LEADER_RETRY_PERIOD": "500ms"}
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


async def serves_xds(cp: ControlPlane) -> bool:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        call = ch.stream_stream("/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
                                request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
        await call.write(discovery_pb2.DiscoveryRequest(
            type_url=CDS, node=base_pb2.Node(id="sidecar~10.0.0.9~probe.default~default.svc.cluster.local")))
        resp = await asyncio.wait_for(call.read(), 10)
        call.cancel()
        return resp.type_url == CDS


def holder(fake: FakeApiServer) -> str | None:
    lease = fake.get("leases.coordination.k8s.io", LEASE, namespace="istio-system")
    return (lease or {}).get("spec", {}).get("holderIdentity") or None


@pytest.fixture
async def replicas(tmp_path):
    fake = await FakeApiServer().start()
    fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
    fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}})
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    planes = {}
    for name in ("replica-a", "replica-b"):
        planes[name] = ControlPlane(tmp_path, kubeconfig=kubeconfig, name=name,
                                    env={**FAST_LEASES, "POD_NAME": name, "CA_KEY_TYPE": "EC"})
    try:
        await asyncio.gather(*(cp.start() for cp in planes.values()))
        yield fake, planes
    finally:
        await asyncio.gather(*(cp.stop() for cp in planes.values()))
        await fake.stop()


def ca_root(fake: FakeApiServer) -> str:
    """The one root both replicas use: the self-signed CA in istio-ca-secret (whoever created it)."""
    secret = fake.get("secrets", "istio-ca-secret", namespace="istio-system")
    return base64.b64decode(secret["data"]["ca-cert.pem"]).decode()


def root_cert(fake: FakeApiServer, ns: str) -> str | None:
    cm = fake.get("configmaps", "istio-ca-root-cert", namespace=ns)
    return (cm or {}).get("data", {}).get("root-cert.pem")


async def test_one_leader_writes_root_certs_and_the_other_takes_over(replicas):
    fake, planes = replicas
    leader = await wait_for(lambda: holder(fake), timeout=10, message="a leader is elected")
    assert leader in planes
    ROOT = ca_root(fake)
    await wait_for(lambda: root_cert(fake, "apps") == ROOT, message="root cert written to apps")
    assert root_cert(fake, "default") == ROOT and root_cert(fake, "istio-system") == ROOT

    # Repairs: a tampered or deleted ConfigMap comes back.
    cm = fake.get("configmaps", "istio-ca-root-cert", namespace="apps")
    cm["data"]["root-cert.pem"] = "tampered"
    fake.update(cm)
    await wait_for(lambda: root_cert(fake, "apps") == ROOT, message="tampered root cert repaired")
    fake.delete("configmaps", "istio-ca-root-cert", namespace="apps")
    await wait_for(lambda: root_cert(fake, "apps") == ROOT, message="deleted root cert recreated")
    # A new namespace gets one.
    fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}})
    await wait_for(lambda: root_cert(fake, "late") == ROOT, message="new namespace gets the root cert")

    # Only the leader ever wrote a ConfigMap, and it still holds the lease.
    other = next(n for n in planes if n != leader)
    assert holder(fake) == leader
    assert configmap_writers(fake) == {leader}
    mark = len(fake.request_log)

    # The leader crashes (no release): the other takes over within the lease time.
    await planes[leader].kill()
    await wait_for(lambda: holder(fake) == other, timeout=10, message="failover after the lease expires")
    fake.delete("configmaps", "istio-ca-root-cert", namespace="late")
    await wait_for(lambda: root_cert(fake, "late") == ROOT, message="new leader repairs")
    assert configmap_writers(fake, since=mark) == {other}
    assert await serves_xds(planes[other])


def configmap_writers(fake: FakeApiServer, since: int = 0) -> set[str]:
    """The replicas (by the identity in their user agent) that created or updated ConfigMaps."""
    return {r.user_agent.rpartition("(")[2].rstrip(")") for r in fake.request_log[since:]
            if r.resource == "configmaps" and r.verb in ("create", "update")}


async def test_both_replicas_serve_xds_and_a_graceful_stop_hands_over_at_once(replicas):
    fake, planes = replicas
    leader = await wait_for(lambda: holder(fake), timeout=10)
    other = next(n for n in planes if n != leader)
    assert await serves_xds(planes["replica-a"]) and await serves_xds(planes["replica-b"])
    rc = await planes[leader].stop()
    assert rc == 0, planes[leader].log_tail()
    await wait_for(lambda: holder(fake) == other, timeout=10, message="handover")
    # Released on shutdown: the other replica does not wait out the 3 s lease. Timed by the
    # apiserver between the two writes (the leader's last, its release, and the other's
    # taking), not from when stop() returned, so a busy machine delaying the processes'
    # exit does not turn a release into a "timeout"; without the release the gap is at
    # least the lease duration after the leader's last renewal.
    writes = [r for r in fake.request_log if r.resource == "leases" and r.verb == "update"
              and r.name == LEASE and r.status == 200]
    last_by_leader = max(r.at for r in writes if r.user_agent.endswith(f"({leader})"))
    taken = min(r.at for r in writes if r.user_agent.endswith(f"({other})") and r.at > last_by_leader)
    assert taken - last_by_leader < LEASE_SECONDS, (taken - last_by_leader, planes[leader].log_tail())
    assert await serves_xds(planes[other])
