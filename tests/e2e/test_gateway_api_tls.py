"""Gateway API beyond plain HTTP, through a real gateway Envoy: HTTPS listeners terminating TLS
with Secrets (same namespace, and across namespaces once a ReferenceGrant allows it), TLS
passthrough by SNI (TLSRoute), TCPRoute, and GRPCRoute to a gRPC backend. Clients verify
certificates against the test CA."""

from __future__ import annotations

import asyncio
import ssl
import textwrap

import grpc
import pytest

from tests.e2e.gateway_api_env import (
    GW_NAME,
    GW_NS,
    SERVICE_PORT,
    GatewayApiEnv,
    client_tls,
    conditions,
    gateway_service_yaml,
    gateway_yaml,
    listener_status,
    parent_status,
    presented_serial,
    request,
    route_yaml,
    running_env,
)
from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.support.backends import HttpBackend
from tests.support.certs import issue, make_ca, tls_secret_yaml
from tests.support.grpc_echo import METHOD, GrpcEchoBackend
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(90)
OK = ("True", "Accepted")


@pytest.fixture
async def env(tmp_path):
    async with running_env(tmp_path, ("alpha", "beta")) as e:
        yield e


async def test_https_listeners_with_certificates_here_and_across_namespaces(env: GatewayApiEnv):
    ca = make_ca()
    local, remote = issue(ca, ["a.example.com"]), issue(ca, ["b.example.com"])
    (port,) = free_ports(1)
    env.cp.write("secrets.yaml", tls_secret_yaml("a-cert", GW_NS, local) + "---\n"
                 + tls_secret_yaml("b-cert", "certs", remote))
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: a
          port: {port}
          protocol: HTTPS
          hostname: a.example.com
          tls: {{certificateRefs: [{{name: a-cert}}]}}
          allowedRoutes: {{namespaces: {{from: All}}}}
        - name: b
          port: {port}
          protocol: HTTPS
          hostname: b.example.com
          tls: {{certificateRefs: [{{name: b-cert, namespace: certs}}]}}
          allowedRoutes: {{namespaces: {{from: All}}}}
        """) + "---\n" + gateway_service_yaml(port))
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "secure", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        rules:
        - backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]
        """))
    await env.start(verified=True)

    async def a_served():
        r = await request(port, "a.example.com", "/", tls=client_tls(ca))
        return r.backend == "alpha"

    await env.until(a_served, "HTTPS a.example.com")
    assert await presented_serial(port, "a.example.com", ca) == local.serial
    # The certificate in `certs` is not the Gateway's to present: that listener is not programmed.
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    assert conditions(listener_status(gw, "a")) == {
        "Accepted": OK, "Conflicted": ("False", "NoConflicts"), "Programmed": ("True", "Programmed"),
        "ResolvedRefs": ("True", "ResolvedRefs")}
    b = listener_status(gw, "b")
    assert conditions(b)["ResolvedRefs"] == ("False", "RefNotPermitted")
    assert conditions(b)["Programmed"] == ("False", "Invalid")
    assert b["attachedRoutes"] == 1  # attached, but nothing served for it
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        await presented_serial(port, "b.example.com", ca)

    env.cp.write("grant.yaml", f"""\
        apiVersion: gateway.networking.k8s.io/v1beta1
        kind: ReferenceGrant
        metadata: {{name: gateway-certs, namespace: certs}}
        spec:
          from: [{{group: gateway.networking.k8s.io, kind: Gateway, namespace: {GW_NS}}}]
          to: [{{group: "", kind: Secret, name: b-cert}}]
        """)

    async def b_served():
        r = await request(port, "b.example.com", "/", tls=client_tls(ca))
        return r.backend == "alpha"

    await env.until(b_served, "HTTPS b.example.com with the granted certificate")
    assert await presented_serial(port, "b.example.com", ca) == remote.serial
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    assert conditions(listener_status(gw, "b"))["Programmed"] == ("True", "Programmed")


async def test_tls_passthrough_by_sni(env: GatewayApiEnv):
    ca = make_ca()
    server_ctx = {}
    backends = {}
    for name, host in (("pass-one", "one.pass.example.com"), ("pass-two", "two.pass.example.com")):
        leaf = issue(ca, [host])
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        d = env.tmp_path / name
        d.mkdir()
        (d / "c.pem").write_bytes(leaf.cert_pem)
        (d / "k.pem").write_bytes(leaf.key_pem)
        ctx.load_cert_chain(d / "c.pem", d / "k.pem")
        server_ctx[name] = leaf
        backends[name] = await HttpBackend(name, ssl_context=ctx).start()
        env.cp.write(f"{name}.yaml", service_yaml(name, 9443, port_name="tls") + "---\n"
                     + endpoint_slice_yaml(name, backends[name].port, port_name="tls"))
    try:
        (port,) = free_ports(1)
        env.cp.write("gateway.yaml", gateway_yaml(f"""\
            - name: pass
              port: {port}
              protocol: TLS
              hostname: "*.pass.example.com"
              tls: {{mode: Passthrough}}
              allowedRoutes: {{namespaces: {{from: All}}}}
            """) + "---\n" + gateway_service_yaml(port))
        for name, host in (("pass-one", "one.pass.example.com"), ("pass-two", "two.pass.example.com")):
            env.cp.write(f"route-{name}.yaml", route_yaml("TLSRoute", name, f"""\
                parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
                hostnames: [{host}]
                rules:
                - backendRefs: [{{name: {name}, port: 9443}}]
                """, version="v1alpha2"))
        await env.start()

        async def served():
            r = await request(port, "one.pass.example.com", "/", tls=client_tls(ca))
            return r.backend == "pass-one"

        await env.until(served, "TLS passthrough to pass-one")
        # The backend's own certificate reaches the client: Envoy did not terminate.
        assert await presented_serial(port, "one.pass.example.com", ca) == server_ctx["pass-one"].serial
        assert await presented_serial(port, "two.pass.example.com", ca) == server_ctx["pass-two"].serial
        assert (await request(port, "two.pass.example.com", "/", tls=client_tls(ca))).backend == "pass-two"
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            await presented_serial(port, "three.pass.example.com", ca)
        gw = await env.status("Gateway", GW_NAME, GW_NS)
        ls = listener_status(gw, "pass")
        assert ls["supportedKinds"] == [{"group": "gateway.networking.k8s.io", "kind": "TLSRoute"}]
        assert ls["attachedRoutes"] == 2
        assert conditions(parent_status(await env.status("TLSRoute", "pass-one")))["Accepted"] == OK
    finally:
        for b in backends.values():
            await b.stop()


