"""AuthorizationPolicy CUSTOM with MeshConfig ext_authz providers, enforced by a real Envoy.

The filters come from the real pipeline: the MeshConfig text is parsed, the PushContext resolves
the provider against a real Service object, and the inbound filter builders make the RBAC marker
and the ext_authz filter. They sit in a static bootstrap (tests/support/static_config.
policy_bootstrap) in front of an HTTP backend and a TCP backend; the provider's cluster,
`outbound|PORT||HOST` (what the proxy's CDS holds for that service), points at a small ext-authz
server written here: HTTP (aiohttp) and gRPC (`envoy.service.auth.v3.Authorization`).
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from aiohttp import web
from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from envoy.type.v3 import http_status_pb2
from google.rpc import code_pb2, status_pb2

from pilot.config.mesh import parse_mesh_config
from pilot.model.push_context import PushContext
from pilot.networking.policy_filters import inbound_http_filters, inbound_network_filters
from tests.e2e.test_tcp_tls_routes import TcpBackend, exchange
from tests.support.backends import HttpBackend, serve
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy, envoy_validate
from tests.support.node import sidecar_node_id
from tests.support.policies import authz, store_of
from tests.support.static_config import _static_cluster, policy_bootstrap, static_bootstrap, to_dict
from tests.support.wait import wait_for
from tests.unit.helpers import World
from tests.unit.test_mtls_generation import SIDECAR_POD, mesh_proxy, reviews_service, reviews_slice

pytestmark = pytest.mark.timeout(90)

AUTHZ_HOST = "ext-authz.foo.svc.cluster.local"
AUTHZ_PORT = 9000
CLUSTER = f"outbound|{AUTHZ_PORT}||{AUTHZ_HOST}"
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext-authz", "namespace": "foo"},
           "spec": {"clusterIP": "10.0.0.99", "ports": [{"name": "grpc", "port": AUTHZ_PORT}]}}


class HttpAuthz:
    """An HTTP ext-authz server: 403 when the request carries `x-ext-authz: deny`, else 200 with
    an `x-user` header for the upstream and one the filter must not pass on."""

    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _check(self, request: web.Request) -> web.Response:
        self.checks.append({"method": request.method, "path": request.path, "headers": dict(request.headers)})
        if request.headers.get("x-ext-authz") == "deny":
            return web.Response(status=403, text="denied by ext-authz", headers={"x-reason": "header"})
        return web.Response(status=200, headers={"x-user": "alice", "x-secret": "not-for-upstream"})

    async def start(self) -> HttpAuthz:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._check)
        self._runner, self.port = await serve(app)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class GrpcAuthz(external_auth_pb2_grpc.AuthorizationServicer):
    """A gRPC ext-authz server: denies (PERMISSION_DENIED, 403) on `x-ext-authz: deny`; a TCP
    connection (no HTTP attributes) is allowed when `allow_tcp`."""

    def __init__(self) -> None:
        self.checks: list[external_auth_pb2.CheckRequest] = []
        self.allow_tcp = True
        self.port = 0
        self._server: grpc.aio.Server | None = None

    async def Check(self, request, context):
        self.checks.append(request)
        http = request.attributes.request.http
        if not http.method:  # a TCP connection
            code = code_pb2.OK if self.allow_tcp else code_pb2.PERMISSION_DENIED
            return external_auth_pb2.CheckResponse(status=status_pb2.Status(code=code))
        if http.headers.get("x-ext-authz") == "deny":
            return external_auth_pb2.CheckResponse(
                status=status_pb2.Status(code=code_pb2.PERMISSION_DENIED),
                denied_response=external_auth_pb2.DeniedHttpResponse(
                    status=http_status_pb2.HttpStatus(code=http_status_pb2.Forbidden), body="denied by grpc"))
        ok = external_auth_pb2.OkHttpResponse(headers=[base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key="x-user", value="bob"))])
        return external_auth_pb2.CheckResponse(status=status_pb2.Status(code=code_pb2.OK), ok_response=ok)

    async def start(self) -> GrpcAuthz:
        self._server = grpc.aio.server()
        external_auth_pb2_grpc.add_AuthorizationServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None


def mesh_text(kind: str, provider_port: int = AUTHZ_PORT, **extra: Any) -> str:
    provider = {"service": "foo/ext-authz", "port": provider_port, **extra}
    return json.dumps({"extensionProviders": [{"name": "my-authz", kind: provider}]})


def custom_policy(provider: str = "my-authz", rules: list | None = None) -> dict:
    return authz("ext", action="CUSTOM", provider={"name": provider},
                 selector={"matchLabels": {"app": "web"}},
                 rules=rules if rules is not None else [{"to": [{"operation": {"paths": ["/protected*"]}}]}])


def filters_for(mesh: str, *docs: dict) -> tuple[list, list, PushContext]:
    ctx = PushContext.build(store_of(SERVICE, *docs), parse_mesh_config(mesh), "m1", "cluster.local", "v1")
    wp = ctx.workload_policies("default", {"app": "web"})
    return inbound_http_filters(wp, "cluster.local"), inbound_network_filters(wp, "cluster.local"), ctx


@asynccontextmanager
async def workload(tmp_path, mesh: str, authz_port: int, *docs: dict, grpc_provider: bool = False):
    """An inbound Envoy for default/web with the CUSTOM policy: yields (HTTP URL, TCP port, app)."""
    http_filters, network_filters, _ctx = filters_for(mesh, *docs)
    app, db = await HttpBackend("app").start(), await TcpBackend("db").start()
    config = policy_bootstrap(http_filters, network_filters, app.port, db.port)
    cluster = _static_cluster(CLUSTER, authz_port)
    if grpc_provider:
        cluster["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    config["static_resources"]["clusters"].append(cluster)
    envoy = Envoy()
    try:
        await envoy.start(config, tmp_path)
        await envoy.wait_ready()
        ports = await envoy.listener_ports()
        yield f"http://127.0.0.1:{ports['http']}", ports["tcp"], app
    finally:
        await envoy.stop()
        await app.stop()
        await db.stop()


async def send(url: str, decision: str | None = None) -> tuple[int, str, dict]:
    headers = {"x-ext-authz": decision} if decision else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s, \
            s.get(url, headers={**headers, "x-other": "private"}) as r:
        return r.status, await r.text(), dict(r.headers)


def _lower(headers: dict) -> dict:
    return {k.lower(): v for k, v in headers.items()}


async def test_http_provider_allows_denies_and_checks_only_matching_requests(tmp_path):
    server = await HttpAuthz().start()
    mesh = mesh_text("envoyExtAuthzHttp", includeRequestHeadersInCheck=["x-ext-*"],
                     includeAdditionalHeadersInCheck={"x-from-mesh": "pilot"},
                     headersToUpstreamOnAllow=["x-user"], headersToDownstreamOnDeny=["x-reason"],
                     pathPrefix="/check", timeout="5s")
    try:
        async with workload(tmp_path, mesh, server.port, custom_policy()) as (url, _tcp, app):
            status, _body, _h = await send(f"{url}/protected/a", "allow")
            assert status == 200
            check = server.checks[-1]
            assert check["path"] == "/check/protected/a"  # pathPrefix, then the request's path
            headers = _lower(check["headers"])
            assert headers["x-ext-authz"] == "allow" and headers["x-from-mesh"] == "pilot"
            assert "x-other" not in headers  # only the headers named in includeRequestHeadersInCheck
            forwarded = _lower(app.requests[-1]["headers"])
            assert forwarded["x-user"] == "alice" and "x-secret" not in forwarded

            status, body, headers_out = await send(f"{url}/protected/b", "deny")
            assert (status, body) == (403, "denied by ext-authz")
            assert _lower(headers_out)["x-reason"] == "header"
            assert [r["path"] for r in app.requests] == ["/protected/a"]  # the denied one never arrived

            before = len(server.checks)
            status, _body, _h = await send(f"{url}/open", "deny")
            assert status == 200  # no CUSTOM rule matches: not checked at all
            assert len(server.checks) == before

            await server.stop()  # provider down, failOpen false: denied (403, the default statusOnError)
            status, _body, _h = await send(f"{url}/protected/c", "allow")
            assert status == 403
            assert (await send(f"{url}/open"))[0] == 200
            assert [r["path"] for r in app.requests] == ["/protected/a", "/open", "/open"]
    finally:
        await server.stop()


async def test_provider_down_with_fail_open_and_status_on_error(tmp_path):
    down_port = (await HttpAuthz().start())
    port = down_port.port
    await down_port.stop()  # nothing listens there
    async with workload(tmp_path, mesh_text("envoyExtAuthzHttp", failOpen=True), port, custom_policy()) as (url, _t, _a):
        assert (await send(f"{url}/protected"))[0] == 200
    async with workload(tmp_path, mesh_text("envoyExtAuthzHttp", statusOnError="503"), port,
                        custom_policy()) as (url, _t, _a):
        assert (await send(f"{url}/protected"))[0] == 503


async def test_missing_or_bad_provider_denies_everything_and_says_why(tmp_path):
    _http, _tcp, ctx = filters_for(mesh_text("envoyExtAuthzHttp"), custom_policy("nope"))
    (problem,) = [p for p in ctx.security.problems if p["name"] == "ext"]
    assert "available providers are ['my-authz'] but found 'nope'" in problem["reason"]
    _http, _tcp, ctx = filters_for(mesh_text("envoyExtAuthzHttp", provider_port=0), custom_policy())
    (problem,) = [p for p in ctx.security.problems if p["name"] == "ext"]
    assert "port must be in the range [1, 65535], found: 0" in problem["reason"]
    mesh = json.dumps({"extensionProviders": [{"name": "my-authz", "envoyExtAuthzHttp": {
        "service": "foo/not-there", "port": 9000}}]})
    async with workload(tmp_path, mesh, 1, custom_policy()) as (url, tcp_port, app):
        status, body, _h = await send(f"{url}/open")
        assert (status, body) == (403, "RBAC: access denied")  # fail closed, even off the rules
        assert await exchange(tcp_port, b"ping") == ""  # and on TCP
        assert app.requests == []


async def test_grpc_provider_checks_http_and_tcp(tmp_path):
    server = await GrpcAuthz().start()
    rules = [{"to": [{"operation": {"paths": ["/protected*"]}}]}]  # on TCP, paths drop out: every connection
    try:
        async with workload(tmp_path, mesh_text("envoyExtAuthzGrpc", timeout="5s"), server.port,
                            custom_policy(rules=rules), grpc_provider=True) as (url, tcp_port, app):
            assert (await send(f"{url}/protected/x", "allow"))[0] == 200
            assert _lower(app.requests[-1]["headers"])["x-user"] == "bob"
            assert (await send(f"{url}/protected/y", "deny"))[:2] == (403, "denied by grpc")
            checked = len(server.checks)
            assert (await send(f"{url}/open", "deny"))[0] == 200
            assert len(server.checks) == checked  # not matching: not checked
            assert await exchange(tcp_port, b"ping") == "db"
            assert not server.checks[-1].attributes.request.http.method  # the TCP check
            server.allow_tcp = False
            assert await exchange(tcp_port, b"ping") == ""
            await server.stop()
            assert (await send(f"{url}/protected/z", "allow"))[0] == 403  # down, failOpen false
    finally:
        await server.stop()


def test_generated_filters_are_istiods():
    http, tcp, _ctx = filters_for(mesh_text("envoyExtAuthzGrpc"), custom_policy())
    rbac, ext = (to_dict(f) for f in http)
    assert rbac["name"] == "envoy.filters.http.rbac" and ext["name"] == "envoy.filters.http.ext_authz"
    shadow = rbac["typed_config"]["shadow_rules"]
    assert list(shadow["policies"]) == ["istio-ext-authz-ns[default]-policy[ext]-rule[0]"]
    assert rbac["typed_config"]["shadow_rules_stat_prefix"] == "istio_ext_authz_"
    assert "rules" not in rbac["typed_config"]  # never enforced by RBAC itself
    cfg = ext["typed_config"]
    assert cfg["grpc_service"]["envoy_grpc"] == {"cluster_name": CLUSTER, "authority": CLUSTER.replace("|", "_.")}
    assert cfg["filter_enabled_metadata"] == {
        "filter": "envoy.filters.http.rbac", "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
        "value": {"string_match": {"prefix": "istio-ext-authz"}}}
    assert [to_dict(f)["name"] for f in tcp] == ["envoy.filters.network.rbac", "envoy.filters.network.ext_authz"]
    # An HTTP provider cannot check TCP: no network filters at all (istiod).
    _http, tcp, _ctx = filters_for(mesh_text("envoyExtAuthzHttp"), custom_policy())
    assert tcp == []


@pytest.mark.parametrize("kind", ["envoyExtAuthzHttp", "envoyExtAuthzGrpc"])
def test_a_sidecars_generated_config_with_custom_passes_envoy_validate(kind: str, tmp_path) -> None:
    """The whole sidecar (CDS, EDS, LDS) the generators give a workload with a CUSTOM policy: the
    ext_authz filter sits before the RBAC filters and names a cluster the proxy's CDS holds."""
    extra: dict[str, Any] = {"timeout": "2s", "failOpen": False, "statusOnError": "503",
                             "includeRequestBodyInCheck": {"maxRequestBytes": 4096, "allowPartialMessage": True}}
    if kind == "envoyExtAuthzHttp":
        extra.update(pathPrefix="/check", includeRequestHeadersInCheck=["x-a", "x-pre*", "*-suf"],
                     includeAdditionalHeadersInCheck={"x-mesh": "1"}, headersToUpstreamOnAllow=["x-user"],
                     headersToDownstreamOnDeny=["x-reason"], headersToDownstreamOnAllow=["x-ok"])
    world = World(parse_mesh_config(mesh_text(kind, **extra)))
    world.apply(reviews_service(), reviews_slice(), SIDECAR_POD, SERVICE,
                authz("ext", action="CUSTOM", provider={"name": "my-authz"}, selector={"matchLabels": {"app": "reviews"}},
                      rules=[{"to": [{"operation": {"paths": ["/protected*"]}}]}]),
                authz("deny", action="DENY", rules=[{"to": [{"operation": {"paths": ["/admin"]}}]}]))
    config = static_bootstrap(world.ctx(), mesh_proxy())
    assert CLUSTER in {c["name"] for c in config["static_resources"]["clusters"]}
    text = json.dumps(config)
    assert '"envoy.filters.http.ext_authz"' in text and "istio-ext-authz-ns[default]-policy[ext]-rule[0]" in text
    inbound = next(ld for ld in config["static_resources"]["listeners"] if ld["name"].startswith("inbound"))
    hcm = next(f for fc in inbound["filter_chains"] for f in fc["filters"]
               if f["name"] == "envoy.filters.network.http_connection_manager")
    names = [f["name"] for f in hcm["typed_config"]["http_filters"]]
    assert names[-4:] == ["envoy.filters.http.rbac", "envoy.filters.http.ext_authz", "envoy.filters.http.rbac",
                          "envoy.filters.http.router"]
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated CUSTOM config:\n{output}"


