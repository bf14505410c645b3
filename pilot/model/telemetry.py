"""Telemetry API and MeshConfig providers -> what each proxy logs and traces (istiod's
pilot/pkg/model/telemetry.go: applicableTelemetries, mergeLogs, Tracing), pure.

Selection as istiod: the root namespace's Telemetry without selector (the oldest), then the
proxy namespace's, then every Telemetry of the proxy namespace whose selector (or Gateway
targetRef, for a gateway) selects it, oldest first; later levels override. The result is split by
workload mode: CLIENT (outbound listeners, gateways) and SERVER (inbound).

A Telemetry naming a provider that is not defined, or one that cannot do what it is named for (a
tracing provider for access logs, a kind this control plane does not apply), is left out as a
whole (no change to generated config) and reported in `problems` (/debug/configz). The same for
`defaultProviders` entries (the entry is ignored). A provider whose service is not in the registry
is left out of what it would have configured (istiod's "could not find cluster"), reported too.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pilot.config.extension_providers import (
    ACCESS_LOG_KINDS,
    BUILTIN_ENVOY,
    METRICS_KINDS,
    NOT_APPLIED,
    TRACING_KINDS,
    ExtensionProvider,
)
from pilot.config.mesh import MeshConfig
from pilot.config.proxy_tracing import ProxyTracing, parse_proxy_tracing
from pilot.config.telemetry import AccessLogging, Telemetry, Tracing
from pilot.model.labels import selects, targets_gateway_of
from pilot.model.store import Entry, Store

# istiod's PILOT_TRACE_SAMPLING default: the sampling when neither Telemetry nor ProxyConfig sets one.
DEFAULT_TRACE_SAMPLING = 1.0


@dataclass(frozen=True, slots=True)
class AccessLog:
    """One access log sink. `config` is the provider's settings as canonical JSON (what the
    builder reads, and the cache key: equal sinks compare equal across pushes)."""

    provider: str
    kind: str  # "mesh-file" (MeshConfig's format), "file", "otel", "http-als", "tcp-als"
    config: str
    cluster: str = ""
    authority: str = ""
    filter: str | None = None  # a CEL expression


@dataclass(frozen=True, slots=True)
class TracingSpec:
    provider: str  # "" for the bootstrap's tracer (istiod's legacy path, no provider)
    kind: str  # zipkin, opentelemetry, datadog; "bootstrap": the tracer pilot-agent wrote
    config: str  # the provider's settings as canonical JSON
    cluster: str
    authority: str
    sampling: float
    custom_tags: tuple[tuple[str, str, str, str], ...]  # (tag, literal|environment|header|formatter, value/name, default)
    istio_tags: tuple[tuple[str, str], ...]  # (tag, literal value): istiod's istio.* tags
    use_request_id_for_sampling: bool
    spawn_upstream_span: bool  # routers (gateways) start a child span, as istiod
    no_context_propagation: bool
    service_name: str  # the node's cluster (datadog/opentelemetry service name)
    max_path_tag_length: int = 0  # the provider's maxTagLength, else ProxyConfig tracing's (0: Envoy's)


@dataclass(frozen=True, slots=True)
class ModeTelemetry:
    """What one listener class (CLIENT or SERVER) logs and traces."""

    access_logs: tuple[AccessLog, ...] = ()
    tracing: TracingSpec | None = None


NO_TELEMETRY = ModeTelemetry()


@dataclass(frozen=True, slots=True)
class TelemetryPlan:
    client: ModeTelemetry = NO_TELEMETRY
    server: ModeTelemetry = NO_TELEMETRY
    origins: tuple[str, ...] = ()  # the Telemetry objects applied ("Telemetry/NS/NAME")


def legacy_access_logs(mesh: MeshConfig) -> ModeTelemetry:
    """No Telemetry and no defaultProviders.accessLogging: MeshConfig accessLogFile, as istiod."""
    if not mesh.access_log_file:
        return NO_TELEMETRY
    return ModeTelemetry(access_logs=(_mesh_file(mesh, mesh.access_log_file, BUILTIN_ENVOY),))


def _mesh_file(mesh: MeshConfig, path: str, provider: str) -> AccessLog:
    return AccessLog(provider, "mesh-file", _canon({"path": path, "format": mesh.access_log_format,
                                                    "encoding": mesh.access_log_encoding}))


def _canon(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class ProxyInfo:
    """What of the proxy its telemetry depends on."""

    namespace: str
    labels: Mapping[str, str]
    is_router: bool
    cluster_id: str
    mesh_id: str
    node_cluster: str  # the xDS node's cluster (service name for datadog/opentelemetry)
    # The proxy's ProxyConfig `tracing` (its PROXY_CONFIG, else MeshConfig defaultConfig's), as
    # istiod's ProxyConfigOrDefault: sampling, custom tags and max path tag length fall back to it.
    tracing: ProxyTracing | None = None


@dataclass(frozen=True)
class TelemetryIndex:
    """Telemetries by namespace (oldest first), with those that cannot be applied left out."""

    by_namespace: Mapping[str, tuple[Entry[Telemetry], ...]] = field(default_factory=dict)
    problems: tuple[dict, ...] = ()

    @classmethod
    def build(cls, store: Store, mesh: MeshConfig) -> TelemetryIndex:
        providers = mesh.providers
        by_ns: dict[str, list[Entry[Telemetry]]] = defaultdict(list)
        problems: list[dict] = []
        for e in sorted(store.list(Telemetry), key=lambda e: (e.obj.metadata.creation_timestamp, e.key)):
            reasons = _provider_problems(e.obj, providers)
            waypoint_refs = [f"{r.kind}/{r.name}" for r in e.obj.spec.target_references if r.kind != "Gateway"]
            if waypoint_refs:  # istiod: these select waypoints, whose config ignores Telemetry here
                reasons.append(f"targetRefs {', '.join(waypoint_refs)}: Telemetry for waypoints is not supported")
            if reasons:
                problems += [_problem(e, f"{r}; the Telemetry is not applied") for r in reasons]
                continue
            by_ns[e.key.namespace].append(e)
        for use, names, kinds in (("tracing", mesh.default_providers.tracing, TRACING_KINDS),
                                  ("accessLogging", mesh.default_providers.access_logging, ACCESS_LOG_KINDS),
                                  ("metrics", mesh.default_providers.metrics, METRICS_KINDS)):
            for i, name in enumerate(names):
                reason = _unusable(name, use, kinds, providers)
                if reason:
                    problems.append({"kind": "MeshConfig", "namespace": "", "name": "mesh",
                                     "reason": f"defaultProviders.{use}[{i}]: {reason}; ignored"})
        _, tracing_problems = mesh_proxy_tracing(mesh)
        problems += [{"kind": "MeshConfig", "namespace": "", "name": "mesh", "reason": r} for r in tracing_problems]
        return cls({k: tuple(v) for k, v in by_ns.items()}, tuple(problems))


def mesh_proxy_tracing(mesh: MeshConfig) -> tuple[ProxyTracing | None, list[str]]:
    """MeshConfig `defaultConfig.tracing` (kept as written by the lenient ProxyConfig model)."""
    extra = mesh.default_config.model_extra or {}
    return parse_proxy_tracing(extra.get("tracing"), "defaultConfig.tracing")


def _problem(e: Entry[Telemetry], reason: str) -> dict:
    return {"kind": "Telemetry", "namespace": e.key.namespace, "name": e.key.name, "reason": reason}


def _unusable(name: str, use: str, kinds: tuple[str, ...], providers: Mapping[str, ExtensionProvider]) -> str:
    p = _lookup(providers, name)
    if p is None:
        return f"extension provider {name!r} is not defined in MeshConfig extensionProviders"
    kind = p.provider_kind
    if kind in kinds:
        return ""
    if kind in NOT_APPLIED:
        return f"extension provider {name!r}: {NOT_APPLIED[kind]}"
    return f"extension provider {name!r} ({kind}) cannot be used for {use}"


def _lookup(providers: Mapping[str, ExtensionProvider], name: str) -> ExtensionProvider | None:
    """istiod's fetchProvider: names compare case-insensitively."""
    p = providers.get(name)
    if p is not None:
        return p
    return next((v for k, v in providers.items() if k.lower() == name.lower()), None)


