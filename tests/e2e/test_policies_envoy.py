"""AuthorizationPolicy and RequestAuthentication enforced by a real Envoy, with real requests.

The inbound listener is not generated yet, so the filters the builders make for one workload sit in
a static bootstrap (tests/support/static_config.policy_bootstrap): an HCM with jwt_authn + RBAC in
front of an HTTP backend, and the network RBAC in front of a TCP backend. Tokens are real JWTs
signed by a test issuer. Peer identities (principals, namespaces) need mTLS and are covered once the
inbound side terminates it.
"""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager

import aiohttp
import pytest

from pilot.networking.policy_filters import inbound_http_filters, inbound_network_filters
from tests.e2e.test_tcp_tls_routes import TcpBackend, exchange
from tests.support.backends import HttpBackend
from tests.support.envoy import Envoy
from tests.support.policies import authz, request_authn, workload_policies
from tests.support.ports import free_ports
from tests.support.static_config import policy_bootstrap
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(60)

ISS = "https://issuer.example"


async def send(method: str, url: str, token: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s, \
            s.request(method, url, headers=headers) as r:
        body = await r.text()
        try:
            return r.status, json.loads(body)
        except ValueError:
            return r.status, {"text": body}


def policies(issuer: Issuer, http_port: int, tcp_port: int, deny_ports: bool = True) -> list[dict]:
    deny_to: dict = {"paths": ["/admin", "/admin/*"]}
    if deny_ports:  # istiod's advice: name the HTTP port, or the rule denies every TCP connection
        deny_to["ports"] = [str(http_port)]
    return [
        request_authn("jwt", selector={"matchLabels": {"app": "web"}}, jwtRules=[{
            "issuer": ISS, "jwks": json.dumps(issuer.jwks), "audiences": ["api"],
            "outputPayloadToHeader": "x-jwt-payload"}]),
        authz("no-admin", action="DENY", rules=[{"to": [{"operation": deny_to}]}]),
        authz("access", selector={"matchLabels": {"app": "web"}}, rules=[
            {"to": [{"operation": {"methods": ["GET"]}}]},
            {"from": [{"source": {"requestPrincipals": [f"{ISS}/*"]}}],
             "to": [{"operation": {"methods": ["POST"], "paths": ["/orders"]}}],
             "when": [{"key": "request.auth.claims[role]", "values": ["writer"]}]},
            {"from": [{"source": {"ipBlocks": ["127.0.0.1"]}}], "to": [{"operation": {"ports": [str(tcp_port)]}}]},
        ]),
    ]


@asynccontextmanager
async def workload(tmp_path, deny_ports: bool = True):
    """An inbound Envoy for workload default/web (labels app=web) with `policies`: yields
    (issuer, HTTP base URL, TCP port, HTTP backend)."""
    issuer = Issuer("RS256", issuer=ISS)
    app, db = await HttpBackend("app").start(), await TcpBackend("db").start()
    http_port, tcp_port = free_ports(2)  # both are inputs of the rules
    wp = workload_policies(*policies(issuer, http_port, tcp_port, deny_ports), labels={"app": "web"})
    config = policy_bootstrap(inbound_http_filters(wp, "cluster.local"), inbound_network_filters(wp, "cluster.local"),
                              app.port, db.port)
    for listener, port in zip(config["static_resources"]["listeners"], (http_port, tcp_port), strict=True):
        listener["address"]["socket_address"]["port_value"] = port
    envoy = Envoy()
    try:
        await envoy.start(config, tmp_path)
        await envoy.wait_ready()
        assert await envoy.listener_ports() == {"http": http_port, "tcp": tcp_port}
        yield issuer, f"http://127.0.0.1:{http_port}", tcp_port, app
    finally:
        await envoy.stop()
        await app.stop()
        await db.stop()


@pytest.fixture
async def inbound(tmp_path):
    async with workload(tmp_path) as w:
        yield w


async def test_deny_and_allow_decide_by_path_and_method(inbound):
    issuer, url, _tcp, app = inbound
    assert (await send("GET", f"{url}/hello"))[0] == 200
    assert await send("POST", f"{url}/hello") == (403, {"text": "RBAC: access denied"})  # ALLOW: GET only
    assert (await send("DELETE", f"{url}/hello"))[0] == 403
    assert (await send("GET", f"{url}/admin"))[0] == 403  # DENY wins over the GET rule
    assert (await send("GET", f"{url}/admin/users", issuer.token(aud=["api"])))[0] == 403
    assert (await send("GET", f"{url}/administrator"))[0] == 200  # exact and `/admin/*` only
    assert [r["method"] for r in app.requests] == ["GET", "GET"]  # nothing denied reached the app


async def test_jwt_valid_passes_invalid_is_401_missing_passes(inbound):
    issuer, url, _tcp, _app = inbound
    status, body = await send("GET", f"{url}/hello", issuer.token(aud=["api"], sub="alice"))
    assert status == 200, body
    headers = {k.lower(): v for k, v in body["headers"].items()}
    payload = json.loads(_b64(headers["x-jwt-payload"]))
    assert payload["sub"] == "alice" and payload["iss"] == ISS  # the verified payload reached the app
    other_key = Issuer("RS256", issuer=ISS)
    for bad in (other_key.token(aud=["api"]),  # signed by a key the JWKS does not hold
                issuer.token(aud=["api"], exp=int(time.time()) - 120, iat=int(time.time()) - 300),  # expired
                "not.a.jwt"):
        assert (await send("GET", f"{url}/hello", bad))[0] == 401, bad
    # A valid token for another audience: Envoy's jwt_authn answers 403 (not RBAC's denial).
    assert await send("GET", f"{url}/hello", issuer.token(aud=["other"])) == (
        403, {"text": "Audiences in Jwt are not allowed"})
    assert (await send("GET", f"{url}/hello"))[0] == 200  # no token: RequestAuthentication alone lets it pass


async def test_request_principal_and_claims_make_a_token_required(inbound):
    issuer, url, _tcp, _app = inbound
    assert (await send("POST", f"{url}/orders"))[0] == 403  # requestPrincipals: no token, no access
    assert (await send("POST", f"{url}/orders", issuer.token(aud=["api"], role="writer")))[0] == 200
    assert (await send("POST", f"{url}/orders", issuer.token(aud=["api"], role=["reader", "writer"])))[0] == 200
    assert (await send("POST", f"{url}/orders", issuer.token(aud=["api"], role="reader")))[0] == 403
    assert (await send("POST", f"{url}/orders", issuer.token(aud=["api"])))[0] == 403  # no role claim
    assert (await send("POST", f"{url}/orders", issuer.token(aud=["api"], role="writer", exp=1)))[0] == 401


async def test_tcp_connections_follow_the_network_rbac(tmp_path):
    async with workload(tmp_path) as (_issuer, url, tcp_port, _app):
        # The ipBlocks+ports rule allows this connection; the HTTP-only ALLOW rules were dropped on
        # TCP, and the DENY rule names only the HTTP port.
        assert await exchange(tcp_port, b"ping") == "db"
        assert (await send("GET", f"{url}/admin"))[0] == 403
    async with workload(tmp_path, deny_ports=False) as (_issuer, url, tcp_port, _app):
        # A DENY rule made only of HTTP attributes keeps nothing on TCP: it denies every connection.
        assert await exchange(tcp_port, b"ping") == ""
        assert (await send("GET", f"{url}/admin"))[0] == 403 and (await send("GET", f"{url}/x"))[0] == 200


def _b64(text: str) -> str:
    import base64
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
