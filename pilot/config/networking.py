"""The networking.istio.io kinds (VirtualService, DestinationRule, ServiceEntry, WorkloadEntry,
Sidecar, Gateway) with istiod's validation-webhook rules.

Field names are the Istio API's proto field names in snake_case; the `Model` base gives them the
API's JSON (camelCase) names, except where protoc's JSON naming differs from `to_camel`
(`consecutive5xxErrors`) or the name is a Python keyword (`from`), which carry explicit aliases.

Validation follows istiod's `pkg/config/validation` (ValidateVirtualService, ValidateDestinationRule,
...): what istiod rejects is rejected here with a reason naming the field; what istiod only warns
about (deprecated fields, duplicate egress hosts) is accepted. Where this deliberately differs from
current istiod it says so next to the rule.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import warnings
from http import HTTPStatus
from typing import Annotated, Literal

from pydantic import AfterValidator, AliasChoices, BeforeValidator, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from pilot.config.base import K8sObject, Model
from pilot.config.mesh import OutboundTrafficPolicy
from pilot.durations import parse_duration

GROUP = "networking.istio.io"
MESH_GATEWAY = "mesh"
UNIX_PREFIX = "unix://"


# --- errors ---------------------------------------------------------------------------------------
def _fail(problems: list[str] | str) -> None:
    """Raise one validation error carrying every problem (no "Value error," prefix)."""
    if isinstance(problems, str):
        problems = [problems]
    raise PydanticCustomError("istio_validation", "{reason}", {"reason": "; ".join(problems)})


def _raise_if(problems: list[str]) -> None:
    if problems:
        _fail(problems)


# --- names, hosts, addresses (istio pkg/config/labels, validation/agent) -----------------------------
_DNS1123_LABEL = re.compile(r"^[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?$")  # istio allows upper case
_WILDCARD_LABEL = re.compile(r"^(?:\*|(?:\*|\*-)?[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?)$")
_HEADER_NAME = re.compile(r"^[-_A-Za-z0-9]+$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_JWT_CLAIM_PREFIXES = ("@request.auth.claims.", "@request.auth.claims[")


def is_dns1123_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS1123_LABEL.match(value))


def _is_wildcard_label(value: str) -> bool:
    return len(value) <= 63 and bool(_WILDCARD_LABEL.match(value))


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return False


def _dns_preconditions(name: str) -> str | None:
    if len(name) > 255:
        return f"domain name {name!r} too long (max 255)"
    if not name:
        return "empty domain name not allowed"
    return None


def _dns_labels(domain: str) -> str | None:
    parts = domain.split(".")
    if parts[-1].isdigit():
        return f"domain name {domain!r} invalid (top level domain {parts[-1]!r} cannot be all-numeric)"
    for i, label in enumerate(parts):
        if i == len(parts) - 1 and label == "":  # a trailing dot: `istio.io.`
            return None
        if not is_dns1123_label(label):
            return f"domain name {domain!r} invalid (label {label!r} invalid)"
    return None


def validate_fqdn(name: str) -> str | None:
    return _dns_preconditions(name) or _dns_labels(name)


def validate_wildcard_domain(domain: str) -> str | None:
    """A DNS name whose first label may be a wildcard (`*`, `*.example.com`, `*foo.example.com`)."""
    if err := _dns_preconditions(domain):
        return err
    first, _, rest = domain.partition(".")
    if not _is_wildcard_label(first):
        return f"domain name {domain!r} invalid (label {first!r} invalid)"
    return _dns_labels(rest) if "." in domain else None


def _validate_wildcard_domain_for_gateway(sni: bool, domain: str) -> str | None:
    if err := _dns_preconditions(domain):
        return err
    first = domain.partition(".")[0]
    if sni and first == "outbound_":  # auto-generated SNI, e.g. outbound_.80_._.e2e.foobar.mesh
        return None if re.match(r"outbound_.([0-8].*).*", domain) else \
            f"domain name {domain!r} invalid (label {first!r} invalid)"
    return validate_wildcard_domain(domain)


def validate_ip_subnet(subnet: str) -> str | None:
    if subnet.count("/") == 1:
        try:
            ipaddress.ip_network(subnet, strict=False)
            return None
        except ValueError:
            return f"{subnet} is not a valid CIDR block"
    return None if is_ip(subnet) else f"{subnet} is not a valid IP"


def validate_port(number: int) -> str | None:
    return None if 1 <= number <= 65535 else f"port number {number} must be in the range 1..65535"


def _port(number: int) -> int:
    if err := validate_port(number):
        _fail(err)
    return number


Port = Annotated[int, AfterValidator(_port)]


def validate_labels(labels: dict[str, str]) -> list[str]:
    """Kubernetes label syntax: an optional DNS-subdomain prefix and a name, and a label value."""
    errs = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (not name or len(name) > 63 or not _LABEL_NAME.match(name)
                or (prefix and (len(prefix) > 253 or validate_fqdn(prefix) is not None))):
            errs.append(f"invalid label key {key!r}")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            errs.append(f"invalid label value {key}={value!r}")
    return errs


def _labels(labels: dict[str, str]) -> dict[str, str]:
    _raise_if(validate_labels(labels))
    return labels


Labels = Annotated[dict[str, str], AfterValidator(_labels)]


def validate_gateway_names(names: list[str]) -> list[str]:
    errs = []
    for name in names:
        ns, slash, gw = name.partition("/")
        if not slash:
            if err := validate_fqdn(name):  # `mesh`, `my-gateway` or the legacy `name.namespace...`
                errs.append(f"invalid gateway name {name!r}: {err}")
            continue
        if not ns or not gw:
            errs.append(f"config namespace and gateway name cannot be empty: {name!r}")
        elif not is_dns1123_label(ns):
            errs.append(f"invalid value for namespace: {ns!r}")
        elif not is_dns1123_label(gw):
            errs.append(f"invalid value for gateway name: {gw!r}")
    return errs


def _gateway_names(names: list[str]) -> list[str]:
    _raise_if(validate_gateway_names(names))
    return names


GatewayNames = Annotated[list[str], AfterValidator(_gateway_names)]


def _source_namespace(ns: str | None) -> str | None:
    if ns and not is_dns1123_label(ns):
        _fail(f"sourceNamespace match {ns} is invalid")
    return ns


def _subnets(subnets: list[str]) -> list[str]:
    _raise_if([e for s in subnets if (e := validate_ip_subnet(s))])
    return subnets


def host_matches(a: str, b: str) -> bool:
    """istio host.Name.Matches: equal, or one wildcard covers the other."""
    aw, bw = a.startswith("*"), b.startswith("*")
    if aw and bw:
        return b[1:].endswith(a[1:]) if len(a) < len(b) else a[1:].endswith(b[1:])
    if aw:
        return b.endswith(a[1:])
    if bw:
        return a.endswith(b[1:])
    return a == b


def host_subset_of(a: str, b: str) -> bool:
    """istio host.Name.SubsetOf: every name `a` matches, `b` matches too."""
    if a.startswith("*"):
        return b.startswith("*") and a[1:].endswith(b[1:])
    if b.startswith("*"):
        return a.endswith(b[1:])
    return a == b


def _partial_wildcard(host: str) -> str | None:
    if "*" in host and len(host) != 1 and not host.startswith("*."):
        return f"partial wildcard {host!r} not allowed"
    return None


def _sidecar_or_gateway_host_part(host: str, is_gateway: bool) -> list[str]:
    errs = []
    if host != "*" and "." not in host:
        errs.append(f"short names (non FQDN) are not allowed: {host!r}")
    err = validate_wildcard_domain(host)
    if err and not (is_gateway and is_ip(host)):  # a Gateway may also name an IP
        errs.append(err)
    if err := _partial_wildcard(host):
        errs.append(err)
    return errs


def validate_namespace_slash_host(host: str, is_gateway: bool) -> list[str]:
    """Sidecar egress and Gateway server hosts: `namespace/dnsName`; the namespace may be `*`
    or `.` (and `~` in a Sidecar); a Gateway also takes a bare dnsName (the old form)."""
    ns, slash, name = host.partition("/")
    if not slash:
        if is_gateway:
            return _sidecar_or_gateway_host_part(host, True)
        return [f"host {host!r} must be of form namespace/dnsName"]
    if not ns or not name:
        return [f"config namespace and dnsName in host entry cannot be empty: {host!r}"]
    errs = []
    allowed = ("*", ".") if is_gateway else ("*", ".", "~")
    if ns not in allowed and not is_dns1123_label(ns):
        errs.append(f"invalid namespace value {ns!r} in {'gateway' if is_gateway else 'sidecar'} host {host!r}")
    return errs + _sidecar_or_gateway_host_part(name, is_gateway)


def validate_export_to(namespace: str, export_to: list[str], service_entry: bool = False,
                       dr_with_selector: bool = False) -> list[str]:
    """istiod's validateExportTo: `.`, `*`, a namespace name (and `~` for a ServiceEntry)."""
    errs: list[str] = []
    seen: set[str] = set()
    for e in export_to:
        key = (namespace or ".") if e == "." else e
        if key in seen:
            errs.append(f"duplicate entries in exportTo: . and current namespace {namespace}" if key != e
                        else f"duplicate entries in exportTo for entry {e}")
            continue
        if (e == "~" and service_entry) or key in ("*", ".") or (key and is_dns1123_label(key)):
            seen.add(key)
        else:
            errs.append(f"only . or * or valid DNS labels are supported as exportTo, got {e!r}")
    if dr_with_selector and seen:
        if namespace not in seen:
            errs.append("destination rule with workload selector cannot have exportTo beyond current namespace")
        elif len(seen) > 1:
            errs.append("destination rule with workload selector cannot have multiple entries in exportTo")
    if "*" in seen and len(export_to) > 1:
        errs.append("cannot have both public (*) and non-public exportTo values for a resource")
    if "~" in seen and len(export_to) > 1:
        errs.append("cannot export service entry to no one (~) and someone")
    return [f"exportTo: {e}" for e in errs]


