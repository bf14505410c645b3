"""BOOTSTRAP_XDS_AGENT: the Envoy bootstrap fetched from the control plane before Envoy starts, with
the proxy's EnvoyFilter `applyTo: BOOTSTRAP` patches merged (istio-agent 1.11-1.20's
bootstrap_stream.go; istio removed it in 1.21, istiod's default was off and stays off here).

As istio-agent: one SotW request of type envoy.config.bootstrap.v3.Bootstrap with the node, retried
with jittered exponential backoff until a response arrives or the agent is stopped; only the
first response is used, so a later change of a BOOTSTRAP EnvoyFilter reaches Envoy at the next
agent start (Envoy restarts by the agent reuse the bootstrap written here).

Unlike istio-agent (which wrote whatever came and left a bad bootstrap to stop Envoy from
starting), the result is checked with `envoy --mode validate` first: a bootstrap Envoy would
refuse is NACKed with Envoy's reason (the control plane then leaves the EnvoyFilter out, as for
any NACKed patch) and Envoy starts with the agent's own bootstrap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2  # type: ignore[import-untyped]

from pilot import logging as plog
from pilot.config.networking.envoy_filter import ensure_type, load_types
from pilot.xds.typeurls import AGENT_BOOTSTRAP_METADATA, BOOTSTRAP

log = plog.get("bootstrap")

METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
RESPONSE_TIMEOUT = 30.0  # one attempt: the control plane answers a request at once, even when empty
VALIDATE_TIMEOUT = 60.0
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0


@dataclass(frozen=True)
class Outcome:
    bootstrap: dict  # what Envoy starts with
    patched: bool  # the control plane's (else the agent's own)
    reason: str  # why the agent's own when something went wrong ("": there were no patches)


def request_node(base: Mapping[str, Any]) -> base_pb2.Node:
    """The bootstrap's node, its metadata carrying the bootstrap itself for the patches to go into."""
    node = base_pb2.Node()
    json_format.ParseDict(base["node"], node)
    node.metadata.update({AGENT_BOOTSTRAP_METADATA: dict(base)})
    return node


def to_json_dict(msg: Message) -> dict:
    """The bootstrap as Envoy's JSON; every typed config it holds must be a type this process can
    print, so the types are loaded first (a patch may name any registered Envoy type)."""
    _load_any_types(msg)
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def _load_any_types(msg: Message) -> None:
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        if fd.message_type.GetOptions().map_entry:
            items = list(value.values()) if fd.message_type.fields_by_name["value"].message_type else []
        else:
            items = list(value) if fd.is_repeated else [value]
        for item in items:
            if isinstance(item, any_pb2.Any):
                if not ensure_type(item.type_url):
                    raise TypeError(f"a typed config of unknown type {item.type_url}")
                inner = message_factory.GetMessageClass(
                    descriptor_pool.Default().FindMessageTypeByName(item.type_url.rsplit("/", 1)[-1]))()
                item.Unpack(inner)
                _load_any_types(inner)
            else:
                _load_any_types(item)


