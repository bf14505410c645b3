"""The ADS gRPC service: StreamAggregatedResources (SotW) and DeltaAggregatedResources.

Responses are pre-assembled bytes, so the methods are registered with a generic handler whose
response serializer is the identity. Each stream has one reader task and one worker loop; the
worker alone writes, so responses to requests and pushes never interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from pilot import logging as plog
from pilot.model.proxy import InvalidNode, Proxy, proxy_from_node, shown
from pilot.xds import delta_request, typeurls
from pilot.xds.connection import NOTHING_HELD, Connection, WatchedResource
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
# Longer than any TYPE~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN Kubernetes names allow (a pod name
# and a domain are at most 253 characters each, a namespace 63).
MAX_NODE_ID_LENGTH = 1024
INVALID = grpc.StatusCode.INVALID_ARGUMENT  # the usual refusal
ABORT_WAIT = 1.0  # seconds a closing stream's handler waits for its status to be written

# Distinct resumed delta maps shared (see AdsService._held_map), and the largest one hashed.
_INTERN_MAPS = 16
_INTERN_MAX_NAMES = 5000

# Secure xDS (15012) checks the authenticated caller against the proxy once its node is known:
# it aborts the call to refuse, or returns how to name the peer (the real client address).
Admit = Callable[[grpc.aio.ServicerContext, Proxy], Awaitable[str | None]]


class Refused(Exception):
    """The server ends this stream: `reason` labels pilot_xds_refused_streams, `message` goes to
    the client (never more than a bounded, escaped part of what it sent)."""

    def __init__(self, reason: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.reason, self.code, self.message = reason, code, message


class DeltaOnly(Refused):
    """A state-of-the-world request for a type only the delta protocol serves."""

    def __init__(self, message: str) -> None:
        super().__init__("delta_only_type", INVALID, message)


class StreamGone(Exception):
    """A write failed because the call is already over."""


class WriteTimeout(Exception):
    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


class AdsService:
    def __init__(self, server: DiscoveryServer) -> None:
        self.server = server
        rate = server.features.max_requests_per_second
        # An operator's fixed rate, or (unset) admission as fast as the server keeps up.
        self.new_streams = TokenBucket(rate) if rate is not None else None
        self.draining = False
        # Counts repeated fields before parsing (the secure port's handler uses it too).
        self.parse_delta = delta_request.parser(server.features.xds_max_resource_names)
        self._resumed: dict[frozenset, dict[str, str]] = {}  # see _held_map
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
                self.stream_delta, request_deserializer=self.parse_delta),
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
        features = self.server.features
        try:
            first = await self._first_request(requests, context)
            if first is None:
                return
            proxy = self._proxy_of(first)
        except Refused as e:
            await self._refuse(context, e, peer=context.peer())
            return
        if proxy.type == "ztunnel" and not features.enable_ambient:
            log.warning("ztunnel refused: ambient mode is off", proxy=proxy.id)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "ztunnel requires PILOT_ENABLE_AMBIENT=true")
        peer = await admit(context, proxy) if admit is not None else None
        if self.new_streams is not None:
            await self.new_streams.acquire()
        else:
            await self.server.pace.admit()
        conn = Connection(proxy, peer or context.peer() or "", delta)
        self.server.register(conn)
        log.info("connected", proxy=proxy.id, peer=conn.peer, delta=delta, conn=conn.id)
        conn.requests_queued, conn.request_bytes_queued = 1, 0
        conn.inbox.put_nowait((first, 0))
        first = None  # the inbox has it; this frame lives as long as the stream
        reader = asyncio.get_running_loop().create_task(self._read(requests, conn))
        send = self._writer(conn, context)
        pace = self.server.pace
        try:
            while True:
                item = await conn.inbox.get()
                if item is _EOF:
                    break
                await pace.turn()  # a thousand streams woken at once take turns (pilot/xds/pace.py)
                if item is None:
                    req = conn.take_push()
                    if req is not None:
                        await self.server.push_connection(conn, req, send)
                    continue
                req, size = item
                try:
                    if delta:
                        await self._on_delta(conn, req, send)
                    else:
                        await self._on_sotw(conn, req, send)
                finally:
                    conn.request_done(size)
                # Not kept while the stream idles: a parsed request holds its names (a delta
                # one, its whole protobuf arena).
                item = req = None
        except asyncio.CancelledError:
            raise
        except WriteTimeout as e:
            # The proxy stopped reading (frozen, overloaded, hostile). Its stream goes; a live
            # proxy reconnects and is sent everything it lacks.
            conn.close_reason = str(e)
            self.server.metrics.xds_write_timeouts.inc()
            log.warning("closing stream: the proxy is not reading", proxy=proxy.id, conn=conn.id,
                        reason=conn.close_reason, bytes_queued=e.size)
            await self._abort_quietly(context, grpc.StatusCode.DEADLINE_EXCEEDED, conn.close_reason)
        except Refused as e:
            conn.close_reason = e.message
            await self._refuse(context, e, proxy=proxy.id, conn=conn.id)
        except StreamGone:
            pass  # the client cancelled or the connection dropped while we were writing
        except debug.DebugRefused as e:
            conn.close_reason = e.message
            await self._abort_quietly(context, e.code, e.message)
        except Exception:
            # One broken stream must not take the server down; the proxy will reconnect.
            self.server.metrics.xds_internal_errors.inc()
            log.exception("stream failed", proxy=proxy.id, conn=conn.id)
        finally:
            conn.closed = True
            reader.cancel()
            self.server.unregister(conn)
            log.info("disconnected", proxy=proxy.id, conn=conn.id)

    async def _first_request(self, requests, context):
        """The first request, within PILOT_XDS_FIRST_REQUEST_TIMEOUT; None if the client left."""
        timeout = self.server.features.xds_first_request_timeout
        try:
            if timeout > 0:
                return await asyncio.wait_for(anext(aiter(requests)), timeout)
            return await anext(aiter(requests))
        except TimeoutError:
            raise Refused("first_request_timeout", grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"no DiscoveryRequest within {timeout:g}s of opening the stream "
                          "(PILOT_XDS_FIRST_REQUEST_TIMEOUT)") from None
        except (StopAsyncIteration, asyncio.CancelledError):
            return None
        except Exception as e:  # noqa: BLE001 - a client that cannot even send a valid first message
            raise Refused("bad_request", INVALID,
                          f"bad request: {shown(str(e), 200)}") from None

    def _proxy_of(self, first) -> Proxy:
        self._check_counted(first)
        if not first.HasField("node") or not first.node.id:
            raise Refused("invalid_node", INVALID,
                          "first request must carry a node with an id")
        node_id = first.node.id
        if len(node_id) > MAX_NODE_ID_LENGTH:
            raise Refused("invalid_node", INVALID,
                          f"node id is {len(node_id)} characters; at most {MAX_NODE_ID_LENGTH} are accepted "
                          f"(starts {shown(node_id)})")
        try:
            return proxy_from_node(first.node)
        except InvalidNode as e:
            raise Refused("invalid_node", INVALID, str(e)) from None

    async def _refuse(self, context, e: Refused, **where) -> None:
        """One log line and one count per refused stream, then the status to the client."""
        self.server.metrics.xds_refused_streams.labels(e.reason).inc()
        log.warning("stream refused", reason=e.reason, detail=e.message, **where)
        await self._abort_quietly(context, e.code, e.message)

    @staticmethod
    async def _abort_quietly(context, code: grpc.StatusCode, message: str) -> None:
        """End the call with a status. Behind a response the proxy is not reading, the status
        waits in line (the proxy sees it once it reads again): the handler does not wait with it."""
        # AbortError: sent. TimeoutError: queued behind the unread response. Either way this
        # stream's handler ends here.
        with contextlib.suppress(grpc.aio.AbortError, TimeoutError):
            await asyncio.wait_for(context.abort(code, message), ABORT_WAIT)

    def _writer(self, conn: Connection, context):
        """`send(body)` for this stream: one response at a time, within PILOT_XDS_SEND_TIMEOUT."""
        timeout = self.server.features.xds_send_timeout

        async def send(body: bytes) -> None:
            conn.write_begun(len(body))
            ok = False
            try:
                if timeout > 0:
                    await asyncio.wait_for(context.write(body), timeout)
                else:
                    await context.write(body)
                ok = True
            except TimeoutError:
                raise WriteTimeout(
                    f"a {len(body)}-byte response was not read within {timeout:g}s (PILOT_XDS_SEND_TIMEOUT)",
                    len(body)) from None
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - grpc's write fails once the call is over: the client left
                raise StreamGone(str(e)) from None
            finally:
                conn.write_ended(ok)

        return send

    async def _read(self, requests, conn: Connection) -> None:
        try:
            async for req in requests:
                size = len(req.raw) if isinstance(req, SotwRequest) else (
                    0 if isinstance(req, delta_request.TooMany) else req.ByteSize())
                await conn.queue_request(req, size)  # waits while the worker is behind
                req = None  # the worker has it; not held here until the next one arrives
        except asyncio.CancelledError:
            return
        except Exception as e:  # noqa: BLE001 - any failure here is retried or reported, never fatal
            log.debug("stream read ended", conn=conn.id, error=shown(str(e), 200))
        conn.inbox.put_nowait(_EOF)

    # --- state of the world -----------------------------------------------------------------
    async def _on_sotw(self, conn: Connection, req: discovery_pb2.DiscoveryRequest | SotwRequest, send) -> None:
        """`req` is a SotwRequest (plaintext xDS) or a parsed message (secure xDS): the same fields."""
        type_url = req.type_url
        if not type_url:
            raise Refused("bad_request", INVALID, "DiscoveryRequest without type_url")
        if plog.enabled("ads"):  # istiod's "ADS:TYPE: REQ" line; envelope fields only (names stay unparsed)
            log.debug("request", proxy=conn.proxy.id, type=type_url, nonce=req.response_nonce,
                      version=req.version_info)
        if type_url == typeurls.HEALTH:
            self._on_health(conn, req)
            return
        if debug.is_debug(type_url):  # as istiod: answered once, starts no watch, never ACKed
            names = list(self._names(conn, req))
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
            w.names_digest = digest
            names = frozenset(requested)
            if names == w.names:
                return  # the same subscription, in another order or with repeated names
            w.names = names  # an ACK that changes the subscription (e.g. Envoy adding EDS names)
            await self.server.respond(conn, w, send)
            return
        # A new subscription, or a reconnect carrying a nonce from a previous server.
        requested = self._names(conn, req)
        names = set(requested)
        if type_url == typeurls.LISTENER and names and "*" not in names and any(":" in n for n in names):
            conn.proxy.mark_grpc()
        w = WatchedResource(type_url, wildcard=type_url in _WILDCARD_TYPES and (not names or "*" in names))
        w.names = names - {"*"}
        w.names_digest = names_digest(req)
        conn.watched[type_url] = w
        await self.server.respond(conn, w, send)

    def _names(self, conn: Connection, req):
        requested = req.resource_names
        self._check_count(req.type_url, "resource_names", len(requested))
        return requested

    @staticmethod
    def _check_counted(req) -> None:
        """A delta request the deserializer found over the bounds, before parsing it."""
        if isinstance(req, delta_request.TooMany):
            raise Refused("too_many_resources", grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"a delta request carries {req.count} {req.field}; at most {req.limit} are "
                          "accepted (PILOT_XDS_MAX_RESOURCE_NAMES)")

    def _check_count(self, type_url: str, field: str, count: int) -> None:
        limit = self.server.features.xds_max_resource_names
        if count > limit:
            raise Refused("too_many_resources", grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"a {shown(type_url, 128)} request carries {count} {field}; "
                          f"at most {limit} are accepted (PILOT_XDS_MAX_RESOURCE_NAMES)")

    # --- delta ------------------------------------------------------------------------------
    def _held_map(self, versions) -> Mapping[str, str]:
        """What a new delta stream holds, as a map shared by every stream that holds the same:
        the response plan and its bytes are shared by identity of that map (discovery._response),
        so a thousand proxies (re)connecting at once build and keep one response, not a
        thousand copies of the whole config. Fresh streams share the empty map; resumed ones
        share one of the last few distinct maps seen (the usual storm: every proxy of a
        restarted server claims the same versions). Huge maps are not worth hashing."""
        if not versions:
            return NOTHING_HELD
        held = dict(versions)
        if len(held) > _INTERN_MAX_NAMES:
            return held
        key = frozenset(held.items())
        hit = self._resumed.get(key)
        if hit is None:
            if len(self._resumed) >= _INTERN_MAPS:
                self._resumed.pop(next(iter(self._resumed)))
            hit = self._resumed[key] = held
        return hit

    def _on_health(self, conn: Connection, req) -> None:
        """The agent's readiness report (istiod's handleWorkloadHealthcheck): never answered."""
        listener = self.server.health_listener
        if listener is None:
            return
        healthy = not req.HasField("error_detail")
        listener(conn.proxy, healthy, "" if healthy else req.error_detail.message)

    async def _on_delta(self, conn: Connection, req: discovery_pb2.DeltaDiscoveryRequest, send) -> None:
        self._check_counted(req)
        type_url = req.type_url
        if not type_url:
            raise Refused("bad_request", INVALID, "DeltaDiscoveryRequest without type_url")
        self._check_count(type_url, "resource_names_subscribe", len(req.resource_names_subscribe))
        self._check_count(type_url, "resource_names_unsubscribe", len(req.resource_names_unsubscribe))
        self._check_count(type_url, "initial_resource_versions", len(req.initial_resource_versions))
        if type_url == typeurls.HEALTH:
            self._on_health(conn, req)
            return
        if debug.is_debug(type_url):
            await send(await self.debug.respond(conn, type_url, list(req.resource_names_subscribe), delta=True))
            return
        subscribe = set(req.resource_names_subscribe)
        unsubscribe = set(req.resource_names_unsubscribe)
        w = conn.watched.get(type_url)
        first = w is None
        if w is None:
            w = WatchedResource(type_url, wildcard=(type_url in _WILDCARD_TYPES and not subscribe) or "*" in subscribe)
            # Resume: the proxy already holds these versions; send only what differs.
            w.sent = self._held_map(req.initial_resource_versions)
            conn.watched[type_url] = w
        if req.response_nonce and (w.awaits(req.response_nonce) or req.response_nonce == w.nonce_sent):
            # Only nonces this stream was sent: anything else is stale or made up.
            if req.HasField("error_detail"):
                self.server.record_nack(conn, w, req.response_nonce, "", req.error_detail.code,
                                        req.error_detail.message)
            else:
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
