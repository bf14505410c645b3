"""The floor: a bare grpc.aio ADS server that does nothing but stream one shared, pre-serialised
response, run in its own process and measured with the same load generator as the real server.

    python -m benchmarks.floor --response FILE [--response FILE ...] [--push FILE ...] [--delta]

Each FILE holds a response a proxy received from the server under test (captured by the load
generator), so both servers send the same bytes. Each new subscription of a response's type is
answered with that type's current body; the `push` command re-versions every body once and queues
the same bytes objects to every stream, in the order given (CDS then EDS is what a full push
sends: Envoy keeps re-created clusters warming until their endpoints come again). The time our
server takes beyond this is the cost of the real work (watching files, debouncing, building,
per-proxy bookkeeping), which is what the ratio reports. With `--push FILE`, a push sends those
responses instead (e.g. one changed ClusterLoadAssignment to proxies set up with all of them).
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
    def __init__(self, captured: list[bytes], delta: bool, pushed: list[bytes] | None = None) -> None:
        self.delta = delta
        self._req_cls = discovery_pb2.DeltaDiscoveryRequest if delta else discovery_pb2.DiscoveryRequest
        resp_cls = discovery_pb2.DeltaDiscoveryResponse if delta else discovery_pb2.DiscoveryResponse
        # type_url -> template, in push order
        self._templates = {t.type_url: t for t in map(resp_cls.FromString, captured)}
        self._pushed = [resp_cls.FromString(raw) for raw in pushed] if pushed else None
        self.generation = 0
        self.bodies = self._render(self._templates.values())
        self.streams: set[asyncio.Queue] = set()
        self.sent = 0
        self.bytes = 0

    def _render(self, templates) -> dict[str, bytes]:
        """Serialise once per push; every stream gets these same bytes objects."""
        bodies = {}
        for template in templates:
            msg = type(template)()
            msg.CopyFrom(template)
            version = f"floor-{self.generation}"
            if self.delta:
                msg.system_version_info = version
            else:
                msg.version_info = version
            msg.nonce = f"{version}-{len(bodies)}"
            bodies[template.type_url] = msg.SerializeToString()
        return bodies

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
        """Answer a new subscription to one of our types; ACKs and other types need no answer."""
        try:
            async for raw in requests:
                req = self._req_cls.FromString(raw)
                if not req.response_nonce and (body := self.bodies.get(req.type_url)) is not None:
                    queue.put_nowait(body)
        finally:
            queue.put_nowait(_CLOSE)

    async def push(self, msg: dict) -> dict:
        t0 = time.time()
        self.generation += 1
        self.bodies = self._render(self._templates.values())
        pushed = self._render(self._pushed) if self._pushed else self.bodies
        for queue in self.streams:
            for body in pushed.values():
                queue.put_nowait(body)
        return {"streams": len(self.streams), "bytes": sum(map(len, pushed.values())),
                "render_ms": (time.time() - t0) * 1000}

    async def stats(self, msg: dict) -> dict:
        return {"streams": len(self.streams), "sent": self.sent, "bytes": self.bytes}


async def amain(args: argparse.Namespace) -> None:
    floor = Floor([Path(p).read_bytes() for p in args.response], args.delta,
                  [Path(p).read_bytes() for p in args.push])
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
    parser.add_argument("--response", required=True, action="append",
                        help="a serialised (Delta)DiscoveryResponse to stream (repeat: pushed in this order)")
    parser.add_argument("--push", action="append", default=[],
                        help="what a push sends instead of the --response bodies (repeatable)")
    parser.add_argument("--delta", action="store_true", help="serve DeltaAggregatedResources")
    asyncio.run(amain(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