async def validate(envoy: str, bootstrap: dict, workdir: str) -> str | None:
    """Envoy's own verdict on a bootstrap (`--mode validate`): None when it would start, else its
    reason."""
    fd, path = tempfile.mkstemp(prefix="envoy-bds-", suffix=".json", dir=workdir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(bootstrap, f)
        proc = await asyncio.create_subprocess_exec(
            envoy, "--mode", "validate", "-c", path, "--allow-unknown-static-fields", "-l", "error",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), VALIDATE_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        if proc.returncode == 0:
            return None
        lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
        # "[time][thread][critical][main] [source...] error initializing configuration 'PATH': WHY"
        why = lines[-1].rsplit("] ", 1)[-1] if lines else f"exit status {proc.returncode}"
        return why.replace(f" '{path}'", "")
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _parse(base: dict) -> bootstrap_pb2.Bootstrap:
    load_types(base)
    return json_format.ParseDict(base, bootstrap_pb2.Bootstrap())


class _Stream:
    """One bootstrap request on its own ADS stream: the request, then an ACK or NACK."""

    def __init__(self, channel: grpc.aio.Channel, node: base_pb2.Node) -> None:
        self._out: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()
        self._out.put_nowait(discovery_pb2.DiscoveryRequest(type_url=BOOTSTRAP, node=node))
        rpc = channel.stream_stream(METHOD, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                    response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        self.call = rpc(self._requests())

    async def _requests(self) -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
        while (r := await self._out.get()) is not None:
            yield r

    async def first(self) -> discovery_pb2.DiscoveryResponse:
        while (response := await self.call.read()) is not grpc.aio.EOF:
            assert isinstance(response, discovery_pb2.DiscoveryResponse)
            if response.type_url == BOOTSTRAP:
                return response
        raise ConnectionError("the control plane ended the stream without a bootstrap")

    async def answer(self, response: discovery_pb2.DiscoveryResponse, error: str | None) -> None:
        """ACK or NACK, then end the stream once the control plane has read it (it ends its side
        when the requests end)."""
        self._out.put_nowait(discovery_pb2.DiscoveryRequest(
            type_url=BOOTSTRAP, response_nonce=response.nonce,
            version_info="" if error else response.version_info,
            error_detail=status_pb2.Status(code=3, message=error) if error else None))
        await self.end()

    async def end(self) -> None:
        self._out.put_nowait(None)
        with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
            async with asyncio.timeout(5):
                while await self.call.read() is not grpc.aio.EOF:
                    pass


def _backoff(attempt: int) -> float:
    delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** attempt)
    return delay * random.uniform(0.8, 1.2)  # jitter, not a secret


async def fetch(channel: Callable[[], grpc.aio.Channel], base: dict, envoy: str, workdir: str) -> Outcome:
    """The bootstrap Envoy starts with: the control plane's when it sends one Envoy accepts, else
    the agent's own `base`. Retries until the control plane answers (cancel to give up)."""
    node = request_node(base)
    attempt = 0
    while True:
        try:
            async with channel() as ch:
                stream = _Stream(ch, node)
                async with asyncio.timeout(RESPONSE_TIMEOUT):
                    response = await stream.first()
                return await _use(stream, response, base, envoy, workdir)
        except (grpc.aio.AioRpcError, ConnectionError, TimeoutError) as e:
            delay = _backoff(attempt)
            attempt += 1
            why = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else str(e) or "no answer"
            log.warning("bootstrap discovery failed; retrying", error=why, retry_in_s=round(delay, 2))
            await asyncio.sleep(delay)


async def _use(stream: _Stream, response: discovery_pb2.DiscoveryResponse, base: dict, envoy: str,
               workdir: str) -> Outcome:
    if not response.resources:
        await stream.answer(response, None)
        return Outcome(base, False, "the control plane sent no bootstrap for this proxy")
    try:
        bs = bootstrap_pb2.Bootstrap()
        if not response.resources[0].Unpack(bs):
            raise TypeError(f"a resource of type {response.resources[0].type_url}")
        if bs == _parse(base):
            await stream.answer(response, None)  # no patch for this proxy: nothing to check
            return Outcome(base, False, "")
        patched = to_json_dict(bs)
        error = await validate(envoy, patched, workdir)
    except (DecodeError, TypeError, json_format.Error) as e:
        error = f"cannot read the bootstrap: {e}"
    except TimeoutError:
        # Not Envoy's verdict: neither accepted nor blamed on the patches; start as if none came.
        await stream.end()
        return Outcome(base, False, f"envoy --mode validate took over {VALIDATE_TIMEOUT:.0f}s")
    if error is not None:
        await stream.answer(response, f"bootstrap: Envoy refuses it: {error}")
        return Outcome(base, False, f"Envoy refuses the patched bootstrap: {error}")
    await stream.answer(response, None)
    return Outcome(patched, True, "")
