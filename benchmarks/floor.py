"""The floor: a bare grpc.aio ADS server that does nothing but stream one shared, pre-serialised
response, run in its own process and measured with the same load generator as the real server.

    python -m benchmarks.floor --response FILE [--delta]

FILE holds a response a proxy received from the server under test (captured by the load
generator), so both servers send the same bytes. Each new subscription of that response's type is
answered with the current body; the `push` command re-versions the body once and queues the same
bytes object to every stream. The time our server takes beyond this is the cost of the real work
(watching files, debouncing, building, per-proxy bookkeeping), which is what the ratio reports.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from benchmarks import ipc

SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
_CLOSE = None


class Floor:
    def __init__(self, captured: bytes, delta: bool) -> None:
        self.delta = delta
        self._req_cls = discovery_pb2.DeltaDiscoveryRequest if delta else discovery_pb2.DiscoveryRequest
        resp_cls = discovery_pb2.DeltaDiscoveryResponse if delta else discovery_pb2.DiscoveryResponse
        self._template = resp_cls.FromString(captured)
        self.type_url = self._template.type_url
        self.generation = 0
        self.body = self._render()
        self.streams: set[asyncio.Queue] = set()
        self.sent = 0
        self.bytes = 0

    def _render(self) -> bytes:
        """Serialise once per push; every stream gets this same bytes object."""
        msg = type(self._template)()
        msg.CopyFrom(self._template)
        version = f"floor-{self.generation}"
        if self.delta:
            msg.system_version_info = version
        else:
            msg.version_info = version
        msg.nonce = version
        return msg.SerializeToString()

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(self.stream)  # bytes in, bytes out
        name = "DeltaAggregatedResources" if self.delta else "StreamAggregatedResources"
        return grpc.method_handlers_generic_handler(SERVICE, {name: method})

    async def stream(self, requests, context: grpc.aio.ServicerContext) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        self.streams.add(queue)
        reader = asyncio.get_running_loop().create_task(self._read(requests, queue))
        try:
            while (body := await queue.get()) is not _CLOSE:
                await context.write(body)
                self.sent += 1
                self.bytes += len(body)
        finally:
            self.streams.discard(queue)
            reader.cancel()

    async def _read(self, requests, queue: asyncio.Queue) -> None:
        """Answer a new subscription to our type; ACKs and other types need no answer here."""
        try:
            async for raw in requests:
                req = self._req_cls.FromString(raw)
                if req.type_url == self.type_url and not req.response_nonce:
                    queue.put_nowait(self.body)
        finally:
            queue.put_nowait(_CLOSE)

    async def push(self, msg: dict) -> dict:
        t0 = time.time()
        self.generation += 1
        self.body = self._render()
        for queue in self.streams:
            queue.put_nowait(self.body)
        return {"streams": len(self.streams), "bytes": len(self.body), "render_ms": (time.time() - t0) * 1000}

    async def stats(self, msg: dict) -> dict:
        return {"streams": len(self.streams), "sent": self.sent, "bytes": self.bytes}


async def amain(args: argparse.Namespace) -> None:
    floor = Floor(Path(args.response).read_bytes(), args.delta)
    # The same transport limits the server under test uses.
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20),
                                      ("grpc.max_receive_message_length", 16 << 20)])
    server.add_generic_rpc_handlers((floor.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await ipc.serve_commands({"ready": True, "port": port}, {"push": floor.push, "stats": floor.stats})
    finally:
        await server.stop(grace=0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--response", required=True, help="a serialised (Delta)DiscoveryResponse to stream")
    parser.add_argument("--delta", action="store_true", help="serve DeltaAggregatedResources")
    asyncio.run(amain(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
