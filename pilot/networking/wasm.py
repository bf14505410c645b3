"""WasmPlugins -> `envoy.filters.http.wasm` filters placed in an HCM's HTTP filter chain by phase,
as istiod's extension.PopAppendHTTP places them: AUTHN before the authentication filters, AUTHZ
after authentication and before authorization, STATS then UNSPECIFIED after authorization (there
is no istio.stats filter in upstream Envoy: both sit just before the router).

As in istiod, the filter in the chain only names its configuration, which is served over ECDS
(`extension_config`, a TypedExtensionConfig of the same name), so a plugin's module or
configuration changing reaches Envoy as one ECDS resource."""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.core.v3 import config_source_pb2, extension_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.wasm.v3 import wasm_pb2
from google.protobuf import duration_pb2, wrappers_pb2

from pilot.model.wasm import WasmFilter
from pilot.networking.protos import pack

V8 = "envoy.wasm.runtime.v8"
AUTHN_FILTERS = frozenset({"envoy.filters.http.jwt_authn"})
AUTHZ_FILTERS = frozenset({"envoy.filters.http.rbac", "envoy.filters.http.ext_authz"})
ROUTER = "envoy.filters.http.router"
WASM_HTTP_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
# istio-agent replaces a module it cannot fetch by an RBAC filter of the same name: istiod lists
# that type too, and so does this (the same config works behind either agent).
RBAC_HTTP_TYPE = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
PULL_POLICY_ENV = "ISTIO_META_WASM_IMAGE_PULL_POLICY"  # istiod's names; read by pilot/agent/wasm.py
RESOURCE_VERSION_ENV = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"
PULL_SECRET_ENV = "ISTIO_META_WASM_IMAGE_PULL_SECRET"
REMOTE_FETCH_TIMEOUT_S = 30  # istiod's


def wasm_filter(f: WasmFilter) -> hcm_pb2.HttpFilter:
    """The filter in the chain: a reference to the ECDS resource `f.name` (istiod's
    toEnvoyHTTPFilter). Listeners wait for it (initial fetch timeout 0: a plugin may be security
    critical)."""
    source = config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource(),
                                            resource_api_version=config_source_pb2.V3,
                                            initial_fetch_timeout=duration_pb2.Duration(seconds=0))
    return hcm_pb2.HttpFilter(name=f.name, config_discovery=config_source_pb2.ExtensionConfigSource(
        config_source=source, type_urls=[WASM_HTTP_TYPE, RBAC_HTTP_TYPE]))


def extension_config(f: WasmFilter, pull_secret: str | None = None) -> extension_pb2.TypedExtensionConfig:
    """The ECDS resource of a plugin (istiod's BuildHTTPWasmFilter). `pull_secret`, for a plugin
    with imagePullSecret: the Secret's docker config JSON, "" when this proxy may not have it or
    it is missing (the agent then fails the fetch, as istiod's empty value makes istio-agent do)."""
    vm = wasm_pb2.VmConfig(runtime=V8, vm_id=f.name)
    env_inline = dict(f.env_inline)
    if f.is_local:
        vm.code.local.filename = f.path
    else:
        # As istiod: a remote source the agent replaces by its local copy before Envoy sees it
        # (Envoy's own fetch would need a cluster, hence the placeholder); the pull policy
        # travels in the VM environment, which the agent strips.
        vm.code.remote.http_uri.uri = f.url
        vm.code.remote.http_uri.cluster = "_"
        vm.code.remote.http_uri.timeout.FromSeconds(REMOTE_FETCH_TIMEOUT_S)
        vm.code.remote.sha256 = f.sha256
        if f.pull_policy != "UNSPECIFIED_POLICY":
            env_inline[PULL_POLICY_ENV] = f.pull_policy
        if f.resource_version:
            env_inline[RESOURCE_VERSION_ENV] = f.resource_version
        if f.pull_secret:
            env_inline[PULL_SECRET_ENV] = pull_secret or ""
    if f.env_host or env_inline:
        vm.environment_variables.host_env_keys.extend(f.env_host)
        vm.environment_variables.key_values.update(env_inline)
    plugin = wasm_pb2.PluginConfig(name=f.name, root_id=f.root_id, vm_config=vm,
                                   failure_policy=wasm_pb2.FAIL_OPEN if f.fail_open else wasm_pb2.FAIL_CLOSED)
    if f.config:
        # istiod: pluginConfig as JSON text in a StringValue (what proxy-wasm SDKs read).
        plugin.configuration.Pack(wrappers_pb2.StringValue(value=f.config))
    return extension_pb2.TypedExtensionConfig(name=f.name, typed_config=pack(http_wasm_pb2.Wasm(config=plugin)))


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
