"""MeshConfig: the mesh-wide settings, from the `istio` ConfigMap's `mesh` key or `--meshConfig`.

Every field of istio 1.30's MeshConfig is either modelled and applied, or declared `Unsupported`.
Unlike a config object, a MeshConfig naming an unsupported (or unknown) field is not refused, as
istiod tolerates them: the field is left out, its path is kept in `MeshConfig.unsupported`
(logged once at warning, shown in /debug/mesh), and everything else applies.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from pilot.config.base import Model, StrictModel, Unsupported
from pilot.config.extension_providers import DefaultProviders, ExtensionProvider, with_builtin
from pilot.config.networking.locality import LocalityLbSetting
from pilot.durations import parse_duration

TOLERATED = ("extra_forbidden", "unsupported")


class OutboundTrafficPolicy(StrictModel):
    mode: Literal["ALLOW_ANY", "REGISTRY_ONLY"] = "ALLOW_ANY"


class HttpRetryPolicy(StrictModel):
    attempts: int = Field(default=2, ge=0)
    per_try_timeout: str | None = None
    retry_on: str = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"

    @field_validator("per_try_timeout")
    @classmethod
    def _duration(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v)
        return v


class LabelSelectorRequirement(StrictModel):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(StrictModel):
    """A Kubernetes label selector (matchLabels AND matchExpressions)."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator == "In" and not (present and labels[req.key] in req.values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