# --- protocols (istio pkg/config/protocol) -------------------------------------------------------
_PROTOCOLS = {"tcp", "udp", "grpc", "grpc-web", "http", "http_proxy", "http2", "https", "tls",
              "mongo", "redis", "mysql"}
_HTTP_PROTOCOLS = {"http", "http2", "grpc", "grpc-web", "http_proxy"}
_TLS_PROTOCOLS = {"https", "tls"}


def validate_protocol(protocol: str) -> str | None:
    """An empty protocol means "sniff"; anything else must be one istiod knows (any case)."""
    if protocol and protocol.lower() not in _PROTOCOLS:
        return f"unsupported protocol: {protocol}"
    return None


def _unix_address(path: str) -> str | None:
    if not path:
        return "unix address must not be empty"
    if path.startswith("@"):  # abstract socket
        return None
    if not path.startswith("/") or path.endswith("/"):
        return f"{path} is not an absolute path to a file"
    return None


# --- durations (istio agent.ValidateDuration) ----------------------------------------------------
def _parse(value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as e:
        _fail(str(e))
        raise  # unreachable


def _duration(value: str) -> str:
    """Positive, at least 1ms, to millisecond precision (istiod's ValidateDuration)."""
    seconds = _parse(value)
    if seconds < 0.001 - 1e-12:
        _fail(f"duration {value!r} must be greater than 1ms")
    if abs(seconds * 1000 - round(seconds * 1000)) > 1e-6:
        _fail(f"duration {value!r}: only durations to ms precision are supported")
    return value


def _duration_or_zero(value: str) -> str:
    """A duration where 0s means "disabled" (TCP idleTimeout, cookie TTL)."""
    return value if _parse(value) == 0 else _duration(value)


Duration = Annotated[str, AfterValidator(_duration)]
DurationOrZero = Annotated[str, AfterValidator(_duration_or_zero)]


def _empty_to_none(v: object) -> object:
    return None if v == "" else v


OptStr = Annotated[str | None, BeforeValidator(_empty_to_none)]


# --- regular expressions (RE2, approximated with Python's re) ------------------------------------
_RE2_DOCS = "Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)"


def validate_regex(expr: str, where: str) -> str | None:
    """Reject what RE2 (Envoy's regex engine) would: syntax errors, and the Python/PCRE features RE2
    lacks (lookaround, backreferences, atomic groups, possessive quantifiers, `\\Z`). RE2-only syntax
    (`\\pL`, `\\z`, `(?<name>`) is translated before Python compiles it."""
    if expr == "":
        return f"{where}: regex string match should not be empty"
    if len(expr) > 1024:
        return f"{where}: regex is too large, max length allowed is 1024"
    out: list[str] = []
    i, n, in_class, prev_quantifier = 0, len(expr), False, False
    while i < n:
        c = expr[i]
        if c == "\\" and i + 1 < n:
            nxt = expr[i + 1]
            if nxt in "123456789" and not in_class:
                return f"{where}: backreferences (\\{nxt}) are not supported by RE2; {_RE2_DOCS}"
            if nxt == "Z":
                return f"{where}: \\Z is not supported by RE2 (use \\z); {_RE2_DOCS}"
            if nxt == "z":
                out.append(r"\Z")
                i += 2
            elif nxt in "pP":  # Unicode classes: \pL, \p{Greek}
                end = expr.find("}", i) + 1 if i + 2 < n and expr[i + 2] == "{" else i + 3
                if end <= i or end > n:
                    return f"{where}: invalid Unicode class in {expr!r}; {_RE2_DOCS}"
                out.append("a" if in_class else ".")
                i = end
            else:
                out.append(expr[i:i + 2])
                i += 2
            prev_quantifier = False
            continue
        if in_class:
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and expr[i] == "^":
                out.append("^")
                i += 1
            if i < n and expr[i] == "]":  # a leading ] is literal
                out.append("]")
                i += 1
            prev_quantifier = False
            continue
        if expr.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            return f"{where}: lookaround assertions are not supported by RE2; {_RE2_DOCS}"
        if expr.startswith(("(?>", "(?P="), i):
            return f"{where}: atomic groups and named backreferences are not supported by RE2; {_RE2_DOCS}"
        if expr.startswith("(?<", i):  # RE2's (?<name>...) is Python's (?P<name>...)
            out.append("(?P<")
            i += 3
            prev_quantifier = False
            continue
        if c == "+" and prev_quantifier:
            return f"{where}: bad repetition operator in {expr!r} (possessive quantifiers are not RE2); {_RE2_DOCS}"
        prev_quantifier = c in "*+?}"
        out.append(c)
        i += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile("".join(out))
    except re.error as e:
        return f"{where}: invalid regex {expr!r}: {e}; {_RE2_DOCS}"
    return None


# --- headers ----------------------------------------------------------------------------------------
def _header_name(name: str, jwt_claims: bool = False) -> str | None:
    if not name:
        return "header name cannot be empty"
    if jwt_claims and name.startswith(_JWT_CLAIM_PREFIXES):
        return None
    return None if _HEADER_NAME.match(name) else f"header name {name} is not a valid header name"


_HEADER_VALUE_CONTROL = re.compile(r"[\x00-\x08\x0A-\x1F\x7F]")
_ENVOY_VAR = re.compile(r"%[A-Z][A-Z0-9_]*")


def _header_value(value: str) -> str | None:
    """No control characters; `%` starts an Envoy variable (`%HOSTNAME%`, `%REQ(x-foo)%`) or is
    escaped as `%%`."""
    if _HEADER_VALUE_CONTROL.search(value):
        return f"header value configuration {value!r} is invalid (control characters)"
    i, n = 0, len(value)
    while i < n:
        if value[i] != "%":
            i += 1
            continue
        if i + 1 < n and value[i + 1] == "%":
            i += 2
            continue
        m = _ENVOY_VAR.match(value, i)
        if m is None:
            return f"header value configuration {value!r}: invalid '%' (escape a literal % as %%)"
        j = m.end()
        if j < n and value[j] == "(":
            close = value.find(")", j)
            if close < 0:
                return f"header value configuration {value!r}: unterminated variable arguments"
            j = close + 1
        if j < n and value[j] == ":":
            k = j + 1
            while k < n and value[k].isdigit():
                k += 1
            j = k
        if j >= n or value[j] != "%":
            return f"header value configuration {value!r}: unterminated variable"
        i = j + 1
    return None


def _is_internal_header(name: str) -> bool:
    return name.startswith(":") or name.lower() == "host"


def _is_authority_header(name: str) -> bool:
    return name.lower() in (":authority", "host")


class HeaderOperations(Model):
    set: dict[str, str] = Field(default_factory=dict)
    add: dict[str, str] = Field(default_factory=dict)
    remove: list[str] = Field(default_factory=list)

    def problems(self, request: bool) -> list[str]:
        errs: list[str] = []
        for op in ("set", "add"):
            for name, value in getattr(self, op).items():
                if not name:
                    errs.append(f"{op}: header name cannot be empty")
                elif _is_internal_header(name) and not (request and _is_authority_header(name)):
                    errs.append(f"{op}: invalid header {name!r}: "
                                + ("cannot set Host header" if name.lower() == "host" else
                                   "header cannot have \":\" prefix"))
                if err := _header_value(value):
                    errs.append(f"{op}[{name}]: {err}")
        for name in self.remove:
            if not name:
                errs.append("remove: header name cannot be empty")
            elif _is_internal_header(name):
                errs.append(f"remove: invalid header {name!r}: cannot remove Host or \":\" headers")
        return errs


class Headers(Model):
    request: HeaderOperations | None = None
    response: HeaderOperations | None = None

    @model_validator(mode="after")
    def _valid(self) -> Headers:
        errs = []
        if self.request is not None:
            errs += [f"request.{e}" for e in self.request.problems(request=True)]
        if self.response is not None:
            errs += [f"response.{e}" for e in self.response.problems(request=False)]
        _raise_if(errs)
        return self

    def authority(self) -> list[str]:
        """Values the request headers set :authority/Host to."""
        if self.request is None:
            return []
        return [v for ops in (self.request.set, self.request.add) for k, v in ops.items()
                if _is_authority_header(k)]


# --- VirtualService ---------------------------------------------------------------------------------
class StringMatch(Model):
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


def _not_empty_match(m: StringMatch | None) -> StringMatch | None:
    if m is not None and m.is_empty:
        _fail("one of exact, prefix or regex must be set")
    return m


RequiredMatch = Annotated[StringMatch | None, AfterValidator(_not_empty_match)]


def _header_matches(headers: dict[str, StringMatch]) -> dict[str, StringMatch]:
    _raise_if([f"{name!r}: {e}" for name in headers if (e := _header_name(name, jwt_claims=True))])
    return headers


HeaderMatches = Annotated[dict[str, StringMatch], AfterValidator(_header_matches)]


class HTTPMatchRequest(Model):
    name: str = ""
    uri: RequiredMatch = None
    scheme: RequiredMatch = None
    method: RequiredMatch = None
    authority: RequiredMatch = None
    headers: HeaderMatches = Field(default_factory=dict)
    query_params: dict[str, StringMatch] = Field(default_factory=dict)
    port: Port | None = None
    source_labels: Labels = Field(default_factory=dict)
    source_namespace: Annotated[str | None, AfterValidator(_source_namespace)] = None
    gateways: GatewayNames = Field(default_factory=list)
    ignore_uri_case: bool = False
    without_headers: HeaderMatches = Field(default_factory=dict)


class PortSelector(Model):
    number: Port


class Destination(Model):
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


def _weight(w: int) -> int:
    if not 0 <= w <= 100:
        _fail(f"weight {w} is not in range 0..100")
    return w


Weight = Annotated[int, AfterValidator(_weight)]


class HTTPRouteDestination(Model):
    destination: Destination
    weight: Weight = 0
    headers: Headers | None = None


class RouteDestination(Model):
    destination: Destination
    weight: Weight = 0


def _total_weight(dests: list[HTTPRouteDestination] | list[RouteDestination]) -> None:
    """With several destinations the weights must add up to 100 (a lone destination gets 100%
    whatever its weight). Current istiod only requires a non-zero total and normalizes; this keeps
    the stricter rule older istiod enforced, which never surprises with a silent rescale."""
    if len(dests) > 1:
        total = sum(d.weight for d in dests)
        if total != 100:
            _fail(f"total destination weight {total} != 100")


class HTTPRedirect(Model):
    uri: OptStr = None
    authority: OptStr = None
    port: Port | None = None
    scheme: OptStr = None
    redirect_code: int = 301

    @field_validator("redirect_code")
    @classmethod
    def _code(cls, code: int) -> int:
        if code not in (301, 302, 303, 307, 308):
            _fail(f"{code} is not a valid redirect code, must be one of 301, 302, 303, 307, 308")
        return code

    @field_validator("scheme")
    @classmethod
    def _scheme(cls, scheme: str | None) -> str | None:
        if scheme is not None and scheme not in ("http", "https"):
            _fail('invalid redirect scheme, must be "http" or "https"')
        return scheme

    @model_validator(mode="after")
    def _something(self) -> HTTPRedirect:
        if self.uri is None and self.authority is None and self.port is None and self.scheme is None:
            _fail("redirect must specify URI, authority, scheme, or port")
        return self


class HTTPBody(Model):
    string: str | None = None
    bytes: str | None = None  # base64, as protobuf JSON writes bytes

    @model_validator(mode="after")
    def _valid(self) -> HTTPBody:
        if self.string is not None and self.bytes is not None:
            _fail("only one of string or bytes may be set")
        size = len(self.string.encode()) if self.string is not None else 0
        if self.bytes is not None:
            try:
                size = len(base64.b64decode(self.bytes, validate=True))
            except (binascii.Error, ValueError):
                _fail("bytes: not valid base64")
        if size > 1024 * 1024:
            _fail("large direct_responses may impact control plane performance, must be less than 1MB")
        return self


class HTTPDirectResponse(Model):
    status: int
    body: HTTPBody | None = None

    @field_validator("status")
    @classmethod
    def _status(cls, status: int) -> int:
        if not 200 <= status <= 599:
            _fail(f"HTTP status {status} is not in range 200-599")
        return status


class RegexRewrite(Model):
    match: str = ""
    rewrite: str = ""

    @model_validator(mode="after")
    def _valid(self) -> RegexRewrite:
        if not self.match or not self.rewrite:
            _fail("uriRegexRewrite requires both rewrite and match fields to be specified")
        if err := validate_regex(self.match, "match"):
            _fail(err)
        return self


class HTTPRewrite(Model):
    uri: OptStr = None
    authority: OptStr = None
    uri_regex_rewrite: RegexRewrite | None = None

    @model_validator(mode="after")
    def _valid(self) -> HTTPRewrite:
        if self.uri is not None and self.uri_regex_rewrite is not None:
            _fail("rewrite may only contain one of uri or uriRegexRewrite")
        if self.uri is None and self.uri_regex_rewrite is None and self.authority is None:
            _fail("rewrite must specify at least one of uri, uriRegexRewrite, or authority")
        return self


_RETRY_ON = {"5xx", "gateway-error", "reset", "reset-before-request", "connect-failure", "retriable-4xx",
             "refused-stream", "retriable-status-codes", "retriable-headers", "envoy-ratelimited",
             "http3-post-connect-failure", "cancelled", "deadline-exceeded", "internal",
             "resource-exhausted", "unavailable"}


def _is_http_status(text: str) -> bool:
    try:
        HTTPStatus(int(text))
        return True
    except ValueError:
        return False


class HTTPRetry(Model):
    attempts: int = 0
    per_try_timeout: Duration | None = None
    retry_on: str | None = None
    retry_remote_localities: bool | None = None

    @field_validator("attempts")
    @classmethod
    def _attempts(cls, attempts: int) -> int:
        if attempts < 0:
            _fail("attempts cannot be negative")
        return attempts

    @field_validator("retry_on")
    @classmethod
    def _retry_on(cls, retry_on: str | None) -> str | None:
        if retry_on:
            bad = [p for p in (p.strip() for p in retry_on.split(","))
                   if p not in _RETRY_ON and not _is_http_status(p)]
            if bad:
                _fail(f"{', '.join(repr(p) for p in bad)} is not a valid retryOn policy")
        return retry_on

    @model_validator(mode="after")
    def _disabled(self) -> HTTPRetry:
        if self.attempts == 0 and (self.per_try_timeout is not None or self.retry_on
                                   or self.retry_remote_localities is not None):
            _fail("http retry policy configured when attempts are set to 0 (disabled)")
        return self


class Percent(Model):
    value: float = 0.0

    @field_validator("value")
    @classmethod
    def _range(cls, value: float) -> float:
        if value < 0 or value > 100 or 0 < value < 0.0001:
            _fail(f"percentage {value} is neither 0.0, nor in range [0.0001, 100.0]")
        return value


class Delay(Model):
    fixed_delay: Duration | None = None
    percentage: Percent | None = None


_GRPC_STATUS = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                "UNAUTHENTICATED"}


