"""WasmPlugin with a real Envoy (V8 runtime) and a real proxy-wasm module (hand-assembled, see
tests/support/wasm_module.py) that adds a response header: selection, phase order, match mode,
and the push when the plugin goes away."""

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
from tests.support.ports import free_ports
from tests.support.wait import wait_for
from tests.support.wasm_module import add_response_header_module

pytestmark = pytest.mark.timeout(120)
NODE = sidecar_node_id("client-1")
METADATA = {"NAMESPACE": "default", "INTERCEPTION_MODE": "NONE", "LABELS": {"app": "client"}}


def plugin(name: str, namespace: str, module: str, extra: str = "") -> str:
    return textwrap.dedent(f"""\
        apiVersion: extensions.istio.io/v1alpha1
        kind: WasmPlugin
        metadata: {{name: {name}, namespace: {namespace}}}
        spec:
          url: file://{module}
        """) + textwrap.indent(textwrap.dedent(extra), "  ")


async def response_headers(port: int, host: str) -> dict[str, list[str]] | None:
    try:
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
                    session.get(f"http://127.0.0.1:{port}/", headers={"Host": host}) as resp):
            if resp.status != 200:
                return None
            out: dict[str, list[str]] = {}
            for k, v in resp.headers.items():
                out.setdefault(k.lower(), []).append(v)
            return out
    except aiohttp.ClientError:
        return None


def http_filter_names(dump: dict, listener_port: int) -> list[str]:
    for entry in dump.get("configs", []):
        listener = entry.get("active_state", {}).get("listener", {})
        if listener.get("address", {}).get("socket_address", {}).get("port_value") != listener_port:
            continue
        for chain in listener.get("filter_chains", []):
            for f in chain.get("filters", []):
                hcm = f.get("typed_config", {})
                if "http_filters" in hcm:
                    return [h["name"] for h in hcm["http_filters"]]
    return []


async def test_a_wasm_plugin_adds_a_response_header_in_phase_and_priority_order(tmp_path):
    port, = free_ports(1)
    backend = HttpBackend("alpha")
    await backend.start()
    first, second = tmp_path / "first.wasm", tmp_path / "second.wasm"
    first.write_bytes(add_response_header_module("x-wasm-first", "one"))
    second.write_bytes(add_response_header_module("x-wasm-second", "two"))
    cp = ControlPlane(tmp_path)
    cp.write("alpha.yaml", service_yaml("alpha", port) + "---\n" + endpoint_slice_yaml("alpha", backend.port))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata=METADATA), tmp_path)
        plain = await wait_for(lambda: response_headers(port, fqdn("alpha")), timeout=30,
                               message=f"routed\n{cp.log_tail()}")
        assert "x-wasm-first" not in plain

        # 1. Mesh-wide (root namespace, no selector): the module's header reaches the client.
        cp.write("first.yaml", plugin("first", "istio-system", str(first), "phase: STATS\n"))

        async def has(header: str, value: str | None = None):
            h = await response_headers(port, fqdn("alpha"))
            return h is not None and (h.get(header) == [value] if value is not None else header in h)

        await wait_for(lambda: has("x-wasm-first", "one"), timeout=30,
                       message=f"the Wasm filter's header\n{cp.log_tail()}\n{envoy.log_tail()}")

        # 2. A second plugin selecting this workload, AUTHN phase: placed before the STATS one;
        #    within a phase, a higher priority goes first.
        cp.write("second.yaml", plugin("second", "default", str(second), """\
            selector: {matchLabels: {app: client}}
            phase: AUTHN
            pluginConfig: {greeting: hi}
            """))
        await wait_for(lambda: has("x-wasm-second", "two"), timeout=30, message=f"second\n{envoy.log_tail()}")
        assert await has("x-wasm-first", "one")
        dump = await envoy.config_dump(resource="dynamic_listeners")
        # As istiod: the listener only names the plugin; its config arrives over ECDS, and
        # pluginConfig reaches the plugin as JSON text.
        assert "greeting" not in json.dumps(dump)
        ecds = json.dumps(await envoy.config_dump(resource="ecds_filters"), indent=1)
        assert '"value": "{\\"greeting\\":\\"hi\\"}"' in ecds, "pluginConfig"
        assert '"name": "default.second"' in ecds
        names = http_filter_names(dump, port)
        assert names == ["default.second", "envoy.filters.http.fault", "envoy.filters.http.cors",
                         "istio-system.first", "envoy.filters.http.router"], names
        cp.write("second.yaml", plugin("second", "default", str(second), """\
            selector: {matchLabels: {app: client}}
            phase: STATS
            priority: 10
            """))

        async def reordered():
            names = http_filter_names(await envoy.config_dump(resource="dynamic_listeners"), port)
            return names if names[-3:-1] == ["default.second", "istio-system.first"] else None

        await wait_for(reordered, timeout=30, message="priority 10 before priority 0 in STATS")

        # 3. match mode SERVER: not on this (outbound, CLIENT) listener; a selector that does not
        #    select the workload: nothing.
        cp.write("second.yaml", plugin("second", "default", str(second), """\
            selector: {matchLabels: {app: other}}
            """))
        cp.write("first.yaml", plugin("first", "istio-system", str(first), "match: [{mode: SERVER}]\n"))

        async def neither():
            h = await response_headers(port, fqdn("alpha"))
            return h is not None and "x-wasm-first" not in h and "x-wasm-second" not in h

        await wait_for(neither, timeout=30, message=f"plugins no longer apply\n{envoy.log_tail()}")
        assert http_filter_names(await envoy.config_dump(resource="dynamic_listeners"), port) == [
            "envoy.filters.http.fault", "envoy.filters.http.cors", "envoy.filters.http.router"]

        # 4. A port match selects the listener again; deleting the plugin removes the filter.
        cp.write("first.yaml", plugin("first", "istio-system", str(first),
                                      f"match: [{{mode: CLIENT, ports: [{{number: {port}}}]}}]\n"))
        await wait_for(lambda: has("x-wasm-first", "one"), timeout=30, message="port match")
        cp.remove("first.yaml")
        await wait_for(neither, timeout=30, message="deleted plugin removed")
    finally:
        await envoy.stop()
        await cp.stop()
        await backend.stop()


async def test_unsupported_wasm_plugin_fields_are_refused_with_their_path(tmp_path):
    cp = ControlPlane(tmp_path)
    cp.write("signed.yaml", textwrap.dedent("""\
        apiVersion: extensions.istio.io/v1alpha1
        kind: WasmPlugin
        metadata: {name: signed, namespace: default}
        spec: {url: "oci://ghcr.io/example/plugin:1", verificationKey: "-----BEGIN PUBLIC KEY-----"}
        """))
    try:
        await cp.start()
        await wait_for(lambda: "istio-agent verifies no image signature" in cp.log_tail(200), timeout=30,
                       message=f"refusal logged\n{cp.log_tail()}")
    finally:
        await cp.stop()
