"""SIGTERM: /ready turns 503, new streams are refused, open streams are closed over the drain
period, and the process exits 0."""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from tests.support.control_plane import ControlPlane
from tests.support.verified_router import ISTIOD_NAME
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(60)
SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


def open_stream(channel: grpc.aio.Channel, pod: str, metadata=None):
    call = channel.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                 response_deserializer=discovery_pb2.DiscoveryResponse.FromString)(metadata=metadata)
    node = base_pb2.Node(id=f"sidecar~10.0.0.1~{pod}.default~default.svc.cluster.local")
    return call, discovery_pb2.DiscoveryRequest(type_url=CDS, node=node)


async def test_sigterm_drains_and_exits_cleanly(tmp_path):
    cp = ControlPlane(tmp_path, env={"PILOT_DRAIN_DURATION": "2s"})
    await cp.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}")
    try:
        streams = []
        for i in range(4):
            call, req = open_stream(channel, f"p{i}")
            await call.write(req)
            await asyncio.wait_for(call.read(), 10)
            streams.append(call)
        assert (await cp.get("/ready"))[0] == 200
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        cp.proc.send_signal(signal.SIGTERM)
        await wait_for(lambda: _not_ready(cp), timeout=5, message="/ready 503 while draining")
        # A newcomer is told to go elsewhere.
        call, req = open_stream(channel, "newcomer")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            try:
                await call.write(req)
            except grpc.aio.UsageError:
                pass
            except Exception:  # noqa: BLE001 - the refusal can land before the write completes
                await call.wait_for_connection()
            await asyncio.wait_for(call.read(), 10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # The open streams end one by one, spread over the drain period rather than all at once.
        async def end_time(stream) -> float:
            assert await asyncio.wait_for(stream.read(), 10) is grpc.aio.EOF
            return loop.time() - t0

        ended = await asyncio.gather(*(end_time(s) for s in streams))
        assert max(ended) - min(ended) > 0.5, ended
        assert await asyncio.wait_for(cp.proc.wait(), 15) == 0
    finally:
        await channel.close()
        await cp.stop()


async def _not_ready(cp: ControlPlane) -> bool:
    return (await cp.get("/ready"))[0] == 503


@pytest.mark.parametrize("port", ["plaintext", "secure"])
async def test_drain_sends_goaway_at_once_on_both_xds_ports(tmp_path, port):
    """At SIGTERM each xDS port tells its connections to go away (HTTP/2 GOAWAY) while their
    streams are still open, so the client's next stream opens a new connection, behind a Service
    another replica, rather than being refused on this one until the drain ends."""
    issuer = Issuer()
    cp = ControlPlane(tmp_path, secure_grpc=port == "secure",
                      env={"PILOT_DRAIN_DURATION": "6s", "JWT_RULE": issuer.rule()})
    await cp.start()
    if port == "secure":
        channel = grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_port}", grpc.ssl_channel_credentials(
            cp.root_cert().encode()), options=[("grpc.ssl_target_name_override", ISTIOD_NAME)])
        metadata = (("authorization", f"Bearer {issuer.token(namespace='default', sa='sleep')}"),)
    else:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}")
        metadata = None
    try:
        streams = []
        for i in range(3):
            call, req = open_stream(channel, f"p{i}", metadata)
            await call.write(req)
            assert (await asyncio.wait_for(call.read(), 10)).resources
            streams.append(call)
        assert channel.get_state() is grpc.ChannelConnectivity.READY
        cp.proc.send_signal(signal.SIGTERM)
        # The drain ends the three streams 2 s apart; the GOAWAY comes before the last one ends.
        await asyncio.wait_for(channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 4)
        assert channel.get_state() is not grpc.ChannelConnectivity.READY
        assert not all(s.done() for s in streams), "GOAWAY only when the drain had ended every stream"
        for s in streams:
            assert await asyncio.wait_for(s.read(), 10) is grpc.aio.EOF
        assert await asyncio.wait_for(cp.proc.wait(), 15) == 0
    finally:
        await channel.close()
        await cp.stop()