class Abort(Model):
    http_status: int | None = None
    grpc_status: str | None = None
    percentage: Percent | None = None

    @field_validator("http_status")
    @classmethod
    def _http(cls, status: int | None) -> int | None:
        if status is not None and not 200 <= status <= 599:
            _fail(f"HTTP status {status} is not in range 200-599")
        return status

    @field_validator("grpc_status")
    @classmethod
    def _grpc(cls, status: str | None) -> str | None:
        if status is not None and status not in _GRPC_STATUS:
            _fail(f"gRPC status {status!r} is not supported (for example 'NOT_FOUND'); see "
                  "https://github.com/grpc/grpc/blob/master/doc/statuscodes.md")
        return status

    @model_validator(mode="after")
    def _one_of(self) -> Abort:
        if self.http_status is not None and self.grpc_status is not None:
            _fail("only one of httpStatus or grpcStatus may be set")
        return self


class HTTPFaultInjection(Model):
    delay: Delay | None = None
    abort: Abort | None = None

    @model_validator(mode="after")
    def _something(self) -> HTTPFaultInjection:
        if self.delay is None and self.abort is None:
            _fail("HTTP fault injection must have an abort and/or a delay")
        return self


_HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE"}


class CorsPolicy(Model):
    allow_origins: list[StringMatch] = Field(default_factory=list)
    allow_methods: list[str] = Field(default_factory=list)
    allow_headers: list[str] = Field(default_factory=list)
    expose_headers: list[str] = Field(default_factory=list)
    max_age: Duration | None = None
    allow_credentials: bool | None = None

    @field_validator("allow_origins")
    @classmethod
    def _origins(cls, origins: list[StringMatch]) -> list[StringMatch]:
        for m in origins:
            value = m.exact if m.exact is not None else m.prefix if m.prefix is not None else m.regex
            if not value:
                _fail("'' is not a valid match type for CORS allow origins")
        return origins

    @field_validator("allow_methods")
    @classmethod
    def _methods(cls, methods: list[str]) -> list[str]:
        _raise_if([f"{m!r} is not a supported HTTP method" for m in methods if m not in _HTTP_METHODS])
        return methods

    @field_validator("allow_headers", "expose_headers")
    @classmethod
    def _headers(cls, names: list[str]) -> list[str]:
        _raise_if([e for n in names if n != "*" and (e := _header_name(n))])
        return names

    @field_validator("max_age")
    @classmethod
    def _seconds(cls, max_age: str | None) -> str | None:
        if max_age is not None and parse_duration(max_age) != int(parse_duration(max_age)):
            _fail("max_age duration is accurate only to seconds precision")
        return max_age


