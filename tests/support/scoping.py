"""A DiscoveryServer's push scoping, driven without gRPC: connections that subscribe and get
answers through the server's own respond/push path, and the scope each push queued for them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from pilot.model.push_request import PushRequest
from pilot.xds import typeurls as T
from pilot.xds.connection import Connection, WatchedResource
from pilot.xds.discovery import DiscoveryServer


async def discard(body: bytes) -> None:
    return None


def _watch(conn: Connection, type_url: str, names: frozenset[str] | None) -> WatchedResource:
    w = conn.watched.get(type_url)
    if w is None:
        w = conn.watched[type_url] = WatchedResource(type_url, wildcard=names is None)
    if names is not None:
        w.names = names
    return w


async def subscribe(
    server: DiscoveryServer, conn: Connection, names: Mapping[str, frozenset[str] | None]
) -> None:
    """What a client does when its wanted names change: (re)subscribe, and get an answer."""
    for t, n in names.items():
        w = conn.watched.get(t)
        if w is None or (n is not None and n != w.names):
            await server.respond(conn, _watch(conn, t, n), discard)


def pushed(server: DiscoveryServer, conn: Connection) -> Mapping[str, frozenset[str] | None] | None:
    """The types (and per-resource names) the server's scoping queued for this connection.
    {} = not pushed; None = every watched type whole. (Without a per-connection scope, as before
    dependency recording: a full push meant every type, an endpoint push the EDS subset and the
    ztunnel types.)"""
    req = conn.pending_push
    if req is None:
        return {}
    if not hasattr(req, "scope"):
        return (
            None
            if req.full
            else {T.ENDPOINT: server._eds_subset(conn, req), T.ADDRESS: None, T.AUTHORIZATION: None}
        )
    return req.scope


class HandPushes:
    """Pushes started by hand: the server's debouncer only collects the requests its Store events
    make, and `push` merges them, pushes, and hands each connection the response it queued."""

    def __init__(self, server: DiscoveryServer) -> None:
        self.server = server
        self.requests: list[PushRequest] = []
        server.debouncer.enqueue = self.requests.append  # type: ignore[method-assign]

    async def push(self, conns: list[Connection]) -> tuple[set[str], set[str]]:
        """(pod names the push scoped, pod names that were sent bytes)."""
        req = self.requests[0]
        for r in self.requests[1:]:
            req = req.merge(r)
        self.requests.clear()
        self.server.push(req)
        scopes = {c.proxy.pod_name: pushed(self.server, c) for c in conns}
        sent: set[str] = set()
        for conn in conns:
            r = conn.take_push()
            if r is not None:
                await self.server.push_connection(conn, r, _recording(sent, conn.proxy.pod_name))
        return {n for n, s in scopes.items() if s != {}}, sent


def _recording(sent: set[str], name: str) -> Callable[[bytes], Awaitable[None]]:
    async def send(body: bytes) -> None:
        sent.add(name)

    return send
