"""What a connected proxy costs the server is its stream state, not its config: streams in the
same state hold the same objects (name sets, held-version maps, what their config read) and get
the same response bytes, and an answered stream keeps nothing of what it was sent. Driven over
real gRPC (grpc.aio server and clients, the bytes Envoy would send); the `is` checks fail as soon
as something starts being copied per stream again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from pilot.features import Features
from pilot.xds import typeurls as T
from pilot.xds.ads import SERVICE, AdsService
from pilot.xds.connection import Connection
from pilot.xds.discovery import DiscoveryServer
from tests.support.wait import wait_for
from tests.unit.helpers import World, endpoint_slice, service

SERVICES = ("reviews", "ratings", "details")
EDS_NAMES = [f"outbound|9080||{s}.default.svc.cluster.local" for s in SERVICES]


def _node(i: int) -> base_pb2.Node:
    return base_pb2.Node(id=f"sidecar~10.0.0.{i}~app-{i}.default~default.svc.cluster.local")


class Client:
    """One ADS stream: requests go out as they are put; every response is kept."""

    def __init__(self, channel: grpc.aio.Channel, delta: bool) -> None:
        method = "DeltaAggregatedResources" if delta else "StreamAggregatedResources"
        self._out: asyncio.Queue = asyncio.Queue()
        self.responses: list[bytes] = []
        self.acked = 0  # how many of `responses` were answered
        self._call = channel.stream_stream(f"/{SERVICE}/{method}", request_serializer=lambda m: m.SerializeToString(),
                                           response_deserializer=lambda b: b)(self._requests())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self) -> AsyncIterator:
        while (m := await self._out.get()) is not None:
            yield m

    async def _read(self) -> None:
        async for raw in self._call:
            self.responses.append(raw)

    def send(self, msg) -> None:
        self._out.put_nowait(msg)

    async def close(self) -> None:
        self._out.put_nowait(None)
        self._call.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


@pytest.fixture
async def ads():
    world = World()
    for i, name in enumerate(SERVICES):
        world.apply(service(name, cluster_ip=f"10.96.0.{20 + i}"),
                    endpoint_slice(f"{name}-1", name, addresses=(f"10.1.0.{i + 1}",)))
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))
    rpc = grpc.aio.server()
    rpc.add_generic_rpc_handlers((AdsService(server).handler(),))
    port = rpc.add_insecure_port("127.0.0.1:0")
    await rpc.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    clients: list[Client] = []
    try:
        yield server, channel, clients
    finally:
        for c in clients:
            await c.close()
        await channel.close()
        await rpc.stop(None)


def _conns(server: DiscoveryServer, n: int) -> list[Connection]:
    conns = sorted(server.connections.values(), key=lambda c: c.number)
    assert len(conns) == n
    return conns


def _answered(conn: Connection, types: tuple[str, ...]) -> bool:
    return all(conn.watched.get(t) is not None and conn.watched[t].nonce_sent
               and conn.watched[t].nonce_acked == conn.watched[t].nonce_sent for t in types)


async def test_sotw_streams_with_the_same_subscription_share_their_state_and_bytes(ads):
    server, channel, clients = ads
    for i in (1, 2):
        c = Client(channel, delta=False)
        clients.append(c)
        c.send(discovery_pb2.DiscoveryRequest(node=_node(i), type_url=T.CLUSTER))
        c.send(discovery_pb2.DiscoveryRequest(type_url=T.ENDPOINT, resource_names=EDS_NAMES))

    def acked_all() -> bool:
        # ACK what arrived, as Envoy does (names repeated), until both types are ACKed on both.
        for c in clients:
            for raw in c.responses[c.acked:]:
                r = discovery_pb2.DiscoveryResponse.FromString(raw)
                c.send(discovery_pb2.DiscoveryRequest(
                    type_url=r.type_url, version_info=r.version_info, response_nonce=r.nonce,
                    resource_names=EDS_NAMES if r.type_url == T.ENDPOINT else []))
                c.acked += 1
        return all(_answered(conn, (T.CLUSTER, T.ENDPOINT)) for conn in _conns(server, 2))

    await wait_for(acked_all, timeout=30, message="both streams ACK CDS and EDS")
    a, b = _conns(server, 2)
    for t in (T.CLUSTER, T.ENDPOINT):
        wa, wb = a.watched[t], b.watched[t]
        assert wa.names is wb.names  # one shared name set per subscription
        assert wa.sent is wb.sent and len(wa.sent) > 0  # one map of what was sent, not a copy each
        assert server.held_deps(a, t) is server.held_deps(b, t)  # what that config read: shared
        assert wa.awaiting is None and wb.awaiting is None  # answered: nothing kept of the response
    assert len(a.watched[T.ENDPOINT].sent) == len(SERVICES)
    # One body per plan and push: byte for byte the same response, nonce included.
    for t in (T.CLUSTER, T.ENDPOINT):
        ra, rb = ([raw for raw in c.responses if discovery_pb2.DiscoveryResponse.FromString(raw).type_url == t]
                  for c in clients)
        assert ra[0] == rb[0]


async def test_delta_streams_in_the_same_state_share_one_held_map(ads):
    server, channel, clients = ads
    for i in (1, 2):
        c = Client(channel, delta=True)
        clients.append(c)
        c.send(discovery_pb2.DeltaDiscoveryRequest(node=_node(i), type_url=T.CLUSTER))
        c.send(discovery_pb2.DeltaDiscoveryRequest(type_url=T.ENDPOINT, resource_names_subscribe=EDS_NAMES))

    def acked_all() -> bool:
        for c in clients:
            for raw in c.responses[c.acked:]:
                r = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
                c.send(discovery_pb2.DeltaDiscoveryRequest(type_url=r.type_url, response_nonce=r.nonce))
                c.acked += 1
        return all(_answered(conn, (T.CLUSTER, T.ENDPOINT)) for conn in _conns(server, 2))

    await wait_for(acked_all, timeout=30, message="both delta streams ACK CDS and EDS")
    a, b = _conns(server, 2)
    for t in (T.CLUSTER, T.ENDPOINT):
        wa, wb = a.watched[t], b.watched[t]
        assert wa.sent is wb.sent and len(wa.sent) > 0  # the versions held: one map for both proxies
        assert wa.awaiting is None and wb.awaiting is None
    assert a.watched[T.ENDPOINT].names is b.watched[T.ENDPOINT].names
    eds = [next(raw for raw in c.responses if discovery_pb2.DeltaDiscoveryResponse.FromString(raw).type_url
                == T.ENDPOINT) for c in clients]
    assert eds[0] == eds[1]

    # Two more proxies resume, claiming the versions the first one holds: they start from one
    # shared map (and so one plan and one response), not a copy of the claim each.
    held = dict(a.watched[T.ENDPOINT].sent)
    resumed = []
    for i in (3, 4):
        c = Client(channel, delta=True)
        clients.append(c)
        resumed.append(c)
        c.send(discovery_pb2.DeltaDiscoveryRequest(node=_node(i), type_url=T.ENDPOINT,
                                                   resource_names_subscribe=EDS_NAMES,
                                                   initial_resource_versions=held))
    def answered_resume() -> list[Connection] | None:
        cs = _conns(server, 4)
        return cs if all(T.ENDPOINT in c.watched and c.watched[T.ENDPOINT].nonce_sent for c in cs[2:]) else None

    conns = await wait_for(answered_resume, timeout=30, message="two resumed streams are answered")
    c, d = conns[2], conns[3]
    assert c.watched[T.ENDPOINT].sent is d.watched[T.ENDPOINT].sent
    assert dict(c.watched[T.ENDPOINT].sent) == held
    # One plan for both claims, so one response (they hold everything: it removes and adds
    # nothing), byte for byte the same, nonce included.
    got = await wait_for(lambda: all(r.responses for r in resumed) and [r.responses[0] for r in resumed],
                         timeout=30, message="both resumed streams get their response")
    first = discovery_pb2.DeltaDiscoveryResponse.FromString(got[0])
    assert not first.resources and not first.removed_resources
    assert got[0] == got[1]
