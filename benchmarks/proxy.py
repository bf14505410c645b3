"""One simulated sidecar: an ADS stream (SotW or delta) that subscribes the way Envoy does and
ACKs every response.

Envoy's order is wildcard CDS, then named EDS for the EDS clusters it received, then wildcard
LDS, then named RDS for the route configs its HTTP listeners reference. Unlike Envoy, the
simulation ACKs each response as soon as it is decoded (Envoy holds a CDS ACK until the new
clusters warm): the latency measured is then the server's and the wire's, not a warming policy's.
Every response is recorded with its receive and ACK wall times, for the convergence queries.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from benchmarks import responses
from benchmarks.ledger import DeltaLedger
from benchmarks.responses import CDS, EDS, LDS, RDS, SHORT

SOTW_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
HISTORY = 4096  # responses kept per proxy: a 60 s churn at 10 pushes/s fits


class Received:
    """One response as the proxy saw it."""

    __slots__ = ("ack", "contents", "recv", "size", "type")

    def __init__(self, type_: str, recv: float, contents: responses.Contents, size: int) -> None:
        self.type = type_  # short name: cds, eds, lds, rds
        self.recv = recv  # wall time the response was read off the stream
        self.ack = 0.0  # wall time the ACK was written
        self.contents = contents
        self.size = size  # bytes of the serialised response


WORKLOADS = 50  # distinct `bench-workload` labels: a workloadSelector on one picks 1 proxy in 50


def workload_label(index: int) -> str:
    return f"w{index % WORKLOADS}"


def node_for(index: int, namespace: str) -> base_pb2.Node:
    ip = f"10.{200 + (index >> 16) % 50}.{(index >> 8) & 255}.{index & 255}"
    md = struct_pb2.Struct()
    # The label is read only by selectors that ask for it (the envoyfilter scenario's).
    md.update({"NAMESPACE": namespace, "INTERCEPTION_MODE": "NONE", "ISTIO_VERSION": "bench",
               "LABELS": {"bench-workload": workload_label(index)}})
    return base_pb2.Node(id=f"sidecar~{ip}~proxy-{index}.{namespace}~{namespace}.svc.cluster.local",
                         cluster=f"proxy-{index}.{namespace}", metadata=md)


class SimProxy:
    def __init__(self, index: int, namespace: str, delta: bool,
                 on_ack: Callable[[SimProxy, Received], None], capture: bool = False) -> None:
        self.index = index
        self.node = node_for(index, namespace)
        self.delta = delta
        self.on_ack = on_ack
        self.capture = capture  # keep the last raw response of each type (for the floor server)
        self.history: deque[Received] = deque(maxlen=HISTORY)
        self.last_raw: dict[str, bytes] = {}
        # Delta, capturing proxy: every resource sent, against what it already held.
        self.ledger = DeltaLedger() if capture and delta else None
        self.started_at = 0.0
        self.synced_at: float | None = None
        self.error: str | None = None
        self.closed = False
        self.cancelled = False
        self.reconnect = False  # open a new stream when one ends (benchmarks/scenarios/scaleout.py)
        self.reconnects = 0
        self._call = None
        self._node_sent = False
        self._acked: set[str] = set()
        # Names subscribed to (EDS and RDS are named; CDS and LDS are wildcard). In SotW these are
        # the frozensets of the shared Contents, so a thousand proxies hold one copy.
        self._subscribed: dict[str, frozenset[str]] = {EDS: frozenset(), RDS: frozenset()}
        # Subscribed names not received yet: empty for both means the proxy has its full config.
        self._missing: dict[str, set[str]] = {EDS: set(), RDS: set()}
        self._lds_requested = False
        # SotW: last (version, nonce) per type, repeated in every request of that type.
        self._last: dict[str, tuple[str, str]] = {}
        # Delta: the clusters and listeners held, with their references (a delta response carries
        # only what changed, so the subscriptions they imply are the union over all held).
        self._held: dict[str, dict[str, frozenset[str]]] = {CDS: {}, LDS: {}}

    # --- the stream ---------------------------------------------------------------------------
    async def run(self, channel: grpc.aio.Channel) -> None:
        """Open the stream, subscribe, and answer responses until the stream ends; with
        `reconnect`, open a new one as Envoy does (waiting for the channel to connect again)
        and start from nothing, until cancelled."""
        try:
            while True:
                await self._stream(channel, wait_for_ready=self.reconnects > 0)
                if not self.reconnect or self.cancelled:
                    break
                self.reconnects += 1
                self._reset()
        finally:
            self.closed = True

    async def _stream(self, channel: grpc.aio.Channel, wait_for_ready: bool) -> None:
        self.started_at = time.time()
        method = DELTA_METHOD if self.delta else SOTW_METHOD
        # Raw bytes in and out: requests are serialised here, responses decoded lazily.
        self._call = channel.stream_stream(method, request_serializer=None, response_deserializer=None)(
            wait_for_ready=wait_for_ready or None)
        try:
            await self._request(CDS)
            while True:
                raw = await self._call.read()
                if raw is grpc.aio.EOF:
                    self.error = self.error or "stream closed by server"
                    break
                await self._on_response(raw, time.time())
                # Reading the next one may take minutes: don't hold this one (up to MBs) meanwhile.
                del raw
        except grpc.aio.AioRpcError as e:
            if not self.cancelled:
                self.error = f"{e.code().name}: {e.details()}"

    def _reset(self) -> None:
        """A new stream knows nothing (as a reconnecting Envoy's state of the world is re-sent)."""
        self.synced_at = None
        self.error = None
        self._node_sent = False
        self._acked = set()
        self._subscribed = {EDS: frozenset(), RDS: frozenset()}
        self._missing = {EDS: set(), RDS: set()}
        self._lds_requested = False
        self._last = {}
        self._held = {CDS: {}, LDS: {}}
        if self.ledger is not None:
            self.ledger = DeltaLedger()

    def cancel(self) -> None:
        self.cancelled = True
        self.closed = True
        if self._call is not None:
            self._call.cancel()

    async def _on_response(self, raw: bytes, recv: float) -> None:
        resp = responses.parse_envelope(raw, self.delta)
        type_url = resp.type_url
        contents = responses.contents(resp, raw, self.delta)
        missing = self._missing.get(type_url)
        if missing:
            missing.difference_update(contents.names)
        held = self._held.get(type_url) if self.delta else None
        if held is not None:
            for name in resp.removed_resources:
                held.pop(name, None)
            held.update(zip(contents.names, contents.refs))
        if self.capture:
            self.last_raw[type_url] = raw
        if self.ledger is not None:
            self.ledger.record(resp, len(raw))
        ev = Received(SHORT.get(type_url, type_url), recv, contents, len(raw))
        if self.delta:
            await self._write(discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=resp.nonce))
        else:
            self._last[type_url] = (resp.version_info, resp.nonce)
            await self._request(type_url)
        ev.ack = time.time()
        self._acked.add(type_url)
        self.history.append(ev)
        # Follow the references, as Envoy does: clusters -> endpoints, listeners -> routes.
        if type_url == CDS:
            await self._resubscribe(EDS, _union(held) if self.delta else contents.all_refs)
            if not self._lds_requested:
                self._lds_requested = True
                await self._request(LDS)
        elif type_url == LDS:
            await self._resubscribe(RDS, _union(held) if self.delta else contents.all_refs)
        if self.synced_at is None and self._has_full_config():
            self.synced_at = ev.ack
        self.on_ack(self, ev)

    # --- requests -----------------------------------------------------------------------------
    async def _resubscribe(self, type_url: str, wanted: frozenset[str]) -> None:
        old = self._subscribed[type_url]
        if wanted == old:
            return
        self._subscribed[type_url] = wanted
        # The server answers a new subscription with everything in it, so only names that are
        # new, or were still missing and are still wanted, must arrive before we are complete.
        self._missing[type_url] = set(wanted - old) | (self._missing[type_url] & wanted)
        if self.delta:
            await self._write(discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, resource_names_subscribe=sorted(wanted - old),
                resource_names_unsubscribe=sorted(old - wanted)))
        else:
            await self._request(type_url)

    async def _request(self, type_url: str) -> None:
        """SotW: the full current subscription with the last version and nonce of the type (an
        ACK when they are the latest); delta: only the first request of a type comes here."""
        if self.delta:
            await self._write(discovery_pb2.DeltaDiscoveryRequest(type_url=type_url))
            return
        version, nonce = self._last.get(type_url, ("", ""))
        names = self._subscribed.get(type_url, frozenset())
        if not self._node_sent:
            await self._write(discovery_pb2.DiscoveryRequest(
                type_url=type_url, version_info=version, response_nonce=nonce, resource_names=sorted(names)))
            return
        # Every ACK repeats the whole subscription (a thousand EDS names), as Envoy's do. Building
        # that from Python strings cost ~0.3 ms per ACK, making the generator, not the server
        # under test, the limit: the names are encoded once per subscription and framed around.
        head = discovery_pb2.DiscoveryRequest(version_info=version).SerializeToString()
        tail = discovery_pb2.DiscoveryRequest(type_url=type_url, response_nonce=nonce).SerializeToString()
        await self._call.write(b"".join((head, _names_field(names), tail)))

    async def _write(self, req) -> None:
        if not self._node_sent:  # set_node_on_first_message_only, as istio-agent configures Envoy
            req.node.CopyFrom(self.node)
            self._node_sent = True
        await self._call.write(req.SerializeToString())

    # --- state --------------------------------------------------------------------------------
    def _has_full_config(self) -> bool:
        """CDS and LDS accepted, and every endpoint set and route config they reference held."""
        return {CDS, LDS} <= self._acked and not self._missing[EDS] and not self._missing[RDS]

    def waiting(self) -> bool:
        """Subscribed to a name it has not received yet (its request may still be on the wire)."""
        return not self.closed and bool(self._missing[EDS] or self._missing[RDS])

    def watches(self, type_url: str, name: str) -> bool:
        return name in self._subscribed.get(type_url, ())


def _union(held: dict[str, frozenset[str]]) -> frozenset[str]:
    return frozenset().union(*held.values())


_NAMES_WIRE: dict[frozenset[str], bytes] = {}


def _names_field(names: frozenset[str]) -> bytes:
    """DiscoveryRequest.resource_names (sorted) in wire form, once per distinct subscription: in
    SotW the subscriptions are the frozensets shared through responses.Contents."""
    found = _NAMES_WIRE.get(names)
    if found is None:
        if len(_NAMES_WIRE) >= 256:
            _NAMES_WIRE.clear()
        found = _NAMES_WIRE[names] = discovery_pb2.DiscoveryRequest(resource_names=sorted(names)).SerializeToString()
    return found
