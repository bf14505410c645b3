"""AuthorizationPolicy on an ingress gateway, enforced by a real router Envoy.

As istiod does, the AuthorizationPolicies selecting the router (by `selector`, or by `targetRefs`
to its Gateway through the `gateway.networking.k8s.io/gateway-name` label) sit on its listeners:
HTTP filters in front of the router, network RBAC in front of tcp_proxy on TCP and TLS
passthrough chains. The router's ProxyConfig (PROXY_CONFIG node metadata, as pilot-agent sends
it) says `gatewayTopology.numTrustedProxies: 1`, so `remoteIpBlocks` sees the client address in
X-Forwarded-For while `ipBlocks` sees the connection's peer (127.0.0.1), as on istiod's gateways.
"""

from __future__ import annotations

import asyncio
import ssl
import textwrap

import pytest
import yaml

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.e2e.test_ext_authz_envoy import HttpAuthz
from tests.e2e.test_gateway import GW_NS, ROUTER, GatewayEnv, gateway_yaml, virtual_service_yaml
from tests.e2e.test_tcp_tls_routes import TcpBackend, exchange
from tests.support.backends import HttpBackend
from tests.support.certs import Issued, issue, make_ca
from tests.support.envoy import Envoy
from tests.support.policies import authz
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(120)

LABELS = {"istio": "ingressgateway", "gateway.networking.k8s.io/gateway-name": "edge"}
SELECTOR = {"matchLabels": {"istio": "ingressgateway"}}


async def get(port: int, path: str, **headers: str) -> int:
    """The status of a GET through the gateway (Host: shop.example.com)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return await _status(reader, writer, f"GET {path} HTTP/1.1\r\nHost: shop.example.com\r\n{extra}")


async def _status(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: str) -> int:
    """Send a request (its head, without the closing headers) and read the response's status."""
    try:
        writer.write(f"{head}Connection: close\r\n\r\n".encode())
        await writer.drain()
        response = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        return int(response.split()[1])
    finally:
        writer.close()


async def tls_status(port: int, sni: str, ca: Issued) -> int | str:
    """A GET over TLS passed through to the backend by SNI: its status, or "closed" when the
    gateway drops the connection before the handshake completes."""
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=sni), 5)
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError, OSError):
        return "closed"
    return await _status(reader, writer, f"GET / HTTP/1.1\r\nHost: {sni}\r\n")


def policy(name: str, **spec) -> str:
    return yaml.safe_dump(authz(name, GW_NS, **spec))


def mesh_with_provider(port: int) -> str:
    return textwrap.dedent(f"""\
        extensionProviders:
        - name: gw-authz
          envoyExtAuthzHttp: {{service: foo/ext-authz, port: {port}, includeRequestHeadersInCheck: [x-ext-authz]}}
        """)


@pytest.fixture
async def env(tmp_path):
    ca = make_ca()
    tls_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert = issue(ca, ["allowed.example.com", "denied.example.com"])
    (tmp_path / "tls.crt").write_bytes(cert.cert_pem)
    (tmp_path / "tls.key").write_bytes(cert.key_pem)
    tls_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    backends = {"alpha": await HttpBackend("alpha").start(),
                "secure": await HttpBackend("secure", ssl_context=tls_ctx).start()}
    db = await TcpBackend("db").start()
    checker = await HttpAuthz().start()
    e = GatewayEnv(tmp_path, backends)
    e.ca, e.db, e.checker = ca, db, checker  # type: ignore[attr-defined]
    e.cp.mesh_config = mesh_with_provider(checker.port)
    e.cp.write("svc-db.yaml", service_yaml("db", 7000, port_name="tcp") + "---\n"
               + endpoint_slice_yaml("db", db.port, port_name="tcp"))
    e.cp.write("svc-authz.yaml", service_yaml("ext-authz", checker.port, namespace="foo") + "---\n"
               + endpoint_slice_yaml("ext-authz", checker.port, namespace="foo"))
    try:
        yield e
    finally:
        await e.envoy.stop()
        await e.cp.stop()
        for b in backends.values():
            await b.stop()
        db.server.close()  # type: ignore[union-attr]
        await checker.stop()


