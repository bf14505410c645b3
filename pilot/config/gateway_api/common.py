"""What the gateway.networking.k8s.io kinds share: the group and controller names, the base model
(whose `status` is kept but never makes a push), hostnames, object references (parentRefs,
backendRefs) and the filters HTTPRoute and GRPCRoute have in common.

Validation follows the Gateway API CRDs' schemas and CEL rules: in Kubernetes the apiserver
enforces them before we ever see an object; in file mode these validators do, with the same
reasons, so a bad file is rejected with its name instead of half-applied.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from pilot.config.base import K8sObject, StrictModel, Unsupported
from pilot.config.networking.validation import _fail, _raise_if, is_ip, validate_regex

GROUP = "gateway.networking.k8s.io"
CONTROLLER_NAME = "istio.io/gateway-controller"
# istiod serves the `istio` class even before its GatewayClass object exists (it creates it).
DEFAULT_CLASS = "istio"

_HOSTNAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
_SECTION_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")
MAX_WEIGHT = 1_000_000


class GatewayApiObject(K8sObject):
    """`status` is what controllers (we, or others for their parents) last wrote. It is kept so
    the status writer can compare against it, and ignored by `spec_equal`: a status write must
    never look like a config change (no push). Any other unknown top-level field is refused, as
    for StrictObject."""

    model_config = ConfigDict(extra="forbid")

    status: dict[str, Any] = Field(default_factory=dict)

    def spec_equal(self, other: K8sObject) -> bool:
        if type(self) is not type(other):
            return False
        ignore: dict[str, Any] = {"status": True,
                  "metadata": {"resource_version", "uid", "generation", "annotations", "creation_timestamp"}}
        return self.model_dump(exclude=ignore) == other.model_dump(exclude=ignore)


# --- names ------------------------------------------------------------------------------------------
def hostname_problem(host: str) -> str | None:
    """The CRDs' Hostname: a DNS name, optionally with a leading `*.` label; never an IP."""
    if is_ip(host):
        return f"hostname {host!r} must not be an IP address"
    if len(host) > 253 or not _HOSTNAME.match(host):
        return (f"hostname {host!r} is not a valid DNS name (lower case labels, an optional leading '*.')")
    return None


def _hostname(host: str) -> str:
    if err := hostname_problem(host):
        _fail(err)
    return host


def _hostnames(hosts: list[str]) -> list[str]:
    _raise_if([e for h in hosts if (e := hostname_problem(h))])
    if len(hosts) > 16:
        _fail("at most 16 hostnames")
    return hosts


Hostname = Annotated[str, AfterValidator(_hostname)]
Hostnames = Annotated[list[str], AfterValidator(_hostnames)]


def _section_name(name: str) -> str:
    if len(name) > 253 or not _SECTION_NAME.match(name):
        _fail(f"{name!r} is not a valid section name (a lower case DNS subdomain)")
    return name


SectionName = Annotated[str, AfterValidator(_section_name)]


def _port(port: int) -> int:
    if not 1 <= port <= 65535:
        _fail(f"port {port} must be in the range 1..65535")
    return port


PortNumber = Annotated[int, AfterValidator(_port)]


def _duration(text: str) -> str:
    if not _DURATION.match(text):
        _fail(f"{text!r} is not a Gateway API duration (e.g. 10s, 500ms, 1h30m)")
    return text


GatewayDuration = Annotated[str, AfterValidator(_duration)]


