"""AuthorizationPolicy CUSTOM through the whole pipeline: the control plane (file mode) reads
MeshConfig extensionProviders, a Service + EndpointSlice for the ext-authz server, a Sidecar with
two ingress listeners (HTTP and TCP, captureMode NONE, so no iptables) and the CUSTOM policy; a
real Envoy gets all of its config (LDS/RDS/CDS/EDS) over ADS and calls the real ext-authz server
written in tests/e2e/test_ext_authz_envoy.py (aiohttp for HTTP, grpcio `envoy.service.auth.v3.
Authorization` for gRPC) through the `outbound|PORT||HOST` cluster our CDS sends.
"""

from __future__ import annotations

import json
import textwrap
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import yaml

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.e2e.test_ext_authz_envoy import GrpcAuthz, HttpAuthz, _lower, custom_policy, send
from tests.e2e.test_tcp_tls_routes import TcpBackend, exchange
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(120)

NODE = sidecar_node_id("web-1", "default")
AUTHZ_SVC_PORT = 9000


def sidecar_yaml(http_port: int, app_port: int, tcp_port: int, db_port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: web, namespace: default}}
        spec:
          workloadSelector: {{labels: {{app: web}}}}
          ingress:
          - port: {{number: {http_port}, protocol: HTTP, name: http}}
            defaultEndpoint: 127.0.0.1:{app_port}
            captureMode: NONE
          - port: {{number: {tcp_port}, protocol: TCP, name: tcp}}
            defaultEndpoint: 127.0.0.1:{db_port}
            captureMode: NONE
        """)


def mesh(kind: str, **provider: Any) -> str:
    return json.dumps({"extensionProviders": [
        {"name": "my-authz", kind: {"service": "ext-authz.foo.svc.cluster.local", "port": AUTHZ_SVC_PORT,
                                    **provider}}]})


@asynccontextmanager
async def sidecar(tmp_path, mesh_config: str, authz_port: int, port_name: str, rules: list | None = None):
    """The control plane + an ADS-fed Envoy for default/web: yields (HTTP URL, TCP port, app)."""
    app, db = await HttpBackend("app").start(), await TcpBackend("db").start()
    http_port, tcp_port = free_ports(2)
    cp = ControlPlane(tmp_path / "cp", mesh_config=mesh_config)
    cp.write("authz-svc.yaml", service_yaml("ext-authz", AUTHZ_SVC_PORT, port_name=port_name, namespace="foo")
             + "---\n" + endpoint_slice_yaml("ext-authz", authz_port, port_name=port_name, namespace="foo"))
    cp.write("sidecar.yaml", sidecar_yaml(http_port, app.port, tcp_port, db.port))
    cp.write("policy.yaml", yaml.safe_dump(custom_policy(rules=rules)))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata={
            "NAMESPACE": "default", "INTERCEPTION_MODE": "NONE", "LABELS": {"app": "web"}}), tmp_path)

        async def ready() -> bool:
            try:
                return (await send(f"http://127.0.0.1:{http_port}/open"))[0] == 200
            except (aiohttp.ClientError, TimeoutError):
                return False

        await wait_for(ready, timeout=30, message=f"the ADS-fed inbound listener\n{cp.log_tail()}")
        yield f"http://127.0.0.1:{http_port}", tcp_port, app
    finally:
        await envoy.stop()
        await cp.stop()
        await app.stop()
        await db.stop()


async def test_http_provider_over_ads_allows_denies_and_shapes_headers(tmp_path):
    server = await HttpAuthz().start()
    config = mesh("envoyExtAuthzHttp", includeRequestHeadersInCheck=["x-ext-authz"],
                  headersToUpstreamOnAllow=["x-user"], headersToDownstreamOnDeny=["x-reason"],
                  pathPrefix="/check", timeout="5s")
    try:
        async with sidecar(tmp_path, config, server.port, "http") as (url, _tcp, app):
            assert server.checks == []  # /open matched no CUSTOM rule: never checked
            status, _body, _h = await send(f"{url}/protected/a", "allow")
            assert status == 200
            check = server.checks[-1]
            assert check["path"] == "/check/protected/a"
            sent = _lower(check["headers"])
            assert sent["x-ext-authz"] == "allow" and "x-other" not in sent  # includeRequestHeadersInCheck
            upstream = _lower(app.requests[-1]["headers"])
            assert upstream["x-user"] == "alice" and "x-secret" not in upstream  # headersToUpstreamOnAllow
            status, body, headers = await send(f"{url}/protected/b", "deny")
            assert (status, body, headers.get("x-reason")) == (403, "denied by ext-authz", "header")
            assert [r["path"] for r in app.requests if r["path"].startswith("/protected")] == ["/protected/a"]
    finally:
        await server.stop()


async def test_grpc_provider_over_ads_checks_http_and_tcp(tmp_path):
    server = await GrpcAuthz().start()
    try:
        async with sidecar(tmp_path, mesh("envoyExtAuthzGrpc", timeout="5s"), server.port, "grpc",
                           rules=[{"to": [{"operation": {"paths": ["/protected*"]}}]}]) as (url, tcp_port, app):
            assert (await send(f"{url}/protected/x", "allow"))[0] == 200
            assert _lower(app.requests[-1]["headers"])["x-user"] == "bob"
            assert (await send(f"{url}/protected/y", "deny"))[:2] == (403, "denied by grpc")
            http_checks = len(server.checks)
            # The TCP port: the network ext_authz filter asks for each connection (paths drop out).
            assert await exchange(tcp_port, b"ping") == "db"
            assert len(server.checks) == http_checks + 1
            assert not server.checks[-1].attributes.request.http.method
            server.allow_tcp = False
            assert await exchange(tcp_port, b"ping") == ""  # denied: the connection is closed
    finally:
        await server.stop()


@pytest.mark.parametrize(("extra", "expected"), [({}, 403), ({"statusOnError": "503"}, 503)])
async def test_unreachable_provider_fails_closed_with_status_on_error(tmp_path, extra, expected):
    (down,) = free_ports(1)  # nothing listens there
    async with sidecar(tmp_path, mesh("envoyExtAuthzHttp", failOpen=False, **extra), down, "http") as (url, _t, app):
        assert (await send(f"{url}/protected", "allow"))[0] == expected
        assert all(r["path"] == "/open" for r in app.requests)