class HTTPRoute(Model):
    name: str = ""
    match: list[HTTPMatchRequest] = Field(default_factory=list)
    route: list[HTTPRouteDestination] = Field(default_factory=list)
    redirect: HTTPRedirect | None = None
    direct_response: HTTPDirectResponse | None = None
    rewrite: HTTPRewrite | None = None
    timeout: Duration | None = None
    retries: HTTPRetry | None = None
    fault: HTTPFaultInjection | None = None
    mirror: Destination | None = None
    mirror_percentage: Percent | None = None
    headers: Headers | None = None
    cors_policy: CorsPolicy | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_delegate(cls, data: object) -> object:
        # Not modelled: said plainly rather than "route, redirect or directResponse is required".
        if isinstance(data, dict) and data.get("delegate") is not None:
            _fail("delegate: VirtualService delegation is not supported by this control plane")
        return data

    @field_validator("route")
    @classmethod
    def _weights(cls, route: list[HTTPRouteDestination]) -> list[HTTPRouteDestination]:
        _total_weight(route)
        return route

    @model_validator(mode="after")
    def _consistent(self) -> HTTPRoute:
        errs = []
        if self.redirect is not None:
            if self.route:
                errs.append("HTTP route cannot contain both route and redirect")
            if self.fault is not None:
                errs.append("HTTP route cannot contain both fault and redirect")
            if self.rewrite is not None:
                errs.append("HTTP route rule cannot contain both rewrite and redirect")
            if self.direct_response is not None:
                errs.append("HTTP route cannot contain both redirect and directResponse")
        if self.direct_response is not None:
            if self.route:
                errs.append("HTTP route cannot contain both route and directResponse")
            if self.rewrite is not None:
                errs.append("HTTP route rule cannot contain both rewrite and directResponse")
        if self.redirect is None and self.direct_response is None and not self.route:
            errs.append("HTTP route, redirect or directResponse is required")
        authorities = ([self.rewrite.authority] if self.rewrite is not None and self.rewrite.authority else []) \
            + (self.headers.authority() if self.headers is not None else [])
        if len(authorities) > 1:
            errs.append(f"authority header cannot be set multiple times: {authorities}")
        _raise_if(errs)
        return self


class L4MatchAttributes(Model):
    destination_subnets: Annotated[list[str], AfterValidator(_subnets)] = Field(default_factory=list)
    port: Port | None = None
    source_labels: Labels = Field(default_factory=dict)
    gateways: GatewayNames = Field(default_factory=list)
    source_namespace: Annotated[str | None, AfterValidator(_source_namespace)] = None


class TLSMatchAttributes(L4MatchAttributes):
    sni_hosts: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _some(self) -> TLSMatchAttributes:
        if not self.sni_hosts:  # (a validated default would be reported as `sni_hosts`)
            _fail("sniHosts: TLS match must have at least one SNI host")
        return self


class TCPRoute(Model):
    match: list[L4MatchAttributes] = Field(default_factory=list)
    route: list[RouteDestination] = Field(default_factory=list, validate_default=True)

    @field_validator("route")
    @classmethod
    def _route(cls, route: list[RouteDestination]) -> list[RouteDestination]:
        if not route:
            _fail("TCP route is required")
        _total_weight(route)
        return route


class TLSRoute(Model):
    match: list[TLSMatchAttributes] = Field(default_factory=list, validate_default=True)
    route: list[RouteDestination] = Field(default_factory=list, validate_default=True)

    @field_validator("match")
    @classmethod
    def _match(cls, match: list[TLSMatchAttributes]) -> list[TLSMatchAttributes]:
        if not match:
            _fail("TLS route must have at least one match condition")
        return match

    @field_validator("route")
    @classmethod
    def _route(cls, route: list[RouteDestination]) -> list[RouteDestination]:
        if not route:
            _fail("TLS route is required")
        _total_weight(route)
        return route


