"""The agent's http(s) Wasm fetch against real loopback HTTP servers: BLOCKED_CIDRS_IN_WASM_FETCH
(redirect hops included), istio-agent's retries of failed downloads, and the purge of modules
unused for WASM_MODULE_EXPIRY (with an injected clock)."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Self

import pytest
from aiohttp import web

from pilot.agent.config import BLOCKED_CIDRS_IN_WASM_FETCH, WASM_HTTP_REQUEST_MAX_RETRIES, blocked_cidrs
from pilot.agent.wasm import FetchError, ModuleCache
from tests.support.backends import serve

MODULE_A = b"\x00asm\x01\x00\x00\x00" + b"a"
MODULE_B = b"\x00asm\x01\x00\x00\x00" + b"b"


class Server:
    """Serves /a.wasm and /b.wasm; `failures[path]` answers that many requests with that status
    first; /redirect sends the client to `redirect_to`. Counts requests per path."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.served: Counter[str] = Counter()
        self.failures: dict[str, tuple[int, int]] = {}  # path -> (status, how many more times)
        self.redirect_to = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.served[request.path] += 1
        status, left = self.failures.get(request.path, (0, 0))
        if left:
            self.failures[request.path] = (status, left - 1)
            return web.Response(status=status, text="not now")
        if request.path == "/redirect":
            raise web.HTTPFound(self.redirect_to)
        body = {"/a.wasm": MODULE_A, "/b.wasm": MODULE_B}.get(request.path)
        return web.Response(body=body) if body is not None else web.Response(status=404)

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/{name}", self._handle)
        self.runner, self.port = await serve(app, self.host)
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.runner.cleanup()

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"


async def test_blocked_cidrs_are_never_connected_to_not_even_through_a_redirect(tmp_path):
    async with Server("127.0.0.1") as allowed, Server("127.0.0.2") as blocked:
        extra = BLOCKED_CIDRS_IN_WASM_FETCH.get({"BLOCKED_CIDRS_IN_WASM_FETCH": " 10.0.0.0/8, 127.0.0.2/32 "})
        cache = ModuleCache(str(tmp_path), blocked=extra, initial_backoff=0.001)
        with pytest.raises(FetchError, match=r"127\.0\.0\.2 is in the blocked CIDR range 127\.0\.0\.2/32"):
            await cache.get(blocked.url("/a.wasm"), "", always=False, timeout=10)
        allowed.redirect_to = blocked.url("/a.wasm")
        with pytest.raises(FetchError, match="blocked CIDR range"):
            await cache.get(allowed.url("/redirect"), "", always=False, timeout=10)
        assert blocked.served["/a.wasm"] == 0  # refused before any connection, and not retried
        assert allowed.served["/redirect"] == 1
        # Outside the blocked ranges (loopback is not blocked by default, as istio-agent): fetched.
        path = await cache.get(allowed.url("/a.wasm"), "", always=False, timeout=10)
        assert Path(path).read_bytes() == MODULE_A
        assert await ModuleCache(str(tmp_path / "2")).get(blocked.url("/b.wasm"), "", always=False, timeout=10)


def test_an_unparsable_blocked_cidr_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match=r"BLOCKED_CIDRS_IN_WASM_FETCH='10\.0\.0\.0/8,10\.1/33'.*not a CIDR"):
        BLOCKED_CIDRS_IN_WASM_FETCH.get({"BLOCKED_CIDRS_IN_WASM_FETCH": "10.0.0.0/8,10.1/33"})
    assert blocked_cidrs("") == ()
    assert WASM_HTTP_REQUEST_MAX_RETRIES.get({}) == 5  # istio-agent's default


async def test_a_retryable_failure_is_tried_again_up_to_the_attempt_count_and_a_404_is_not(tmp_path):
    async with Server() as srv:
        cache = ModuleCache(str(tmp_path), http_attempts=3, initial_backoff=0.001)
        srv.failures["/a.wasm"] = (503, 2)
        path = await cache.get(srv.url("/a.wasm"), hashlib.sha256(MODULE_A).hexdigest(), always=False, timeout=10)
        assert Path(path).read_bytes() == MODULE_A and srv.served["/a.wasm"] == 3
        srv.failures["/b.wasm"] = (502, 10)
        with pytest.raises(FetchError, match=r"failed after 3 attempt\(s\), last error: HTTP 502"):
            await cache.get(srv.url("/b.wasm"), "", always=False, timeout=10)
        assert srv.served["/b.wasm"] == 3
        for status in (404, 501):  # not retryable (istio-agent's rule)
            srv.failures["/b.wasm"] = (status, 1)
            with pytest.raises(FetchError, match=rf"after 1 attempt\(s\), last error: HTTP {status}"):
                await cache.get(srv.url("/b.wasm"), "", always=False, timeout=10)
        assert srv.served["/b.wasm"] == 5
        assert 'istio_agent_wasm_remote_fetch_count{result="download_failure"} 3' in cache.metrics.render()


async def test_modules_unused_for_the_expiry_are_purged_and_fetched_again_on_next_use(tmp_path):
    now = [1000.0]
    async with Server() as srv:
        cache = ModuleCache(str(tmp_path), module_expiry=100, clock=lambda: now[0])
        a = await cache.get(srv.url("/a.wasm"), "", always=False, timeout=10)
        b = await cache.get(srv.url("/b.wasm"), "", always=False, timeout=10)
        now[0] += 60
        assert await cache.get(srv.url("/a.wasm"), "", always=False, timeout=10) == a  # a hit: used again
        assert srv.served == Counter({"/a.wasm": 1, "/b.wasm": 1})
        now[0] += 41  # b unused for 101 > 100, a for 41
        assert cache.purge() == [Path(b)]
        assert not Path(b).exists() and Path(a).exists()
        assert "istio_agent_wasm_cache_entries 1" in cache.metrics.render()
        # Its URL's checksum went with it: the next use downloads the module again.
        assert await cache.get(srv.url("/b.wasm"), "", always=False, timeout=10) == b
        assert await cache.get(srv.url("/a.wasm"), "", always=False, timeout=10) == a
        assert srv.served == Counter({"/a.wasm": 1, "/b.wasm": 2})
        assert Path(b).read_bytes() == MODULE_B
        assert cache.purge() == []  # exactly at the expiry is not past it
        now[0] += 100
        assert cache.purge() == []
        now[0] += 0.5
        assert sorted(cache.purge()) == sorted([Path(a), Path(b)])
