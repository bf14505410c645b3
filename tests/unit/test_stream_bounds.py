"""The pieces that bound what one xDS client can make the server hold or echo."""

from __future__ import annotations

import asyncio

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from pilot.model.proxy import InvalidNode, Proxy, parse_node_id, shown
from pilot.xds import delta_request
from pilot.xds.connection import MAX_QUEUED_REQUESTS, Connection


def test_shown_bounds_and_escapes_what_a_client_sent():
    assert shown("abc") == "'abc'"
    assert shown("\x1b[31m\n") == "'\\x1b[31m\\n'"
    long = shown("a" * 10_000)
    assert long.startswith("'" + "a" * 64 + "'...") and "(10000 characters)" in long and len(long) < 100


def test_a_malformed_node_id_is_quoted_only_as_a_short_escaped_prefix():
    with pytest.raises(InvalidNode) as err:
        parse_node_id("\x00evil" + "x" * 5000)
    assert "\\x00evil" in str(err.value) and "\x00" not in str(err.value) and len(str(err.value)) < 250


@pytest.mark.parametrize("field", ["resource_names_subscribe", "resource_names_unsubscribe",
                                   "initial_resource_versions"])
def test_delta_requests_over_the_bound_are_counted_not_parsed(field):
    parse = delta_request.parser(limit=10)
    req = discovery_pb2.DeltaDiscoveryRequest(type_url="t")
    for i in range(11):
        if field == "initial_resource_versions":
            req.initial_resource_versions[f"n{i}"] = "1"
        else:
            getattr(req, field).append(f"n{i}")
    assert parse(req.SerializeToString()) == delta_request.TooMany(field, 11, 10)
    del_one = discovery_pb2.DeltaDiscoveryRequest.FromString(req.SerializeToString())
    if field == "initial_resource_versions":
        del del_one.initial_resource_versions["n0"]
    else:
        del getattr(del_one, field)[0]
    assert parse(del_one.SerializeToString()) == del_one  # at the bound: the real message


def test_delta_parser_rejects_malformed_bytes_like_protobuf():
    with pytest.raises(Exception):  # noqa: B017 - protobuf's DecodeError, whatever its class
        delta_request.parser(10)(b"\xff\xff\xff\xff garbage")


async def test_the_inbox_holds_the_reader_back_once_full():
    conn = Connection(Proxy("sidecar~1.1.1.1~p.ns~ns.svc.cluster.local", "sidecar", ("1.1.1.1",), "p", "ns",
                            "cluster.local"), "peer", False)
    for i in range(MAX_QUEUED_REQUESTS):
        await conn.queue_request(i, 10)
    blocked = asyncio.get_running_loop().create_task(conn.queue_request("one too many", 10))
    await asyncio.sleep(0)  # let it run up to its wait
    assert not blocked.done() and conn.requests_queued == MAX_QUEUED_REQUESTS
    conn.inbox.get_nowait()
    conn.request_done(10)
    await asyncio.wait_for(blocked, 1)
    assert conn.requests_queued == MAX_QUEUED_REQUESTS
