"""Constants and the small building-block models of the networking.istio.io kinds: string matches,
percentages and destinations (VirtualService), port selectors (VirtualService, DestinationRule) and
workload selectors (DestinationRule, ServiceEntry, Sidecar)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from pilot.config.base import StrictModel
from pilot.config.networking.validation import (
    Port,
    _fail,
    _raise_if,
    is_dns1123_label,
    validate_regex,
    validate_wildcard_domain,
)

GROUP = "networking.istio.io"
MESH_GATEWAY = "mesh"
UNIX_PREFIX = "unix://"


class StringMatch(StrictModel):
    """At most one of exact/prefix/regex. An empty match (`{}`) is only meaningful, and only
    accepted, as a header/query-parameter match, where Istio defines it as "present"."""

    exact: str | None = None
    prefix: str | None = None
    regex: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> StringMatch:
        given = [k for k in ("exact", "prefix", "regex") if getattr(self, k) is not None]
        if len(given) > 1:
            _fail(f"only one of exact, prefix or regex may be set, got {' and '.join(given)}")
        if self.prefix == "":
            _fail("prefix string match should not be empty")
        if self.regex is not None and (err := validate_regex(self.regex, "regex")):
            _fail(err)
        return self

    @property
    def is_empty(self) -> bool:
        return self.exact is None and self.prefix is None and self.regex is None



class PortSelector(StrictModel):
    number: Port


class Destination(StrictModel):
    host: str
    subset: str = ""
    port: PortSelector | None = None

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        if host == "*":
            _fail("invalid destination host *")
        if err := validate_wildcard_domain(host):
            _fail(err)
        return host

    @field_validator("subset")
    @classmethod
    def _subset(cls, subset: str) -> str:
        if subset and not is_dns1123_label(subset):
            _fail(f"subset name is invalid: {subset}")
        return subset



class Percent(StrictModel):
    value: float = 0.0

    @field_validator("value")
    @classmethod
    def _range(cls, value: float) -> float:
        if value < 0 or value > 100 or 0 < value < 0.0001:
            _fail(f"percentage {value} is neither 0.0, nor in range [0.0001, 100.0]")
        return value



def _selector_labels(labels: dict[str, str]) -> dict[str, str]:
    errs = []
    for k, v in labels.items():
        if not k:
            errs.append(f"empty key is not supported in selector: '{k}={v}'")
        if "*" in k or "*" in v:
            errs.append(f"wildcard is not supported in selector: '{k}={v}'")
    _raise_if(errs)
    return labels


SelectorLabels = Annotated[dict[str, str], AfterValidator(_selector_labels)]


class WorkloadSelector(StrictModel):
    """istio.type.v1beta1.WorkloadSelector (DestinationRule, and the security kinds): the field is
    `matchLabels`. Sidecar's and ServiceEntry's selector spells it `labels`
    (`NetworkingWorkloadSelector`); neither spelling is accepted for the other, as in istio."""

    match_labels: SelectorLabels = Field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return self.match_labels


class NetworkingWorkloadSelector(StrictModel):
    """networking.v1alpha3.WorkloadSelector (Sidecar, ServiceEntry): the field is `labels`."""

    labels: SelectorLabels = Field(default_factory=dict)

    @property
    def match_labels(self) -> dict[str, str]:
        return self.labels
