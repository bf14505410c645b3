"""A gRPC echo backend that needs no generated code.

Without (de)serializers grpcio hands the handler raw request bytes and sends
raw response bytes, so ``/test.Echo/Echo`` can be served and called without
any .proto file. The reply ``NAME:REQUEST`` shows which backend answered.
"""

from __future__ import annotations

from typing import Self

import grpc

SERVICE = "test.Echo"
METHOD = f"/{SERVICE}/Echo"


class GrpcEchoBackend:
    """A ``grpc.aio`` server on 127.0.0.1 replying ``name + b":" + request``."""

    def __init__(self, name: str | bytes, port: int = 0, *, host: str = "127.0.0.1",
                 fail_every_other: bool = False) -> None:
        self.name = name if isinstance(name, str) else name.decode()
        # Odd-numbered calls fail with UNAVAILABLE: each RPC's first attempt fails once, so a
        # client that retries on `unavailable` always succeeds and one that does not fails half.
        self.fail_every_other = fail_every_other
        self.host = host
        self.call_count = 0
        self._name_bytes = self.name.encode()
        self._requested_port = port
        self._port: int | None = None
        self._server: grpc.aio.Server | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"GrpcEchoBackend {self.name!r} not started")
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def _echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.call_count += 1
        if self.fail_every_other and self.call_count % 2 == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name}: failing call {self.call_count}")
        return self._name_bytes + b":" + request

    async def start(self) -> GrpcEchoBackend:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(self._echo)}
                ),
            )
        )
        # add_insecure_port returns the bound port, which matters for port 0.
        self._port = server.add_insecure_port(f"{self.host}:{self._requested_port}")
        if self._port == 0:
            raise RuntimeError(f"could not bind {self.host}:{self._requested_port}")
        await server.start()
        self._server = server
        return self

    async def stop(self, grace: float | None = None) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def echo_call(target: str, payload: bytes = b"hello", timeout: float = 2.0) -> bytes:
    """One ``/test.Echo/Echo`` call over a fresh insecure channel; returns the raw reply.

    Only for non-xDS targets: an ``xds:///`` target would start grpcio's
    process-wide xDS client inside the test process (use grpc_client_proc).
    """
    if target.startswith("xds:"):
        raise ValueError("xds targets must be called from a separate process (grpc_client_proc)")
    async with grpc.aio.insecure_channel(target) as channel:
        return await channel.unary_unary(METHOD)(payload, timeout=timeout)
