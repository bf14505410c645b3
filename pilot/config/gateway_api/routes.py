"""HTTPRoute, GRPCRoute, TCPRoute, TLSRoute and ReferenceGrant (gateway.networking.k8s.io)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from pilot.config.base import StrictModel, Unsupported, fails_closed
from pilot.config.gateway_api.common import (
    BackendRef,
    CommonRouteSpec,
    GatewayApiObject,
    GatewayDuration,
    Group,
    HeaderMatch,
    HeaderModifier,
    Hostnames,
    Kind,
    LocalObjectReference,
    Namespace,
    ObjectName,
    PortNumber,
    PreciseHostname,
    RequestMirror,
    SectionName,
    check_filter_fields,
    unique_names,
    validate_regex_value,
)
from pilot.config.networking.validation import _fail, _raise_if

# --- HTTPRoute --------------------------------------------------------------------------------------
_PATH_CHARS = re.compile(r"^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$")


class PathMatch(StrictModel):
    type: Literal["Exact", "PathPrefix", "RegularExpression"] = "PathPrefix"
    value: str = Field(default="/", max_length=1024)

    @model_validator(mode="after")
    def _valid(self) -> PathMatch:
        if self.type == "RegularExpression":
            validate_regex_value(self.value, "value")
            return self
        errs = []
        if not self.value.startswith("/"):
            errs.append("value must be an absolute path and start with '/' when type one of ['Exact', 'PathPrefix']")
        for bad in ("//", "/./", "/../", "%2f", "%2F", "#"):
            if bad in self.value:
                errs.append(f"value must not contain {bad!r} when type one of ['Exact', 'PathPrefix']")
        if self.value.endswith(("/..", "/.")):
            errs.append("value must not end with '/..' or '/.' when type one of ['Exact', 'PathPrefix']")
        if not _PATH_CHARS.match(self.value):
            errs.append(f"value must only contain valid characters (matching {_PATH_CHARS.pattern}) "
                        "for types ['Exact', 'PathPrefix']")
        _raise_if(errs)
        return self


class QueryParamMatch(StrictModel):
    type: Literal["Exact", "RegularExpression"] = "Exact"
    name: str = Field(min_length=1, max_length=256)
    value: str = Field(min_length=1, max_length=1024)

    @model_validator(mode="after")
    def _regex(self) -> QueryParamMatch:
        if self.type == "RegularExpression":
            validate_regex_value(self.value, "value")
        return self


Method = Literal["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]


class HTTPRouteMatch(StrictModel):
    path: PathMatch = Field(default_factory=PathMatch)
    headers: list[HeaderMatch] = Field(default_factory=list, max_length=16)
    query_params: list[QueryParamMatch] = Field(default_factory=list, max_length=16)
    method: Method | None = None

    @model_validator(mode="after")
    def _unique(self) -> HTTPRouteMatch:
        unique_names(self.headers, "headers")
        unique_names(self.query_params, "queryParams")
        return self


class PathModifier(StrictModel):
    type: Literal["ReplaceFullPath", "ReplacePrefixMatch"]
    replace_full_path: str | None = None
    replace_prefix_match: str | None = None

    @model_validator(mode="after")
    def _one(self) -> PathModifier:
        errs = []
        if self.type == "ReplaceFullPath" and (self.replace_full_path is None or self.replace_prefix_match is not None):
            errs.append("replaceFullPath must be specified (and replacePrefixMatch not) when type is ReplaceFullPath")
        if self.type == "ReplacePrefixMatch" and (self.replace_prefix_match is None
                                                  or self.replace_full_path is not None):
            errs.append("replacePrefixMatch must be specified (and replaceFullPath not) when type is "
                        "ReplacePrefixMatch")
        value = self.replace_full_path if self.type == "ReplaceFullPath" else self.replace_prefix_match
        if value is not None and value and not value.startswith("/"):
            errs.append(f"{value!r} must start with '/'")
        _raise_if(errs)
        return self

    @property
    def value(self) -> str:
        return (self.replace_full_path if self.type == "ReplaceFullPath" else self.replace_prefix_match) or "/"


class RequestRedirect(StrictModel):
    scheme: Literal["http", "https"] | None = None
    hostname: PreciseHostname | None = None
    path: PathModifier | None = None
    port: PortNumber | None = None
    status_code: Literal[301, 302, 303, 307, 308] = 302


class URLRewrite(StrictModel):
    hostname: PreciseHostname | None = None
    path: PathModifier | None = None


# Gateway API's answer for a filter an implementation lacks: the route is accepted, its status
# says so, and the rule answers 500 (never serves the request unfiltered).
FAILS_CLOSED = "the rule answers 500 and the route's status says why (Gateway API's rule for filters)"


class CORSFilter(StrictModel):
    allow_origins: list[str] = Field(default_factory=list)
    allow_credentials: bool | None = None
    allow_methods: list[str] = Field(default_factory=list)
    allow_headers: list[str] = Field(default_factory=list)
    expose_headers: list[str] = Field(default_factory=list)
    max_age: int | None = None


class HTTPRouteFilter(StrictModel):
    type: Literal["RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "RequestRedirect",
                  "URLRewrite", "ExtensionRef", "CORS", "ExternalAuth"]
    request_header_modifier: HeaderModifier | None = None
    response_header_modifier: HeaderModifier | None = None
    request_mirror: RequestMirror | None = None
    request_redirect: RequestRedirect | None = None
    url_rewrite: URLRewrite | None = Field(default=None, alias="urlRewrite")
    extension_ref: LocalObjectReference | None = fails_closed(FAILS_CLOSED)
    cors: CORSFilter | None = None
    # Authentication and authorisation by an external service: refused outright, as a request
    # must never pass a filter meant to check it.
    external_auth: Unsupported = None

    @model_validator(mode="after")
    def _fields(self) -> HTTPRouteFilter:
        check_filter_fields(self, self.type)
        return self


class HTTPBackendRef(BackendRef):
    filters: list[HTTPRouteFilter] = Field(default_factory=list)


class HTTPRouteRetry(StrictModel):
    codes: list[Annotated[int, Field(ge=400, le=599)]] = Field(default_factory=list)
    attempts: int | None = Field(default=None, ge=0)
    backoff: GatewayDuration | None = None


class HTTPRouteTimeouts(StrictModel):
    request: GatewayDuration | None = None
    backend_request: GatewayDuration | None = None


def _filters_ok(filters: list[HTTPRouteFilter], matches: list[HTTPRouteMatch]) -> list[str]:
    """The HTTPRoute CEL rules about filters in one rule."""
    errs = []
    types = [f.type for f in filters]
    if "RequestRedirect" in types and "URLRewrite" in types:
        errs.append("May specify either httpRouteFilterRequestRedirect or httpRouteFilterRequestRewrite, but not both")
    for t in ("RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite"):
        if types.count(t) > 1:
            errs.append(f"{t} filter cannot be repeated")
    for f in filters:
        path = (f.request_redirect.path if f.request_redirect is not None
                else f.url_rewrite.path if f.url_rewrite is not None else None)
        if path is not None and path.type == "ReplacePrefixMatch" and (
                len(matches) != 1 or matches[0].path.type != "PathPrefix"):
            errs.append("When using ReplacePrefixMatch, exactly one PathPrefix match must be specified")
    return errs


class CookieConfig(StrictModel):
    lifetime_type: Literal["Permanent", "Session"] = "Session"


class SessionPersistence(StrictModel):
    """Built as Envoy's stateful session filter (the cookie or header names the backend host a
    first response chose). Envoy's session state has no idle timer, and a header carries no
    expiry: those two are refused rather than accepted and not enforced."""

    session_name: str | None = Field(default=None, max_length=128)
    absolute_timeout: GatewayDuration | None = None
    idle_timeout: Unsupported = None
    type: Literal["Cookie", "Header"] = "Cookie"
    cookie_config: CookieConfig | None = None

    @model_validator(mode="after")
    def _cel(self) -> SessionPersistence:
        errs = []
        if self.cookie_config is not None and self.cookie_config.lifetime_type == "Permanent" \
                and self.absolute_timeout is None:
            errs.append("AbsoluteTimeout must be specified when cookie lifetimeType is Permanent")
        if self.cookie_config is not None and self.type != "Cookie":
            errs.append("cookieConfig can only be set with type Cookie")
        if self.type == "Cookie" and self.absolute_timeout is not None and (
                self.cookie_config is None or self.cookie_config.lifetime_type == "Session"):
            errs.append("absoluteTimeout is not supported with a Session cookie (Envoy gives a cookie with an "
                        "expiry a Max-Age, which makes it Permanent)")
        if self.type == "Header" and self.absolute_timeout is not None:
            errs.append("absoluteTimeout is not supported with type Header (Envoy's header-based session "
                        "state carries no expiry)")
        if self.session_name is not None and not _TOKEN.match(self.session_name):
            errs.append("sessionName must be a valid cookie or header name (an RFC 7230 token)")
        _raise_if(errs)
        return self


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class HTTPRouteRule(StrictModel):
    name: SectionName | None = None
    matches: list[HTTPRouteMatch] = Field(default_factory=lambda: [HTTPRouteMatch()])
    filters: list[HTTPRouteFilter] = Field(default_factory=list)
    backend_refs: list[HTTPBackendRef] = Field(default_factory=list)
    timeouts: HTTPRouteTimeouts | None = None
    retry: HTTPRouteRetry | None = None
    session_persistence: SessionPersistence | None = None

    @model_validator(mode="after")
    def _cel(self) -> HTTPRouteRule:
        errs = _filters_ok(self.filters, self.matches)
        if len(self.matches) > 64:
            errs.append("at most 64 matches")
        if self.backend_refs and any(f.type == "RequestRedirect" for f in self.filters):
            errs.append("RequestRedirect filter must not be used together with backendRefs")
        _raise_if(errs)
        return self


def _total_matches(rules: list) -> list:
    if sum(len(r.matches) for r in rules) >= 128:
        from pilot.config.networking.validation import _fail
        _fail("While 16 rules and 64 matches per rule are allowed, the total number of matches across all "
              "rules in a route must be less than 128")
    return rules


class HTTPRouteSpec(CommonRouteSpec):
    hostnames: Hostnames = Field(default_factory=list)
    rules: list[HTTPRouteRule] = Field(default_factory=lambda: [HTTPRouteRule()], max_length=16)

    @model_validator(mode="after")
    def _matches(self) -> HTTPRouteSpec:
        _total_matches(self.rules)
        return self


class HTTPRoute(GatewayApiObject):
    kind: Literal["HTTPRoute"] = "HTTPRoute"
    spec: HTTPRouteSpec


# --- GRPCRoute --------------------------------------------------------------------------------------
class GRPCMethodMatch(StrictModel):
    type: Literal["Exact", "RegularExpression"] = "Exact"
    service: str | None = Field(default=None, max_length=1024)
    method: str | None = Field(default=None, max_length=1024)

    @model_validator(mode="after")
    def _valid(self) -> GRPCMethodMatch:
        if self.service is None and self.method is None:
            _fail("One or both of 'service' or 'method' must be specified")
        if self.type == "Exact":
            if self.service is not None and ("/" in self.service or not self.service):
                _fail("service must be a valid gRPC service name (no '/')")
            if self.method is not None and ("/" in self.method or not self.method):
                _fail("method must be a valid gRPC method name (no '/')")
        else:
            for v, where in ((self.service, "service"), (self.method, "method")):
                if v is not None:
                    validate_regex_value(v, where)
        return self


class GRPCRouteMatch(StrictModel):
    method: GRPCMethodMatch | None = None
    headers: list[HeaderMatch] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _unique(self) -> GRPCRouteMatch:
        unique_names(self.headers, "headers")
        return self


class GRPCRouteFilter(StrictModel):
    type: Literal["RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "ExtensionRef"]
    request_header_modifier: HeaderModifier | None = None
    response_header_modifier: HeaderModifier | None = None
    request_mirror: RequestMirror | None = None
    extension_ref: LocalObjectReference | None = fails_closed(FAILS_CLOSED)

    @model_validator(mode="after")
    def _fields(self) -> GRPCRouteFilter:
        check_filter_fields(self, self.type)
        return self


class GRPCBackendRef(BackendRef):
    filters: list[GRPCRouteFilter] = Field(default_factory=list)


class GRPCRouteRule(StrictModel):
    name: SectionName | None = None
    matches: list[GRPCRouteMatch] = Field(default_factory=list)
    filters: list[GRPCRouteFilter] = Field(default_factory=list)
    backend_refs: list[GRPCBackendRef] = Field(default_factory=list)
    session_persistence: Unsupported = None


class GRPCRouteSpec(CommonRouteSpec):
    hostnames: Hostnames = Field(default_factory=list)
    rules: list[GRPCRouteRule] = Field(default_factory=list, max_length=16)


class GRPCRoute(GatewayApiObject):
    kind: Literal["GRPCRoute"] = "GRPCRoute"
    spec: GRPCRouteSpec


# --- TCPRoute and TLSRoute --------------------------------------------------------------------------
class L4RouteRule(StrictModel):
    name: SectionName | None = None
    backend_refs: list[BackendRef] = Field(default_factory=list, max_length=16)


class TCPRouteSpec(CommonRouteSpec):
    rules: list[L4RouteRule] = Field(min_length=1, max_length=16)


class TCPRoute(GatewayApiObject):
    kind: Literal["TCPRoute"] = "TCPRoute"
    spec: TCPRouteSpec


class TLSRouteSpec(CommonRouteSpec):
    hostnames: Hostnames = Field(default_factory=list)
    rules: list[L4RouteRule] = Field(min_length=1, max_length=16)


class TLSRoute(GatewayApiObject):
    kind: Literal["TLSRoute"] = "TLSRoute"
    spec: TLSRouteSpec


# --- ReferenceGrant ---------------------------------------------------------------------------------
class ReferenceGrantFrom(StrictModel):
    group: Group
    kind: Kind
    namespace: Namespace


class ReferenceGrantTo(StrictModel):
    group: Group
    kind: Kind
    name: ObjectName | None = None


class ReferenceGrantSpec(StrictModel):
    from_: list[ReferenceGrantFrom] = Field(alias="from", min_length=1, max_length=16)
    to: list[ReferenceGrantTo] = Field(min_length=1, max_length=16)


class ReferenceGrant(GatewayApiObject):
    kind: Literal["ReferenceGrant"] = "ReferenceGrant"
    spec: ReferenceGrantSpec
