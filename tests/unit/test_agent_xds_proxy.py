"""The agent xDS proxy's pieces that need no Envoy: reading a response's type without decoding it,
and the ECDS rewrite of a module that cannot be fetched (a real, refused loopback connection)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from envoy.config.core.v3 import extension_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.wasm.v3 import wasm_pb2
from envoy.service.discovery.v3 import discovery_pb2

from pilot.agent.wasm import ModuleCache, rewrite_response
from pilot.agent.xds_proxy import ECDS_TYPE, type_url
from tests.support.backends import serve
from tests.support.ports import free_port


def test_the_type_url_is_read_past_large_resources_in_both_protocols():
    sotw = discovery_pb2.DiscoveryResponse(version_info="7", type_url="t/cluster", nonce="n")
    sotw.resources.add().value = b"\xff" * 100_000
    assert type_url(sotw.SerializeToString()) == "t/cluster"
    delta = discovery_pb2.DeltaDiscoveryResponse(system_version_info="1", type_url="t/listener", nonce="x")
    delta.resources.add(name="a", version="1").resource.value = b"\x00" * 300
    assert type_url(delta.SerializeToString()) == "t/listener"
    assert type_url(b"") == "" and type_url(b"\x0a\xff") == ""


def ecds(url: str, fail_open: bool) -> discovery_pb2.DiscoveryResponse:
    vm = wasm_pb2.VmConfig(runtime="envoy.wasm.runtime.v8")
    vm.code.remote.http_uri.uri = url
    vm.code.remote.http_uri.cluster = "_"
    vm.code.remote.http_uri.timeout.FromSeconds(2)
    vm.code.remote.sha256 = "ab" * 32
    vm.environment_variables.key_values["ISTIO_META_WASM_IMAGE_PULL_POLICY"] = "Always"
    plugin = wasm_pb2.PluginConfig(name="p", vm_config=vm,
                                   failure_policy=wasm_pb2.FAIL_OPEN if fail_open else wasm_pb2.FAIL_CLOSED)
    tec = extension_pb2.TypedExtensionConfig(name="default.p")
    tec.typed_config.Pack(http_wasm_pb2.Wasm(config=plugin))
    out = discovery_pb2.DiscoveryResponse(type_url=ECDS_TYPE, nonce="n1", version_info="v1")
    out.resources.add().Pack(tec)
    return out


async def test_an_unreachable_module_becomes_deny_all_or_allow_all_rbac(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/p.wasm"  # nothing listens there
    cache = ModuleCache(str(tmp_path), http_attempts=1)  # retries: tests/unit/test_agent_wasm_fetch.py
    for fail_open in (False, True):
        data = await rewrite_response(ecds(url, fail_open).SerializeToString(), False, cache)
        got = discovery_pb2.DiscoveryResponse.FromString(data)
        assert (got.nonce, got.version_info) == ("n1", "v1")
        tec = extension_pb2.TypedExtensionConfig()
        assert got.resources[0].Unpack(tec) and tec.name == "default.p"
        rbac = rbac_pb2.RBAC()
        assert tec.typed_config.Unpack(rbac)
        # Deny-all: rules present (action ALLOW) with no policy; allow-all: no rules at all.
        assert rbac.HasField("rules") is not fail_open
        assert not rbac.rules.policies


async def test_a_response_without_remote_modules_is_forwarded_byte_for_byte(tmp_path):
    response = ecds("http://127.0.0.1:1/x.wasm", False)
    tec = extension_pb2.TypedExtensionConfig(name="other")
    tec.typed_config.Pack(rbac_pb2.RBAC())
    response.resources[0].Pack(tec)
    data = response.SerializeToString()
    assert await rewrite_response(data, False, ModuleCache(str(tmp_path))) is data


async def test_always_fetches_again_when_the_plugins_resource_version_changes_only_unless_pinned(tmp_path):
    from aiohttp import web
    module = b"\x00asm\x01\x00\x00\x00"
    app = web.Application()

    async def module_file(_: web.Request) -> web.Response:
        return web.Response(body=module)

    app.router.add_get("/m.wasm", module_file)
    runner, port = await serve(app)
    cache = ModuleCache(str(tmp_path))

    async def push(version: str | None, pinned: bool = False) -> str:
        response = ecds(f"http://127.0.0.1:{port}/m.wasm", False)
        tec = extension_pb2.TypedExtensionConfig()
        response.resources[0].Unpack(tec)
        filt = http_wasm_pb2.Wasm()
        tec.typed_config.Unpack(filt)
        filt.config.vm_config.code.remote.sha256 = hashlib.sha256(module).hexdigest() if pinned else ""
        env = filt.config.vm_config.environment_variables.key_values
        if version is not None:
            env["ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"] = version
        tec.typed_config.Pack(filt)
        response.resources[0].Pack(tec)
        got = discovery_pb2.DiscoveryResponse.FromString(
            await rewrite_response(response.SerializeToString(), False, cache))
        got.resources[0].Unpack(tec)
        tec.typed_config.Unpack(filt)
        assert not filt.config.vm_config.environment_variables.key_values  # both stripped
        return filt.config.vm_config.code.local.filename

    try:
        path = await push("5")
        assert Path(path).read_bytes() == module and cache.fetches == 1
        assert await push("5") == path and cache.fetches == 1  # another push of the same plugin
        await push("6")
        assert cache.fetches == 2  # the plugin changed
        await push(None)
        await push(None)
        assert cache.fetches == 4  # no version to compare (another control plane): every time
        # As istio-agent: a module pinned by sha256 is the same module whatever the policy.
        assert await push("7", pinned=True) == path and await push("8", pinned=True) == path
        assert cache.fetches == 4
        text = cache.metrics.render()
        assert 'istio_agent_wasm_remote_fetch_count{result="success"} 4' in text
        assert "istio_agent_wasm_cache_entries 1" in text
    finally:
        await runner.cleanup()
