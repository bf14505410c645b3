"""Validation helpers shared by the networking.istio.io kinds, after istiod's `pkg/config/validation`
(and `validation/agent`): the error helpers, DNS names, hosts, labels, addresses and ports, exportTo,
protocols, durations, RE2 regular expressions and header names/values, and the constrained field
types (`Port`, `Labels`, `GatewayNames`, `Duration`, `OptStr`) built from them."""

from __future__ import annotations

import ipaddress
import re
import warnings
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator
from pydantic_core import PydanticCustomError

from pilot.durations import parse_duration


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
