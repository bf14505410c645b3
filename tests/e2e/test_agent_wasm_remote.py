"""WasmPlugin with a module served over HTTP: the real pilot-agent's xDS proxy fetches it, checks
its sha256, caches it and hands Envoy a local file; a module that does not match applies the
plugin's failStrategy (FAIL_CLOSE: 403 for every request; FAIL_OPEN: traffic passes without it)."""

from __future__ import annotations

import hashlib
import json
import textwrap
from typing import Self

import aiohttp
import pytest
from aiohttp import web

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.e2e.test_pilot_agent import NAMESPACE, agent, plane
from tests.support.backends import HttpBackend, serve
from tests.support.ports import free_port
from tests.support.wait import wait_for
from tests.support.wasm_module import add_response_header_module
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(120)
HOST = f"backend.{NAMESPACE}.svc.cluster.local"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer("ES256")


class ModuleServer:
    """The module over HTTP on loopback, counting downloads."""

    def __init__(self, module: bytes) -> None:
        self.module = module
        self.downloads = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _get(self, _: web.Request) -> web.Response:
        self.downloads += 1
        return web.Response(body=self.module, content_type="application/wasm")

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/plugin.wasm", self._get)
        self._runner, self.port = await serve(app)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/plugin.wasm"


def plugin(url: str, sha256: str, extra: str = "") -> str:
    return textwrap.dedent(f"""\
        apiVersion: extensions.istio.io/v1alpha1
        kind: WasmPlugin
        metadata: {{name: remote, namespace: istio-system}}
        spec:
          url: {url}
          phase: STATS
        """) + (f"  sha256: {sha256}\n" if sha256 else "") + textwrap.indent(textwrap.dedent(extra), "  ")


async def get(port: int) -> tuple[int, dict[str, str]] | None:
    try:
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session,
                    session.get(f"http://127.0.0.1:{port}/", headers={"Host": HOST}) as resp):
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}
    except aiohttp.ClientError:
        return None


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_a_module_served_over_http_is_fetched_verified_and_its_fail_strategy_applied(tmp_path, issuer, delta):
    module = add_response_header_module("x-wasm-remote", "fetched")
    good = hashlib.sha256(module).hexdigest()
    wrong = hashlib.sha256(b"something else").hexdigest()
    port = free_port()
    async with plane(tmp_path, issuer) as cp, HttpBackend("backend") as backend, ModuleServer(module) as server:
        cp.write("backend.yaml", service_yaml("backend", port, namespace=NAMESPACE) + "---\n"
                 + endpoint_slice_yaml("backend", backend.port, namespace=NAMESPACE))
        async with agent(tmp_path, cp, issuer, env={"ISTIO_DELTA_XDS": str(delta).lower()}) as a:
            await a.wait_ready()

            async def answer(status: int, header: str | None):
                got = await get(port)
                if got is None or got[0] != status:
                    return None
                return got if got[1].get("x-wasm-remote") == header else None

            await wait_for(lambda: answer(200, None), timeout=30, message=f"routed\n{a.log_tail()}")

            # 1. The agent fetches the module; Envoy runs it from the agent's cache.
            cp.write("plugin.yaml", plugin(server.url, good))
            await wait_for(lambda: answer(200, "fetched"), timeout=30,
                           message=f"the module's header\n{a.log_tail()}\n{cp.log_tail()}")
            assert server.downloads == 1
            ecds = json.dumps(await a.admin_json("/config_dump?resource=ecds_filters"))
            assert "var/lib/istio/data/" in ecds and server.url not in ecds, ecds

            # 2. IfNotPresent (the default): a change of the plugin's config reuses the cached module.
            cp.write("plugin.yaml", plugin(server.url, good, "pluginConfig: {v: 2}\n"))

            async def pushed() -> bool:
                dump = json.dumps(await a.admin_json("/config_dump?resource=ecds_filters"))
                return '\\"v\\":2' in dump

            await wait_for(pushed, timeout=30, message="new pluginConfig reached Envoy")
            assert (await answer(200, "fetched")) is not None
            assert server.downloads == 1

            # 3. Always, unpinned (as istio-agent, a module pinned by sha256 is never fetched
            # again): fetched again, the plugin having changed (its resource version).
            cp.write("plugin.yaml", plugin(server.url, "", "imagePullPolicy: Always\n"))
            await wait_for(lambda: server.downloads >= 2, timeout=30, message=f"refetched\n{a.log_tail()}")
            await wait_for(lambda: answer(200, "fetched"), timeout=30, message="still applied")
            downloads = server.downloads
            cp.write("plugin.yaml", plugin(server.url, "", "imagePullPolicy: Always\npluginConfig: {v: 3}\n"))
            await wait_for(lambda: server.downloads > downloads, timeout=30, message="refetched on change")

            # 4. A sha256 the module does not have: FAIL_CLOSE (the default) denies every request.
            cp.write("plugin.yaml", plugin(server.url, wrong))
            await wait_for(lambda: answer(403, None), timeout=30, message=f"fail closed\n{a.log_tail()}")
            assert "cannot fetch Wasm module" in a.log_text()

            # 5. FAIL_OPEN: traffic passes, without the plugin.
            cp.write("plugin.yaml", plugin(server.url, wrong, "failStrategy: FAIL_OPEN\n"))
            await wait_for(lambda: answer(200, None), timeout=30, message=f"fail open\n{a.log_tail()}")
