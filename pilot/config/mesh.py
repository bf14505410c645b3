"""MeshConfig: the mesh-wide settings, from the `istio` ConfigMap's `mesh` key or `--meshConfig`."""

from __future__ import annotations

from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from pilot.config.base import Model, StrictModel
from pilot.durations import parse_duration


class OutboundTrafficPolicy(Model):
    mode: Literal["ALLOW_ANY", "REGISTRY_ONLY"] = "ALLOW_ANY"


class HttpRetryPolicy(Model):
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
    discovery_address: str = "istiod.istio-system.svc:15012"


class MeshConfig(Model):
    trust_domain: str = "cluster.local"
    root_namespace: str = "istio-system"
    connect_timeout: str = "10s"
    outbound_traffic_policy: OutboundTrafficPolicy = Field(default_factory=OutboundTrafficPolicy)
    enable_auto_mtls: bool = True
    default_http_retry_policy: HttpRetryPolicy = Field(default_factory=HttpRetryPolicy)
    access_log_file: str = ""
    default_config: ProxyConfig = Field(default_factory=ProxyConfig)
    # Which namespaces' services, endpoints and pods the control plane discovers (none = all).
    discovery_selectors: tuple[LabelSelector, ...] = ()

    @field_validator("connect_timeout")
    @classmethod
    def _timeout(cls, v: str) -> str:
        if parse_duration(v) <= 0:
            raise ValueError("connectTimeout must be positive")
        return v

    @property
    def connect_timeout_seconds(self) -> float:
        return parse_duration(self.connect_timeout)


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
        raise MeshConfigError(f"invalid mesh config: {_first_errors(e)}") from None


def _first_errors(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5]
    )
