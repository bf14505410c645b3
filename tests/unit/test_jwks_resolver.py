"""The JWKS resolver against a real HTTP issuer: keys fetched by jwksUri or OpenID discovery,
failures kept visible and retried, rotation and removal noticed, a push asked for on change."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from pilot.model.security_policies import SecurityIndex
from pilot.networking.jwt_authn import FAKE_JWKS, jwt_authn_config
from pilot.security.jwks import JwksResolver
from tests.support.policies import ROOT_NS, request_authn, store_of
from tests.support.wait import wait_for

from .test_authn import Issuer

pytestmark = pytest.mark.timeout(30)


class IssuerServer:
    """An HTTP issuer: /jwks, /.well-known/openid-configuration; `status` simulates outages."""

    def __init__(self) -> None:
        self.jwks: dict = Issuer("RS256").jwks
        self.status = 200
        self.hits: list[str] = []
        self.runner: web.AppRunner | None = None
        self.base = ""

    async def start(self) -> IssuerServer:
        async def handle(request: web.Request) -> web.Response:
            self.hits.append(request.path)
            if self.status != 200:
                return web.Response(status=self.status, text="down")
            if request.path == "/.well-known/openid-configuration":
                return web.json_response({"issuer": self.base, "jwks_uri": f"{self.base}/jwks"})
            if request.path == "/jwks":
                return web.json_response(self.jwks)
            return web.Response(status=404)

        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.base = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()


@pytest.fixture
async def issuer():
    server = await IssuerServer().start()
    yield server
    await server.stop()


def canonical(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


async def test_keys_by_jwks_uri_and_by_discovery_reach_the_jwt_filter(issuer: IssuerServer) -> None:
    store = store_of(request_authn("by-uri", jwtRules=[{"issuer": "https://a", "jwksUri": f"{issuer.base}/jwks"}]),
                     request_authn("by-issuer", jwtRules=[{"issuer": issuer.base}]))
    pushes: list[int] = []
    resolver = JwksResolver(store, lambda: pushes.append(1))
    before = SecurityIndex.build(store, ROOT_NS, resolver.snapshot())
    assert {p["name"] for p in before.problems} == {"by-uri", "by-issuer"}
    assert await resolver.refresh() is True and pushes == [1]
    keys = resolver.snapshot().keys
    assert keys == {f"{issuer.base}/jwks": canonical(issuer.jwks), issuer.base: canonical(issuer.jwks)}
    assert "/.well-known/openid-configuration" in issuer.hits
    index = SecurityIndex.build(store, ROOT_NS, resolver.snapshot())
    assert index.problems == ()
    config = jwt_authn_config(index.for_workload("default", {"app": "web"}))
    assert {p.local_jwks.inline_string for p in config.providers.values()} == {canonical(issuer.jwks)}
    # Nothing due yet: no fetch, no push.
    hits = len(issuer.hits)
    assert await resolver.refresh() is False and len(issuer.hits) == hits and pushes == [1]


async def test_a_failing_issuer_is_reported_retried_and_recovers(issuer: IssuerServer) -> None:
    uri = f"{issuer.base}/jwks"
    store = store_of(request_authn("jwt", jwtRules=[{"issuer": "https://a", "jwksUri": uri}]))
    pushes: list[int] = []
    resolver = JwksResolver(store, lambda: pushes.append(1))
    issuer.status = 503
    await resolver.refresh()
    assert resolver.snapshot().keys == {} and "HTTP 503" in resolver.snapshot().errors[uri]
    [problem] = SecurityIndex.build(store, ROOT_NS, resolver.snapshot()).problems
    assert "HTTP 503" in problem["reason"] and "rejected with 401" in problem["reason"]
    policies = SecurityIndex.build(store, ROOT_NS, resolver.snapshot()).for_workload("default", {})
    assert jwt_authn_config(policies).providers["origins-0"].local_jwks.inline_string == FAKE_JWKS
    issuer.status = 200
    resolver.start()
    try:
        await wait_for(lambda: resolver.snapshot().keys.get(uri), timeout=10, message="retried after the outage")
        assert resolver.snapshot().errors == {}
    finally:
        await resolver.stop()


async def test_rotation_keeps_old_keys_through_bad_documents_and_removal_drops_them(issuer: IssuerServer) -> None:
    uri = f"{issuer.base}/jwks"
    store = store_of(request_authn("jwt", jwtRules=[{"issuer": "https://a", "jwksUri": uri}]))
    pushes: list[int] = []
    resolver = JwksResolver(store, lambda: pushes.append(1), refresh_interval=0.1)
    resolver.start()
    try:
        await wait_for(lambda: resolver.snapshot().keys.get(uri) == canonical(issuer.jwks), timeout=10)
        old = resolver.snapshot().keys[uri]
        issuer.jwks = {"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}  # no signature key: refused
        await wait_for(lambda: "no RSA or EC signature key" in resolver.snapshot().errors.get(uri, ""), timeout=10)
        assert resolver.snapshot().keys[uri] == old
        issuer.jwks = Issuer("ES256").jwks  # the issuer rotates its key
        await wait_for(lambda: resolver.snapshot().keys.get(uri) == canonical(issuer.jwks), timeout=10)
        n = len(pushes)
        store.delete(next(e.key for e in store.list("RequestAuthentication")))
        await wait_for(lambda: resolver.snapshot().keys == {} and len(pushes) > n, timeout=10)
    finally:
        await resolver.stop()


async def test_a_rules_timeout_bounds_its_jwks_fetch(issuer: IssuerServer) -> None:
    """istiod's JWTRule `timeout`: how long the JWKS fetch may take (default 5 s). A slow issuer
    within the rule's timeout is fetched; one beyond it is an error, kept visible."""
    slow = web.Application()

    async def late(request: web.Request) -> web.Response:
        await asyncio.sleep(0.6)
        return web.json_response(issuer.jwks)

    slow.router.add_get("/jwks", late)
    runner = web.AppRunner(slow, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    uri = f"http://127.0.0.1:{runner.addresses[0][1]}/jwks"
    try:
        store = store_of(request_authn("short", jwtRules=[{"issuer": "https://a", "jwksUri": uri, "timeout": "0.1s"}]))
        resolver = JwksResolver(store, lambda: None)
        assert resolver.wanted() == {uri: pytest.approx(0.1)}
        await resolver.refresh()
        assert uri in resolver.snapshot().errors and uri not in resolver.snapshot().keys
        generous = store_of(request_authn("long", jwtRules=[{"issuer": "https://a", "jwksUri": uri, "timeout": "20s"}]))
        resolver = JwksResolver(generous, lambda: None)
        assert await resolver.refresh() is True
        assert resolver.snapshot().keys[uri] == canonical(issuer.jwks)
    finally:
        await runner.cleanup()