_GROUP = re.compile(r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_KIND = re.compile(r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_PRECISE_HOSTNAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Visible ASCII, single spaces or tabs between words: no CR/LF (header injection) and no padding.
_HEADER_VALUE = re.compile(r"^[!-~]+([\t ]?[!-~]+)*$")
CONTROLLER_NAME_PATTERN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")


def _matching(pattern: re.Pattern, what: str, max_len: int) -> AfterValidator:
    def check(value: str) -> str:
        if len(value) > max_len or not pattern.match(value):
            _fail(f"{value!r} is not a valid {what} (matching {pattern.pattern})")
        return value
    return AfterValidator(check)


# The CRDs' reference types (apis/v1/shared_types.go), as the apiserver enforces them.
Group = Annotated[str, _matching(_GROUP, "group", 253)]
Kind = Annotated[str, _matching(_KIND, "kind", 63)]
Namespace = Annotated[str, _matching(_NAMESPACE, "namespace", 63)]
ObjectName = Annotated[str, Field(min_length=1, max_length=253)]
PreciseHostname = Annotated[str, _matching(_PRECISE_HOSTNAME, "precise hostname (no wildcard)", 253)]
HeaderValue = Annotated[str, Field(min_length=1, max_length=4096),
                        _matching(_HEADER_VALUE, "header value", 4096)]
ControllerName = Annotated[str, _matching(CONTROLLER_NAME_PATTERN, "controller name (DOMAIN/PATH)", 253)]


def _header_name(name: str) -> str:
    if not _HEADER_NAME.match(name) or len(name) > 256:
        _fail(f"{name!r} is not a valid HTTP header name")
    return name


HeaderName = Annotated[str, AfterValidator(_header_name)]


# --- references -------------------------------------------------------------------------------------
class ParentReference(StrictModel):
    group: Group = GROUP
    kind: Kind = "Gateway"
    namespace: Namespace | None = None
    name: ObjectName
    section_name: SectionName | None = None
    port: PortNumber | None = None

    def as_status(self) -> dict[str, Any]:
        """The reference as the apiserver holds it: as written, with the CRD's defaults for `group`
        and `kind` filled in (status echoes the stored parentRef, and conformance compares
        group and kind exactly; in file mode nothing else would default them)."""
        return {"group": self.group, "kind": self.kind, **self.model_dump(by_alias=True, exclude_unset=True)}

    def refers_to_gateway(self) -> bool:
        return self.group == GROUP and self.kind == "Gateway"


class BackendObjectReference(StrictModel):
    group: Group = ""
    kind: Kind = "Service"
    name: ObjectName
    namespace: Namespace | None = None
    port: PortNumber | None = None

    def describe(self, namespace: str) -> str:
        return f"{self.group or 'core'}/{self.kind}/{self.namespace or namespace}/{self.name}"


def _weight(w: int) -> int:
    if not 0 <= w <= MAX_WEIGHT:
        _fail(f"weight {w} must be in the range 0..{MAX_WEIGHT}")
    return w


Weight = Annotated[int, AfterValidator(_weight)]


class BackendRef(BackendObjectReference):
    weight: Weight = 1

    @model_validator(mode="after")
    def _port_for_services(self) -> BackendRef:
        # CEL: "Must have port for Service reference"
        if self.group in ("", "core") and self.kind == "Service" and self.port is None:
            _fail("port is required for a Service reference")
        return self


class SecretObjectReference(StrictModel):
    group: Group = ""
    kind: Kind = "Secret"
    name: ObjectName
    namespace: Namespace | None = None


# --- filters ----------------------------------------------------------------------------------------
class HTTPHeader(StrictModel):
    name: HeaderName
    value: HeaderValue


class HeaderModifier(StrictModel):
    set: list[HTTPHeader] = Field(default_factory=list)
    add: list[HTTPHeader] = Field(default_factory=list)
    remove: list[HeaderName] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> HeaderModifier:
        for op, names in (("set", [h.name for h in self.set]), ("add", [h.name for h in self.add]),
                          ("remove", list(self.remove))):
            lowered = [n.lower() for n in names]
            if len(set(lowered)) != len(lowered):
                _fail(f"{op}: header names must be unique (case-insensitively)")
        return self


class Fraction(StrictModel):
    numerator: int = Field(ge=0)
    denominator: int = Field(default=100, gt=0)

    @model_validator(mode="after")
    def _le(self) -> Fraction:
        if self.numerator > self.denominator:
            _fail("numerator must be less than or equal to denominator")
        return self


class RequestMirror(StrictModel):
    backend_ref: BackendObjectReference
    percent: int | None = Field(default=None, ge=0, le=100)
    fraction: Fraction | None = None

    @model_validator(mode="after")
    def _one(self) -> RequestMirror:
        if self.percent is not None and self.fraction is not None:
            _fail("only one of percent or fraction may be specified")
        return self

    @property
    def share(self) -> float | None:
        """The mirrored share in percent, or None for every request."""
        if self.percent is not None:
            return float(self.percent)
        if self.fraction is not None:
            return 100.0 * self.fraction.numerator / self.fraction.denominator
        return None


class LocalObjectReference(StrictModel):
    group: Group
    kind: Kind
    name: ObjectName


FilterType = Literal["RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "RequestRedirect",
                     "URLRewrite", "ExtensionRef", "CORS", "ExternalAuth"]


def check_filter_fields(f: StrictModel, kind: str) -> None:
    """CEL: the field named by `type` must be set, and no other filter field."""
    fields = {"RequestHeaderModifier": "request_header_modifier", "ResponseHeaderModifier": "response_header_modifier",
              "RequestMirror": "request_mirror", "RequestRedirect": "request_redirect", "URLRewrite": "url_rewrite",
              "ExtensionRef": "extension_ref", "CORS": "cors", "ExternalAuth": "external_auth"}
    own = fields.get(kind)
    errs = []
    for k, attr in fields.items():
        present = getattr(f, attr, None) is not None
        if k == kind and not present:
            errs.append(f"filter.{attr} must be specified for type {kind}")
        elif k != kind and present:
            errs.append(f"filter.{attr} must be nil if the filter.type is not {k}")
    if own is None:
        errs.append(f"unknown filter type {kind!r}")
    _raise_if(errs)


def validate_regex_value(value: str, where: str) -> None:
    if err := validate_regex(value, where):
        _fail(err)


class HeaderMatch(StrictModel):
    type: Literal["Exact", "RegularExpression"] = "Exact"
    name: HeaderName
    value: str = Field(min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _regex(self) -> HeaderMatch:
        if self.type == "RegularExpression":
            validate_regex_value(self.value, "value")
        return self


def unique_names(items: list, what: str) -> list:
    """A list the CRD keys by `name` (x-kubernetes-list-type: map): the apiserver refuses a
    name given twice."""
    names = [i.name for i in items]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        _fail(f"{what}: duplicate name {', '.join(repr(d) for d in dupes)}")
    return items


def first_per_name(matches: list[HeaderMatch]) -> list[HeaderMatch]:
    """The spec: of several matches for one name (case-insensitive), only the first counts."""
    seen: set[str] = set()
    out = []
    for m in matches:
        if m.name.lower() not in seen:
            seen.add(m.name.lower())
            out.append(m)
    return out


class CommonRouteSpec(StrictModel):
    parent_refs: list[ParentReference] = Field(default_factory=list)
    # Gateway API 1.6 (experimental): attach to the Gateways marked default. Nothing here marks a
    # Gateway default, so a route asking for it would attach nowhere the user expects.
    use_default_gateways: Unsupported = None

    @field_validator("parent_refs")
    @classmethod
    def _parents(cls, refs: list[ParentReference]) -> list[ParentReference]:
        if len(refs) > 32:
            _fail("at most 32 parentRefs")
        seen = set()
        for r in refs:
            key = (r.group, r.kind, r.namespace, r.name, r.section_name, r.port)
            if key in seen:
                _fail("sectionName or port must be specified when parentRefs includes 2 or more references "
                      "to the same parent")
            seen.add(key)
        return refs
