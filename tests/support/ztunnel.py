"""A delta xDS client that behaves as ztunnel does towards istiod (no ztunnel binary exists here).

What it copies from ztunnel's xDS client (src/xds/client.rs):
- node id `ztunnel~IP~POD.NS~NS.svc.cluster.local` with NAME, NAMESPACE, INSTANCE_IPS and
  NODE_NAME metadata;
- one DeltaAggregatedResources stream asking for exactly `istio.workload.Address` and
  `istio.security.Authorization`: wildcard (no names), or, for on-demand Address, subscribe and
  unsubscribe `*` at once ("subscribe to nothing") and then subscribe names as they are needed;
- every response is decoded with the generated protos (a resource that does not decode is
  NACKed, as ztunnel does), removals are applied, and each response is ACKed by nonce;
- on reconnect the first request of each type carries `initial_resource_versions` with the names
  it holds. ztunnel sends empty versions there; `versions=True` sends the real ones instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

from pilot.gen.workloadapi import workload_pb2
from pilot.gen.workloadapi.security import authorization_pb2

from .wait import wait_for

ADDRESS = "type.googleapis.com/istio.workload.Address"
AUTHORIZATION = "type.googleapis.com/istio.security.Authorization"
DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
MESSAGES = {ADDRESS: workload_pb2.Address, AUTHORIZATION: authorization_pb2.Authorization}


def ztunnel_node(pod: str = "ztunnel-abcde", namespace: str = "istio-system", ip: str = "10.0.0.2",
                 node_name: str = "node-1") -> base_pb2.Node:
    md = struct_pb2.Struct()
    md.update({"NAME": pod, "NAMESPACE": namespace, "INSTANCE_IPS": ip, "NODE_NAME": node_name})
    return base_pb2.Node(id=f"ztunnel~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local", metadata=md)


@dataclass
class Received:
    """One DeltaDiscoveryResponse, decoded."""

    type_url: str
    nonce: str
    resources: dict[str, object]  # name -> decoded message
    versions: dict[str, str]
    aliases: dict[str, tuple[str, ...]]
    removed: tuple[str, ...]


@dataclass
class ZtunnelClient:
    port: int
    node: base_pb2.Node = field(default_factory=ztunnel_node)
    on_demand: bool = False
    # What the client holds, per type: name -> (version, message)
    state: dict[str, dict[str, tuple[str, object]]] = field(default_factory=lambda: {ADDRESS: {}, AUTHORIZATION: {}})
    responses: list[Received] = field(default_factory=list)
    nacks: list[str] = field(default_factory=list)
    error: grpc.RpcError | None = None
    metadata: tuple[tuple[str, str], ...] = ()
    channel_factory: object = None  # callable returning a grpc.aio channel (e.g. TLS); default insecure

    async def connect(self, *, versions: bool = False) -> None:
        """Open a stream and send the initial request of both types (resuming what is held)."""
        self._channel = (self.channel_factory() if self.channel_factory is not None
                         else grpc.aio.insecure_channel(f"127.0.0.1:{self.port}"))
        self._call = self._channel.stream_stream(
            DELTA, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)(metadata=self.metadata or None)
        self.responses = []
        for type_url in (ADDRESS, AUTHORIZATION):
            req = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, node=self.node)
            if self.on_demand and type_url == ADDRESS:
                req.resource_names_subscribe.append("*")
                req.resource_names_unsubscribe.append("*")
            for name, (version, _) in self.state[type_url].items():
                req.initial_resource_versions[name] = version if versions else ""
            try:
                await self._call.write(req)
            except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                break  # the server already ended the stream (a refusal): _read records why
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for resp in self._call:
                await self._handle(resp)
        except grpc.RpcError as e:
            self.error = e
        except asyncio.CancelledError:
            pass

    async def _handle(self, resp: discovery_pb2.DeltaDiscoveryResponse) -> None:
        cls = MESSAGES.get(resp.type_url)
        decoded, versions, aliases, problems = {}, {}, {}, []
        for r in resp.resources:
            try:
                if cls is None:
                    raise ValueError(f"unknown type {resp.type_url}")
                if r.resource.type_url != resp.type_url:
                    raise ValueError(f"Any of type {r.resource.type_url} in a {resp.type_url} response")
                msg = cls()
                if not r.resource.Unpack(msg):
                    raise ValueError("does not decode")
                decoded[r.name] = msg
                versions[r.name] = r.version
                aliases[r.name] = tuple(r.aliases)
            except Exception as e:  # noqa: BLE001 - reported to the server as a NACK
                problems.append(f"{r.name}: {e}")
        held = self.state.setdefault(resp.type_url, {})
        for name in resp.removed_resources:
            held.pop(name, None)
        for name, msg in decoded.items():
            held[name] = (versions[name], msg)
        self.responses.append(Received(resp.type_url, resp.nonce, decoded, versions, aliases,
                                       tuple(resp.removed_resources)))
        ack = discovery_pb2.DeltaDiscoveryRequest(type_url=resp.type_url, response_nonce=resp.nonce)
        if problems:
            self.nacks.append("; ".join(problems))
            ack.error_detail.CopyFrom(status_pb2.Status(code=13, message="; ".join(problems)))
        with contextlib.suppress(Exception):  # the stream may be closing
            await self._call.write(ack)

    async def demand(self, *names: str, type_url: str = ADDRESS) -> None:
        await self._call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=type_url,
                                                                   resource_names_subscribe=list(names)))

    async def unsubscribe(self, *names: str, type_url: str = ADDRESS) -> None:
        await self._call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=type_url,
                                                                   resource_names_unsubscribe=list(names)))

    async def close(self) -> None:
        if getattr(self, "_call", None) is not None:
            self._call.cancel()
            self._reader.cancel()
            with contextlib.suppress(Exception):
                await self._reader
            await self._channel.close()
            self._call = None

    # --- reading state ------------------------------------------------------------------------
    def workloads(self) -> dict[str, workload_pb2.Workload]:
        return {n: m.workload for n, (_, m) in self.state[ADDRESS].items() if m.HasField("workload")}

    def services(self) -> dict[str, workload_pb2.Service]:
        return {n: m.service for n, (_, m) in self.state[ADDRESS].items() if m.HasField("service")}

    def policies(self) -> dict[str, authorization_pb2.Authorization]:
        return {n: m for n, (_, m) in self.state[AUTHORIZATION].items()}

    def versions(self, type_url: str = ADDRESS) -> dict[str, str]:
        return {n: v for n, (v, _) in self.state[type_url].items()}

    def received(self, type_url: str) -> list[Received]:
        return [r for r in self.responses if r.type_url == type_url]

    async def wait(self, predicate, timeout: float = 10.0, message: str = ""):
        async def check():
            if self.error is not None:
                raise AssertionError(f"stream failed: {self.error.code()} {self.error.details()}")
            return predicate()
        return await wait_for(check, timeout, message=message)

