"""MeshConfig `extensionProviders` and `defaultProviders` (mesh/v1alpha1/config.proto).

Every provider kind of istio 1.30 is modelled, so a MeshConfig naming any of them parses. The
kinds this control plane turns into Envoy config (access logs: envoyFileAccessLog, envoyOtelAls,
envoyHttpAls and envoyTcpAls, Envoy's gRPC access log service; tracing: zipkin, opentelemetry, datadog; metrics: prometheus, which is Envoy's own stats) are
strict. The others are kept leniently (their fields are not read): a Telemetry or
`defaultProviders` naming one is refused with the reason (pilot/model/telemetry.py), never
silently dropped. The ext_authz kinds (envoyExtAuthzHttp, envoyExtAuthzGrpc: pilot/config/ext_authz.py)
are for AuthorizationPolicy CUSTOM: applied there, refused as telemetry providers.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from pilot.config.base import StrictModel, Unsupported, fails_closed
from pilot.config.ext_authz import ExtAuthzProviderKinds
from pilot.durations import parse_duration


class HttpHeader(StrictModel):
    name: str = Field(min_length=1)
    value: str = ""
    env_name: Unsupported = None


class LogFormat(StrictModel):
    """`text` (a substitution format string) or `labels` (JSON: name -> format string)."""

    text: str | None = None
    labels: dict[str, str] | None = None  # each value a format string

    @model_validator(mode="after")
    def _one(self) -> LogFormat:
        if self.text is not None and self.labels is not None:
            raise ValueError("logFormat: set text or labels, not both")
        return self


class EnvoyFileAccessLog(StrictModel):
    path: str = ""
    log_format: LogFormat | None = None
    omit_empty_values: bool = False


class OtelLogFormat(StrictModel):
    text: str = ""
    labels: dict[str, str] | None = None


class EnvoyOtelAls(StrictModel):
    service: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    log_name: str = ""
    log_format: OtelLogFormat | None = None


class EnvoyHttpAls(StrictModel):
    """envoyHttpAls (EnvoyHttpGrpcV3LogProvider): Envoy's `envoy.access_loggers.http_grpc`."""

    service: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    log_name: str = ""
    filter_state_objects_to_log: list[str] = Field(default_factory=list)
    additional_request_headers_to_log: list[str] = Field(default_factory=list)
    additional_response_headers_to_log: list[str] = Field(default_factory=list)
    additional_response_trailers_to_log: list[str] = Field(default_factory=list)


class EnvoyTcpAls(StrictModel):
    """envoyTcpAls (EnvoyTcpGrpcV3LogProvider): Envoy's `envoy.access_loggers.tcp_grpc`."""

    service: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    log_name: str = ""
    filter_state_objects_to_log: list[str] = Field(default_factory=list)


class _Collector(StrictModel):
    service: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    max_tag_length: int = Field(default=0, ge=0)


class Zipkin(_Collector):
    enable_64bit_trace_id: bool = Field(default=False, alias="enable64bitTraceId")
    path: str = ""
    trace_context_option: str = "USE_B3"
    timeout: str | None = None
    headers: list[HttpHeader] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> Zipkin:
        if self.trace_context_option not in ("USE_B3", "USE_B3_WITH_W3C_PROPAGATION"):
            raise ValueError(f"traceContextOption: unknown option {self.trace_context_option!r}")
        if self.timeout is not None:
            parse_duration(self.timeout)
        return self


class Datadog(_Collector):
    pass


class OtelHttp(StrictModel):
    path: str = ""
    timeout: str | None = None
    headers: list[HttpHeader] = Field(default_factory=list)


class OtelGrpc(StrictModel):
    timeout: str | None = None
    initial_metadata: list[HttpHeader] = Field(default_factory=list)


class OpenTelemetry(_Collector):
    http: OtelHttp | None = None
    grpc: OtelGrpc | None = None
    resource_detectors: Unsupported = None
    dynatrace_sampler: Unsupported = None
    service_attribute_enrichment: Unsupported = None


class Prometheus(StrictModel):
    """Metrics: Envoy's own Prometheus stats (there is nothing to configure in upstream Envoy)."""


# Kinds whose Envoy config is generated, by what they provide.
ACCESS_LOG_KINDS = ("envoy_file_access_log", "envoy_otel_als", "envoy_http_als", "envoy_tcp_als")
TRACING_KINDS = ("zipkin", "opentelemetry", "datadog")
METRICS_KINDS = ("prometheus",)
# Kept but not applied (their fields are not read): why, for the refusal.
NOT_APPLIED = {
    "envoy_ext_authz_http": "ext_authz providers are for AuthorizationPolicy CUSTOM, not telemetry",
    "envoy_ext_authz_grpc": "ext_authz providers are for AuthorizationPolicy CUSTOM, not telemetry",
    "lightstep": "lightstep is deprecated in istio (use opentelemetry)",
    "stackdriver": "stackdriver needs istio-proxy's stackdriver filter, not in upstream Envoy",
    "opencensus": "opencensus was removed from Envoy (use opentelemetry)",
    "skywalking": "the skywalking provider is not supported",
    "sds": "the sds provider is not supported",
}


_REFUSED = "kept, not applied: a Telemetry or defaultProviders naming it is refused with the reason"


class ExtensionProvider(ExtAuthzProviderKinds):
    name: str = Field(min_length=1)
    envoy_file_access_log: EnvoyFileAccessLog | None = None
    envoy_otel_als: EnvoyOtelAls | None = None
    zipkin: Zipkin | None = None
    opentelemetry: OpenTelemetry | None = None
    datadog: Datadog | None = None
    prometheus: Prometheus | None = None
    envoy_http_als: EnvoyHttpAls | None = None
    envoy_tcp_als: EnvoyTcpAls | None = None
    lightstep: dict[str, Any] | None = fails_closed(_REFUSED)
    stackdriver: dict[str, Any] | None = fails_closed(_REFUSED)
    opencensus: dict[str, Any] | None = fails_closed(_REFUSED)
    skywalking: dict[str, Any] | None = fails_closed(_REFUSED)
    sds: dict[str, Any] | None = fails_closed(_REFUSED)

    @model_validator(mode="after")
    def _one(self) -> ExtensionProvider:
        set_ = [k for k in type(self).model_fields if k != "name" and getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError(f"extension provider {self.name!r} must set exactly one provider kind")
        return self

    @property
    def provider_kind(self) -> str:
        return next(k for k in type(self).model_fields if k != "name" and getattr(self, k) is not None)


class DefaultProviders(StrictModel):
    tracing: list[str] = Field(default_factory=list)
    metrics: list[str] = Field(default_factory=list)
    access_logging: list[str] = Field(default_factory=list)


# The built-in providers istiod adds when absent (pkg/config/mesh addBuiltinProviders): `envoy`
# logs to /dev/stdout in MeshConfig's accessLogFormat/accessLogEncoding; `prometheus`.
BUILTIN_ENVOY = "envoy"


def with_builtin(providers: tuple[ExtensionProvider, ...]) -> tuple[ExtensionProvider, ...]:
    names = {p.name for p in providers}
    out = list(providers)
    if BUILTIN_ENVOY not in names:
        out.append(ExtensionProvider(name=BUILTIN_ENVOY, envoy_file_access_log=EnvoyFileAccessLog(path="/dev/stdout")))
    if "prometheus" not in names:
        out.append(ExtensionProvider(name="prometheus", prometheus=Prometheus()))
    return tuple(out)