async def start_router(env: GatewayEnv, trusted_hops: int) -> None:
    await env.start(envoy=False)
    metadata = {"NAMESPACE": GW_NS, "LABELS": LABELS,
                "PROXY_CONFIG": {"gatewayTopology": {"numTrustedProxies": trusted_hops}}}
    await env.envoy.start(Envoy.bootstrap(ROUTER, env.cp.xds_port, metadata=metadata,
                                          cluster="istio-ingressgateway.istio-system"), env.tmp_path)
    await env.envoy.wait_ready()


def write_gateway(env: GatewayEnv) -> tuple[int, int, int]:
    http_port, tcp_port, tls_port = free_ports(3)
    env.cp.write("gateway.yaml", gateway_yaml("edge", f"""\
        - port: {{number: {http_port}, name: http, protocol: HTTP}}
          hosts: ["*/shop.example.com"]
        - port: {{number: {tcp_port}, name: tcp, protocol: TCP}}
          hosts: ["*"]
        - port: {{number: {tls_port}, name: tls, protocol: TLS}}
          hosts: ["*.example.com"]
          tls: {{mode: PASSTHROUGH}}
        """))
    env.cp.write("vs.yaml", virtual_service_yaml("edge", f"""\
        hosts: [shop.example.com, allowed.example.com, denied.example.com]
        gateways: [{GW_NS}/edge]
        http:
        - route: [{{destination: {{host: alpha}}}}]
        tcp:
        - match: [{{port: {tcp_port}}}]
          route: [{{destination: {{host: db, port: {{number: 7000}}}}}}]
        tls:
        - match: [{{sniHosts: [allowed.example.com, denied.example.com]}}]
          route: [{{destination: {{host: secure, port: {{number: 8000}}}}}}]
        """))
    return http_port, tcp_port, tls_port


async def test_allow_and_deny_on_http_tcp_and_tls_passthrough(env: GatewayEnv):
    http_port, tcp_port, tls_port = write_gateway(env)
    env.cp.write("policies.yaml", "---\n".join([
        # `ports` keeps this DENY off the TCP ports: a DENY rule of HTTP-only attributes denies
        # every TCP connection (istiod's rule, which its validation warns about).
        policy("deny-admin", selector=SELECTOR, action="DENY",
               rules=[{"to": [{"operation": {"paths": ["/admin*"], "ports": [str(http_port)]}}]}]),
        # remoteIpBlocks: the client address X-Forwarded-For names (one trusted hop).
        policy("deny-remote", selector=SELECTOR, action="DENY",
               rules=[{"from": [{"source": {"remoteIpBlocks": ["192.0.2.0/24"]}}]}]),
        # ipBlocks: the connection's peer, whatever X-Forwarded-For says.
        policy("deny-peer", selector=SELECTOR, action="DENY",
               rules=[{"from": [{"source": {"ipBlocks": ["198.51.100.0/24"]}}]}]),
        policy("allow-some", selector=SELECTOR, action="ALLOW", rules=[
            {"to": [{"operation": {"paths": ["/public*", "/admin*"]}}]},
            {"when": [{"key": "request.headers[x-user]", "values": ["alice"]}]},
            {"to": [{"operation": {"ports": [str(tcp_port)]}}]},
            {"to": [{"operation": {"ports": [str(tls_port)]}}],
             "when": [{"key": "connection.sni", "values": ["allowed.example.com"]}]},
        ]),
    ]))
    await start_router(env, trusted_hops=1)

    async def enforced():
        return await get(http_port, "/public") == 200 and await get(http_port, "/private") == 403

    await env.until(enforced, "the gateway allows /public and denies /private")
    assert await get(http_port, "/private", x_user="alice") == 200  # a header rule
    assert await get(http_port, "/admin/users") == 403  # DENY wins over ALLOW
    assert await get(http_port, "/public", x_forwarded_for="192.0.2.9") == 403
    assert await get(http_port, "/public", x_forwarded_for="203.0.113.1") == 200
    assert await get(http_port, "/public", x_forwarded_for="198.51.100.5") == 200  # ipBlocks: the peer
    assert await exchange(tcp_port, b"hello") == "db"
    assert await tls_status(tls_port, "allowed.example.com", env.ca) == 200  # type: ignore[attr-defined]
    assert await tls_status(tls_port, "denied.example.com", env.ca) == "closed"  # type: ignore[attr-defined]

    # A DENY by peer address on the TCP port closes TCP connections; HTTP is untouched.
    env.cp.write("deny-tcp.yaml", policy("deny-tcp", selector=SELECTOR, action="DENY", rules=[
        {"from": [{"source": {"ipBlocks": ["127.0.0.1/32"]}}], "to": [{"operation": {"ports": [str(tcp_port)]}}]}]))

    async def tcp_denied():
        return await exchange(tcp_port, b"hello") == ""

    await env.until(tcp_denied, "the gateway closes denied TCP connections")
    assert await get(http_port, "/public") == 200

    # The RBAC filters are in the config Envoy holds: HTTP on the HTTP chain, network on the others.
    dump = await env.envoy.config_dump(resource="dynamic_listeners")
    by_name = {ld["name"]: ld["active_state"]["listener"] for ld in dump["configs"]}
    hcm = by_name[f"0.0.0.0_{http_port}"]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["xff_num_trusted_hops"] == 1
    assert [f["name"] for f in hcm["http_filters"]].count("envoy.filters.http.rbac") == 2  # DENY, ALLOW
    for port in (tcp_port, tls_port):
        for chain in by_name[f"0.0.0.0_{port}"]["filter_chains"]:
            assert [f["name"] for f in chain["filters"]][-3:] == [
                "envoy.filters.network.rbac", "envoy.filters.network.rbac", "envoy.filters.network.tcp_proxy"]


