"""Protocol sniffing through a real Envoy: a port that names no protocol (`web`) carries HTTP with
L7 routing (a VirtualService header match) and raw TCP on the same port, outbound and inbound."""

from __future__ import annotations

import asyncio
import textwrap

import aiohttp
import grpc
import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.support.backends import http_get
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.grpc_echo import METHOD, GrpcEchoBackend
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)
NODE = sidecar_node_id("client-1")
INGRESS_BIND = "127.0.0.6"
HTTP_METHODS = (b"GET ", b"POST", b"HEAD", b"PUT ")


class DualBackend:
    """Answers an HTTP/1.1 request with `name` in the body, and any other first bytes with
    `tcp:name`: which of the two a connection reached shows how the sidecar treated it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.server: asyncio.Server | None = None

    async def start(self) -> DualBackend:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                head = await reader.read(4096)
                if head[:4] in HTTP_METHODS:
                    while b"\r\n\r\n" not in head:
                        more = await reader.read(4096)
                        if not more:
                            return
                        head += more
                    body = self.name.encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                else:
                    writer.write(b"tcp:" + self.name.encode())
                await writer.drain()
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def raw_exchange(address: str, port: int, payload: bytes) -> str:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), 3)
    try:
        writer.write(payload)
        await writer.drain()
        return (await asyncio.wait_for(reader.read(100), 3)).decode(errors="replace")
    finally:
        writer.close()


def mesh_yaml(port: int, ingress_port: int, web: int, canary: int, app: int) -> str:
    # Port name `web`: no protocol prefix, no appProtocol. `web` sorts before `web2`, so the
    # port's TCP chain (NONE mode: one per bound port) reaches `web`.
    return (service_yaml("web", port, port_name="web") + "---\n"
            + endpoint_slice_yaml("web", web, port_name="web") + "---\n"
            + service_yaml("web2", port, port_name="web") + "---\n"
            + endpoint_slice_yaml("web2", canary, port_name="web") + "---\n"
            + textwrap.dedent(f"""\
                apiVersion: networking.istio.io/v1
                kind: VirtualService
                metadata: {{name: web, namespace: default}}
                spec:
                  hosts: [web]
                  http:
                  - match: [{{headers: {{x-canary: {{exact: "yes"}}}}}}]
                    route: [{{destination: {{host: web2}}}}]
                  - route: [{{destination: {{host: web}}}}]
                ---
                apiVersion: networking.istio.io/v1
                kind: Sidecar
                metadata: {{name: client, namespace: default}}
                spec:
                  workloadSelector: {{labels: {{app: client}}}}
                  ingress:
                  - port: {{number: {ingress_port}, name: web}}
                    bind: {INGRESS_BIND}
                    defaultEndpoint: 127.0.0.1:{app}
                    captureMode: NONE
                """))


async def test_unnamed_port_routes_http_at_l7_and_passes_tcp(tmp_path):
    port, ingress_port = free_ports(2)
    backends = {n: await DualBackend(n).start() for n in ("web-v1", "web-canary", "local-app")}
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mesh_yaml(port, ingress_port, backends["web-v1"].port, backends["web-canary"].port,
                                    backends["local-app"].port))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata={
            "NAMESPACE": "default", "INTERCEPTION_MODE": "NONE", "LABELS": {"app": "client"}}), tmp_path)

        async def http(address: str, p: int, headers: dict[str, str]) -> tuple[int, str] | None:
            try:
                return await http_get(f"http://{address}:{p}/", headers)
            except (aiohttp.ClientError, TimeoutError):
                return None

        canary = {"Host": "web", "x-canary": "yes"}
        await wait_for(lambda: _is(http("127.0.0.1", port, canary), (200, "web-canary")), timeout=30,
                       message=f"header match on the unnamed port\n{cp.log_tail()}")
        # The same port, without the header: the VirtualService's default route.
        assert await http("127.0.0.1", port, {"Host": fqdn("web")}) == (200, "web-v1")
        # Raw TCP through the same listener: the TCP chain, bytes unchanged to the first service.
        assert await raw_exchange("127.0.0.1", port, b"\x00\x01ping\r\n") == "tcp:web-v1"

        # Inbound: the Sidecar ingress port names no protocol either.
        async def inbound_http() -> bool:
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s, \
                        s.get(f"http://{INGRESS_BIND}:{ingress_port}/") as resp:
                    # Served by the connection manager: Envoy's router adds this header.
                    return resp.status == 200 and await resp.text() == "local-app" \
                        and "x-envoy-upstream-service-time" in resp.headers
            except (aiohttp.ClientError, TimeoutError):
                return False

        await wait_for(inbound_http, timeout=20, message=f"inbound HTTP on the unnamed port\n{cp.log_tail()}")
        # (Bytes that cannot start an HTTP request: "hello" alone could be the start of a request
        # line, and the inspector would wait for more, with no detection timeout for ever.)
        assert await raw_exchange(INGRESS_BIND, ingress_port, b"\x16hello") == "tcp:local-app"
    finally:
        await envoy.stop()
        await cp.stop()
        for b in backends.values():
            await b.stop()


async def _is(result, expected) -> bool:
    return await result == expected


async def test_unnamed_port_routes_h2c_grpc_at_l7(tmp_path):
    """HTTP/2 with prior knowledge (a plaintext gRPC client) is sniffed as h2c: a VirtualService
    header match picks the backend, and the cluster keeps HTTP/2 upstream (gRPC needs it)."""
    (port,) = free_ports(1)
    stable, canary = GrpcEchoBackend("rpc-v1"), GrpcEchoBackend("rpc-canary")
    await stable.start()
    await canary.start()
    cp = ControlPlane(tmp_path)
    cp.write("rpc.yaml", service_yaml("rpc", port, port_name="api") + "---\n"
             + endpoint_slice_yaml("rpc", stable.port, port_name="api") + "---\n"
             + service_yaml("rpc2", port, port_name="api") + "---\n"
             + endpoint_slice_yaml("rpc2", canary.port, port_name="api") + "---\n"
             + textwrap.dedent("""\
                apiVersion: networking.istio.io/v1
                kind: VirtualService
                metadata: {name: rpc, namespace: default}
                spec:
                  hosts: [rpc]
                  http:
                  - match: [{headers: {x-canary: {exact: "yes"}}}]
                    route: [{destination: {host: rpc2}}]
                  - route: [{destination: {host: rpc}}]
                """))
    envoy = Envoy()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.default_authority", "rpc")])
    call = channel.unary_unary(METHOD)
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port), tmp_path)

        async def answer(metadata) -> bytes | None:
            try:
                return await call(b"hi", metadata=metadata, timeout=3)
            except grpc.aio.AioRpcError:
                return None

        async def canary_answers() -> bool:
            return await answer((("x-canary", "yes"),)) == b"rpc-canary:hi"

        await wait_for(canary_answers, timeout=30, message=f"h2c header match on the unnamed port\n{cp.log_tail()}")
        assert await answer(()) == b"rpc-v1:hi"
    finally:
        await channel.close()
        await envoy.stop()
        await cp.stop()
        await stable.stop()
        await canary.stop()
