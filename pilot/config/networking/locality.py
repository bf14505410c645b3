"""LocalityLoadBalancerSetting (DestinationRule `trafficPolicy.loadBalancer.localityLbSetting`
and MeshConfig `localityLbSetting`), with istiod's ValidateLocalityLbSetting rules."""

from __future__ import annotations

from pydantic import Field, model_validator

from pilot.config.base import StrictModel
from pilot.config.networking.validation import _fail

TOPOLOGY_LABELS = ("topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone")


class LocalityDistribute(StrictModel):
    from_: str = Field(default="", alias="from")
    to: dict[str, int] = Field(default_factory=dict)


class LocalityFailover(StrictModel):
    from_: str = Field(default="", alias="from")
    to: str = ""


class LocalityLbSetting(StrictModel):
    distribute: list[LocalityDistribute] = Field(default_factory=list)
    failover: list[LocalityFailover] = Field(default_factory=list)
    failover_priority: list[str] = Field(default_factory=list)
    enabled: bool | None = None

    @model_validator(mode="after")
    def _valid(self) -> LocalityLbSetting:
        if self.distribute and self.failover:
            _fail("can not simultaneously specify 'distribute' and 'failover'")
        if self.failover and self.failover_priority:
            for label in self.failover_priority:
                if label in TOPOLOGY_LABELS:
                    _fail(f"can not simultaneously set 'failover' and topology label '{label}' in 'failover_priority'")
        for d in self.distribute:
            for loc, weight in d.to.items():
                if not 1 <= weight <= 100:
                    _fail(f"distribute from {d.from_!r}: weight of {loc!r} must be in range [1, 100], got {weight}")
            total = sum(d.to.values())
            if total != 100:
                _fail(f"distribute from {d.from_!r}: total locality weight {total} != 100")
            _check_localities(list(d.to))
        _check_localities([d.from_ for d in self.distribute])
        for f in self.failover:
            if f.from_ == f.to:
                _fail("locality lb failover settings must specify different regions")
            if "/" in f.from_ or "/" in f.to:
                _fail("locality lb failover only specify region")
            if "*" in f.from_ or "*" in f.to:
                _fail("locality lb failover region should not contain '*' wildcard")
        return self


def _check_localities(localities: list[str]) -> None:
    """istiod's validateLocalities: at most one trailing '*', no empty part, no overlap."""
    seen: list[tuple[str, ...]] = []
    for loc in localities:
        n = loc.count("*")
        if n > 1 or (n == 1 and not loc.endswith("*")):
            _fail(f"locality {loc} wildcard '*' number can not exceed 1 and must be in the end")
        parts = tuple(loc.split("/", 2))
        if any(p == "" for p in parts):
            _fail(f"locality {loc} must not contain empty region/zone/subzone info")
        # "a" or "a/*" covers everything under a: two entries overlap when one is a prefix of the other.
        norm = parts[:-1] if parts[-1] == "*" else parts
        for other in seen:
            k = min(len(norm), len(other))
            if norm[:k] == other[:k]:
                _fail(f"locality {loc} overlap with previous specified ones")
        seen.append(norm)
