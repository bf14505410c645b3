"""WasmPlugins -> `envoy.filters.http.wasm` filters placed in an HCM's HTTP filter chain by phase,
as istiod's extension.PopAppendHTTP places them: AUTHN before the authentication filters, AUTHZ
after authentication and before authorization, STATS then UNSPECIFIED after authorization (there
is no istio.stats filter in upstream Envoy: both sit just before the router)."""

from __future__ import annotations

from collections.abc import Sequence

from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.wasm.v3 import wasm_pb2
from google.protobuf import wrappers_pb2

from pilot.model.wasm import WasmFilter
from pilot.networking.protos import pack

V8 = "envoy.wasm.runtime.v8"
AUTHN_FILTERS = frozenset({"envoy.filters.http.jwt_authn"})
AUTHZ_FILTERS = frozenset({"envoy.filters.http.rbac", "envoy.filters.http.ext_authz"})
ROUTER = "envoy.filters.http.router"


def wasm_filter(f: WasmFilter) -> hcm_pb2.HttpFilter:
    vm = wasm_pb2.VmConfig(runtime=V8, vm_id=f.name)
    vm.code.local.filename = f.path
    if f.env_host or f.env_inline:
        vm.environment_variables.host_env_keys.extend(f.env_host)
        vm.environment_variables.key_values.update(dict(f.env_inline))
    plugin = wasm_pb2.PluginConfig(name=f.name, root_id=f.root_id, vm_config=vm,
                                   failure_policy=wasm_pb2.FAIL_OPEN if f.fail_open else wasm_pb2.FAIL_CLOSED)
    if f.config:
        # istiod: pluginConfig as JSON text in a StringValue (what proxy-wasm SDKs read).
        plugin.configuration.Pack(wrappers_pb2.StringValue(value=f.config))
    return hcm_pb2.HttpFilter(name=f.name, typed_config=pack(http_wasm_pb2.Wasm(config=plugin)))


def insert(filters: Sequence[hcm_pb2.HttpFilter], plugins: Sequence[WasmFilter],
           port: int) -> list[hcm_pb2.HttpFilter]:
    """`filters` with the plugins applying to `port` placed by phase (their order within a phase
    is the plan's: priority, then age)."""
    mine = [p for p in plugins if p.applies_to_port(port)]
    if not mine:
        return list(filters)

    def of(phase: str) -> list[hcm_pb2.HttpFilter]:
        return [wasm_filter(p) for p in mine if p.phase == phase]

    out: list[hcm_pb2.HttpFilter] = of("AUTHN")
    authz = of("AUTHZ")
    late = of("STATS") + of("UNSPECIFIED_PHASE")
    for f in filters:
        if authz and (f.name in AUTHZ_FILTERS or f.name == ROUTER or f.name not in AUTHN_FILTERS):
            out += authz  # after the authentication filters, before anything else
            authz = []
        if f.name == ROUTER:
            out += late
            late = []
        out.append(f)
    return out + authz + late
