"""The ADS gRPC service: StreamAggregatedResources (SotW) and DeltaAggregatedResources.

Responses are pre-assembled bytes, so the methods are registered with a generic handler whose
response serializer is the identity. Each stream has one reader task and one worker loop; the
worker alone writes, so responses to requests and pushes never interleave.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from pilot import logging as plog
from pilot.model.proxy import InvalidNode, Proxy, proxy_from_node
from pilot.xds import typeurls
from pilot.xds.connection import Connection, WatchedResource
from pilot.xds.discovery import DiscoveryServer
from pilot.xds.generators import debug
from pilot.xds.ratelimit import TokenBucket
from pilot.xds.sotw_request import SotwRequest, names_digest

log = plog.get("ads")


SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
_EOF = object()
# Wildcard by default for these when the first request names nothing (Envoy's legacy wildcard;
# istiod treats its own types, ztunnel's included, the same way).
_WILDCARD_TYPES = {typeurls.CLUSTER, typeurls.LISTENER, *typeurls.AMBIENT_TYPES}
MAX_NAMES = 100_000  # a request naming more than this is hostile, not a proxy

# Secure xDS (15012) checks the authenticated caller against the proxy once its node is known:
# it aborts the call to refuse, or returns how to name the peer (the real client address).
Admit = Callable[[grpc.aio.ServicerContext, Proxy], Awaitable[str | None]]


class DeltaOnly(Exception):
    """A state-of-the-world request for a type only the delta protocol serves."""


class AdsService:
    def __init__(self, server: DiscoveryServer) -> None:
        self.server = server
        self.new_streams = TokenBucket(server.features.max_requests_per_second)
        self.draining = False
        self.debug = debug.DebugXds(server)  # istio.io/debug/* (istioctl): answered, never watched

    async def drain(self, duration: float) -> None:
        """Refuse new streams and end the open ones at random moments within `duration`."""
        self.draining = True
        conns = list(self.server.connections.values())
        random.shuffle(conns)
        step = duration / max(1, len(conns))
        for i, conn in enumerate(conns):
            if i and step > 0:
                await asyncio.sleep(step)  # pacing the reconnects, not synchronisation
            conn.inbox.put_nowait(_EOF)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self.stream_sotw, request_deserializer=SotwRequest.parse),
            "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self.stream_delta, request_deserializer=discovery_pb2.DeltaDiscoveryRequest.FromString),
        })

    async def stream_sotw(self, requests, context: grpc.aio.ServicerContext) -> None:
        await self._stream(requests, context, delta=False)

    async def stream_delta(self, requests, context: grpc.aio.ServicerContext) -> None:
        await self._stream(requests, context, delta=True)

    async def serve_stream(self, requests, context: grpc.aio.ServicerContext, *, delta: bool,
                           admit: Admit | None = None) -> None:
        """One ADS stream; `admit` (secure xDS) may refuse it once the first request names the node."""
        await self._stream(requests, context, delta, admit)

    async def _stream(self, requests, context, delta: bool, admit: Admit | None = None) -> None:
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down; connect to another replica")
        try:
            first = await anext(aiter(requests))
        except (StopAsyncIteration, asyncio.CancelledError):
            return
        except Exception as e:  # a client that cannot even send a valid first message
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {e}")
        if not first.HasField("node") or not first.node.id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first request must carry a node with an id")
        try:
            proxy = proxy_from_node(first.node)
        except InvalidNode as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if proxy.type == "ztunnel" and not self.server.features.enable_ambient:
            log.warning("ztunnel refused: ambient mode is off", proxy=proxy.id)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "ztunnel requires PILOT_ENABLE_AMBIENT=true")
        peer = await admit(context, proxy) if admit is not None else None
        await self.new_streams.acquire()
        conn = Connection(proxy, peer or context.peer() or "", delta)
        self.server.register(conn)
        log.info("connected", proxy=proxy.id, peer=conn.peer, delta=delta, conn=conn.id)
        conn.inbox.put_nowait(first)
        reader = asyncio.get_running_loop().create_task(self._read(requests, conn))

        async def send(body: bytes) -> None:
            await context.write(body)

        try:
            while True:
                item = await conn.inbox.get()
                if item is _EOF:
                    break
                if item is None:
                    req = conn.take_push()
                    if req is not None:
                        await self.server.push_connection(conn, req, send)
                elif delta:
                    await self._on_delta(conn, item, send)
                else:
                    await self._on_sotw(conn, item, send)
        except asyncio.CancelledError:
            raise
        except DeltaOnly as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except debug.DebugRefused as e:
            await context.abort(e.code, e.message)
        except Exception:
            # One broken stream must not take the server down; the proxy will reconnect.
            self.server.metrics.xds_internal_errors.inc()
            log.exception("stream failed", proxy=proxy.id, conn=conn.id)
        finally:
            conn.closed = True
            reader.cancel()
            self.server.unregister(conn)
            log.info("disconnected", proxy=proxy.id, conn=conn.id)

    async def _read(self, requests, conn: Connection) -> None:
        try:
            async for req in requests:
                conn.inbox.put_nowait(req)
        except asyncio.CancelledError:
            return
        except Exception as e:
            log.debug("stream read ended", conn=conn.id, error=str(e))
        conn.inbox.put_nowait(_EOF)

    # --- state of the world -----------------------------------------------------------------
    async def _on_sotw(self, conn: Connection, req: discovery_pb2.DiscoveryRequest | SotwRequest, send) -> None:
        """`req` is a SotwRequest (plaintext xDS) or a parsed message (secure xDS): the same fields."""
        type_url = req.type_url
        if not type_url:
            log.warning("request without type_url ignored", proxy=conn.proxy.id)
            return
        if plog.enabled("ads"):  # istiod's "ADS:TYPE: REQ" line; envelope fields only (names stay unparsed)
            log.debug("request", proxy=conn.proxy.id, type=type_url, nonce=req.response_nonce,
                      version=req.version_info)
        if debug.is_debug(type_url):  # as istiod: answered once, starts no watch, never ACKed
            names = list(req.resource_names[:MAX_NAMES])
            await send(await self.debug.respond(conn, type_url, names, delta=False))
            return
        if type_url in typeurls.AMBIENT_TYPES:
            raise DeltaOnly(f"{type_url} is served over delta xDS only (DeltaAggregatedResources), as istiod does")
        w = conn.watched.get(type_url)
        if req.response_nonce and w is not None:
            if req.response_nonce != w.nonce_sent:
                self.server.metrics.xds_expired_nonce.labels(typeurls.SHORT.get(type_url, "other")).inc()
                return  # stale: the proxy has not seen our latest response yet; it will answer that
            if req.HasField("error_detail"):
                self.server.record_nack(conn, w, req.response_nonce, req.version_info,
                                        req.error_detail.code, req.error_detail.message)
                return
            self.server.record_ack(conn, w, req.response_nonce, req.version_info)
            if w.wildcard:
                return  # a plain ACK: answering it would loop
            # Envoy repeats its whole subscription in every ACK: a thousand EDS names, a thousand
            # times per push. A digest of their bytes says whether they changed.
            digest = names_digest(req)
            if digest == w.names_digest:
                return  # a plain ACK
            requested = self._names(conn, req)
            if requested is None:
                return
            w.names_digest = digest
            names = frozenset(requested)
            if names == w.names:
                return  # the same subscription, in another order or with repeated names
            w.names = names  # an ACK that changes the subscription (e.g. Envoy adding EDS names)
            await self.server.respond(conn, w, send)
            return
        # A new subscription, or a reconnect carrying a nonce from a previous server.
        requested = self._names(conn, req)
        if requested is None:
            return
        names = set(requested)
        if type_url == typeurls.LISTENER and names and "*" not in names and any(":" in n for n in names):
            conn.proxy.mark_grpc()
        w = WatchedResource(type_url, wildcard=type_url in _WILDCARD_TYPES and (not names or "*" in names))
        w.names = names - {"*"}
        w.names_digest = names_digest(req)
        conn.watched[type_url] = w
        await self.server.respond(conn, w, send)

    @staticmethod
    def _names(conn: Connection, req):
        requested = req.resource_names
        if len(requested) > MAX_NAMES:
            log.warning("request names too many resources; ignored", proxy=conn.proxy.id, count=len(requested))
            return None
        return requested

    # --- delta ------------------------------------------------------------------------------
    async def _on_delta(self, conn: Connection, req: discovery_pb2.DeltaDiscoveryRequest, send) -> None:
        type_url = req.type_url
        if not type_url:
            log.warning("delta request without type_url ignored", proxy=conn.proxy.id)
            return
        if debug.is_debug(type_url):
            names = list(req.resource_names_subscribe[:MAX_NAMES])
            await send(await self.debug.respond(conn, type_url, names, delta=True))
            return
        subscribe = set(req.resource_names_subscribe[:MAX_NAMES])
        unsubscribe = set(req.resource_names_unsubscribe[:MAX_NAMES])
        w = conn.watched.get(type_url)
        first = w is None
        if first:
            w = WatchedResource(type_url, wildcard=(type_url in _WILDCARD_TYPES and not subscribe) or "*" in subscribe)
            # Resume: the proxy already holds these versions; send only what differs.
            w.sent = dict(req.initial_resource_versions)
            conn.watched[type_url] = w
        if req.response_nonce:
            if req.HasField("error_detail"):
                self.server.record_nack(conn, w, req.response_nonce, "", req.error_detail.code,
                                        req.error_detail.message)
            elif req.response_nonce in w.pending or req.response_nonce == w.nonce_sent:
                self.server.record_ack(conn, w, req.response_nonce, w.version_sent)
        if "*" in subscribe:
            w.wildcard = True
        if "*" in unsubscribe:
            w.wildcard = False
        subscribing = bool(subscribe)
        subscribe.discard("*")
        new_names = subscribe - w.names
        if new_names or not unsubscribe.isdisjoint(w.names):  # a plain ACK changes nothing: no copy
            w.names = (w.names | new_names) - unsubscribe
        if unsubscribe:  # held maps are shared between proxies: replace, never mutate
            w.sent = {n: v for n, v in w.sent.items() if n not in unsubscribe}
        if first or new_names or (subscribing and w.wildcard):
            await self.server.respond(conn, w, send)
