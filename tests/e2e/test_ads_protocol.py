"""The ADS wire rules, checked with a raw xDS client against the real server.

Absence of a response is proven by ordering, not by waiting: a stream's responses come out in
order, so after an ACK we make a request that must be answered, and the next message must be
that answer rather than a reply to the ACK.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
NODE_ID = "sidecar~10.0.0.5~raw-1.default~default.svc.cluster.local"

SERVICE = """
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {ip}
  ports: [{{name: http, port: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: http, port: {port}}}]
endpoints: [{{addresses: ["10.1.0.1"]}}]
"""

MESH = """
apiVersion: v1
kind: ConfigMap
metadata: {{name: istio, namespace: istio-system}}
data:
  mesh: |
    accessLogFile: {log}
"""


def node(node_id: str = NODE_ID) -> base_pb2.Node:
    md = struct_pb2.Struct()
    md.update({"NAMESPACE": "default", "INTERCEPTION_MODE": "NONE"})
    return base_pb2.Node(id=node_id, metadata=md)


@pytest.fixture
async def cp(tmp_path):
    plane = ControlPlane(tmp_path)
    plane.write("svc.yaml", SERVICE.format(name="a", ip="10.96.0.1", port=9001))
    async with plane:
        yield plane


class Sotw:
    def __init__(self, port: int, node_id: str = NODE_ID) -> None:
        self.node_id = node_id
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.call = self.channel.stream_stream(
            SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
        self.sent_node = False

    async def request(self, type_url: str, names=(), nonce: str = "", version: str = "", error: str = "") -> None:
        req = discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=list(names),
                                             response_nonce=nonce, version_info=version)
        if not self.sent_node:
            req.node.CopyFrom(node(self.node_id))
            self.sent_node = True
        if error:
            req.error_detail.CopyFrom(status_pb2.Status(code=13, message=error))
        await self.call.write(req)

    async def read(self, timeout: float = 10.0) -> discovery_pb2.DiscoveryResponse:
        return await asyncio.wait_for(self.call.read(), timeout)

    async def ack(self, resp: discovery_pb2.DiscoveryResponse, names=()) -> None:
        await self.request(resp.type_url, names, nonce=resp.nonce, version=resp.version_info)

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


async def test_ack_gets_no_response_and_nack_is_recorded_not_resent(cp: ControlPlane):
    c = Sotw(cp.xds_port)
    try:
        await c.request(CDS)
        cds = await c.read()
        assert cds.type_url == CDS
        assert "outbound|8080||a.default.svc.cluster.local" in {_name(r) for r in cds.resources}
        await c.ack(cds)
        # Had the ACK been answered, that answer would come before this LDS response.
        await c.request(LDS)
        lds = await c.read()
        assert lds.type_url == LDS

        # A CDS change arrives; the proxy rejects it.
        cp.write("svc-b.yaml", SERVICE.format(name="b", ip="10.96.0.2", port=9002))
        pushed = await c.read()
        while pushed.type_url != CDS:  # LDS for the new port may come too; ACK whatever else
            await c.ack(pushed)
            pushed = await c.read()
        error = "Error adding/updating cluster(s) outbound|8080||b.default.svc.cluster.local: made up"
        await c.request(CDS, nonce=pushed.nonce, version=cds.version_info, error=error)
        row = await wait_for(_nack_row(cp), message="nack recorded")
        assert row["cluster_nack"]["message"] == error
        # The resource Envoy named, and only it, is tied to the config object it came from.
        assert row["cluster_nack"]["resources"] == ["outbound|8080||b.default.svc.cluster.local"]
        assert row["cluster_nack"]["config"] == ["Service/default/b"]
        metrics = await cp.metrics()
        assert 'pilot_total_xds_rejects{type="cds"} 1.0' in metrics
        assert 'pilot_xds_rejected_config{type="cds",config="Service/default/b"} 1.0' in metrics

        # A push that leaves clusters as they were (only listeners change) must not re-send the
        # rejected CDS: the next response is LDS. (Service b shares port 8080, so LDS did not
        # change with it and was not pushed.)
        cp.write("mesh.yaml", MESH.format(log="/dev/stdout"))
        nxt = await c.read()
        assert nxt.type_url == LDS, "a rejected CDS version was sent again"
    finally:
        await c.close()


async def test_eds_acks_repeating_the_subscription_are_silent_and_changes_are_answered(cp: ControlPlane):
    """Envoy repeats its whole EDS subscription in every ACK. Repeated (even reordered) it gets
    no answer; when it shrinks or grows, the answer carries the new subscription."""
    cp.write("svc-b.yaml", SERVICE.format(name="b", ip="10.96.0.2", port=9002))
    a, b = "outbound|8080||a.default.svc.cluster.local", "outbound|8080||b.default.svc.cluster.local"
    c = Sotw(cp.xds_port)
    try:
        await c.request(CDS)
        cds = await c.read()
        while b not in {_name(r) for r in cds.resources}:  # b may land after the first load
            await c.ack(cds)
            cds = await c.read()
        await c.ack(cds)
        await c.request(EDS, [a, b])
        eds = await c.read()
        assert sorted(_cla_names(eds)) == [a, b]
        await c.ack(eds, [a, b])
        await c.ack(eds, [b, a])  # the same subscription in another order
        await c.request(LDS)
        assert (await c.read()).type_url == LDS, "an ACK repeating the subscription was answered"

        await c.ack(eds, [a])
        shrunk = await c.read()
        assert shrunk.type_url == EDS and _cla_names(shrunk) == [a]
        await c.ack(shrunk, [a, b])
        grown = await c.read()
        assert grown.type_url == EDS and sorted(_cla_names(grown)) == [a, b]
    finally:
        await c.close()


async def test_nonces_never_repeat_on_a_stream_even_when_the_same_response_is_due_again(cp: ControlPlane):
    """Responses are built once for every proxy in the same state, nonce included; a stream that
    comes back to a state it was in earlier (same config, same subscription) must still get a
    nonce it has not seen, or it could not tell its ACKs apart."""
    cp.write("svc-b.yaml", SERVICE.format(name="b", ip="10.96.0.2", port=9002))
    a, b = "outbound|8080||a.default.svc.cluster.local", "outbound|8080||b.default.svc.cluster.local"
    c = Sotw(cp.xds_port)
    try:
        await c.request(CDS)
        cds = await c.read()
        while b not in {_name(r) for r in cds.resources}:
            await c.ack(cds)
            cds = await c.read()
        await c.ack(cds)
        await c.request(EDS, [a, b])
        seen = [await c.read()]
        for names in ([a], [a, b], [a], [a, b]):
            await c.ack(seen[-1], names)
            seen.append(await c.read())
        assert [sorted(_cla_names(r)) for r in seen] == [[a, b], [a], [a, b], [a], [a, b]]
        nonces = [r.nonce for r in seen]
        assert len(set(nonces)) == len(nonces), nonces
    finally:
        await c.close()


async def test_proxies_in_the_same_state_get_identical_pushes(cp: ControlPlane):
    """A push is the same bytes for every proxy in the same state (one body built, not one per
    proxy), even when they got their clusters in different pushes; each proxy still ACKs it and
    is then in sync."""
    clients = [Sotw(cp.xds_port, node_id=f"sidecar~10.0.0.{i}~raw-{i}.default~default.svc.cluster.local")
               for i in (7, 8)]
    try:
        await clients[0].request(CDS)
        await clients[0].ack(await clients[0].read())
        # A push that changes listeners only: the first proxy's clusters stay as they were.
        # (Wait for that push itself: the startup push may still come first, and a push that
        # changes nothing a proxy's config read no longer reaches that proxy.)
        cp.write("mesh.yaml", MESH.format(log="/dev/stdout"))
        await wait_for(lambda: _pushed_for(cp, "mesh"), message="the listener push")
        await clients[1].request(CDS)
        await clients[1].ack(await clients[1].read())
        cp.write("svc-b.yaml", SERVICE.format(name="b", ip="10.96.0.2", port=9002))
        pushed = []
        for c in clients:
            resp = await c.read()
            while resp.type_url != CDS:
                await c.ack(resp)
                resp = await c.read()
            pushed.append(resp)
            await c.ack(resp)
        assert "outbound|8080||b.default.svc.cluster.local" in {_name(r) for r in pushed[0].resources}
        assert pushed[0].SerializeToString() == pushed[1].SerializeToString()
        for c in clients:  # both ACKs were taken: each proxy is in sync at the pushed version
            row = await wait_for(_synced_row(cp, c.node_id, pushed[0].nonce), message=f"{c.node_id} in sync")
            assert row["cluster_acked"] == pushed[0].nonce
    finally:
        for c in clients:
            await c.close()


async def test_unknown_type_url_gets_empty_response_and_stream_survives(cp: ControlPlane):
    c = Sotw(cp.xds_port)
    try:
        await c.request("type.googleapis.com/made.up.Thing", names=["x"])
        resp = await c.read()
        assert resp.type_url == "type.googleapis.com/made.up.Thing"
        assert len(resp.resources) == 0
        await c.request(CDS)
        assert (await c.read()).type_url == CDS
    finally:
        await c.close()


@pytest.mark.parametrize("node_id, reason", [
    ("not-a-node-id", "4 '~'-separated parts"),
    ("gateway~10.0.0.1~a.default~default.svc.cluster.local", "unknown proxy type"),
    ("sidecar~notanip~a.default~default.svc.cluster.local", "not an IP address"),
])
async def test_malformed_node_is_refused_with_reason(cp: ControlPlane, node_id: str, reason: str):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        call = ch.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
        await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=base_pb2.Node(id=node_id)))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), 10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason in err.value.details()


async def test_garbage_bytes_do_not_hurt_the_server(cp: ControlPlane):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        call = ch.stream_stream(SOTW, request_serializer=None, response_deserializer=None)()
        await call.write(b"\xff\xff\xff\xff garbage")
        with pytest.raises(grpc.aio.AioRpcError):
            await asyncio.wait_for(call.read(), 10)
    c = Sotw(cp.xds_port)  # the server still serves everyone else
    try:
        await c.request(CDS)
        assert (await c.read()).type_url == CDS
    finally:
        await c.close()
    assert cp.proc.returncode is None


async def test_delta_ack_is_silent_and_reconnect_with_versions_sends_nothing_new(cp: ControlPlane):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        def open_stream():
            return ch.stream_stream(DELTA, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                                    response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()

        call = open_stream()
        await call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, node=node()))
        first = await asyncio.wait_for(call.read(), 10)
        versions = {r.name: r.version for r in first.resources}
        assert "outbound|8080||a.default.svc.cluster.local" in versions
        await call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, response_nonce=first.nonce))
        await call.write(discovery_pb2.DeltaDiscoveryRequest(
            type_url=EDS, resource_names_subscribe=["outbound|8080||a.default.svc.cluster.local"]))
        eds = await asyncio.wait_for(call.read(), 10)
        assert eds.type_url == EDS, "the CDS ACK was answered"
        assert [r.name for r in eds.resources] == ["outbound|8080||a.default.svc.cluster.local"]
        call.cancel()

        # Reconnect claiming every version we hold: the response carries nothing.
        again = open_stream()
        await again.write(discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, node=node(),
                                                              initial_resource_versions=versions))
        resp = await asyncio.wait_for(again.read(), 10)
        assert list(resp.resources) == [] and list(resp.removed_resources) == []
        # ...and a stale version is corrected with just that one resource.
        stale = dict(versions, **{"outbound|8080||a.default.svc.cluster.local": "old"}, gone="x")
        third = open_stream()
        await third.write(discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, node=node(),
                                                              initial_resource_versions=stale))
        resp = await asyncio.wait_for(third.read(), 10)
        assert [r.name for r in resp.resources] == ["outbound|8080||a.default.svc.cluster.local"]
        assert list(resp.removed_resources) == ["gone"]
        again.cancel()
        third.cancel()


async def test_delta_streams_in_the_same_state_are_given_one_shared_response(cp: ControlPlane):
    """Proxies connecting at once with nothing held, or resuming with the same versions, get
    the same response (one nonce, the same bytes): the server built it once for all of them,
    rather than a copy of the whole config per stream (1.7 MB each at 1,000 services)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        def open_stream():
            return ch.stream_stream(DELTA, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                                    response_deserializer=None)()

        async def first_response(**fields) -> discovery_pb2.DeltaDiscoveryResponse:
            call = open_stream()
            calls.append(call)
            await call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=CDS, node=node(), **fields))
            return await asyncio.wait_for(call.read(), 10)

        async def three_in_one_version(**fields) -> list[bytes]:
            """Three first responses built from one config version. A push landing between two
            streams (the control plane may still be settling its start) gives a new version and
            rightly another response: then ask three again."""
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                got = [await first_response(**fields) for _ in range(3)]
                versions = {discovery_pb2.DeltaDiscoveryResponse.FromString(b).system_version_info for b in got}
                if len(versions) == 1 or asyncio.get_running_loop().time() > deadline:
                    return got

        calls: list = []
        fresh = await three_in_one_version()
        assert len(set(fresh)) == 1, "fresh streams were given different responses"
        parsed = discovery_pb2.DeltaDiscoveryResponse.FromString(fresh[0])
        assert "outbound|8080||a.default.svc.cluster.local" in {r.name for r in parsed.resources}
        stale = {r.name: r.version for r in parsed.resources} | {"outbound|8080||a.default.svc.cluster.local": "old"}
        resumed = await three_in_one_version(initial_resource_versions=stale)
        assert len(set(resumed)) == 1, "streams resuming with the same versions were given different responses"
        only = discovery_pb2.DeltaDiscoveryResponse.FromString(resumed[0])
        assert [r.name for r in only.resources] == ["outbound|8080||a.default.svc.cluster.local"]
        for call in calls:
            call.cancel()


def _name(any_msg) -> str:
    from envoy.config.cluster.v3 import cluster_pb2
    c = cluster_pb2.Cluster()
    any_msg.Unpack(c)
    return c.name


def _cla_names(resp: discovery_pb2.DiscoveryResponse) -> list[str]:
    from envoy.config.endpoint.v3 import endpoint_pb2
    out = []
    for r in resp.resources:
        cla = endpoint_pb2.ClusterLoadAssignment()
        r.Unpack(cla)
        out.append(cla.cluster_name)
    return out


async def _pushed_for(cp: ControlPlane, reason: str) -> bool:
    return any(reason in p["reasons"] for p in await cp.debug("/debug/push_timeline"))


def _synced_row(cp: ControlPlane, node_id: str, nonce: str):
    async def check():
        row = await cp.sync_status(node_id)
        return row if row and row["cluster_acked"] == nonce else None
    return check


def _nack_row(cp: ControlPlane):
    async def check():
        row = await cp.sync_status(NODE_ID)
        return row if row and row["cluster_nack"] else None
    return check