class VirtualServiceSpec(Model):
    hosts: list[str] = Field(default_factory=list)
    gateways: GatewayNames = Field(default_factory=list)
    http: list[HTTPRoute] = Field(default_factory=list)
    tcp: list[TCPRoute] = Field(default_factory=list)
    tls: list[TLSRoute] = Field(default_factory=list)
    export_to: list[str] = Field(default_factory=list)

    @property
    def applies_to_gateway(self) -> bool:
        """Bound only to gateways (not to the sidecars: `mesh` is not among its gateways)."""
        return bool(self.gateways) and MESH_GATEWAY not in self.gateways

    @model_validator(mode="after")
    def _valid(self) -> VirtualServiceSpec:
        errs: list[str] = []
        if not self.hosts:  # a delegate VirtualService (referenced by another's `delegate`)
            if self.gateways:
                errs.append("delegate virtual service (no hosts) must have no gateways specified")
            if self.tls:
                errs.append("delegate virtual service (no hosts) must have no tls route specified")
            if self.tcp:
                errs.append("delegate virtual service (no hosts) must have no tcp route specified")
        to_gateway = self.applies_to_gateway
        sni = any(m.sni_hosts for t in self.tls for m in t.match)
        hosts_valid = True
        for i, host in enumerate(self.hosts):
            err = _validate_wildcard_domain_for_gateway(sni, host) if to_gateway else validate_wildcard_domain(host)
            if err is not None and not is_ip(host):  # istiod accepts IP addresses here
                errs.append(f"hosts[{i}]: {err}")
                hosts_valid = False
            elif err is None and not to_gateway and host == "*":
                errs.append(f"hosts[{i}]: wildcard host * is not allowed for virtual services bound to the "
                            "mesh gateway (set gateways)")
                hosts_valid = False
        if hosts_valid:
            for i, a in enumerate(self.hosts):
                for b in self.hosts[i + 1:]:
                    if host_matches(a, b):
                        errs.append(f"hosts: duplicate hosts in virtual service: {a} & {b}")
        if not self.http and not self.tcp and not self.tls:
            errs.append("http, tcp or tls must be provided in virtual service")
        if not to_gateway:
            for i, rule in enumerate(self.http):
                for j, m in enumerate(rule.match):
                    for name in (*m.headers, *m.without_headers):
                        if name.startswith(_JWT_CLAIM_PREFIXES):
                            errs.append(f"http[{i}].match[{j}]: JWT claim based routing (key: {name}) is only "
                                        f"supported for gateway, found no gateways: {self.gateways}")
        for i, route in enumerate(self.tls):
            for j, m in enumerate(route.match):
                for k, sni_host in enumerate(m.sni_hosts):
                    where = f"tls[{i}].match[{j}].sniHosts[{k}]"
                    err = (_validate_wildcard_domain_for_gateway(True, sni_host) if to_gateway
                           else validate_wildcard_domain(sni_host))
                    if err is not None:
                        if not is_ip(sni_host):  # an IP goes against the SNI spec: istiod only warns
                            errs.append(f"{where}: {err}")
                    elif not any(host_subset_of(sni_host, h) for h in self.hosts):
                        errs.append(f"{where}: SNI host {sni_host!r} is not a compatible subset of any of the "
                                    f"virtual service hosts: [{', '.join(self.hosts)}]")
        _raise_if(errs)
        return self


class VirtualService(K8sObject):
    kind: Literal["VirtualService"] = "VirtualService"
    spec: VirtualServiceSpec

    @model_validator(mode="after")
    def _export_to(self) -> VirtualService:
        _raise_if([f"spec.{e}" for e in validate_export_to(self.metadata.namespace, self.spec.export_to)])
        return self


