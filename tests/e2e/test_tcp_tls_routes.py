"""VirtualService `tcp` and `tls` rules on a sidecar: TCP connections shifted to another
service, and TLS connections routed by SNI without terminating TLS."""

from __future__ import annotations

import asyncio
import ssl
import textwrap

import pytest

from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)
NODE = sidecar_node_id("client-1")


class TcpBackend:
    """Answers every connection with its name once it has received some bytes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.server: asyncio.Server | None = None

    async def start(self) -> TcpBackend:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.read(4096)
                writer.write(self.name.encode())
                await writer.drain()
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def client_hello(sni: str) -> bytes:
    """The first bytes a TLS client sends, with this SNI (the sidecar routes on it)."""
    ctx = ssl.create_default_context()
    obj = ctx.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


async def exchange(port: int, payload: bytes) -> str:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 3)
    try:
        writer.write(payload)
        await writer.drain()
        return (await asyncio.wait_for(reader.read(100), 3)).decode(errors="replace")
    finally:
        writer.close()


def service(name: str, port: int, port_name: str, backend: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: {name}, namespace: default}}
        spec:
          ports: [{{name: {port_name}, port: {port}}}]
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
        addressType: IPv4
        ports: [{{name: {port_name}, port: {backend}}}]
        endpoints: [{{addresses: ["127.0.0.1"]}}]
        """)


async def test_tcp_shift_and_sni_routing(tmp_path):
    backends = {n: await TcpBackend(n).start() for n in ("db-v1", "db-v2", "tls-a", "tls-b")}
    db_port, tls_port = free_ports(2)
    cp = ControlPlane(tmp_path)
    # Services sharing a port: without iptables the sidecar's listener on that port belongs to the
    # first by hostname (db, secure); the others are reached through VirtualService rules.
    cp.write("db.yaml", service("db", db_port, "tcp-db", backends["db-v1"].port)
             + "---\n" + service("shadowdb", db_port, "tcp-db", backends["db-v2"].port))
    cp.write("tls.yaml", service("secure", tls_port, "tls", backends["tls-a"].port)
             + "---\n" + service("tlsbackend-b", tls_port, "tls", backends["tls-b"].port))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port), tmp_path)
        await envoy.wait_ready()

        async def answers(port: int, payload: bytes, name: str) -> bool:
            try:
                return await exchange(port, payload) == name
            except (TimeoutError, OSError):
                return False

        await wait_for(lambda: answers(db_port, b"ping", "db-v1"), message="plain TCP to db")
        cp.write("vs.yaml", textwrap.dedent(f"""\
            apiVersion: networking.istio.io/v1
            kind: VirtualService
            metadata: {{name: db, namespace: default}}
            spec:
              hosts: [db]
              tcp:
              - match: [{{port: {db_port}}}]
                route: [{{destination: {{host: shadowdb, port: {{number: {db_port}}}}}}}]
            ---
            apiVersion: networking.istio.io/v1
            kind: VirtualService
            metadata: {{name: secure, namespace: default}}
            spec:
              hosts: [secure, "*.secure.test"]
              tls:
              - match: [{{sniHosts: [b.secure.test]}}]
                route: [{{destination: {{host: tlsbackend-b}}}}]
              - match: [{{sniHosts: [a.secure.test]}}]
                route: [{{destination: {{host: secure}}}}]
            """))
        await wait_for(lambda: answers(db_port, b"ping", "db-v2"), message="tcp route shifted db to v2")
        await wait_for(lambda: answers(tls_port, client_hello("b.secure.test"), "tls-b"), message="SNI b")
        assert await answers(tls_port, client_hello("a.secure.test"), "tls-a")
    finally:
        await envoy.stop()
        await cp.stop()
        for b in backends.values():
            await b.stop()
