"""EnvoyFilter `applyTo: EXTENSION_CONFIG` with a real Envoy, as istiod serves it: the ADD patch
is a TypedExtensionConfig served over ECDS, an HTTP filter inserted with `config_discovery`
names it, and the Lua in it adds a header to real responses. Changing the extension config
alone changes the response (ECDS push); removing the EnvoyFilter removes both."""

from __future__ import annotations

import json
import textwrap

import aiohttp
import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(120)

HCM = "envoy.filters.network.http_connection_manager"
LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"


def ecds_filter(port: int, value: str) -> str:
    code = f"function envoy_on_response(handle)\n  handle:headers():add('x-ecds', '{value}')\nend\n"
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1alpha3
        kind: EnvoyFilter
        metadata: {{name: ecds, namespace: default}}
        spec:
          configPatches:
          - applyTo: EXTENSION_CONFIG
            patch:
              operation: ADD
              value:
                name: my-lua
                typed_config:
                  "@type": {LUA}
                  inlineCode: {json.dumps(code)}
          - applyTo: HTTP_FILTER
            match:
              context: SIDECAR_OUTBOUND
              listener:
                portNumber: {port}
                filterChain:
                  filter:
                    name: {HCM}
                    subFilter: {{name: envoy.filters.http.router}}
            patch:
              operation: INSERT_BEFORE
              value:
                name: my-lua
                config_discovery:
                  config_source: {{ads: {{}}, initial_fetch_timeout: 0s}}
                  type_urls: ["{LUA}"]
        """)


async def header(port: int) -> str | None:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s, \
                s.get(f"http://127.0.0.1:{port}/", headers={"Host": fqdn("alpha")}) as r:
            await r.read()
            return r.headers.get("x-ecds", "") if r.status == 200 else None
    except aiohttp.ClientError:
        return None


async def _gone(cp: ControlPlane) -> bool:
    return 'name="default/ecds"' not in await cp.metrics()


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_an_extension_config_added_by_envoy_filter_is_served_over_ecds(tmp_path, delta):
    backend = await HttpBackend("a").start()
    cp = ControlPlane(tmp_path)
    port = free_port()
    cp.write("svc.yaml", service_yaml("alpha", port))
    cp.write("eps.yaml", endpoint_slice_yaml("alpha", backend.port))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(sidecar_node_id("app-1"), cp.xds_port, delta=delta), tmp_path)

        async def has(value: str):
            return await header(port) == value or None

        await wait_for(lambda: has(""), 20, message=f"routed\n{envoy.log_tail(10)}\n{cp.log_tail(10)}")
        cp.write("ecds.yaml", ecds_filter(port, "one"))
        await wait_for(lambda: has("one"), 20, message=f"ECDS Lua header\n{envoy.log_tail(10)}\n{cp.log_tail(10)}")
        dump = await envoy.config_dump(resource="ecds_filters")
        names = [c["ecds_filter"]["name"] for c in dump.get("configs", [])]
        assert names == ["my-lua"], dump
        # The control plane's own dump of what it sends this proxy lists the same extension config
        # as Envoy's does (istioctl proxy-config compares the two).
        sent = await cp.debug(f"/debug/config_dump?proxyID={sidecar_node_id('app-1')}")
        ecds = next(c for c in sent["configs"] if c["@type"].endswith("EcdsConfigDump"))
        assert [c["ecds_filter"]["name"] for c in ecds["ecds_filters"]] == ["my-lua"], ecds
        assert "envoy_on_response" in json.dumps(ecds)
        listeners = json.dumps(await envoy.config_dump(resource="dynamic_listeners"))
        assert "config_discovery" in listeners and "inline_code" not in listeners  # only the reference

        metrics = await cp.metrics()
        for kind in ("extensionconfig", "httpfilter"):
            assert f'pilot_envoy_filter_status{{name="default/ecds",type="{kind}"}} 1.0' in metrics, metrics[-2000:]

        # Only the extension config's content changes: Envoy picks it up over ECDS.
        cp.write("ecds.yaml", ecds_filter(port, "two"))
        await wait_for(lambda: has("two"), 20, message=f"ECDS update\n{envoy.log_tail(10)}")

        cp.remove("ecds.yaml")
        await wait_for(lambda: has(""), 20, message="filter removed")
        await wait_for(lambda: _gone(cp), 20, message="the gauge of a deleted EnvoyFilter goes")
    finally:
        await envoy.stop()
        await cp.stop()
        await backend.stop()

