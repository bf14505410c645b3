"""Hostile or broken xDS clients against the real control plane: each bound ends only the
offending stream, with a clear status, one log line and a count, and everyone else is served."""

from __future__ import annotations

import asyncio
import re

import grpc
import psutil
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from tests.e2e.test_ads_protocol import CDS, DELTA, EDS, SOTW, Sotw, node
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for

SERVICES = 300  # enough that a wildcard CDS response (~50 KB) fills a non-reading client's window fast
NAMES = [f"outbound|8080||s{i}.default.svc.cluster.local" for i in range(SERVICES)]


def services_yaml(n: int = SERVICES) -> str:
    return "---\n".join(f"""
apiVersion: v1
kind: Service
metadata: {{name: s{i}, namespace: default}}
spec:
  clusterIP: 10.96.{i // 250}.{i % 250 + 1}
  ports: [{{name: http, port: 8080}}]
""" for i in range(n))


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


async def start(tmp_path, **env: str) -> ControlPlane:
    cp = ControlPlane(tmp_path, env={"PILOT_XDS_MAX_RESOURCE_NAMES": "1000",
                                     "PILOT_XDS_FIRST_REQUEST_TIMEOUT": "1s", **env})
    cp.write("svcs.yaml", services_yaml())
    return await cp.start()


@pytest.fixture
async def cp(tmp_path):
    plane = await start(tmp_path, PILOT_XDS_SEND_TIMEOUT="1s")
    try:
        yield plane
    finally:
        await plane.stop()


def sotw_call(ch: grpc.aio.Channel):
    return ch.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()


async def refusal(call, timeout: float = 10.0) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        while True:
            await asyncio.wait_for(call.read(), timeout)
    return err.value


async def healthy_client_is_served(cp: ControlPlane) -> None:
    c = Sotw(cp.xds_port, node_id="sidecar~10.0.0.9~good-1.default~default.svc.cluster.local")
    try:
        await c.request(CDS)
        resp = await c.read()
        assert resp.type_url == CDS and len(resp.resources) >= SERVICES
    finally:
        await c.close()


async def test_too_many_names_or_initial_versions_end_the_stream_with_resource_exhausted(cp: ControlPlane):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        call = sotw_call(ch)
        await call.write(discovery_pb2.DiscoveryRequest(type_url=EDS, node=node(),
                                                        resource_names=[f"n{i}" for i in range(1001)]))
        err = await refusal(call)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1001 resource_names; at most 1000" in err.details()

        delta = ch.stream_stream(DELTA,
                                 request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                                 response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        req = discovery_pb2.DeltaDiscoveryRequest(type_url=EDS, node=node())
        for i in range(1001):
            req.initial_resource_versions[f"n{i}"] = "1"
        await delta.write(req)
        err = await refusal(delta)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1001 initial_resource_versions; at most 1000" in err.details()
    text = await cp.metrics()
    assert metric(text, "pilot_xds_refused_streams", 'reason="too_many_resources"') == 2
    # One log line per refused stream, not per message.
    assert cp.log_path.read_text().count("stream refused") == 2
    await healthy_client_is_served(cp)


async def test_node_ids_are_bounded_and_echoed_only_as_a_short_escaped_prefix(cp: ControlPlane):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        long_id = "sidecar~10.0.0.1~" + "a" * 100_000 + ".default~default.svc.cluster.local"
        call = sotw_call(ch)
        await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=base_pb2.Node(id=long_id)))
        err = await refusal(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "node id is 100051 characters; at most 1024" in err.details()
        assert len(err.details()) < 300

        hostile = "\x1b[31mred\n" + "b" * 500
        call = sotw_call(ch)
        await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=base_pb2.Node(id=hostile)))
        err = await refusal(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "\\x1b[31mred\\n" in err.details() and "\x1b" not in err.details()
        assert len(err.details()) < 300
    log = cp.log_path.read_text()
    assert "a" * 200 not in log and "\x1b[31m" not in log
    assert metric(await cp.metrics(), "pilot_xds_refused_streams", 'reason="invalid_node"') == 2


async def test_a_stream_that_never_sends_a_first_request_is_closed(cp: ControlPlane):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        call = sotw_call(ch)
        await call.wait_for_connection()
        err = await refusal(call)  # PILOT_XDS_FIRST_REQUEST_TIMEOUT=1s
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "PILOT_XDS_FIRST_REQUEST_TIMEOUT" in err.details()
    assert metric(await cp.metrics(), "pilot_xds_refused_streams", 'reason="first_request_timeout"') == 1


async def test_an_oversized_message_is_refused_by_grpc_and_the_server_carries_on(cp: ControlPlane):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}",
                                         options=[("grpc.max_send_message_length", 8 << 20)]) as ch:
        call = sotw_call(ch)
        big = discovery_pb2.DiscoveryRequest(type_url=CDS, node=node(), version_info="v" * (5 << 20))
        await call.write(big)
        err = await refusal(call)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # ISTIO_GPRC_MAXRECVMSGSIZE, 4 MiB
    await healthy_client_is_served(cp)