async def test_target_refs_custom_and_audit_on_the_gateway(env: GatewayEnv):
    """targetRefs to the Gateway select its router; CUSTOM asks the ext_authz provider; a CUSTOM
    policy naming an unknown provider denies everything (istiod's fail-closed); AUDIT logs only."""
    http_port, _tcp, _tls = write_gateway(env)
    target = [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"}]
    env.cp.write("policies.yaml", "---\n".join([
        policy("ext", targetRefs=target, action="CUSTOM", provider={"name": "gw-authz"},
               rules=[{"to": [{"operation": {"paths": ["/checked*"]}}]}]),
        policy("audit", selector=SELECTOR, action="AUDIT", rules=[{"to": [{"operation": {"paths": ["/x"]}}]}]),
        # A targetRef naming another Gateway selects nothing here.
        policy("other", targetRefs=[{**target[0], "name": "other"}], action="DENY", rules=[{}]),
    ]))
    await start_router(env, trusted_hops=0)
    checker: HttpAuthz = env.checker  # type: ignore[attr-defined]

    async def checked():
        return await get(http_port, "/checked", x_ext_authz="deny") == 403

    await env.until(checked, "the gateway asks the ext_authz provider")
    assert await get(http_port, "/checked") == 200
    assert {c["path"] for c in checker.checks} == {"/checked"}
    assert await get(http_port, "/x") == 200  # AUDIT never denies
    assert {c["path"] for c in checker.checks} == {"/checked"}  # only what CUSTOM rules match is checked

    # With numTrustedProxies 0, remoteIpBlocks sees the peer: X-Forwarded-For cannot dodge or fake it.
    env.cp.write("remote.yaml", policy("remote", selector=SELECTOR, action="DENY",
                                       rules=[{"from": [{"source": {"remoteIpBlocks": ["192.0.2.0/24"]}}]}]))
    env.cp.write("remote-peer.yaml", policy("remote-peer", selector=SELECTOR, action="DENY",
                                            rules=[{"from": [{"source": {"remoteIpBlocks": ["127.0.0.1/32"]}}],
                                                    "to": [{"operation": {"paths": ["/peer"]}}]}]))

    async def peer_denied():
        return await get(http_port, "/peer", x_forwarded_for="203.0.113.1") == 403

    await env.until(peer_denied, "remoteIpBlocks matches the peer without trusted hops")
    assert await get(http_port, "/y", x_forwarded_for="192.0.2.9") == 200

    env.cp.write("policies.yaml", policy("ext", targetRefs=target, action="CUSTOM", provider={"name": "nobody"},
                                         rules=[{"to": [{"operation": {"paths": ["/checked*"]}}]}]))

    async def all_denied():
        return await get(http_port, "/y") == 403

    await env.until(all_denied, "a CUSTOM policy without a provider denies everything")
    problems = (await env.cp.debug("/debug/push_status"))["policyProblems"]
    assert any(p["name"] == "ext" and "nobody" in p["reason"] for p in problems), problems
