"""Telemetry (telemetry.istio.io v1, v1alpha1 serves the same schema) with istiod's
validation-webhook rules (`pkg/config/validation` validateTelemetry*).

What the upstream Envoy binary cannot do is refused here, naming the field: metric overrides and
reporting intervals configure istio-proxy's `istio.stats` filter, which upstream Envoy lacks.
Providers are names of MeshConfig `extensionProviders`; whether they exist is checked when the
Telemetry is applied (pilot/model/telemetry.py), since the MeshConfig can change after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pilot.config import cel
from pilot.config.base import StrictModel, StrictObject, Unsupported
from pilot.config.networking.validation import _raise_if
from pilot.config.proxy_tracing import TracingCustomTag
from pilot.config.security.common import PolicyTargetReference, Selector, selector_problems

GROUP = "telemetry.istio.io"
VERSIONS = ("v1", "v1alpha1")

WorkloadMode = Literal["CLIENT_AND_SERVER", "CLIENT", "SERVER"]


class ProviderRef(StrictModel):
    name: str = Field(min_length=1)


class WorkloadModeSelector(StrictModel):
    mode: WorkloadMode = "CLIENT_AND_SERVER"


class TagFormatter(StrictModel):
    value: str = Field(min_length=1)


class CustomTag(TracingCustomTag):
    """ProxyConfig's custom tag (one validator: exactly one kind set), plus `formatter`."""
    formatter: TagFormatter | None = None

    def spec(self) -> tuple[str, str, str]:
        if self.formatter is not None:
            return "formatter", self.formatter.value, ""
        return super().spec()


class Tracing(StrictModel):
    match: WorkloadModeSelector | None = None
    providers: list[ProviderRef] = Field(default_factory=list)
    random_sampling_percentage: float | None = Field(default=None, ge=0, le=100)
    disable_span_reporting: bool | None = None
    custom_tags: dict[str, CustomTag] = Field(default_factory=dict)
    use_request_id_for_trace_sampling: bool | None = None
    enable_istio_tags: bool | None = None
    disable_context_propagation: bool | None = None

    @model_validator(mode="after")
    def _valid(self) -> Tracing:
        if len(self.providers) > 1:  # istiod: "multiple providers is not currently supported"
            raise ValueError("providers: multiple tracing providers are not supported (name one)")
        return self


class AccessLogFilter(StrictModel):
    expression: str = Field(min_length=1)

    @field_validator("expression")
    @classmethod
    def _cel(cls, v: str) -> str:
        try:
            cel.check(v)
        except cel.CelSyntaxError as e:
            raise ValueError(f"expression is not a valid CEL expression: {e}") from None
        return v


class AccessLogging(StrictModel):
    match: WorkloadModeSelector | None = None
    providers: list[ProviderRef] = Field(default_factory=list)
    disabled: bool | None = None
    filter: AccessLogFilter | None = None


class Metrics(StrictModel):
    providers: list[ProviderRef] = Field(default_factory=list)
    # istio-proxy's istio.stats filter (not in upstream Envoy) is what these configure.
    overrides: Unsupported = None
    reporting_interval: Unsupported = None

    @model_validator(mode="before")
    @classmethod
    def _no_istio_stats(cls, data: object) -> object:
        if isinstance(data, dict):
            for key in ("overrides", "reportingInterval", "reporting_interval"):
                if data.get(key) is not None:
                    raise ValueError(f"{key}: not supported: metric overrides and the reporting interval "
                                     "configure istio-proxy's istio.stats filter, which upstream Envoy does "
                                     "not have (Envoy's own Prometheus stats are unchanged)")
        return data


class TelemetrySpec(StrictModel):
    selector: Selector | None = None
    target_ref: PolicyTargetReference | None = None
    target_refs: list[PolicyTargetReference] = Field(default_factory=list)
    tracing: list[Tracing] = Field(default_factory=list)
    metrics: list[Metrics] = Field(default_factory=list)
    access_logging: list[AccessLogging] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> TelemetrySpec:
        _raise_if(selector_problems(self.selector, self.target_ref, self.target_refs))
        return self

    @property
    def target_references(self) -> list[PolicyTargetReference]:
        return ([self.target_ref] if self.target_ref is not None else []) + list(self.target_refs)

    def provider_names(self) -> list[tuple[str, str]]:
        """(field path, provider name) of every provider this Telemetry names."""
        out = []
        uses: tuple[tuple[str, Sequence[Tracing | AccessLogging | Metrics]], ...] = (
            ("tracing", self.tracing), ("accessLogging", self.access_logging), ("metrics", self.metrics))
        for what, items in uses:
            for i, item in enumerate(items):
                out += [(f"{what}[{i}].providers[{j}]", p.name) for j, p in enumerate(item.providers)]
        return out


class Telemetry(StrictObject):
    kind: Literal["Telemetry"] = "Telemetry"
    spec: TelemetrySpec = TelemetrySpec()