class ProxyConfig(Model):
    """`defaultConfig` is pilot-agent's (pilot/agent/config.py applies it and warns about what it
    does not know), so it is kept lenient here. Every field is kept as written (extra="allow"):
    the injector and the gateway deployments pass it on to the proxies in PROXY_CONFIG, as istiod
    does. The control plane itself reads only what istiod reads from it for proxies that send no
    PROXY_CONFIG: `tracing` (pilot/model/telemetry.py) and `gatewayTopology.numTrustedProxies`
    (gateway listeners), each from `model_extra`."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)

    discovery_address: str = "istiod.istio-system.svc:15012"


class MeshConfig(StrictModel):
    # --- applied ---
    trust_domain: str = "cluster.local"
    root_namespace: str = "istio-system"
    connect_timeout: str = "10s"
    outbound_traffic_policy: OutboundTrafficPolicy = Field(default_factory=OutboundTrafficPolicy)
    enable_auto_mtls: bool = True
    default_http_retry_policy: HttpRetryPolicy = Field(default_factory=HttpRetryPolicy)
    access_log_file: str = ""
    # Text: a substitution format string (istiod's EnvoyTextLogFormat when empty); JSON: a JSON
    # object of name -> format string (istiod's JSON fields when empty).
    access_log_format: str = ""
    access_log_encoding: Literal["TEXT", "JSON"] = "TEXT"
    # Tracing without a Telemetry or defaultProviders.tracing: istiod's legacy path, where the HCM
    # traces with the proxy's ProxyConfig tracing and pilot-agent writes the tracer (Zipkin) into
    # the bootstrap from it (pilot/model/telemetry.py _legacy_tracing).
    enable_tracing: bool = True
    extension_providers: tuple[ExtensionProvider, ...] = ()
    default_providers: DefaultProviders = Field(default_factory=DefaultProviders)
    default_config: ProxyConfig = Field(
        default_factory=ProxyConfig,
        description="applied by pilot-agent (pilot/agent/config.py), which warns about fields it does "
                    "not know")
    # Which namespaces' services, endpoints and pods the control plane discovers (none = all).
    discovery_selectors: tuple[LabelSelector, ...] = ()
    # Other names of this mesh's trust domain (a migration): AuthorizationPolicy principals and
    # trust domains naming any of them match all of them, as in istiod. (istiod also accepts
    # servers of an alias trust domain on the client side; here a client verifies the server's
    # identity in the trust domain only, which refuses more, never less.)
    trust_domain_aliases: tuple[str, ...] = ()
    # How long a sidecar waits for a client's first bytes on a port it sniffs (no protocol named)
    # before treating the connection as TCP; 0s (istiod's default) waits for ever, so server-first
    # protocols on such ports need a port name or appProtocol.
    protocol_detection_timeout: str = "0s"
    # Kubernetes Ingress (pilot/model/ingress.py), istiod's defaults: the class an Ingress's
    # `kubernetes.io/ingress.class` annotation must name; which Ingresses are processed (OFF: none,
    # STRICT: those naming the class or an IngressClass of istio.io/ingress-controller, DEFAULT:
    # those too and the ones naming no class; UNSPECIFIED: none, as istiod); the Service in
    # K8S_INGRESS_NS whose addresses go to Ingress status; and the `istio` label value of the
    # gateway pods (empty: the service name, or `ingressgateway` for istio-ingressgateway).
    ingress_class: str = "istio"
    ingress_controller_mode: Literal["UNSPECIFIED", "OFF", "DEFAULT", "STRICT"] = "STRICT"
    ingress_service: str = "istio-ingressgateway"
    ingress_selector: str = ""
    # --- istio 1.30 fields not applied here (mesh/v1alpha1/config.proto) ---
    proxy_listen_port: Unsupported = None
    proxy_inbound_listen_port: Unsupported = None
    proxy_http_port: Unsupported = None
    hbone_idle_timeout: Unsupported = None
    tcp_keepalive: Unsupported = None
    enable_envoy_access_log_service: Unsupported = None
    disable_envoy_listener_log: Unsupported = None
    inbound_traffic_policy: Unsupported = None
    config_sources: Unsupported = None
    ca_certificates: Unsupported = None
    default_service_export_to: Unsupported = None
    default_virtual_service_export_to: Unsupported = None
    default_destination_rule_export_to: Unsupported = None
    locality_lb_setting: LocalityLbSetting | None = None  # the default for DestinationRules without one
    dns_refresh_rate: Unsupported = None
    # istiod's mesh default for HTTP ports' outbound clusters (a DestinationRule's wins).
    h2_upgrade_policy: Literal["DO_NOT_UPGRADE", "UPGRADE"] | None = None
    inbound_cluster_stat_name: Unsupported = None
    outbound_cluster_stat_name: Unsupported = None
    certificates: Unsupported = None
    service_settings: Unsupported = None
    service_scope_configs: Unsupported = None
    enable_prometheus_merge: Unsupported = None
    verify_certificate_at_client: Unsupported = None
    ca: Unsupported = None
    path_normalization: Unsupported = None
    mesh_mtls: Unsupported = Field(default=None, alias="meshMTLS")
    tls_defaults: Unsupported = None

    # Paths of the fields the text set that are not applied (see the module docstring).
    _unsupported: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("connect_timeout")
    @classmethod
    def _timeout(cls, v: str) -> str:
        if parse_duration(v) <= 0:
            raise ValueError("connectTimeout must be positive")
        return v

    @property
    def connect_timeout_seconds(self) -> float:
        return parse_duration(self.connect_timeout)

    @property
    def protocol_detection_timeout_seconds(self) -> float:
        return parse_duration(self.protocol_detection_timeout)

    @field_validator("protocol_detection_timeout")
    @classmethod
    def _detection(cls, v: str) -> str:
        if parse_duration(v) < 0:
            raise ValueError("protocolDetectionTimeout must not be negative")
        return v

    @field_validator("trust_domain_aliases")
    @classmethod
    def _aliases(cls, aliases: tuple[str, ...]) -> tuple[str, ...]:
        for a in aliases:
            if not a or "/" in a or any(c.isspace() for c in a):
                raise ValueError(f"trustDomainAliases: {a!r} is not a trust domain")
        return aliases

    @property
    def trust_domains(self) -> tuple[str, ...]:
        """The trust domain, then its aliases (istiod's trust domain bundle)."""
        return tuple(dict.fromkeys((self.trust_domain, *self.trust_domain_aliases)))

    @field_validator("extension_providers")
    @classmethod
    def _unique_providers(cls, v: tuple[ExtensionProvider, ...]) -> tuple[ExtensionProvider, ...]:
        seen: set[str] = set()
        for p in v:
            if p.name in seen:  # istiod's validateExtensionProvider: "duplicate extension provider name"
                raise ValueError(f"extensionProviders: duplicate extension provider name {p.name!r}")
            seen.add(p.name)
        return v

    @property
    def providers(self) -> dict[str, ExtensionProvider]:
        """By name, istiod's built-in `envoy` and `prometheus` included."""
        return {p.name: p for p in with_builtin(self.extension_providers)}

    @property
    def unsupported(self) -> tuple[str, ...]:
        return self._unsupported


class MeshConfigError(ValueError):
    pass


def parse_mesh_config(text: str) -> MeshConfig:
    """Parse MeshConfig YAML; defaults fill whatever the text leaves out, as istiod does."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        raise MeshConfigError(f"mesh config is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MeshConfigError("mesh config must be a YAML mapping")
    try:
        return MeshConfig.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
    fatal = [err for err in errors if err["type"] not in TOLERATED]
    if fatal:
        raise MeshConfigError(f"invalid mesh config: {_describe(fatal)}")
    # Only unknown or unsupported fields: leave them out, remember where they were.
    for err in errors:
        data = _without(data, err["loc"])
    try:
        mesh = MeshConfig.model_validate(data)
    except ValidationError as e:  # cannot happen: what was refused is gone
        raise MeshConfigError(f"invalid mesh config: {_describe(e.errors())}") from None
    mesh._unsupported = tuple(sorted({_path(err["loc"]) for err in errors}))
    return mesh


def _path(loc: tuple) -> str:
    from pilot.config.validation import field_path  # validation imports kinds, which import us
    return field_path(loc)


def _describe(errors: list[Any], limit: int = 5) -> str:
    parts = [f"{_path(err['loc'])}: {err['msg']}" for err in errors[:limit]]
    if len(errors) > limit:
        parts.append(f"... and {len(errors) - limit} more")
    return "; ".join(parts)


def _without(data: Any, loc: tuple) -> Any:
    """A copy of `data` without the value at `loc` (dict keys and list indexes)."""
    if not loc:
        return data
    head, rest = loc[0], loc[1:]
    if isinstance(data, dict) and head in data:
        if not rest:
            return {k: v for k, v in data.items() if k != head}
        return {**data, head: _without(data[head], rest)}
    if isinstance(data, list) and isinstance(head, int) and 0 <= head < len(data):
        if not rest:
            return data  # a list item itself is never an unknown field
        return [*data[:head], _without(data[head], rest), *data[head + 1:]]
    return data