# --- DestinationRule ----------------------------------------------------------------------------------
class WorkloadSelector(Model):
    """DestinationRule's selector is `matchLabels`; Sidecar's and ServiceEntry's is `labels`. Both
    read into `match_labels` (also available as `.labels`), so neither is silently ignored."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, validation_alias=AliasChoices("matchLabels", "labels", "match_labels"),
        serialization_alias="matchLabels")

    @field_validator("match_labels")
    @classmethod
    def _valid(cls, labels: dict[str, str]) -> dict[str, str]:
        errs = []
        for k, v in labels.items():
            if not k:
                errs.append(f"empty key is not supported in selector: '{k}={v}'")
            if "*" in k or "*" in v:
                errs.append(f"wildcard is not supported in selector: '{k}={v}'")
        _raise_if(errs)
        return labels

    @property
    def labels(self) -> dict[str, str]:
        return self.match_labels


class HTTPCookie(Model):
    name: str = Field(default="", validate_default=True)
    path: str | None = None
    ttl: DurationOrZero | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name:
            _fail("name required for HttpCookie")
        return name


class ConsistentHashLB(Model):
    http_header_name: str | None = None
    http_cookie: HTTPCookie | None = None
    use_source_ip: bool | None = None
    http_query_parameter_name: str | None = None
    minimum_ring_size: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_key(self) -> ConsistentHashLB:
        keys = [k for k in ("httpHeaderName", "httpCookie", "useSourceIp", "httpQueryParameterName")
                if getattr(self, _snake(k)) is not None]
        if len(keys) > 1:
            _fail(f"only one hash key may be set, got {' and '.join(keys)}")
        return self


def _snake(camel: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), camel)


class LocalityDistribute(Model):
    from_: str = Field(default="", alias="from")
    to: dict[str, int] = Field(default_factory=dict)


class LocalityFailover(Model):
    from_: str = Field(default="", alias="from")
    to: str = ""


def _localities(localities: list[str]) -> str | None:
    """istio validateLocalities: region[/zone[/subzone]], one trailing `*` at most, no overlap."""
    seen: dict[str, dict[str, set[str]]] = {}
    for loc in localities:
        stars = loc.count("*")
        if stars and (stars > 1 or not loc.endswith("*")):
            return f"locality {loc} wildcard '*' number can not exceed 1 and must be in the end"
        overlap = f"locality {loc} overlap with previous specified ones"
        if "*" in seen:
            return overlap
        parts = loc.split("/", 2)
        if any(p == "" for p in parts):
            return f"locality {loc} must not contain empty region/zone/subzone info"
        region = parts[0]
        if len(parts) == 1:
            if region in seen:
                return overlap
            seen[region] = {"*": {"*"}}
            continue
        zones = seen.setdefault(region, {})
        zone = parts[1]
        if "*" in zones:
            return overlap
        if len(parts) == 2:
            if zone in zones:
                return overlap
            zones[zone] = {"*"}
            continue
        subzones = zones.setdefault(zone, set())
        if "*" in subzones or parts[2] in subzones:
            return overlap
        subzones.add(parts[2])
    return None


class LocalityLoadBalancerSetting(Model):
    distribute: list[LocalityDistribute] = Field(default_factory=list)
    failover: list[LocalityFailover] = Field(default_factory=list)
    failover_priority: list[str] = Field(default_factory=list)
    enabled: bool | None = None

    @model_validator(mode="after")
    def _valid(self) -> LocalityLoadBalancerSetting:
        if self.distribute and self.failover:
            _fail("can not simultaneously specify 'distribute' and 'failover'")
        topology = {"topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone"}
        if self.failover and topology & set(self.failover_priority):
            _fail("can not simultaneously set 'failover' and topology labels in 'failoverPriority'")
        errs = []
        for i, d in enumerate(self.distribute):
            if any(not 1 <= w <= 100 for w in d.to.values()):
                errs.append(f"distribute[{i}].to: locality weight must be in range [1, 100]")
            elif sum(d.to.values()) != 100:
                errs.append(f"distribute[{i}].to: total locality weight {sum(d.to.values())} != 100")
            elif err := _localities(list(d.to)):
                errs.append(f"distribute[{i}].to: {err}")
        if err := _localities([d.from_ for d in self.distribute]):
            errs.append(f"distribute: {err}")
        for i, f in enumerate(self.failover):
            if f.from_ == f.to:
                errs.append(f"failover[{i}]: locality lb failover settings must specify different regions")
            if "/" in f.from_ or "/" in f.to:
                errs.append(f"failover[{i}]: locality lb failover only specify region")
            if "*" in f.from_ or "*" in f.to:
                errs.append(f"failover[{i}]: locality lb failover region should not contain '*' wildcard")
        _raise_if(errs)
        return self


class LoadBalancerSettings(Model):
    simple: Literal["UNSPECIFIED", "LEAST_CONN", "RANDOM", "PASSTHROUGH", "ROUND_ROBIN", "LEAST_REQUEST"] | None = None
    consistent_hash: ConsistentHashLB | None = None
    locality_lb_setting: LocalityLoadBalancerSetting | None = None
    warmup_duration_secs: Duration | None = None

    @model_validator(mode="after")
    def _one_of(self) -> LoadBalancerSettings:
        # A oneof in the API: istiod cannot even decode both. Neither is fine (locality settings only).
        if self.simple is not None and self.consistent_hash is not None:
            _fail("only one of simple or consistentHash may be set")
        return self


class TcpKeepalive(Model):
    probes: int | None = Field(default=None, ge=0)
    time: Duration | None = None
    interval: Duration | None = None


class TCPSettings(Model):
    max_connections: int | None = Field(default=None, ge=0)
    connect_timeout: Duration | None = None
    tcp_keepalive: TcpKeepalive | None = None
    max_connection_duration: Duration | None = None
    idle_timeout: DurationOrZero | None = None


class HTTPSettings(Model):
    http1_max_pending_requests: int | None = Field(default=None, ge=0)
    http2_max_requests: int | None = Field(default=None, ge=0)
    max_requests_per_connection: int | None = Field(default=None, ge=0)
    max_retries: int | None = Field(default=None, ge=0)
    idle_timeout: Duration | None = None
    h2_upgrade_policy: Literal["DEFAULT", "DO_NOT_UPGRADE", "UPGRADE"] | None = None
    use_client_protocol: bool | None = None
    max_concurrent_streams: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _upgrade(self) -> HTTPSettings:
        if self.h2_upgrade_policy == "UPGRADE" and self.use_client_protocol:
            _fail("useClientProtocol must not be true when h2UpgradePolicy is UPGRADE")
        return self


class ConnectionPoolSettings(Model):
    tcp: TCPSettings | None = None
    http: HTTPSettings | None = None

    @model_validator(mode="after")
    def _something(self) -> ConnectionPoolSettings:
        if self.tcp is None and self.http is None:
            _fail("connection pool must have at least one field")
        return self


def _percent_int(v: int | None) -> int | None:
    if v is not None and not 0 <= v <= 100:
        _fail(f"percentage {v} is not in range 0..100")
    return v


class OutlierDetection(Model):
    consecutive_errors: int | None = None  # deprecated (istiod warns): consecutive5xxErrors
    consecutive_5xx_errors: int | None = Field(default=None, ge=0, alias="consecutive5xxErrors")
    consecutive_gateway_errors: int | None = Field(default=None, ge=0)
    consecutive_local_origin_failures: int | None = Field(default=None, ge=0)
    split_external_local_origin_errors: bool | None = None
    interval: Duration | None = None
    base_ejection_time: Duration | None = None
    max_ejection_percent: Annotated[int | None, AfterValidator(_percent_int)] = None
    min_health_percent: Annotated[int | None, AfterValidator(_percent_int)] = None

    @model_validator(mode="after")
    def _split(self) -> OutlierDetection:
        if not self.split_external_local_origin_errors and (self.consecutive_local_origin_failures or 0) > 0:
            _fail("consecutiveLocalOriginFailures is set, but splitExternalLocalOriginErrors is false")
        return self


class ClientTLSSettings(Model):
    mode: Literal["DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"] = "DISABLE"
    client_certificate: OptStr = None
    private_key: OptStr = None
    ca_certificates: OptStr = None
    credential_name: OptStr = None
    subject_alt_names: list[str] = Field(default_factory=list)
    sni: str | None = None
    insecure_skip_verify: bool | None = None

    @model_validator(mode="after")
    def _valid(self) -> ClientTLSSettings:
        errs = []
        if self.insecure_skip_verify:
            if self.mode == "SIMPLE" and (self.ca_certificates or self.credential_name or self.subject_alt_names):
                errs.append("cannot specify caCertificates or credentialName or subjectAltNames when "
                            "insecureSkipVerify is set true")
            if self.mode == "MUTUAL" and (self.ca_certificates or self.subject_alt_names):
                errs.append("cannot specify caCertificates or subjectAltNames when insecureSkipVerify is set true")
        if self.mode in ("SIMPLE", "MUTUAL") and self.credential_name:
            if self.client_certificate or self.ca_certificates or self.private_key:
                errs.append("cannot specify client certificates or CA certificate if credentialName is set")
        elif self.mode == "MUTUAL":
            if not self.client_certificate:
                errs.append("client certificate required for mutual tls")
            if not self.private_key:
                errs.append("private key required for mutual tls")
        _raise_if(errs)
        return self


class PortTrafficPolicy(Model):
    port: PortSelector | None = Field(default=None, validate_default=True)
    load_balancer: LoadBalancerSettings | None = None
    connection_pool: ConnectionPoolSettings | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTLSSettings | None = None

    @field_validator("port")
    @classmethod
    def _port(cls, port: PortSelector | None) -> PortSelector | None:
        if port is None:
            _fail("portTrafficPolicy must have valid port")
        return port

    @model_validator(mode="after")
    def _something(self) -> PortTrafficPolicy:
        if (self.load_balancer is None and self.connection_pool is None and self.outlier_detection is None
                and self.tls is None):
            _fail("port traffic policy must have at least one field")
        return self


class TrafficPolicy(Model):
    load_balancer: LoadBalancerSettings | None = None
    connection_pool: ConnectionPoolSettings | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTLSSettings | None = None
    port_level_settings: list[PortTrafficPolicy] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _something(cls, data: object) -> object:
        # Checked on the input: istiod counts a field that is present, even as an empty list.
        if isinstance(data, dict) and not any(
                data.get(k) is not None for k in ("loadBalancer", "load_balancer", "connectionPool",
                                                  "connection_pool", "outlierDetection", "outlier_detection",
                                                  "tls", "portLevelSettings", "port_level_settings",
                                                  "tunnel", "proxyProtocol")):
            _fail("traffic policy must have at least one field")
        return data


class Subset(Model):
    name: str
    labels: Labels = Field(default_factory=dict)
    traffic_policy: TrafficPolicy | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name:
            _fail("subset name cannot be empty")
        if not is_dns1123_label(name):
            _fail(f"subset name is invalid: {name}")
        return name


class DestinationRuleSpec(Model):
    host: str
    traffic_policy: TrafficPolicy | None = None
    subsets: list[Subset] = Field(default_factory=list)
    export_to: list[str] = Field(default_factory=list)
    workload_selector: WorkloadSelector | None = None

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        if err := validate_wildcard_domain(host):
            _fail(err)
        return host

    @field_validator("subsets")
    @classmethod
    def _unique(cls, subsets: list[Subset]) -> list[Subset]:
        seen: set[str] = set()
        for s in subsets:
            if s.name in seen:
                _fail(f"duplicate subset names: {s.name}")
            seen.add(s.name)
        return subsets


class DestinationRule(K8sObject):
    kind: Literal["DestinationRule"] = "DestinationRule"
    spec: DestinationRuleSpec

    @model_validator(mode="after")
    def _export_to(self) -> DestinationRule:
        _raise_if([f"spec.{e}" for e in validate_export_to(
            self.metadata.namespace, self.spec.export_to, dr_with_selector=self.spec.workload_selector is not None)])
        return self


# --- WorkloadEntry / ServiceEntry -----------------------------------------------------------------
class WorkloadEntrySpec(Model):
    address: str = ""
    ports: dict[str, int] = Field(default_factory=dict)
    labels: Labels = Field(default_factory=dict)
    network: str = ""
    locality: str = ""
    weight: int | None = Field(default=None, ge=0)
    service_account: str = ""

    @property
    def is_unix(self) -> bool:
        return self.address.startswith(UNIX_PREFIX)

    @field_validator("ports")
    @classmethod
    def _ports(cls, ports: dict[str, int]) -> dict[str, int]:
        errs = []
        for name, number in ports.items():
            if not is_dns1123_label(name):
                errs.append(f"invalid port name: {name!r}")
            if err := validate_port(number):
                errs.append(f"{name}: {err}")
        _raise_if(errs)
        return ports

    @model_validator(mode="after")
    def _address(self) -> WorkloadEntrySpec:
        addr = self.address
        if not addr:
            if not self.network:
                _fail("address is required")
        elif self.is_unix:
            if err := _unix_address(addr[len(UNIX_PREFIX):]):
                _fail(f"address: {err}")
            if self.ports:
                _fail(f"unix endpoint {addr} must not include ports")
        elif not is_ip(addr) and validate_fqdn(addr) is not None:
            _fail(f"address: endpoint address {addr!r} is not a valid FQDN or an IP address")
        return self


class WorkloadEntry(K8sObject):
    kind: Literal["WorkloadEntry"] = "WorkloadEntry"
    spec: WorkloadEntrySpec


class ServiceEntryPort(Model):
    number: Port
    protocol: str = ""
    name: str
    target_port: Port | None = None

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, protocol: str) -> str:
        if err := validate_protocol(protocol):
            _fail(err)
        return protocol

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not is_dns1123_label(name):
            _fail(f"invalid port name: {name!r}")
        return name


class ServiceEntrySpec(Model):
    hosts: list[str] = Field(default_factory=list, validate_default=True)
    addresses: Annotated[list[str], AfterValidator(_subnets)] = Field(default_factory=list)
    ports: list[ServiceEntryPort] = Field(default_factory=list)
    location: Literal["MESH_EXTERNAL", "MESH_INTERNAL"] = "MESH_EXTERNAL"
    resolution: Literal["NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN"] = "NONE"
    endpoints: list[WorkloadEntrySpec] = Field(default_factory=list)
    workload_selector: WorkloadSelector | None = None
    export_to: list[str] = Field(default_factory=list)
    subject_alt_names: list[str] = Field(default_factory=list)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        if not hosts:
            _fail("service entry must have at least one host")
        errs = []
        for i, h in enumerate(hosts):
            if h == "*":
                errs.append(f"[{i}]: invalid host * (a full wildcard is not allowed in a service entry)")
            elif err := validate_wildcard_domain(h):
                errs.append(f"[{i}]: {err}")
        _raise_if(errs)
        return hosts

    @field_validator("ports")
    @classmethod
    def _unique_ports(cls, ports: list[ServiceEntryPort]) -> list[ServiceEntryPort]:
        names: set[str] = set()
        numbers: set[int] = set()
        errs = []
        for p in ports:
            if p.name in names:
                errs.append(f"service entry port name {p.name!r} already defined")
            if p.number in numbers:
                errs.append(f"service entry port {p.number} already defined")
            names.add(p.name)
            numbers.add(p.number)
        _raise_if(errs)
        return ports

    @model_validator(mode="after")
    def _valid(self) -> ServiceEntrySpec:
        errs: list[str] = []
        if self.workload_selector is not None and self.endpoints:
            errs.append("only one of workloadSelector or endpoints is allowed in a service entry")
        if any("/" in a for a in self.addresses) and self.resolution not in ("NONE", "STATIC"):
            errs.append("addresses: CIDR addresses are allowed only for NONE/STATIC resolution types")
        port_names = {p.name for p in self.ports}
        if self.resolution == "NONE":
            if self.endpoints:
                errs.append("endpoints: no endpoints should be provided for resolution type NONE")
        elif self.resolution == "STATIC":
            # Older istiod's rule, kept: a STATIC entry must say where its endpoints are (inline or
            # through workloadSelector); current istiod accepts an empty one that can never route.
            if not self.endpoints and self.workload_selector is None:
                errs.append("endpoints: endpoints (or a workloadSelector) must be provided for resolution type STATIC")
            for i, ep in enumerate(self.endpoints):
                if ep.address and not ep.is_unix and not is_ip(ep.address):
                    errs.append(f"endpoints[{i}].address: endpoint address {ep.address!r} is not a valid IP address")
                if ep.is_unix and len(self.ports) != 1:
                    errs.append(f"endpoints[{i}]: exactly 1 service port required for unix endpoints")
        else:  # DNS, DNS_ROUND_ROBIN
            if not self.endpoints:
                for i, h in enumerate(self.hosts):
                    if validate_fqdn(h) is not None:
                        errs.append(f"hosts[{i}]: hosts must be FQDN if no endpoints are provided for resolution "
                                    f"mode {self.resolution} (got {h!r})")
            if self.resolution == "DNS_ROUND_ROBIN" and len(self.endpoints) > 1:
                errs.append(f"endpoints: there must only be 0 or 1 endpoint for resolution mode {self.resolution}")
            for i, ep in enumerate(self.endpoints):
                if ep.is_unix:
                    errs.append(f"endpoints[{i}].address: unix endpoints need resolution STATIC")
        for i, ep in enumerate(self.endpoints):
            for name in ep.ports:
                if name not in port_names:
                    errs.append(f"endpoints[{i}].ports: endpoint port {name!r} is not defined by the service entry")
        if self.resolution != "NONE" and len(self.hosts) > 1:
            for p in self.ports:
                proto = p.protocol.lower()
                if proto not in _HTTP_PROTOCOLS and proto not in _TLS_PROTOCOLS:
                    errs.append("multiple hosts provided with non-HTTP, non-TLS ports")
                    break
        _raise_if(errs)
        return self


class ServiceEntry(K8sObject):
    kind: Literal["ServiceEntry"] = "ServiceEntry"
    spec: ServiceEntrySpec

    @model_validator(mode="after")
    def _export_to(self) -> ServiceEntry:
        _raise_if([f"spec.{e}" for e in validate_export_to(self.metadata.namespace, self.spec.export_to,
                                                            service_entry=True)])
        return self


# --- Gateway ----------------------------------------------------------------------------------------
class ServerTLSSettings(Model):
    mode: Literal["PASSTHROUGH", "SIMPLE", "MUTUAL", "AUTO_PASSTHROUGH", "ISTIO_MUTUAL",
                  "OPTIONAL_MUTUAL"] = "PASSTHROUGH"
    credential_name: OptStr = None
    server_certificate: OptStr = None
    private_key: OptStr = None
    ca_certificates: OptStr = None
    subject_alt_names: list[str] = Field(default_factory=list)
    https_redirect: bool | None = None
    min_protocol_version: Literal["TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3"] | None = None
    max_protocol_version: Literal["TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3"] | None = None
    cipher_suites: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> ServerTLSSettings:
        errs = []
        if self.mode == "ISTIO_MUTUAL":
            for field, what in (("server_certificate", "server certificate"), ("private_key", "private key"),
                                ("ca_certificates", "CA bundle"), ("credential_name", "credentialName")):
                if getattr(self, field):
                    errs.append(f"ISTIO_MUTUAL TLS cannot have associated {what}")
        elif self.mode in ("SIMPLE", "MUTUAL", "OPTIONAL_MUTUAL") and not self.credential_name:
            mode = "SIMPLE" if self.mode == "SIMPLE" else "MUTUAL"
            if not self.server_certificate:
                errs.append(f"{mode} TLS requires a server certificate (or credentialName)")
            if not self.private_key:
                errs.append(f"{mode} TLS requires a private key (or credentialName)")
            if mode == "MUTUAL" and not self.ca_certificates:
                errs.append("MUTUAL TLS requires a client CA bundle (or credentialName)")
        _raise_if(errs)
        return self


class GatewayPort(Model):
    number: int = 0
    protocol: str = ""
    name: str = ""
    target_port: int | None = None


class Server(Model):
    port: GatewayPort | None = Field(default=None, validate_default=True)
    hosts: list[str] = Field(default_factory=list, validate_default=True)
    tls: ServerTLSSettings | None = None
    name: str = ""
    bind: str | None = None

    @field_validator("port")
    @classmethod
    def _required(cls, port: GatewayPort | None) -> GatewayPort | None:
        if port is None:
            _fail("port is required")
        return port

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        if not hosts:
            _fail("server config must contain at least one host")
        _raise_if([f"[{i}] {h!r}: {e}" for i, h in enumerate(hosts)
                   for e in validate_namespace_slash_host(h, is_gateway=True)])
        return hosts

    @model_validator(mode="after")
    def _valid(self) -> Server:
        port, bind = self.port, self.bind or ""
        assert port is not None  # the field validator requires it
        errs = []
        proto = port.protocol.lower()
        if proto not in _PROTOCOLS:
            errs.append(f"port.protocol: invalid protocol {port.protocol!r}, supported protocols are HTTP, HTTP2, "
                        "GRPC, GRPC-WEB, HTTPS, TLS, MONGO, REDIS, MYSQL, TCP")
        if (port.number > 0 or not bind.startswith(UNIX_PREFIX)) and (err := validate_port(port.number)):
            errs.append(f"port.number: {err}")
        if port.target_port:
            errs.append("port.targetPort: targetPort has no impact on Gateways")
        if not port.name:
            errs.append("port.name: port name must be set")
        if bind.startswith(UNIX_PREFIX):
            if err := _unix_address(bind[len(UNIX_PREFIX):]):
                errs.append(f"bind: {err}")
            if port.number != 0:
                errs.append("port.number: port number must be 0 for unix domain socket")
        elif bind and not is_ip(bind):
            errs.append(f"bind: {bind} is not a valid IP")
        if proto in _PROTOCOLS:
            if proto in _TLS_PROTOCOLS and self.tls is None:
                errs.append("tls: server must have TLS settings for HTTPS/TLS protocols")
            elif proto not in _TLS_PROTOCOLS and self.tls is not None:
                t = self.tls
                if proto in _HTTP_PROTOCOLS:  # only httpsRedirect makes sense on plain HTTP
                    if (t.mode not in ("PASSTHROUGH", "AUTO_PASSTHROUGH") or t.ca_certificates
                            or t.private_key or t.server_certificate):
                        errs.append("tls: server cannot have TLS settings for plain text HTTP ports")
                else:
                    errs.append("tls: server cannot have TLS settings for non HTTPS/TLS ports")
        _raise_if(errs)
        return self


class GatewaySpec(Model):
    selector: dict[str, str] = Field(default_factory=dict)
    servers: list[Server] = Field(default_factory=list, validate_default=True)

    @field_validator("servers")
    @classmethod
    def _servers(cls, servers: list[Server]) -> list[Server]:
        if not servers:
            _fail("gateway must have at least one server")
        names: set[str] = set()
        for s in servers:
            assert s.port is not None
            if s.port.name in names:
                _fail(f"port names in servers must be unique: duplicate name {s.port.name}")
            names.add(s.port.name)
        return servers


class Gateway(K8sObject):
    kind: Literal["Gateway"] = "Gateway"
    spec: GatewaySpec

    @model_validator(mode="after")
    def _name(self) -> Gateway:
        # VirtualServices refer to gateways as namespace/name, so the name cannot contain dots.
        if not is_dns1123_label(self.metadata.name):
            _fail(f"metadata.name: invalid gateway name {self.metadata.name!r} (must be a DNS label)")
        return self


# --- Sidecar ----------------------------------------------------------------------------------------
class SidecarPort(Model):
    number: int = 0
    protocol: str = ""
    name: str = ""

    def problems(self) -> list[str]:
        errs = []
        if self.name and not is_dns1123_label(self.name):
            errs.append(f"port.name: invalid port name: {self.name!r}")
        if err := validate_protocol(self.protocol):
            errs.append(f"port.protocol: {err}")
        return errs


CaptureMode = Literal["DEFAULT", "IPTABLES", "NONE"]


class IstioIngressListener(Model):
    port: SidecarPort | None = Field(default=None, validate_default=True)
    bind: str | None = None
    capture_mode: CaptureMode | None = None
    default_endpoint: str = ""
    tls: ServerTLSSettings | None = None
    connection_pool: ConnectionPoolSettings | None = None

    @field_validator("port")
    @classmethod
    def _required(cls, port: SidecarPort | None) -> SidecarPort | None:
        if port is None:
            _fail("sidecar: port is required for ingress listeners")
        return port

    @model_validator(mode="after")
    def _valid(self) -> IstioIngressListener:
        assert self.port is not None
        errs = self.port.problems()
        if err := validate_port(self.port.number):
            errs.append(f"port.number: {err}")
        if self.bind and not is_ip(self.bind):
            errs.append(f"bind: {self.bind} is not a valid IP")
        ep = self.default_endpoint
        if ep.startswith(UNIX_PREFIX):
            if err := _unix_address(ep[len(UNIX_PREFIX):]):
                errs.append(f"defaultEndpoint: {err}")
        elif ep:
            host, sep, port = ep.rpartition(":")
            host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
            if not sep:
                errs.append(f"defaultEndpoint: {ep!r}: missing port")
            elif host not in ("", "127.0.0.1", "0.0.0.0", "::1", "::"):
                errs.append("defaultEndpoint: must be of form 127.0.0.1:<port>, 0.0.0.0:<port>, [::1]:<port>, "
                            "[::]:<port>, unix://filepath or unset")
            elif not port.isdigit():
                errs.append(f"defaultEndpoint: port ({port}) is not a number")
            elif err := validate_port(int(port)):
                errs.append(f"defaultEndpoint: {err}")
        if self.tls is not None:
            if self.tls.subject_alt_names:
                errs.append("tls: subjectAltNames is not supported in ingress tls")
            if self.tls.https_redirect:
                errs.append("tls: httpsRedirect is not supported")
            if self.tls.credential_name:
                errs.append("tls: credentialName is not currently supported")
            if self.tls.mode in ("ISTIO_MUTUAL", "AUTO_PASSTHROUGH"):
                errs.append(f"tls: cannot set mode to {self.tls.mode} in sidecar ingress tls")
        _raise_if(errs)
        return self


class IstioEgressListener(Model):
    port: SidecarPort | None = None
    bind: str | None = None
    capture_mode: CaptureMode | None = None
    hosts: list[str] = Field(default_factory=list, validate_default=True)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        if not hosts:
            _fail("sidecar: egress listener must contain at least one host")
        _raise_if([f"[{i}] {h!r}: {e}" for i, h in enumerate(hosts)
                   for e in validate_namespace_slash_host(h, is_gateway=False)])
        return hosts

    @model_validator(mode="after")
    def _port(self) -> IstioEgressListener:
        if self.port is None:
            return self
        errs = self.port.problems()
        bind = self.bind or ""
        if self.port.number == 0:  # a Unix domain socket listener
            if not bind.startswith(UNIX_PREFIX):
                errs.append("bind: ports with 0 value must have a unix domain socket bind address")
            elif err := _unix_address(bind[len(UNIX_PREFIX):]):
                errs.append(f"bind: {err}")
            if self.capture_mode not in (None, "DEFAULT", "NONE"):
                errs.append("captureMode: must be DEFAULT/NONE for unix domain socket listeners")
        else:
            if err := validate_port(self.port.number):
                errs.append(f"port.number: {err}")
            if bind and not is_ip(bind):
                errs.append(f"bind: {bind} is not a valid IP")
        _raise_if(errs)
        return self


class SidecarSpec(Model):
    workload_selector: WorkloadSelector | None = None
    ingress: list[IstioIngressListener] = Field(default_factory=list)
    egress: list[IstioEgressListener] = Field(default_factory=list)
    outbound_traffic_policy: OutboundTrafficPolicy | None = None
    inbound_connection_pool: ConnectionPoolSettings | None = None

    @field_validator("ingress")
    @classmethod
    def _ingress(cls, ingress: list[IstioIngressListener]) -> list[IstioIngressListener]:
        ports: set[int] = set()
        for listener in ingress:
            assert listener.port is not None
            if listener.port.number in ports:
                _fail(f"sidecar: ports on IP bound listeners must be unique (port {listener.port.number})")
            ports.add(listener.port.number)
        return ingress

    @field_validator("egress")
    @classmethod
    def _egress(cls, egress: list[IstioEgressListener]) -> list[IstioEgressListener]:
        errs = []
        ports: set[int] = set()
        sockets: set[str] = set()
        for i, listener in enumerate(egress):
            if listener.port is None:
                if i != len(egress) - 1:
                    errs.append(f"[{i}]: the egress listener with empty port should be the last listener in the list")
                continue
            if listener.port.number == 0:
                if (listener.bind or "") in sockets:
                    errs.append(f"[{i}]: unix domain socket values for listeners must be unique")
                sockets.add(listener.bind or "")
            else:
                if listener.port.number in ports:
                    errs.append(f"[{i}]: ports on IP bound listeners must be unique (port {listener.port.number})")
                ports.add(listener.port.number)
        _raise_if(errs)
        return egress

    @model_validator(mode="after")
    def _something(self) -> SidecarSpec:
        if (not self.egress and not self.ingress and self.outbound_traffic_policy is None
                and self.inbound_connection_pool is None):
            _fail("sidecar: empty configuration provided")
        return self


class Sidecar(K8sObject):
    kind: Literal["Sidecar"] = "Sidecar"
    spec: SidecarSpec


NETWORKING_KINDS: tuple[type[K8sObject], ...] = (VirtualService, DestinationRule, ServiceEntry, WorkloadEntry,
                                                 Sidecar, Gateway)
