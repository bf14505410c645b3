"""HTTPRoute and GRPCRoute rules -> VirtualService HTTP rules (pure), one rule per match so the
rules of every route on a host can be put in the spec's precedence order:

1. an Exact path before a PathPrefix before a RegularExpression before the `/` prefix (which
   matches everything); longer paths first;
2. a method match before none; 3. more header matches first; 4. more query matches first;
then the oldest route (creationTimestamp, then namespace/name) and rule order, which is the
order candidates are made in (the sort is stable). GRPCRoute methods become paths
(`/service/method` exact, `/service/` prefix, or a regex) and rank the same way.

Filters: RequestHeaderModifier/ResponseHeaderModifier -> headers (also on a single backendRef:
that destination's headers); RequestRedirect -> redirect; URLRewrite -> rewrite (hostname, full
path, or the matched prefix); RequestMirror -> mirrors (each one; several on a rule all apply).
sessionPersistence -> the
rule's `session` (Envoy's stateful session on its routes). Backends keep their relative weights. An invalid backendRef (not found, not permitted, an
unsupported kind) keeps its share of the weight on a cluster that never exists, which the
route answers with 500 (gateway semantics); a rule with no usable backend at all, or with a
filter this controller cannot apply (ExtensionRef, CORS), answers 500 directly.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pilot.config.core import Service
from pilot.config.gateway_api import GRPCRoute, HTTPRoute, SessionPersistence, first_per_name
from pilot.config.networking import (
    CorsPolicy,
    Headers,
    HTTPDirectResponse,
    HTTPMirrorPolicy,
    HTTPRedirect,
    HTTPRetry,
    HTTPRewrite,
    Percent,
    RegexRewrite,
)
from pilot.model.gateway_api.internal import (
    GatewayApiRule,
    Route,
    destination,
    header_operations,
    headers,
    http_destination,
    http_match,
    string_match,
)
from pilot.model.gateway_api.references import INVALID_BACKEND_HOST, Backend, ReferenceGrants, resolve_backend
from pilot.model.store import Entry

DEFAULT_ATTEMPTS = 2  # MeshConfig's default retry attempts, kept when only backendRequest is set
RETRY_CONDITIONS = "connect-failure,refused-stream,unavailable,cancelled"  # istiod's default retryOn


@dataclass(frozen=True, slots=True, eq=False)  # compared by identity: memoized ones are reused as is
class Candidate:
    rank: tuple
    rule: GatewayApiRule
    origin: str  # the route it comes from, `Kind/namespace/name`


@dataclass(frozen=True)
class RouteRefs:
    """What resolving references needs (the same for every rule of every route in one pass)."""

    services: Mapping[tuple[str, str], Entry[Service]]
    grants: ReferenceGrants
    domain: str
    # host -> (namespace, exportTo) of each ServiceEntry declaring it (Hostname backendRefs)
    hostnames: Mapping[str, tuple[tuple[str, tuple[str, ...]], ...]] = field(default_factory=dict)


def referenced_services(route: Entry[Route]) -> tuple[tuple[str, str], ...]:
    """(namespace, name) of every Service a route's backendRefs and mirrors may name: what its
    translation reads of the registry."""
    ns = route.key.namespace
    out = []
    for rule in route.obj.spec.rules:
        refs = list(rule.backend_refs)
        refs += [f.request_mirror.backend_ref for f in getattr(rule, "filters", ()) if f.type == "RequestMirror"]
        out += [(r.namespace or ns, r.name) for r in refs]
    return tuple(sorted(set(out)))


def rank(match) -> tuple:
    uri = match.uri
    kind = 3 if uri.exact is not None else 0 if uri.prefix == "/" else 2 if uri.prefix is not None else 1
    length = len(uri.exact or uri.prefix or uri.regex or "")
    return (-kind, -length, match.method is None, -len(match.headers), -len(match.query_params))


def _string(type_: str, value: str):
    return string_match(regex=value) if type_ == "RegularExpression" else string_match(exact=value)


def _header_matches(matches) -> dict:
    return {m.name.lower(): _string(m.type, m.value) for m in first_per_name(matches)}


def _modifier(mod):
    if mod is None:
        return None
    return header_operations({h.name: h.value for h in mod.set}, {h.name: h.value for h in mod.add},
                             list(mod.remove))


def _prefix_rewrite(prefix: str, replacement: str) -> tuple[str | None, RegexRewrite | None]:
    """Replace the matched (path-segment) prefix: a plain prefix rewrite, except where Envoy's
    would leave a double or missing slash (a `/` prefix or a `/` replacement)."""
    p, r = prefix.rstrip("/"), replacement.rstrip("/")
    if not p:
        return None, RegexRewrite.model_construct(match="^/", rewrite=r + "/")
    if not r:
        return None, RegexRewrite.model_construct(match=f"^{re.escape(p)}/*", rewrite="/")
    return r, None


def _backends(refs, kind: str, namespace: str, ctx: RouteRefs, problems: list[Backend],
              unsupported: list[str]) -> list[tuple[Backend, Headers | None]]:
    """Each backendRef resolved, with the header operations of its own filters."""
    out = []
    for ref in refs:
        b = resolve_backend(ref, kind, namespace, ctx.services, ctx.grants, ctx.domain, ctx.hostnames)
        if not b.valid:
            problems.append(b)
        request = response = None
        for f in getattr(ref, "filters", ()):
            if f.type == "RequestHeaderModifier":
                request = _modifier(f.request_header_modifier)
            elif f.type == "ResponseHeaderModifier":
                response = _modifier(f.response_header_modifier)
            else:  # the backend cannot be served as asked: its share fails (500)
                unsupported.append(f"{f.type} filters on a backendRef are not supported")
                b = Backend(INVALID_BACKEND_HOST, b.port, b.weight, "InvalidKind", unsupported[-1])
        out.append((b, headers(request, response)))
    return out


def _destinations(backends: list[tuple[Backend, Headers | None]]):
    """VirtualService destinations for the backends with weight, invalid shares pooled on one
    never-existing cluster; None when nothing can serve (answer 500)."""
    live = [(b, h) for b, h in backends if b.weight > 0]
    valid = [(b, h) for b, h in live if b.valid]
    if not valid:
        return None
    invalid = sum(b.weight for b, _ in live if not b.valid)
    dests = [http_destination(b.host, b.port, b.weight, h) for b, h in valid]
    if invalid:
        dests.append(http_destination(INVALID_BACKEND_HOST, valid[0][0].port, invalid))
    return dests


_ERROR_500 = HTTPDirectResponse.model_construct(status=500, body=None)


def _rule_fields(rule, kind: str, namespace: str, prefix: str | None, ctx: RouteRefs,
                 problems: list[Backend], unsupported: list[str]) -> dict:
    fields: dict = {"headers": None, "redirect": None, "rewrite": None, "mirror": None, "mirror_percentage": None,
                    "mirrors": [], "route": [], "direct_response": None, "timeout": None, "retries": None}
    request = response = None
    broken = False
    for f in rule.filters:
        if f.type == "RequestHeaderModifier":
            request = _modifier(f.request_header_modifier)
        elif f.type == "ResponseHeaderModifier":
            response = _modifier(f.response_header_modifier)
        elif f.type == "RequestMirror":  # every one applies (Envoy's request_mirror_policies)
            m = f.request_mirror
            b = resolve_backend(m.backend_ref, kind, namespace, ctx.services, ctx.grants, ctx.domain, ctx.hostnames)
            if b.valid:
                share = m.share
                fields["mirrors"].append(HTTPMirrorPolicy.model_construct(
                    destination=destination(b.host, b.port),
                    percentage=Percent.model_construct(value=share) if share is not None else None))
            else:
                problems.append(b)
        elif f.type == "RequestRedirect":
            r = f.request_redirect
            uri = None
            if r.path is not None and r.path.type == "ReplaceFullPath":
                uri = r.path.value
            elif r.path is not None and prefix is not None:
                fields["redirect_prefix"], fields["redirect_regex"] = _prefix_rewrite(prefix, r.path.value)
            # No port: the request's (the listener's) unless a scheme is given, then the scheme's
            # default (the spec's rule, istiod's derivePort).
            derive = None if r.port else "FROM_PROTOCOL_DEFAULT" if r.scheme else "FROM_REQUEST_PORT"
            fields["redirect"] = HTTPRedirect.model_construct(uri=uri, authority=r.hostname, port=r.port,
                                                              scheme=r.scheme, redirect_code=r.status_code,
                                                              derive_port=derive)
        elif f.type == "URLRewrite":
            w = f.url_rewrite
            uri, regex = None, None
            if w.path is not None and w.path.type == "ReplaceFullPath":
                regex = RegexRewrite.model_construct(match="^.*$", rewrite=w.path.value)
            elif w.path is not None and prefix is not None:
                uri, regex = _prefix_rewrite(prefix, w.path.value)
            if uri is not None or regex is not None or w.hostname:
                fields["rewrite"] = HTTPRewrite.model_construct(uri=uri, authority=w.hostname, uri_regex_rewrite=regex)
        elif f.type == "CORS":
            fields["cors_policy"] = cors_policy(f.cors)
        else:  # ExtensionRef
            unsupported.append(f"{f.type} filters are not supported")
            broken = True
    fields["headers"] = headers(request, response)
    timeouts = getattr(rule, "timeouts", None)
    per_try = timeouts.backend_request if timeouts is not None else None
    if timeouts is not None:
        fields["timeout"] = timeouts.request
        if per_try:
            fields["retries"] = HTTPRetry.model_construct(attempts=DEFAULT_ATTEMPTS, per_try_timeout=per_try,
                                                          retry_on=None, retry_remote_localities=None)
    retry = getattr(rule, "retry", None)
    if retry is not None:
        # HTTPRoute `retry`: its codes join the connection-level conditions retried anyway (istiod's
        # default retryOn); `attempts` unset keeps the mesh default; backendRequest is per try.
        fields["retries"] = HTTPRetry.model_construct(
            attempts=DEFAULT_ATTEMPTS if retry.attempts is None else retry.attempts, per_try_timeout=per_try,
            retry_on=",".join([RETRY_CONDITIONS, *(str(c) for c in retry.codes)]), retry_remote_localities=None,
            retry_ignore_previous_hosts=None, backoff=retry.backoff)
    backends = _backends(rule.backend_refs, kind, namespace, ctx, problems, unsupported)
    if broken:
        fields["redirect"] = fields["rewrite"] = None
        fields["mirrors"] = []
        fields["direct_response"] = _ERROR_500
    elif fields["redirect"] is None:
        dests = _destinations(backends)
        if dests is None:
            fields["direct_response"] = _ERROR_500
            fields["rewrite"] = None
            fields["mirrors"] = []
        else:
            fields["route"] = dests
    return fields


# istiod's `*` origin: any well-formed origin (scheme://host[:port], RFC 6454), not any string.
_ANY_ORIGIN = r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+$"


def _origin_match(origin: str):
    """A CORS allowOrigins entry as a string match, as istiod converts it: `*` any well-formed
    origin, no wildcard exact, one trailing wildcard a prefix, any other wildcard (`https://*.x.com`,
    any number of labels in its place) an anchored regex."""
    if origin == "*":
        return string_match(regex=_ANY_ORIGIN)
    if "*" not in origin:
        return string_match(exact=origin)
    if origin.count("*") == 1 and origin.endswith("*"):
        return string_match(prefix=origin[:-1])
    return string_match(regex="^" + ".*".join(re.escape(part) for part in origin.split("*")) + "$")


def cors_policy(f) -> CorsPolicy:
    """The HTTPRoute CORS filter as a VirtualService corsPolicy (istiod's translation), applied by
    Envoy's CORS filter on the route. A preflight from an origin not allowed is answered by Envoy
    without CORS headers rather than forwarded (istiod's unmatchedPreflights IGNORE): the backend
    never sees it."""
    return CorsPolicy.model_construct(
        allow_origin=[], allow_origins=[_origin_match(o) for o in f.allow_origins],
        allow_methods=list(f.allow_methods), allow_headers=list(f.allow_headers),
        expose_headers=list(f.expose_headers), max_age=f"{f.max_age}s" if f.max_age else None,
        allow_credentials=True if f.allow_credentials else None, unmatched_preflights="IGNORE")


def _http_uri(path):
    if path.type == "Exact":
        return string_match(exact=path.value)
    if path.type == "RegularExpression":
        return string_match(regex=path.value)
    return string_match(prefix=path.value)


def http_route_rules(route: Entry[HTTPRoute], ctx: RouteRefs, problems: list[Backend],
                     unsupported: list[str]) -> list[Candidate]:
    ns, name = route.key.namespace, route.key.name
    out = []
    for i, rule in enumerate(route.obj.spec.rules):
        prefix = rule.matches[0].path.value if len(rule.matches) == 1 and rule.matches[0].path.type == "PathPrefix" \
            else None
        fields = _rule_fields(rule, "HTTPRoute", ns, prefix, ctx, problems, unsupported)
        fields["session"] = _session(rule.session_persistence, ns, name, i)
        for m in rule.matches:
            match = http_match(_http_uri(m.path), _header_matches(m.headers),
                               {q.name: _string(q.type, q.value) for q in _first_query(m.query_params)}, m.method)
            out.append(Candidate(rank(match), GatewayApiRule.model_construct(name=_rule_name(rule, ns, name, i),
                                                                             match=[match], origin=str(route.key),
                                                                             **fields),
                                 str(route.key)))
    return out


def _session(sp: SessionPersistence | None, ns: str, name: str, index: int) -> SessionPersistence | None:
    """The rule's sessionPersistence with its session name decided: the one written, else one of
    this rule's own (the name is implementation-specific; a name per rule keeps two routes'
    sessions apart, as the spec asks of users who name them)."""
    if sp is None or sp.session_name:
        return sp
    digest = hashlib.blake2b(f"{ns}/{name}/{index}".encode(), digest_size=6).hexdigest()
    return sp.model_copy(update={"session_name": f"gw-session-{digest}"})


def _rule_name(rule, ns: str, name: str, index: int) -> str:
    """istiod's route name: the rule's `name`, else NAMESPACE.NAME.RULE_INDEX (each match of a
    rule is split into its own route of the same name)."""
    return rule.name or f"{ns}.{name}.{index}"


def _first_query(params) -> list:
    seen: set[str] = set()
    out = []
    for q in params:
        if q.name not in seen:
            seen.add(q.name)
            out.append(q)
    return out


def _grpc_uri(method):
    if method is None:
        return string_match(prefix="/")
    if method.type == "Exact":
        if method.service and method.method:
            return string_match(exact=f"/{method.service}/{method.method}")
        if method.service:
            return string_match(prefix=f"/{method.service}/")
        return string_match(regex=f"/[^/]+/{re.escape(method.method)}")
    return string_match(regex=f"/{method.service or '[^/]+'}/{method.method or '[^/]+'}")


def grpc_route_rules(route: Entry[GRPCRoute], ctx: RouteRefs, problems: list[Backend],
                     unsupported: list[str]) -> list[Candidate]:
    ns, name = route.key.namespace, route.key.name
    out = []
    for i, rule in enumerate(route.obj.spec.rules):
        fields = _rule_fields(rule, "GRPCRoute", ns, None, ctx, problems, unsupported)
        matches: list = list(rule.matches) or [None]  # a rule without matches matches every method
        for m in matches:
            match = http_match(_grpc_uri(m.method if m is not None else None),
                               _header_matches(m.headers) if m is not None else {}, {}, None)
            out.append(Candidate(rank(match), GatewayApiRule.model_construct(name=_rule_name(rule, ns, name, i),
                                                                             match=[match], origin=str(route.key),
                                                                             **fields),
                                 str(route.key)))
    return out
