"""Per-stream state shared by the SotW and delta protocols: what a proxy watches, what it was
sent, what it acknowledged, and the last thing it rejected."""

from __future__ import annotations

import asyncio
import sys
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pilot.model.proxy import Proxy
from pilot.model.push_request import PushRequest
from pilot.xds.cache import CachedResource
from pilot.xds.identity_memo import IdentityMemo


@dataclass
class Nack:
    version: str  # the rejected version (SotW) or the nonce's push version (delta)
    nonce: str
    message: str
    code: int
    at: float
    resources: tuple[str, ...]  # the rejected resources (those Envoy named, else the whole response)
    origins: tuple[str, ...]  # config objects those resources were built from
    cleared: bool = False  # a later ACK (or disconnect) ended this rejection


NOTHING_HELD: Mapping[str, str] = MappingProxyType({})  # one shared "holds nothing" state

# A thousand sidecars that see the same services ask for the same thousand EDS names: they share
# one frozenset (with interned strings), so memo keys holding it hash once and compare by
# identity, and indexes derived from it are built once. Keyed by an equal copy, so an entry goes
# when the last stream using that set lets go of it.
_SHARED_NAMES: weakref.WeakValueDictionary[frozenset[str], frozenset[str]] = weakref.WeakValueDictionary()
# By identity (pilot/xds/identity_memo.py): by equality, every lookup would compare the sets.
_BY_HOST: IdentityMemo[frozenset[str], dict[str, tuple[str, ...]]] = IdentityMemo()


def shared_names(names: Iterable[str]) -> frozenset[str]:
    """The one shared frozenset equal to `names`."""
    fs = names if isinstance(names, frozenset) else frozenset(names)
    found = _SHARED_NAMES.get(fs)
    if found is None:
        found = frozenset(map(sys.intern, fs))
        _SHARED_NAMES[frozenset(found)] = found
    return found


def names_by_host(names: frozenset[str]) -> dict[str, tuple[str, ...]]:
    """Cluster-style names (`dir|port|subset|host`) grouped by host, once per shared set."""
    index = _BY_HOST.get(names)
    if index is None:
        grouped: dict[str, list[str]] = {}
        for n in names:
            grouped.setdefault(n.rpartition("|")[2], []).append(n)
        index = _BY_HOST.put(names, {h: tuple(v) for h, v in grouped.items()})
    return index


@dataclass(slots=True)
class WatchedResource:
    """One watched type of one stream. Slotted and with nothing allocated until it is needed:
    a thousand proxies each hold four or more of these."""

    type_url: str
    wildcard: bool = False
    _names: frozenset[str] = frozenset()
    # What the proxy holds (delta) or was last sent (SotW): name -> resource version. Shared
    # between proxies in the same state and never mutated in place: always replaced.
    sent: Mapping[str, str] = field(default_factory=lambda: NOTHING_HELD)
    nonce_sent: str = ""
    version_sent: str = ""
    nonce_acked: str = ""
    version_acked: str = ""
    last_sent_at: float = 0.0
    last_acked_at: float = 0.0
    last_nack: Nack | None = None
    nacks: int = 0
    # nonce -> (resources, (PushRequest.start, push version) or None) of each response still
    # awaiting an ACK: a NACK is tied to its resources and their config, and a push's convergence
    # is measured from its first event. None while nothing awaits one (most of a stream's life).
    awaiting: dict[str, tuple[tuple[CachedResource, ...], tuple[float, str] | None]] | None = None

    # Digest of the names of the last SotW request (ads.names_digest): an ACK that repeats them
    # is recognised without reading a thousand strings.
    names_digest: int | None = None
    last_shared_seq: int = 0  # the newest shared response this stream took (DiscoveryServer._response)

    @property
    def names(self) -> frozenset[str]:
        return self._names

    @names.setter
    def names(self, value: Iterable[str]) -> None:
        self._names = shared_names(value)

    # --- responses awaiting an answer ---------------------------------------------------------
    def sent_response(self, nonce: str, resources: tuple[CachedResource, ...],
                      started: tuple[float, str] | None) -> None:
        awaiting = self.awaiting
        if awaiting is None:
            awaiting = self.awaiting = {}
        awaiting[nonce] = (resources, started)
        if len(awaiting) > MAX_AWAITING:  # a proxy that never answers must not grow memory
            awaiting.pop(next(iter(awaiting)))

    def answered(self, nonce: str) -> tuple[tuple[CachedResource, ...], tuple[float, str] | None]:
        """What was sent with this nonce, no longer awaited: ((), None) if unknown."""
        awaiting = self.awaiting
        if awaiting is None:
            return (), None
        found = awaiting.pop(nonce, None)
        if not awaiting:
            self.awaiting = None  # an empty dict keeps its table; None costs nothing
        return found if found is not None else ((), None)

    def awaits(self, nonce: str) -> bool:
        return self.awaiting is not None and nonce in self.awaiting

    def requested(self) -> frozenset[str] | None:
        """None means "everything" (wildcard); otherwise the names asked for: the one frozenset
        shared by every stream asking for the same names, so memo keys compare by identity."""
        return None if self.wildcard else self._names

    def names_for_hosts(self, hosts: Iterable[str]) -> frozenset[str]:
        """The subscribed cluster-style names (`dir|port|subset|host`) of these hosts."""
        by_host = names_by_host(self._names)
        return frozenset(n for h in hosts for n in by_host.get(h, ()))


