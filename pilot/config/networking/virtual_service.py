"""VirtualService (istiod's ValidateVirtualService): HTTP, TCP and TLS routes, their matches,
destinations, redirects, rewrites, retries, fault injection, CORS and header manipulation."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from http import HTTPStatus
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pilot.config.base import K8sObject, StrictModel, Unsupported
from pilot.config.networking.common import MESH_GATEWAY, Destination, Percent, StringMatch
from pilot.config.networking.validation import (
    _JWT_CLAIM_PREFIXES,
    Duration,
    GatewayNames,
    Labels,
    OptStr,
    Port,
    _fail,
    _header_name,
    _header_value,
    _is_authority_header,
    _is_internal_header,
    _raise_if,
    _source_namespace,
    _validate_wildcard_domain_for_gateway,
    host_matches,
    host_subset_of,
    is_ip,
    validate_export_to,
    validate_regex,
    validate_wildcard_domain,
)
from pilot.durations import parse_duration


# --- headers ----------------------------------------------------------------------------------------
class HeaderOperations(StrictModel):
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


class Headers(StrictModel):
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
def _not_empty_match(m: StringMatch | None) -> StringMatch | None:
    if m is not None and m.is_empty:
        _fail("one of exact, prefix or regex must be set")
    return m


RequiredMatch = Annotated[StringMatch | None, AfterValidator(_not_empty_match)]


def _header_matches(headers: dict[str, StringMatch]) -> dict[str, StringMatch]:
    _raise_if([f"{name!r}: {e}" for name in headers if (e := _header_name(name, jwt_claims=True))])
    return headers


HeaderMatches = Annotated[dict[str, StringMatch], AfterValidator(_header_matches)]


class HTTPMatchRequest(StrictModel):
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
    stat_prefix: str = ""  # the Envoy route's stat_prefix

def _weight(w: int) -> int:
    if not 0 <= w <= 100:
        _fail(f"weight {w} is not in range 0..100")
    return w


Weight = Annotated[int, AfterValidator(_weight)]


class HTTPRouteDestination(StrictModel):
    destination: Destination
    weight: Weight = 0
    headers: Headers | None = None


class RouteDestination(StrictModel):
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


class HTTPRedirect(StrictModel):
    uri: OptStr = None
    authority: OptStr = None
    port: Port | None = None
    scheme: OptStr = None
    redirect_code: int = 301
    # FROM_REQUEST_PORT: the port the route serves (istiod: routes are built per request port).
    derive_port: Literal["FROM_PROTOCOL_DEFAULT", "FROM_REQUEST_PORT"] | None = None

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
        if self.port is not None and self.derive_port is not None:
            _fail("only one of port or derivePort may be set")
        if self.uri is None and self.authority is None and self.port is None and self.scheme is None \
                and self.derive_port is None:
            _fail("redirect must specify URI, authority, scheme, or port")
        return self


class HTTPBody(StrictModel):
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


class HTTPDirectResponse(StrictModel):
    status: int
    body: HTTPBody | None = None

    @field_validator("status")
    @classmethod
    def _status(cls, status: int) -> int:
        if not 200 <= status <= 599:
            _fail(f"HTTP status {status} is not in range 200-599")
        return status


class RegexRewrite(StrictModel):
    match: str = ""
    rewrite: str = ""

    @model_validator(mode="after")
    def _valid(self) -> RegexRewrite:
        if not self.match or not self.rewrite:
            _fail("uriRegexRewrite requires both rewrite and match fields to be specified")
        if err := validate_regex(self.match, "match"):
            _fail(err)
        return self


class HTTPRewrite(StrictModel):
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


class HTTPRetry(StrictModel):
    attempts: int = 0
    per_try_timeout: Duration | None = None
    retry_on: str | None = None
    retry_remote_localities: bool | None = None
    # istiod adds the previous_hosts predicate unless this is false (true keeps it).
    retry_ignore_previous_hosts: bool | None = None
    backoff: Duration | None = None  # Envoy retry_back_off.base_interval

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

class Delay(StrictModel):
    fixed_delay: Duration | None = None
    percentage: Percent | None = None
    percent: int | None = Field(default=None, ge=0, le=100)  # deprecated: used when percentage is absent
    exponential_delay: Unsupported = None  # istiod does not generate it either


_GRPC_STATUS = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                "UNAUTHENTICATED"}


class Abort(StrictModel):
    http_status: int | None = None
    grpc_status: str | None = None
    http2_error: Unsupported = None  # istiod does not generate it either
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


class HTTPFaultInjection(StrictModel):
    delay: Delay | None = None
    abort: Abort | None = None

    @model_validator(mode="after")
    def _something(self) -> HTTPFaultInjection:
        if self.delay is None and self.abort is None:
            _fail("HTTP fault injection must have an abort and/or a delay")
        return self


_HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE"}


class CorsPolicy(StrictModel):
    allow_origin: list[str] = Field(default_factory=list)  # deprecated: exact origins, before allowOrigins
    allow_origins: list[StringMatch] = Field(default_factory=list)
    allow_methods: list[str] = Field(default_factory=list)
    allow_headers: list[str] = Field(default_factory=list)
    expose_headers: list[str] = Field(default_factory=list)
    max_age: Duration | None = None
    allow_credentials: bool | None = None
    unmatched_preflights: Literal["UNSPECIFIED", "FORWARD", "IGNORE"] | None = None

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


class HTTPMirrorPolicy(StrictModel):
    destination: Destination
    percentage: Percent | None = None


class HTTPRoute(StrictModel):
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
    mirrors: list[HTTPMirrorPolicy] = Field(default_factory=list)
    mirror_percent: int | None = Field(default=None, ge=0, le=100)  # deprecated: mirrorPercentage wins
    mirror_percentage: Percent | None = None
    headers: Headers | None = None
    cors_policy: CorsPolicy | None = None
    # VirtualService delegation is not generated. Refused by name (a field error stops the model
    # checks, so it is not reported as "route, redirect or directResponse is required").
    delegate: Unsupported = None

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
        if self.mirror is not None and self.mirrors:
            errs.append("HTTP route cannot contain both mirror and mirrors")
        authorities = ([self.rewrite.authority] if self.rewrite is not None and self.rewrite.authority else []) \
            + (self.headers.authority() if self.headers is not None else [])
        if len(authorities) > 1:
            errs.append(f"authority header cannot be set multiple times: {authorities}")
        _raise_if(errs)
        return self


class L4MatchAttributes(StrictModel):
    """TCP/TLS rules are chosen per listener port, gateway and, for sidecars, client (its
    namespace and labels). The address conditions are not generated, and ignoring them would
    route every connection, so they are refused when set."""

    port: Port | None = None
    gateways: GatewayNames = Field(default_factory=list)
    source_labels: Labels = Field(default_factory=dict)
    source_namespace: Annotated[str | None, AfterValidator(_source_namespace)] = None
    destination_subnets: Unsupported = None
    source_subnet: Unsupported = None


class TLSMatchAttributes(StrictModel):
    sni_hosts: list[str] = Field(default_factory=list)
    port: Port | None = None
    gateways: GatewayNames = Field(default_factory=list)
    source_labels: Labels = Field(default_factory=dict)
    source_namespace: Annotated[str | None, AfterValidator(_source_namespace)] = None
    destination_subnets: Unsupported = None

    @model_validator(mode="after")
    def _some(self) -> TLSMatchAttributes:
        if not self.sni_hosts:  # (a validated default would be reported as `sni_hosts`)
            _fail("sniHosts: TLS match must have at least one SNI host")
        return self


class TCPRoute(StrictModel):
    match: list[L4MatchAttributes] = Field(default_factory=list)
    route: list[RouteDestination] = Field(default_factory=list, validate_default=True)

    @field_validator("route")
    @classmethod
    def _route(cls, route: list[RouteDestination]) -> list[RouteDestination]:
        if not route:
            _fail("TCP route is required")
        _total_weight(route)
        return route


class TLSRoute(StrictModel):
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


class VirtualServiceSpec(StrictModel):
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
        # Routers choose tcp/tls rules without looking at the client: a source condition there
        # would be ignored (applied to every client), so it is refused where a gateway is bound.
        l4: tuple[tuple[str, Sequence[TCPRoute | TLSRoute]], ...] = (("tcp", self.tcp), ("tls", self.tls))
        for kind, rules in l4:
            for i, rule in enumerate(rules):
                for j, m in enumerate[L4MatchAttributes | TLSMatchAttributes](rule.match):
                    bound = m.gateways or self.gateways or [MESH_GATEWAY]
                    if (m.source_labels or m.source_namespace) and any(g != MESH_GATEWAY for g in bound):
                        errs.append(f"{kind}[{i}].match[{j}]: sourceLabels/sourceNamespace are not supported "
                                    "on gateways (only for sidecars, the mesh gateway)")
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