async def test_a_connected_proxy_whose_custom_policies_disagree_is_reported(tmp_path) -> None:
    """Two CUSTOM policies, each naming a good provider, select one workload: istiod allows one
    provider per workload, so it denies everything; /debug/push_status says so for that proxy."""
    mesh = json.dumps({"extensionProviders": [
        {"name": "a", "envoyExtAuthzHttp": {"service": "foo/ext-authz", "port": AUTHZ_PORT}},
        {"name": "b", "envoyExtAuthzGrpc": {"service": "foo/ext-authz", "port": AUTHZ_PORT}}]})
    cp = ControlPlane(tmp_path, mesh_config=mesh)
    cp.write("config.yaml", yaml.safe_dump_all([
        SERVICE, authz("one", action="CUSTOM", provider={"name": "a"}, rules=[{}]),
        authz("two", action="CUSTOM", provider={"name": "b"}, rules=[{}])]))
    async with cp:
        envoy = Envoy()
        try:
            node = sidecar_node_id("web-1", "default")
            await envoy.start(Envoy.bootstrap(node, cp.xds_port), tmp_path)

            async def reported() -> list[str]:
                status = await cp.debug("/debug/push_status")
                return [c for c in status["conflicts"] if c.startswith(node) and "CUSTOM" in c]

            (line,) = await wait_for(reported, timeout=30, message="the proxy's CUSTOM conflict is reported")
            assert "only 1 provider can be used per workload, found multiple providers: ['a', 'b']" in line
        finally:
            await envoy.stop()
