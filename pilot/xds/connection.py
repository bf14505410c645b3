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
_BY_HOST: weakref.WeakKeyDictionary[frozenset[str], dict[str, tuple[str, ...]]] = weakref.WeakKeyDictionary()


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
        index = _BY_HOST[names] = {h: tuple(v) for h, v in grouped.items()}
    return index


@dataclass
class WatchedResource:
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
    # Each response still awaiting an ACK, for tying a NACK to its resources and their config.
    pending: dict[str, tuple[CachedResource, ...]] = field(default_factory=dict)
    # nonce -> (PushRequest.start, push version): convergence is measured from the first event
    push_started: dict[str, tuple[float, str]] = field(default_factory=dict)

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

    def requested(self) -> frozenset[str] | None:
        """None means "everything" (wildcard); otherwise the names asked for: the one frozenset
        shared by every stream asking for the same names, so memo keys compare by identity."""
        return None if self.wildcard else self._names

    def names_for_hosts(self, hosts: Iterable[str]) -> frozenset[str]:
        """The subscribed cluster-style names (`dir|port|subset|host`) of these hosts."""
        by_host = names_by_host(self._names)
        return frozenset(n for h in hosts for n in by_host.get(h, ()))


# Requests read from a stream but not yet handled. Past either bound the stream is simply not
# read until the worker catches up (HTTP/2 flow control then holds the client back), as istiod's
# one-slot request channel does: a client that writes without reading cannot grow the server.
MAX_QUEUED_REQUESTS = 16
MAX_QUEUED_REQUEST_BYTES = 4 << 20


class Connection:
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
        self.inbox: asyncio.Queue = asyncio.Queue()
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
        self._room = asyncio.Event()
        self._room.set()
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
            self._room.clear()
            await self._room.wait()
        self.requests_queued += 1
        self.request_bytes_queued += size
        self.inbox.put_nowait((req, size))

    def request_done(self, size: int) -> None:
        self.requests_queued -= 1
        self.request_bytes_queued -= size
        self._room.set()

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