def _provider_problems(t: Telemetry, providers: Mapping[str, ExtensionProvider]) -> list[str]:
    out = []
    kinds = {"tracing": TRACING_KINDS, "accessLogging": ACCESS_LOG_KINDS, "metrics": METRICS_KINDS}
    for path, name in t.spec.provider_names():
        reason = _unusable(name, path.split("[")[0], kinds[path.split("[")[0]], providers)
        if reason:
            out.append(f"{path}: {reason}")
    return out


# --- per proxy -----------------------------------------------------------------------------------

def _attaches(e: Entry[Telemetry], proxy: ProxyInfo) -> bool:
    spec = e.obj.spec
    refs = spec.target_references
    if not refs:
        return selects(spec.selector.match_labels if spec.selector else {}, proxy.labels)
    # applicable() only asks about the proxy's own namespace's Telemetries; the shared matcher
    # keeps the same-namespace rule here too, so no caller can widen a targetRef past it.
    return targets_gateway_of(refs, e.key.namespace, proxy.namespace, proxy.labels)


def _is_namespace_wide(e: Entry[Telemetry]) -> bool:
    spec = e.obj.spec
    return not (spec.selector and spec.selector.match_labels) and not spec.target_references


def applicable(index: TelemetryIndex, root_namespace: str, proxy: ProxyInfo) -> list[Entry[Telemetry]]:
    """istiod's applicableTelemetries: mesh, namespace, then workload Telemetries, in that order."""
    out: list[Entry[Telemetry]] = []
    namespaces = [root_namespace] + ([proxy.namespace] if proxy.namespace != root_namespace else [])
    for ns in namespaces:
        wide = next((e for e in index.by_namespace.get(ns, ()) if _is_namespace_wide(e)), None)
        if wide is not None:
            out.append(wide)
    out += [e for e in index.by_namespace.get(proxy.namespace, ())
            if not _is_namespace_wide(e) and _attaches(e, proxy)]
    return out


