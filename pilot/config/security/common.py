"""What the security.istio.io kinds share: the group, workload selectors, policy target references
(istiod's validatePolicyTargetReference and validateOneOfSelectorType) and the value checks of
istiod's `pkg/config/security` (IPs and CIDRs, ports, empty values, path templates)."""

from __future__ import annotations

import ipaddress
import re

from pydantic import ConfigDict

from pilot.config.base import StrictModel
from pilot.config.networking.common import WorkloadSelector

GROUP = "security.istio.io"
VERSIONS = ("v1", "v1beta1")

# (group, kind) a targetRef may name; the empty group is the core API ("core" in istiod's message).
ALLOWED_TARGET_KINDS = (("", "Service"), ("networking.istio.io", "ServiceEntry"),
                        ("gateway.networking.k8s.io", "Gateway"), ("gateway.networking.k8s.io", "GatewayClass"))


class PolicyTargetReference(StrictModel):
    group: str = ""
    kind: str = ""
    name: str = ""
    namespace: str = ""

    def problems(self) -> list[str]:
        errs = []
        if not self.name:
            errs.append("targetRef name must be set")
        if self.namespace:
            errs.append("targetRef namespace must not be set; cross namespace referencing is not supported")
        group = "" if self.group in ("", "core") else self.group
        if (group, self.kind) not in ALLOWED_TARGET_KINDS:
            allowed = ", ".join(f"{g or 'core'}/{k}" for g, k in ALLOWED_TARGET_KINDS)
            errs.append(f"targetRef must be to one of [{allowed}] but was {self.group}/{self.kind}")
        return errs


class Selector(WorkloadSelector):
    """`selector.matchLabels`; an empty selector selects like no selector (istiod only warns).
    Strict: a misspelt key (`matchLabel`) would otherwise select every workload of the namespace."""

    model_config = ConfigDict(extra="forbid")


def selector_problems(selector: Selector | None, target_ref: PolicyTargetReference | None,
                      target_refs: list[PolicyTargetReference]) -> list[str]:
    errs = []
    if sum((selector is not None, target_ref is not None, bool(target_refs))) > 1:
        errs.append("only one of targetRefs or workloadSelector can be set")
    for ref in ([target_ref] if target_ref is not None else []) + list(target_refs):
        errs += ref.problems()
    return errs


def ip_problems(values: list[str] | None) -> list[str]:
    """istio security.ValidateIPs: an address, or a CIDR when it holds a '/'."""
    errs = []
    for v in values or ():
        if "/" in v:
            try:
                ipaddress.ip_network(v, strict=False)
            except ValueError as e:
                errs.append(f"bad CIDR range ({v}): {e}")
        else:
            try:
                ipaddress.ip_address(v)
            except ValueError:
                errs.append(f"bad IP address ({v})")
    return errs


def port_problems(values: list[str] | None) -> list[str]:
    """istio security.ValidatePorts: decimal 0..65535."""
    return [f"bad port ({p})" for p in values or () if not (p.isascii() and p.isdigit() and int(p) <= 65535)]


def empty_value_problem(field: str, values: list[str] | None) -> list[str]:
    return [f"empty value not allowed, found in {field}"] if any(v == "" for v in values or ()) else []


def wildcard_problem(field: str, values: list[str] | None) -> str | None:
    """istio security.CheckWildcardValues: exact, `prefix*`, `*suffix` or `*`, one `*` at most."""
    for v in values or ():
        if v == "":
            return f"empty value not allowed, found in {field}"
        stars = v.count("*")
        if stars > 1:
            return f"at most one wildcard is allowed, found in {field}: {v!r}"
        if stars == 1 and v != "*" and not v.startswith("*") and not v.endswith("*"):
            return f"wildcard is only allowed at the start or end, found in {field}: {v!r}"
    return None


def trust_domain_problem(field: str, values: list[str] | None) -> str | None:
    """istio security.CheckTrustDomainValues: wildcard values without '/'."""
    if err := wildcard_problem(field, values):
        return err
    for v in values or ():
        if "/" in v:
            return f"trust domain must not contain '/', found in {field}: {v!r}"
    return None


def service_account_problem(field: str, values: list[str] | None) -> str | None:
    """istio security.CheckServiceAccount: `sa` or `ns/sa`, no wildcard, 16 values at most."""
    values = values or []
    if len(values) > 16:
        return "may not have more than 16 values"
    expected = "expected format 'serviceAccount' or 'namespace/serviceAccount'"
    for v in values:
        if v == "":
            return f"empty value not allowed, found in {field}"
        if "*" in v:
            return f"wildcard not allowed, found in {field}"
        if v.count("/") > 1:
            return f"{expected}, found {v!r} in {field}"
        if len(v) > 320:
            return f"value cannot exceed 320 characters, found {v!r} in {field}"
        ns, slash, sa = v.partition("/")
        if slash and not ns:
            return f"{expected}, found empty namespace {v!r} in {field}"
        if slash and not sa:
            return f"{expected}, found empty serviceAccount {v!r} in {field}"
    return None


MATCH_ONE_TEMPLATE = "{*}"
MATCH_ANY_TEMPLATE = "{**}"
# Named variables, empty braces and bare `*`/`**` segments: what Envoy's uri_template needs but
# istiod does not offer (only `{*}` and `{**}`).
_UNSUPPORTED_TEMPLATE = re.compile(r"/\{\w+=\*[*]?\}|\{\w*\}|/\*[*]?|\*[*]?/")


def is_path_template(path: str) -> bool:
    return MATCH_ONE_TEMPLATE in path or MATCH_ANY_TEMPLATE in path


def path_template_problems(field: str, paths: list[str] | None) -> list[str]:
    for p in paths or ():
        if is_path_template(p) and _UNSUPPORTED_TEMPLATE.search(p):
            return [f"invalid or unsupported path template, found in {field}"]
    return []


class Provider(StrictModel):
    """`provider: {name}` of a CUSTOM AuthorizationPolicy: an extension provider of MeshConfig."""

    name: str = ""
