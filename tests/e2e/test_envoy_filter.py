"""EnvoyFilter with a real Envoy, over SotW and delta: a Lua HTTP filter inserted before the
router adds a response header to real traffic, a cluster MERGE changes connect_timeout, a REMOVE
(higher priority) takes the Lua filter out again, a typed_config of an unknown type is refused in
/debug/configz, and a patch Envoy NACKs (Lua that does not compile) is reported in
/debug/push_status while the proxy's config moves on without it (no NACK loop: the proxy ends
ACKing the current version). On an ingress gateway (a router), GATEWAY-context patches: a
header-mutation filter before the router and a route configuration MERGE, both seen on responses."""

from __future__ import annotations

import json
import textwrap

import aiohttp
import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.e2e.test_gateway import GatewayEnv, gateway_yaml, virtual_service_yaml
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(120)

HCM = "envoy.filters.network.http_connection_manager"


def lua_filter(port: int, code: str, name: str = "add-header", filter_name: str = "envoy.filters.http.lua") -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1alpha3
        kind: EnvoyFilter
        metadata: {{name: {name}, namespace: default}}
        spec:
          configPatches:
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
                name: {filter_name}
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
                  inlineCode: {json.dumps(code)}
          - applyTo: CLUSTER
            match:
              context: SIDECAR_OUTBOUND
              cluster: {{service: {fqdn("alpha")}, portNumber: {port}}}
            patch:
              operation: MERGE
              value: {{connect_timeout: 7s}}
        """)


ADD_HEADER = "function envoy_on_response(handle)\n  handle:headers():add('x-envoy-filter', 'lua')\nend\n"

REMOVE_LUA = textwrap.dedent(f"""\
    apiVersion: networking.istio.io/v1alpha3
    kind: EnvoyFilter
    metadata: {{name: remove-lua, namespace: istio-system}}
    spec:
      priority: 10
      configPatches:
      - applyTo: HTTP_FILTER
        match:
          listener:
            filterChain:
              filter:
                name: {HCM}
                subFilter: {{name: envoy.filters.http.lua}}
        patch: {{operation: REMOVE}}
    """)


def _lua(code: str) -> str:
    return ('{"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", '
            f'"inlineCode": {json.dumps(code)}}}')


ADD_REPLACED = "function envoy_on_response(h)\n  h:headers():add('x-envoy-filter', 'replaced')\nend\n"
# REPLACE the Lua filter with one whose header says so, and INSERT_AFTER it a second filter.
REPLACE_AND_INSERT_AFTER = textwrap.dedent(f"""\
    apiVersion: networking.istio.io/v1alpha3
    kind: EnvoyFilter
    metadata: {{name: replace-lua, namespace: istio-system}}
    spec:
      priority: 10
      configPatches:
      - applyTo: HTTP_FILTER
        match:
          listener:
            filterChain:
              filter: {{name: {HCM}, subFilter: {{name: envoy.filters.http.lua}}}}
        patch:
          operation: INSERT_AFTER
          value: {{name: after-lua, typed_config: {_lua("function envoy_on_response(h) end")}}}
      - applyTo: HTTP_FILTER
        match:
          listener:
            filterChain:
              filter: {{name: {HCM}, subFilter: {{name: envoy.filters.http.lua}}}}
        patch:
          operation: REPLACE
          value:
            name: envoy.filters.http.lua
            typed_config: {_lua(ADD_REPLACED)}
    """)


async def call(port: int) -> tuple[int, str | None]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s, \
            s.get(f"http://127.0.0.1:{port}/", headers={"Host": fqdn("alpha")}) as r:
        await r.read()
        return r.status, r.headers.get("x-envoy-filter")


async def listener_http_filters(envoy: Envoy, port: int) -> list[str] | None:
    dump = await envoy.config_dump(resource="dynamic_listeners")
    for entry in dump.get("configs", []):
        listener = entry.get("active_state", {}).get("listener", {})
        if listener.get("address", {}).get("socket_address", {}).get("port_value") != port:
            continue
        for fc in listener.get("filter_chains", []):
            for f in fc.get("filters", []):
                if f.get("name") == HCM:
                    return [h["name"] for h in f["typed_config"].get("http_filters", [])]
    return None


async def connect_timeout(envoy: Envoy, port: int) -> str | None:
    dump = await envoy.config_dump(resource="dynamic_active_clusters")
    for c in dump.get("configs", []):
        cluster = c.get("cluster", {})
        if cluster.get("name") == f"outbound|{port}||{fqdn('alpha')}":
            return cluster.get("connect_timeout")
    return None


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_envoy_filter_operations_with_a_real_envoy(tmp_path, delta):
    backend = await HttpBackend("a").start()
    cp = ControlPlane(tmp_path)
    port = free_port()
    node_id = sidecar_node_id("app-1")
    cp.write("svc.yaml", service_yaml("alpha", port))
    cp.write("eps.yaml", endpoint_slice_yaml("alpha", backend.port))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(node_id, cp.xds_port, delta=delta), tmp_path)
        await envoy.wait_ready()

        async def answered(header: str | None):
            try:
                status, got = await call(port)
            except aiohttp.ClientError:
                return None
            return (status, got) if status == 200 and got == header else None

        await wait_for(lambda: answered(None), 20, message=f"routed\n{envoy.log_tail(10)}\n{cp.log_tail(10)}")
        assert "envoy.filters.http.lua" not in (await listener_http_filters(envoy, port) or [])
        assert await connect_timeout(envoy, port) != "7s"

        # INSERT_BEFORE router: the header appears on real responses; MERGE: the cluster's timeout.
        cp.write("lua.yaml", lua_filter(port, ADD_HEADER))
        await wait_for(lambda: answered("lua"), 20, message=f"lua header\n{envoy.log_tail(10)}\n{cp.log_tail(10)}")
        filters = await listener_http_filters(envoy, port)
        assert filters is not None and filters.index("envoy.filters.http.lua") == filters.index(
            "envoy.filters.http.router") - 1, filters

        # The control plane's own config dump for the proxy renders the patched listener, Lua included.
        status, text = await cp.get(f"/debug/config_dump?proxyID={node_id}")
        assert status == 200 and "envoy.extensions.filters.http.lua.v3.Lua" in text, text[:500]

        async def timeout_is_7s():
            return await connect_timeout(envoy, port) == "7s"

        await wait_for(timeout_is_7s, 20, message="connect_timeout merged")

        # REMOVE from the root namespace, priority 10 (after the insert): the filter is gone again.
        cp.write("remove.yaml", REMOVE_LUA)
        await wait_for(lambda: answered(None), 20, message=f"lua removed\n{cp.log_tail(10)}")
        assert "envoy.filters.http.lua" not in (await listener_http_filters(envoy, port) or [])
        cp.remove("remove.yaml")
        await wait_for(lambda: answered("lua"), 20, message="lua back")

        # REPLACE: the replacement's header on real responses; INSERT_AFTER: right after it.
        cp.write("replace.yaml", REPLACE_AND_INSERT_AFTER)
        await wait_for(lambda: answered("replaced"), 20, message=f"lua replaced\n{cp.log_tail(10)}")
        filters = await listener_http_filters(envoy, port)
        assert filters is not None and filters.count("envoy.filters.http.lua") == 1, filters
        lua = filters.index("envoy.filters.http.lua")
        assert filters[lua + 1:lua + 3] == ["after-lua", "envoy.filters.http.router"], filters
        cp.remove("replace.yaml")
        await wait_for(lambda: answered("lua"), 20, message="the original lua back")

        # A typed_config of a type no installed proto defines: refused at validation, in
        # /debug/configz with the object and the reason; nothing else changes.
        cp.write("unknown.yaml", lua_filter(port, ADD_HEADER, name="unknown").replace(
            "envoy.extensions.filters.http.lua.v3.Lua", "envoy.extensions.filters.http.nope.v3.Nope"))

        async def refused():
            rows = [r for r in (await cp.debug("/debug/configz"))["rejected"] if r.get("name") == "unknown"]
            return rows or None

        rows = await wait_for(refused, 20, message=f"unknown type refused\n{cp.log_tail(10)}")
        assert rows[0]["kind"] == "EnvoyFilter" and "envoy.extensions.filters.http.nope.v3.Nope" in rows[0]["reason"]
        assert "configPatches[0]" in rows[0]["reason"], rows[0]
        assert (await call(port)) == (200, "lua")

        # A patch Envoy rejects: reported, the listener generated without it, no NACK loop.
        cp.write("bad.yaml", lua_filter(port, "this is not lua (", name="broken", filter_name="lua.broken"))

        async def reported():
            status = await cp.debug("/debug/push_status")
            rows = [r for r in status["envoyFilterRejections"] if r["envoyFilter"] == "EnvoyFilter/default/broken"]
            return rows or None

        rows = await wait_for(reported, 30, message=f"rejection reported\n{cp.log_tail(20)}")
        assert rows[0]["proxy"] == node_id and rows[0]["type"] == "lds" and rows[0]["error"]
        # istiod's gauge: the NACKed filter is 0, the good one (its HTTP filter and cluster patches) 1.
        metrics = await cp.metrics()
        assert 'pilot_envoy_filter_status{name="default/broken",type="httpfilter"} 0.0' in metrics, metrics[-3000:]
        assert 'pilot_envoy_filter_status{name="default/add-header",type="httpfilter"} 1.0' in metrics
        assert 'pilot_envoy_filter_status{name="default/add-header",type="cluster"} 1.0' in metrics
        await cp.wait_synced(node_id, timeout=30)
        # The good filter still applies; the broken one is not in what Envoy holds.
        assert (await call(port)) == (200, "lua")
        filters = await listener_http_filters(envoy, port)
        assert filters is not None and "lua.broken" not in filters and "envoy.filters.http.lua" in filters, filters
        # Fixing the object (a new revision) gives it a fresh chance and clears the report.
        cp.write("bad.yaml", lua_filter(port, ADD_HEADER.replace("'lua'", "'fixed'"), name="broken",
                                        filter_name="lua.broken"))

        async def cleared():
            status = await cp.debug("/debug/push_status")
            return not any(r["envoyFilter"] == "EnvoyFilter/default/broken" for r in status["envoyFilterRejections"])

        await wait_for(cleared, 20, message="rejection cleared")

        async def fixed_in_place():
            filters = await listener_http_filters(envoy, port)
            return filters if filters and "lua.broken" in filters else None

        await wait_for(fixed_in_place, 20, message=f"the fixed filter applied\n{cp.log_tail(10)}")
    finally:
        await envoy.stop()
        await cp.stop()
        await backend.stop()



GATEWAY_FILTER = textwrap.dedent("""\
    apiVersion: networking.istio.io/v1alpha3
    kind: EnvoyFilter
    metadata: {{name: gateway-headers, namespace: istio-system}}
    spec:
      workloadSelector: {{labels: {{istio: ingressgateway}}}}
      configPatches:
      - applyTo: HTTP_FILTER
        match:
          context: GATEWAY
          listener:
            portNumber: {port}
            filterChain:
              filter:
                name: {hcm}
                subFilter: {{name: envoy.filters.http.router}}
        patch:
          operation: INSERT_BEFORE
          value:
            name: envoy.filters.http.header_mutation
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                response_mutations:
                - append: {{header: {{key: x-gateway-filter, value: header-mutation}}}}
      - applyTo: ROUTE_CONFIGURATION
        match: {{context: GATEWAY, routeConfiguration: {{portNumber: {port}}}}}
        patch:
          operation: MERGE
          value: {{response_headers_to_add: [{{header: {{key: x-gateway-route, value: merged}}}}]}}
      - applyTo: HTTP_FILTER
        match: {{context: SIDECAR_OUTBOUND}}
        patch:
          operation: INSERT_FIRST
          value:
            name: sidecar-only
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
    """)


async def test_gateway_context_header_mutation_filter_and_route_merge(tmp_path):
    backends = {n: await HttpBackend(n).start() for n in ("alpha", "beta")}
    env = GatewayEnv(tmp_path, backends)
    port = free_port()
    env.cp.write("gateway.yaml", gateway_yaml("web", f"""\
        - port: {{number: {port}, name: http, protocol: HTTP}}
          hosts: ["*/shop.example.com"]
        """))
    env.cp.write("vs.yaml", virtual_service_yaml("shop", """\
        hosts: [shop.example.com]
        gateways: [istio-system/web]
        http:
        - route: [{destination: {host: alpha}}]
        """))
    try:
        await env.start()

        async def answered():
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s, \
                        s.get(f"http://127.0.0.1:{port}/", headers={"Host": "shop.example.com"}) as r:
                    await r.read()
                    return r.status, r.headers.get("x-gateway-filter"), r.headers.get("x-gateway-route")
            except aiohttp.ClientError:
                return None

        await env.until(lambda: _is(answered, (200, None, None)), "gateway routes")
        env.cp.write("ef.yaml", GATEWAY_FILTER.format(port=port, hcm=HCM))
        await env.until(lambda: _is(answered, (200, "header-mutation", "merged")), "gateway patched")
        dump = await env.envoy.config_dump(resource="dynamic_listeners")
        names = [h["name"] for c in dump["configs"]
                 for fc in c["active_state"]["listener"]["filter_chains"] for f in fc["filters"]
                 if f["name"] == HCM for h in f["typed_config"]["http_filters"]]
        # The SIDECAR_OUTBOUND patch of the same object does not reach a gateway.
        assert "sidecar-only" not in names and names.index("envoy.filters.http.header_mutation") == \
            names.index("envoy.filters.http.router") - 1, names
    finally:
        await env.envoy.stop()
        await env.cp.stop()
        for b in backends.values():
            await b.stop()


async def _is(probe, want):
    got = await probe()
    return got == want