def _match(selector, mode: str) -> bool:
    return selector is None or selector.mode in ("CLIENT_AND_SERVER", mode)


def merge_logs(levels: list[list[AccessLogging]], defaults: list[str], mode: str) -> dict[str, tuple[bool, str | None]]:
    """istiod's mergeLogs: provider -> (disabled, filter expression)."""
    providers: dict[str, tuple[bool, str | None]] = {}
    if not levels:
        return {dp: (False, None) for dp in defaults}
    names_in_scope: list[str] = list(defaults)
    filters: dict[str, tuple[bool, str | None]] = {}
    for level in levels:
        names: set[str] = set()
        for p in level:
            if not _match(p.match, mode):
                continue
            sub = [x.name for x in p.providers]
            names.update(sub)
            for prov in sub:
                filters[prov] = (False, p.filter.expression if p.filter else None)
        if names:
            names_in_scope = list(names)
    in_scope = set(names_in_scope)
    parent = list(defaults)
    for level in levels:
        for m in level:
            names_ = [x.name for x in m.providers] or parent
            parent = names_
            for provider in names_:
                if provider not in in_scope or not _match(m.match, mode):
                    continue
                if m.disabled:
                    providers[provider] = (True, None)
                    continue
                providers[provider] = filters.get(provider, (False, None))
    return providers


Lookup = Callable[[str, int], "tuple[str, str] | None"]  # (service, port) -> (hostname, cluster)