class TcpEcho:
    """Answers every connection with `NAME:` followed by whatever it reads."""

    def __init__(self, name: str) -> None:
        self.name = name.encode()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(1024)
        writer.write(self.name + b":" + data)
        await writer.drain()
        writer.close()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def tcp_exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1024), 5)
    finally:
        writer.close()


async def test_tcp_route(env: GatewayApiEnv):
    echo = TcpEcho("db")
    echo_port = await echo.start()
    try:
        (port,) = free_ports(1)
        env.cp.write("db.yaml", service_yaml("db", 5432, port_name="tcp") + "---\n"
                     + endpoint_slice_yaml("db", echo_port, port_name="tcp"))
        env.cp.write("gateway.yaml", gateway_yaml(f"""\
            - name: tcp
              port: {port}
              protocol: TCP
              allowedRoutes: {{namespaces: {{from: All}}}}
            """) + "---\n" + gateway_service_yaml(port))
        env.cp.write("route.yaml", route_yaml("TCPRoute", "db", f"""\
            parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}, sectionName: tcp}}]
            rules:
            - backendRefs: [{{name: db, port: 5432}}]
            """, version="v1alpha2"))
        await env.start()

        async def echoed():
            return await tcp_exchange(port, b"ping") == b"db:ping"

        await env.until(echoed, "TCP through the gateway")
        gw = await env.status("Gateway", GW_NAME, GW_NS)
        assert listener_status(gw, "tcp")["supportedKinds"] == [
            {"group": "gateway.networking.k8s.io", "kind": "TCPRoute"}]
        assert conditions(parent_status(await env.status("TCPRoute", "db"), section="tcp")) == {
            "Accepted": OK, "ResolvedRefs": ("True", "ResolvedRefs")}
    finally:
        await echo.stop()


async def grpc_call(port: int, authority: str, metadata: tuple = ()) -> bytes:
    options = [("grpc.default_authority", authority)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        return await channel.unary_unary(METHOD)(b"hi", timeout=3, metadata=metadata)


async def test_grpc_route_to_grpc_backends(env: GatewayApiEnv):
    backends = {n: await GrpcEchoBackend(n).start() for n in ("g1", "g2")}
    try:
        (port,) = free_ports(1)
        for name, b in backends.items():
            env.cp.write(f"{name}.yaml", service_yaml(name, 9090, port_name="grpc") + "---\n"
                         + endpoint_slice_yaml(name, b.port, port_name="grpc"))
        env.cp.write("gateway.yaml", gateway_yaml(f"""\
            - name: http
              port: {port}
              protocol: HTTP
              allowedRoutes: {{namespaces: {{from: All}}}}
            """) + "---\n" + gateway_service_yaml(port))
        env.cp.write("route.yaml", route_yaml("GRPCRoute", "echo", textwrap.dedent(f"""\
            parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
            hostnames: [grpc.example.com]
            rules:
            - matches:
              - method: {{service: test.Echo, method: Echo}}
                headers: [{{name: x-canary, value: "true"}}]
              backendRefs: [{{name: g2, port: 9090}}]
            - matches: [{{method: {{service: test.Echo}}}}]
              backendRefs: [{{name: g1, port: 9090}}]
            """)))
        await env.start()

        async def answered():
            return await grpc_call(port, "grpc.example.com") == b"g1:hi"

        await env.until(answered, "gRPC through the gateway")
        assert await grpc_call(port, "grpc.example.com", (("x-canary", "true"),)) == b"g2:hi"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await grpc_call(port, "other.example.com")
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED  # Envoy's 404, as gRPC maps it
        assert conditions(parent_status(await env.status("GRPCRoute", "echo"))) == {
            "Accepted": OK, "ResolvedRefs": ("True", "ResolvedRefs")}
        gw = await env.status("Gateway", GW_NAME, GW_NS)
        assert listener_status(gw, "http")["attachedRoutes"] == 1
    finally:
        for b in backends.values():
            await b.stop()
