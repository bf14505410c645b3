"""A DiscoveryServer's push scoping, driven without gRPC: connections that subscribe and get
answers through the server's own respond/push path, and the scope each push queued for them."""

from __future__ import annotations

from collections.abc import Mapping

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