def plan_for(index: TelemetryIndex, mesh: MeshConfig, proxy: ProxyInfo, lookup: Lookup,
             problems: list[str], legacy: ModeTelemetry | None = None,
             default_sampling: float = DEFAULT_TRACE_SAMPLING) -> TelemetryPlan:
    """The telemetry of one proxy (its namespace, labels and traits). `lookup` resolves a
    provider's service to its cluster; what cannot be resolved is appended to `problems`.
    `legacy` is MeshConfig's own (the same object for every proxy no Telemetry reaches, so
    listeners built from it share their cache keys by identity). `default_sampling`: the
    percentage of requests traced when no Telemetry sets randomSamplingPercentage
    (PILOT_TRACE_SAMPLING)."""
    legacy = legacy if legacy is not None else legacy_access_logs(mesh)
    applied = applicable(index, mesh.root_namespace, proxy)
    defaults = mesh.default_providers
    if not applied and not defaults.access_logging and not defaults.tracing:
        traced = _legacy_tracing(mesh, proxy, default_sampling)
        if traced is None:
            return TelemetryPlan(legacy, legacy, ())
        both = ModeTelemetry(legacy.access_logs, traced)
        return TelemetryPlan(both, both, ())
    origins = tuple(f"Telemetry/{e.key.namespace}/{e.key.name}" for e in applied)
    levels = [list(e.obj.spec.access_logging) for e in applied if e.obj.spec.access_logging]
    tracing = [t for e in applied for t in e.obj.spec.tracing]
    out = {}
    for mode in ("CLIENT", "SERVER"):
        if not levels and not mesh.default_providers.access_logging:
            logs = legacy.access_logs
        else:
            logs = _access_logs(mesh, merge_logs(levels, _usable_defaults(mesh, "access"), mode), lookup, problems)
        out[mode] = ModeTelemetry(logs, _tracing(mesh, tracing, mode, proxy, lookup, problems, default_sampling))
    return TelemetryPlan(out["CLIENT"], out["SERVER"], origins)


def _usable_defaults(mesh: MeshConfig, what: str) -> list[str]:
    names = mesh.default_providers.access_logging if what == "access" else mesh.default_providers.tracing
    kinds = ACCESS_LOG_KINDS if what == "access" else TRACING_KINDS
    return [n for n in names if not _unusable(n, what, kinds, mesh.providers)]


def _access_logs(mesh: MeshConfig, merged: dict[str, tuple[bool, str | None]], lookup: Lookup,
                 problems: list[str]) -> tuple[AccessLog, ...]:
    out = []
    providers = mesh.providers
    found_providers = [(p, merged[name]) for name in merged if (p := _lookup(providers, name)) is not None]
    for p, (disabled, expression) in sorted(found_providers, key=lambda item: item[0].name):  # istiod's order
        if disabled:
            continue
        if p.envoy_file_access_log is not None:
            f = p.envoy_file_access_log
            if p.name == BUILTIN_ENVOY and f.log_format is None and not f.omit_empty_values:
                out.append(_with_filter(_mesh_file(mesh, f.path, p.name), expression))
            else:
                out.append(AccessLog(p.name, "file", f.model_dump_json(by_alias=True), filter=expression))
        elif p.provider_kind in _GRPC_LOG_KINDS:
            kind, o = _GRPC_LOG_KINDS[p.provider_kind], getattr(p, p.provider_kind)
            found = lookup(o.service, o.port)
            if found is None:
                problems.append(f"extension provider {p.name!r}: service {o.service} port {o.port} is not in the "
                                "registry; its access log is left out")
                continue
            out.append(AccessLog(p.name, kind, o.model_dump_json(by_alias=True), cluster=found[1],
                                 authority=found[0], filter=expression))
    return tuple(out)


# The gRPC access loggers: provider kind -> AccessLog.kind (istiod's telemetryAccessLog puts each
# on HTTP and TCP listeners alike, as here).
_GRPC_LOG_KINDS = {"envoy_otel_als": "otel", "envoy_http_als": "http-als", "envoy_tcp_als": "tcp-als"}


def _with_filter(log: AccessLog, expression: str | None) -> AccessLog:
    return AccessLog(log.provider, log.kind, log.config, log.cluster, log.authority, expression)


def _proxy_sampling(tracing: ProxyTracing | None, default: float) -> float:
    """istiod's proxyConfigSamplingValue: ProxyConfig tracing.sampling, else PILOT_TRACE_SAMPLING."""
    if tracing is None or tracing.sampling == 0:
        return default
    return 1.0 if tracing.sampling > 100 else tracing.sampling


