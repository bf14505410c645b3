"""ProxyConfig `tracing` (mesh/v1alpha1 proxy.proto Tracing): MeshConfig `defaultConfig.tracing`,
or a proxy's own ProxyConfig (`PROXY_CONFIG`, the `proxy.istio.io/config` annotation).

Two parties read it, as in Istio: the control plane (sampling, custom tags, max path tag length
and the istio.* tags of each HTTP connection manager's `tracing`, pilot/model/telemetry.py), and
pilot-agent, which writes the Zipkin tracer into Envoy's bootstrap from `zipkin.address`
(pilot/agent/bootstrap.py). The other tracers of the proto need istio-proxy's bootstrap template
(lightstep, stackdriver, openCensusAgent) or are better configured as a MeshConfig extension
provider (datadog): they and `tls` are refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError, model_validator

from pilot.config.base import StrictModel, Unsupported


class ZipkinTracer(StrictModel):
    address: str = Field(min_length=1)  # HOST:PORT of the collector

    @model_validator(mode="after")
    def _host_port(self) -> ZipkinTracer:
        host, sep, port = self.address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise ValueError(f"zipkin.address {self.address!r} must be HOST:PORT")
        return self


class TracingLiteral(StrictModel):
    value: str = ""


class TracingEnvironment(StrictModel):
    name: str = Field(min_length=1)
    default_value: str = ""


class TracingHeader(StrictModel):
    name: str = Field(min_length=1)
    default_value: str = ""


class TracingCustomTag(StrictModel):
    literal: TracingLiteral | None = None
    environment: TracingEnvironment | None = None
    header: TracingHeader | None = None

    @model_validator(mode="after")
    def _one(self) -> TracingCustomTag:
        if sum(v is not None for v in (self.literal, self.environment, self.header)) != 1:
            raise ValueError("custom tag must set exactly one of literal, environment, header")
        return self


class ProxyTracing(StrictModel):
    zipkin: ZipkinTracer | None = None
    # istiod: 0 means "not set" (PILOT_TRACE_SAMPLING applies); above 100 is taken as 1.
    sampling: float = Field(default=0.0, ge=0)
    custom_tags: dict[str, TracingCustomTag] = Field(default_factory=dict)
    max_path_tag_length: int = Field(default=0, ge=0)
    enable_istio_tags: bool | None = None
    tls: Unsupported = None
    lightstep: Unsupported = None
    datadog: Unsupported = None
    stackdriver: Unsupported = None
    open_census_agent: Unsupported = None

    def tags(self) -> tuple[tuple[str, str, str, str], ...]:
        """(tag, literal|environment|header, value or name, default), sorted by tag."""
        out = []
        for name, t in sorted(self.custom_tags.items()):
            if t.literal is not None:
                out.append((name, "literal", t.literal.value, ""))
            elif t.environment is not None:
                out.append((name, "environment", t.environment.name, t.environment.default_value))
            elif t.header is not None:
                out.append((name, "header", t.header.name, t.header.default_value))
        return tuple(out)


def parse_proxy_tracing(raw: Any, where: str) -> tuple[ProxyTracing | None, list[str]]:
    """A ProxyConfig's `tracing` value -> the model and problems. What cannot be parsed is
    reported and treated as absent (the proxy is traced as if no tracing section were written),
    since the ProxyConfig itself was accepted (MeshConfig is tolerant, PROXY_CONFIG is the agent's)."""
    if raw is None:
        return None, []
    if not isinstance(raw, Mapping):
        return None, [f"{where}: must be an object, got {type(raw).__name__}; ignored"]
    try:
        return ProxyTracing.model_validate(raw), []
    except ValidationError as e:
        from pilot.config.validation import field_path  # validation imports kinds, which import mesh
        reasons = "; ".join(f"{field_path(err['loc'])}: {err['msg']}" for err in e.errors()[:5])
        return None, [f"{where}: {reasons}; the tracing section is ignored"]