async def _spam_without_reading(cp: ControlPlane, ch: grpc.aio.Channel, written: list[int]):
    """Subscribe, then keep asking for CDS (each request is answered) and never read."""
    call = sotw_call(ch)
    await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=node()))

    async def spam():
        while True:
            await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, resource_names=NAMES))
            written[0] += 1

    return call, asyncio.get_running_loop().create_task(spam())


async def test_a_client_that_never_reads_is_closed_after_the_send_timeout(cp: ControlPlane):
    server = psutil.Process(cp.proc.pid)
    rss_before = server.memory_info().rss
    written = [0]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        call, spam = await _spam_without_reading(cp, ch, written)
        try:
            # The server stops reading this stream while its answers are unread, so the client
            # is held back, and after PILOT_XDS_SEND_TIMEOUT (1s) the stream is closed.
            await wait_for(lambda: "closing stream: the proxy is not reading" in cp.log_path.read_text(), 20,
                           message="write timeout logged")
            await wait_for(_no_connections(cp), 10, message="stream gone from /debug/connections")
            assert metric(await cp.metrics(), "pilot_xds_write_timeout") == 1
            assert "response was not read within 1s (PILOT_XDS_SEND_TIMEOUT)" in cp.log_path.read_text()
            await healthy_client_is_served(cp)
            # Once it reads again, the client gets what was queued, then the end of the stream (its
            # status is that of its own write the server never read, so it is not asserted here).
            await refusal(call)
        finally:
            spam.cancel()
            await asyncio.gather(spam, return_exceptions=True)
    assert written[0] < 5000  # held back by flow control, not buffered by the server
    assert server.memory_info().rss - rss_before < 100 << 20  # 820 MB in 12 s before the bound


def _no_connections(cp: ControlPlane):
    async def check():
        return await cp.debug("/debug/connections") == []
    return check


async def test_without_a_send_timeout_a_non_reading_client_is_held_back_not_buffered(tmp_path):
    cp = await start(tmp_path)  # PILOT_XDS_SEND_TIMEOUT unset: 0, istiod's default (no timeout)
    try:
        server = psutil.Process(cp.proc.pid)
        rss_before = server.memory_info().rss
        written = [0]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
            _call, spam = await _spam_without_reading(cp, ch, written)
            try:
                async def stalled():
                    rows = await cp.debug("/debug/connections")
                    stuck = rows and rows[0]["state"] == "writing" and rows[0]["writingForSeconds"] > 1
                    return rows if stuck else None
                rows = await wait_for(stalled, 20, message="a write waiting on the client")
                assert rows[0]["bytesQueued"] > 0
                assert rows[0]["requestsQueued"] <= 16  # the inbox bound
                before = written[0]
                await healthy_client_is_served(cp)  # the stuck stream holds nobody back
                assert written[0] - before < 100  # the spamming client is held by flow control
            finally:
                spam.cancel()
                await asyncio.gather(spam, return_exceptions=True)
        assert server.memory_info().rss - rss_before < 100 << 20
    finally:
        await cp.stop()