def _legacy_tracing(mesh: MeshConfig, proxy: ProxyInfo, default_sampling: float) -> TracingSpec | None:
    """No Telemetry tracing and no defaultProviders.tracing: istiod's legacy path. The HCM traces
    with ProxyConfig's sampling and tags and no provider, so Envoy uses the bootstrap's tracer,
    which pilot-agent writes from ProxyConfig tracing.zipkin. Only built when the proxy's
    ProxyConfig has a tracing section: without one no tracer exists (none is defaulted here), the
    HCM setting would change nothing Envoy does, and leaving it out keeps listeners shared."""
    t = proxy.tracing
    if not mesh.enable_tracing or t is None:
        return None
    istio_tags = t.enable_istio_tags if t.enable_istio_tags is not None else True
    return TracingSpec(
        provider="", kind="bootstrap", config="{}", cluster="", authority="", sampling=_proxy_sampling(t, default_sampling),
        custom_tags=t.tags(), istio_tags=_istio_tags(proxy) if istio_tags else (),
        use_request_id_for_sampling=True, spawn_upstream_span=False, no_context_propagation=False,
        service_name=proxy.node_cluster, max_path_tag_length=t.max_path_tag_length)


def _tracing(mesh: MeshConfig, entries: list[Tracing], mode: str, proxy: ProxyInfo, lookup: Lookup,
             problems: list[str], default_sampling: float = DEFAULT_TRACE_SAMPLING) -> TracingSpec | None:
    """istiod's Telemetries.Tracing for one mode, then configureTracingFromTelemetry's choices."""
    defaults = _usable_defaults(mesh, "tracing")
    if not entries and not defaults:
        return _legacy_tracing(mesh, proxy, default_sampling)
    provider = _lookup(mesh.providers, defaults[0]) if defaults else None
    disabled = False
    sampling: float | None = None
    tags: dict = {}
    use_request_id, istio_tags, no_propagation = True, True, False
    for t in entries:
        if not _match(t.match, mode):
            continue
        if t.providers:
            provider = _lookup(mesh.providers, t.providers[0].name)
        if t.disable_span_reporting is not None:
            disabled = t.disable_span_reporting
        if t.custom_tags:
            tags = t.custom_tags
        if t.random_sampling_percentage is not None:
            sampling = t.random_sampling_percentage
        if t.use_request_id_for_trace_sampling is not None:
            use_request_id = t.use_request_id_for_trace_sampling
        if t.enable_istio_tags is not None:
            istio_tags = t.enable_istio_tags
        if t.disable_context_propagation is not None:
            no_propagation = t.disable_context_propagation
    if provider is None or disabled:
        return None
    kind = provider.provider_kind
    settings = getattr(provider, kind)
    found = lookup(settings.service, settings.port)
    if found is None:
        problems.append(f"extension provider {provider.name!r}: service {settings.service} port {settings.port} "
                        "is not in the registry; tracing is not configured")
        return None
    custom: list[tuple[str, str, str, str]] = []
    if not tags and proxy.tracing is not None:  # istiod: ProxyConfig's tags when the Telemetry has none
        custom = list(proxy.tracing.tags())
    custom.extend((name, *tag.spec()) for name, tag in sorted(tags.items()))
    return TracingSpec(
        provider=provider.name, kind=kind, config=settings.model_dump_json(by_alias=True),
        cluster=found[1], authority=found[0],
        sampling=sampling if sampling is not None else _proxy_sampling(proxy.tracing, default_sampling),
        custom_tags=tuple(custom), istio_tags=_istio_tags(proxy) if istio_tags else (),
        use_request_id_for_sampling=use_request_id, spawn_upstream_span=proxy.is_router,
        no_context_propagation=no_propagation, service_name=proxy.node_cluster,
        max_path_tag_length=settings.max_tag_length or (proxy.tracing.max_path_tag_length if proxy.tracing else 0))


def _istio_tags(proxy: ProxyInfo) -> tuple[tuple[str, str], ...]:
    """istiod's buildServiceTags."""
    return (("istio.canonical_revision", proxy.labels.get("service.istio.io/canonical-revision") or "latest"),
            ("istio.canonical_service", proxy.labels.get("service.istio.io/canonical-name") or "unknown"),
            ("istio.cluster_id", proxy.cluster_id or "unknown"),
            ("istio.mesh_id", proxy.mesh_id or "unknown"),
            ("istio.namespace", proxy.namespace or "default"))