MAX_AWAITING = 16  # responses remembered per watched type while unanswered


class Inbox:
    """What a stream's worker waits on: requests read from the stream, push markers, the end.
    One consumer (the worker), so it needs a list and, while the worker waits, one future:
    asyncio.Queue would cost three deques and an Event per stream (~3 KB, per proxy)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list = []  # a few items at most (MAX_QUEUED_REQUESTS + markers)
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get_nowait(self):
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.pop(0)

    async def get(self):
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)


# Requests read from a stream but not yet handled. Past either bound the stream is simply not
# read until the worker catches up (HTTP/2 flow control then holds the client back), as istiod's
# one-slot request channel does: a client that writes without reading cannot grow the server.
MAX_QUEUED_REQUESTS = 16
MAX_QUEUED_REQUEST_BYTES = 4 << 20


class Connection:
    __slots__ = ("__weakref__", "_nonce", "_room", "bytes_queued", "bytes_sent", "close_reason", "closed", "connected_at",
                 "credential_refusal", "credentials_refused", "delta", "id", "inbox", "last_write_at",
                 "last_write_s", "number", "peer", "pending_push", "proxy", "pushing", "request_bytes_queued",
                 "requests_queued", "responses_sent", "watched", "write_started")
    _seq = 0

    def __init__(self, proxy: Proxy, peer: str, delta: bool) -> None:
        Connection._seq += 1
        self.number = Connection._seq
        self.id = f"{proxy.id}-{self.number}"
        self.proxy = proxy
        self.peer = peer
        self.delta = delta
        self.connected_at = time.time()
        self.watched: dict[str, WatchedResource] = {}
        self.inbox = Inbox()
        self.pending_push: PushRequest | None = None
        self.pushing = False  # inside DiscoveryServer.push_connection
        self.closed = False
        # Why this stream may be given no credential (None: it may); see DiscoveryServer.
        self.credential_refusal: str | None = None
        self.credentials_refused = False  # logged once per stream
        self._nonce = 0
        # Requests waiting for the worker (bounded: see MAX_QUEUED_REQUESTS).
        self.requests_queued = 0
        self.request_bytes_queued = 0
        self._room: asyncio.Future | None = None  # the reader waits on it while the inbox is full
        # The response being written, if any: at most one per stream at a time, since pushes for
        # a stream that is still writing merge into `pending_push`.
        self.bytes_queued = 0
        self.write_started: float | None = None  # monotonic
        self.last_write_s = 0.0
        self.last_write_at = 0.0  # wall clock, when the last write completed
        self.bytes_sent = 0
        self.responses_sent = 0
        self.close_reason = ""

    # --- the request inbox ------------------------------------------------------------------
    async def queue_request(self, req, size: int) -> None:
        """Called by the stream's reader: waits while the inbox is full."""
        while self.requests_queued and (self.requests_queued >= MAX_QUEUED_REQUESTS
                                        or self.request_bytes_queued + size > MAX_QUEUED_REQUEST_BYTES):
            room = self._room = asyncio.get_running_loop().create_future()
            try:
                await room
            finally:
                self._room = None
        self.requests_queued += 1
        self.request_bytes_queued += size
        self.inbox.put_nowait((req, size))

    def request_done(self, size: int) -> None:
        self.requests_queued -= 1
        self.request_bytes_queued -= size
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)

    # --- writes -----------------------------------------------------------------------------
    def write_begun(self, size: int) -> None:
        self.bytes_queued = size
        self.write_started = time.monotonic()

    def write_ended(self, ok: bool) -> None:
        if self.write_started is not None:
            self.last_write_s = time.monotonic() - self.write_started
        if ok:
            self.bytes_sent += self.bytes_queued
            self.responses_sent += 1
            self.last_write_at = time.time()
        self.bytes_queued = 0
        self.write_started = None

    @property
    def writing(self) -> bool:
        return self.write_started is not None

    def writing_for(self) -> float:
        """Seconds the current write has been waiting for the proxy to read (0 if none)."""
        return 0.0 if self.write_started is None else time.monotonic() - self.write_started

    def next_nonce(self) -> str:
        self._nonce += 1
        return f"{self.number:x}-{self._nonce}"

    def enqueue_push(self, req: PushRequest) -> None:
        """At most one pending push per connection: a new one merges into the waiting one."""
        if self.pending_push is None:
            self.pending_push = req
            self.inbox.put_nowait(None)  # None = "a push is waiting"
        else:
            self.pending_push = self.pending_push.merge(req)

    def take_push(self) -> PushRequest | None:
        req, self.pending_push = self.pending_push, None
        return req
