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


# The custom tag shapes are the Telemetry API's too (pilot/config/telemetry.py adds `formatter`).
class TagLiteral(StrictModel):
    value: str = ""


class TagEnvironment(StrictModel):
    name: str = Field(min_length=1)
    default_value: str = ""


class TagHeader(StrictModel):
    name: str = Field(min_length=1)
    default_value: str = ""


class TracingCustomTag(StrictModel):
    literal: TagLiteral | None = None
    environment: TagEnvironment | None = None
    header: TagHeader | None = None

    @model_validator(mode="after")
    def _one(self) -> TracingCustomTag:
        kinds = type(self).model_fields
        if sum(getattr(self, k) is not None for k in kinds) != 1:
            raise ValueError(f"custom tag must set exactly one of {', '.join(kinds)}")
        return self

    def spec(self) -> tuple[str, str, str]:
        """(literal|environment|header, value or name, default)."""
        if self.literal is not None:
            return "literal", self.literal.value, ""
        if self.environment is not None:
            return "environment", self.environment.name, self.environment.default_value
        assert self.header is not None
        return "header", self.header.name, self.header.default_value


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
        return tuple((name, *t.spec()) for name, t in sorted(self.custom_tags.items()))


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
