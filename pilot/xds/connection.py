"""Per-stream state shared by the SotW and delta protocols: what a proxy watches, what it was
sent, what it acknowledged, and the last thing it rejected."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

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


@dataclass
class WatchedResource:
    type_url: str
    wildcard: bool = False
    names: set[str] = field(default_factory=set)
    # What the proxy holds (delta) or was last sent (SotW): name -> resource version.
    sent: dict[str, str] = field(default_factory=dict)
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

    def requested(self) -> frozenset[str] | None:
        """None means "everything" (wildcard); otherwise the names asked for."""
        return None if self.wildcard else frozenset(self.names)


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
        self.closed = False
        self._nonce = 0

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
