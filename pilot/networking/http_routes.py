"""VirtualService HTTP rules -> Envoy routes (istiod's translation, pure functions).

Rules keep their order (first match wins); a rule with several matches becomes one Envoy route
per match, as in istiod. Destinations become `outbound|PORT|SUBSET|HOST` clusters.

Rules translated from Gateway API routes (`gateway_semantics`, istiod's UseGatewaySemantics) differ
in two ways the spec requires: a prefix matches whole path segments (`/foo` matches `/foo/bar`,
not `/foobar`), and a destination whose cluster does not exist (an invalid backendRef) answers
500 rather than Envoy's 503. Their rules may also redirect by replacing only the matched prefix
(`GatewayApiRule`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2, extension_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.common.fault.v3 import fault_pb2 as common_fault_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2
from envoy.extensions.http.stateful_session.cookie.v3 import cookie_pb2 as session_cookie_pb2
from envoy.extensions.http.stateful_session.header.v3 import header_pb2 as session_header_pb2
from envoy.extensions.retry.priority.previous_priorities.v3 import previous_priorities_config_pb2
from envoy.type.http.v3 import cookie_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import wrappers_pb2

from pilot.config.mesh import HttpRetryPolicy
from pilot.durations import parse_duration
from pilot.model.gateway_api.internal import GatewayApiRule
from pilot.model.services import MeshService
from pilot.model.traffic import MESH_GATEWAY, resolve_host
from pilot.networking import metadata, names
from pilot.networking.filters import STATEFUL_SESSION_FILTER
from pilot.networking.protos import duration, pack
from pilot.networking.retries import retry_policy

FAULT_FILTER = "envoy.filters.http.fault"
PREVIOUS_PRIORITIES = "envoy.retry_priorities.previous_priorities"
CORS_FILTER = "envoy.filters.http.cors"
_REDIRECT_CODES = {301: rc.RedirectAction.MOVED_PERMANENTLY, 302: rc.RedirectAction.FOUND,
                   303: rc.RedirectAction.SEE_OTHER, 307: rc.RedirectAction.TEMPORARY_REDIRECT,
                   308: rc.RedirectAction.PERMANENT_REDIRECT}


@dataclass(frozen=True)
class RouteInputs:
    """What translating one VirtualService needs besides its rules (all hashable)."""

    namespace: str  # of the VirtualService: short destination hosts resolve against it
    domain: str
    port: int  # the route configuration's port
    services: Mapping[str, MeshService]  # FQDN -> service, for destination ports
    default_retry: HttpRetryPolicy
    # The client: matches on sourceNamespace / sourceLabels keep only rules meant for it.
    client_namespace: str = ""
    client_labels: Mapping[str, str] | None = None  # None: source matching not evaluated
    gateway_semantics: bool = False  # rules translated from Gateway API routes (see the module doc)
    sidecar: bool = False  # routes for sidecars (the `mesh` gateway): matches for other gateways are dropped
    config: str = ""  # the VirtualService's `config` path, written into each route's istio metadata
    tls: bool = False  # the requests arrive over TLS (a redirect without a scheme keeps https)


def _source_ok(match, inputs: RouteInputs) -> bool:
    if match.source_namespace and inputs.client_namespace and match.source_namespace != inputs.client_namespace:
        return False
    if match.source_labels and inputs.client_labels is not None:
        return all(inputs.client_labels.get(k) == v for k, v in match.source_labels.items())
    return True


def _gateway_ok(match, inputs: RouteInputs) -> bool:
    """A match naming gateways applies to sidecars only when `mesh` is among them (routers
    narrow matches by their own gateway before translating: pilot.networking.gateway)."""
    return not (inputs.sidecar and match.gateways and MESH_GATEWAY not in match.gateways)


def destination_cluster(dest, inputs: RouteInputs) -> str:
    host = resolve_host(dest.host, inputs.namespace, inputs.domain)
    port = dest.port.number if dest.port is not None and dest.port.number else None
    if port is None:
        svc = inputs.services.get(host)
        # A destination without a port uses the service's only port, else the listener's port.
        port = svc.ports[0].port if svc is not None and len(svc.ports) == 1 else inputs.port
    return names.outbound_cluster_name(port, host, dest.subset or "")


def _string_matcher(m) -> string_pb2.StringMatcher:
    if m.exact is not None:
        return string_pb2.StringMatcher(exact=m.exact)
    if m.prefix is not None:
        return string_pb2.StringMatcher(prefix=m.prefix)
    return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=m.regex))


def _header(name: str, m, invert: bool = False) -> rc.HeaderMatcher:
    if m.exact is None and m.prefix is None and m.regex is None:  # `{}`: Istio's "header present"
        return rc.HeaderMatcher(name=name, present_match=True, invert_match=invert)
    return rc.HeaderMatcher(name=name, string_match=_string_matcher(m), invert_match=invert)


def route_match(match, segment_prefix: bool = False) -> rc.RouteMatch:
    """`segment_prefix`: prefixes match whole path segments (Gateway API PathPrefix)."""
    out = rc.RouteMatch()
    uri = match.uri if match is not None else None
    if uri is None:
        out.prefix = "/"
    elif uri.exact is not None:
        out.path = uri.exact
    elif uri.prefix is not None and segment_prefix and uri.prefix.rstrip("/"):
        out.path_separated_prefix = uri.prefix.rstrip("/")
    elif uri.prefix is not None:
        out.prefix = uri.prefix
    else:
        out.safe_regex.CopyFrom(regex_pb2.RegexMatcher(regex=uri.regex))
    if match is None:
        return out
    if match.ignore_uri_case:
        out.case_sensitive.CopyFrom(wrappers_pb2.BoolValue(value=False))
    for name, m in sorted(match.headers.items()):
        out.headers.append(_header(name.lower(), m))
    for name, m in sorted(match.without_headers.items()):
        out.headers.append(_header(name.lower(), m, invert=True))
    for pseudo, m in ((":method", match.method), (":authority", match.authority), (":scheme", match.scheme)):
        if m is not None:
            out.headers.append(_header(pseudo, m))
    for name, m in sorted(match.query_params.items()):
        if m.exact is None and m.prefix is None and m.regex is None:
            out.query_parameters.add(name=name, present_match=True)
        else:
            out.query_parameters.add(name=name, string_match=_string_matcher(m))
    return out


def _headers_to_add(ops, append: bool) -> list[base_pb2.HeaderValueOption]:
    action = (base_pb2.HeaderValueOption.APPEND_IF_EXISTS_OR_ADD if append
              else base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)
    items = ops.add.items() if append else ops.set.items()
    return [base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, value=v), append_action=action)
            for k, v in sorted(items)]


def _apply_headers(route: rc.Route, headers) -> None:
    if headers is None:
        return
    if headers.request is not None:
        route.request_headers_to_add.extend(_headers_to_add(headers.request, False) +
                                            _headers_to_add(headers.request, True))
        route.request_headers_to_remove.extend(headers.request.remove)
    if headers.response is not None:
        route.response_headers_to_add.extend(_headers_to_add(headers.response, False) +
                                             _headers_to_add(headers.response, True))
        route.response_headers_to_remove.extend(headers.response.remove)


def _percent(p, default: float = 100.0) -> percent_pb2.FractionalPercent:
    """An Istio Percent (or its absence: `default`). Millionths keep 0.1% exact."""
    value = p.value if p is not None else default
    return percent_pb2.FractionalPercent(numerator=round(value * 10_000),
                                         denominator=percent_pb2.FractionalPercent.MILLION)


def _fault(fault) -> fault_pb2.HTTPFault:
    """istiod's TranslateFault. A delay without `percentage` takes the deprecated integer
    `percent`, and without either delays no request (0 of 100, as istiod writes it); an abort
    without `percentage` leaves Envoy's percentage unset, which aborts no request either."""
    out = fault_pb2.HTTPFault()
    if fault.delay is not None and fault.delay.fixed_delay:
        if fault.delay.percentage is not None:
            share = _percent(fault.delay.percentage)
        else:
            share = percent_pb2.FractionalPercent(numerator=fault.delay.percent or 0,
                                                  denominator=percent_pb2.FractionalPercent.HUNDRED)
        out.delay.CopyFrom(common_fault_pb2.FaultDelay(
            fixed_delay=duration(parse_duration(fault.delay.fixed_delay)), percentage=share))
    if fault.abort is not None:
        abort = fault_pb2.FaultAbort()
        if fault.abort.percentage is not None:
            abort.percentage.CopyFrom(_percent(fault.abort.percentage))
        if fault.abort.http_status:
            abort.http_status = fault.abort.http_status
        elif fault.abort.grpc_status:
            abort.grpc_status = _GRPC_CODES.get(fault.abort.grpc_status.upper(), 14)
        out.abort.CopyFrom(abort)
    return out


_GRPC_CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
               "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
               "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
               "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16}


def _cors(policy) -> cors_pb2.CorsPolicy:
    # The deprecated `allowOrigin` entries are exact origins; istiod uses them only without allowOrigins.
    origins = [_string_matcher(m) for m in policy.allow_origins] or \
        [string_pb2.StringMatcher(exact=o) for o in policy.allow_origin]
    out = cors_pb2.CorsPolicy(allow_origin_string_match=origins,
                              allow_methods=",".join(policy.allow_methods),
                              allow_headers=",".join(policy.allow_headers),
                              expose_headers=",".join(policy.expose_headers))
    if policy.max_age:
        out.max_age = str(int(parse_duration(policy.max_age)))
    if policy.allow_credentials is not None:
        out.allow_credentials.CopyFrom(wrappers_pb2.BoolValue(value=policy.allow_credentials))
    if policy.unmatched_preflights in ("FORWARD", "IGNORE"):  # UNSPECIFIED: Envoy's default (forward)
        out.forward_not_matching_preflights.value = policy.unmatched_preflights == "FORWARD"
    return out


def _retry(retries, default: HttpRetryPolicy) -> rc.RetryPolicy | None:
    if retries is None:
        return retry_policy(default)
    if retries.attempts == 0:
        return None
    retry_on = retries.retry_on or default.retry_on
    # istiod: numeric entries of retryOn are status codes; the rest are Envoy retry conditions.
    codes = [int(p) for p in retry_on.split(",") if p.strip().isdigit()]
    conditions = [p.strip() for p in retry_on.split(",") if p.strip() and not p.strip().isdigit()]
    if codes and "retriable-status-codes" not in conditions:
        conditions.append("retriable-status-codes")
    policy = HttpRetryPolicy(attempts=retries.attempts, per_try_timeout=retries.per_try_timeout,
                             retry_on=",".join(conditions))
    out = retry_policy(policy)
    if out is None:
        return None
    if codes:
        del out.retriable_status_codes[:]
        out.retriable_status_codes.extend(codes)
    # istiod's ConvertPolicy: previous_hosts is on by default; `retryIgnorePreviousHosts: false`
    # takes it off (true keeps it).
    if retries.retry_ignore_previous_hosts is False:
        del out.retry_host_predicate[:]
    if retries.retry_remote_localities:
        out.retry_priority.name = PREVIOUS_PRIORITIES
        out.retry_priority.typed_config.CopyFrom(pack(previous_priorities_config_pb2.PreviousPrioritiesConfig(
            update_frequency=2)))
    if retries.backoff:
        out.retry_back_off.base_interval.CopyFrom(duration(parse_duration(retries.backoff)))
    return out


def _action(rule, inputs: RouteInputs, route: rc.Route, match) -> None:
    if rule.redirect is not None:
        r = rule.redirect
        action = rc.RedirectAction(response_code=_REDIRECT_CODES.get(r.redirect_code or 301,
                                                                      rc.RedirectAction.MOVED_PERMANENTLY))
        if r.uri:
            action.path_redirect = r.uri
        if r.authority:
            action.host_redirect = r.authority
        if r.port:
            action.port_redirect = r.port
        elif r.derive_port == "FROM_REQUEST_PORT":
            action.port_redirect = inputs.port  # (FROM_PROTOCOL_DEFAULT is Envoy's own behaviour)
        if r.scheme:
            action.scheme_redirect = r.scheme
        if r.port or r.derive_port:
            # istiod: never an explicit :80 for http or :443 for https (the scheme's own port).
            scheme = r.scheme or ("https" if inputs.tls else "http")
            if (action.port_redirect, scheme) in ((80, "http"), (443, "https")):
                action.port_redirect = 0
        if isinstance(rule, GatewayApiRule):
            if rule.redirect_prefix is not None:
                action.prefix_rewrite = rule.redirect_prefix
            elif rule.redirect_regex is not None:
                action.regex_rewrite.CopyFrom(regex_pb2.RegexMatchAndSubstitute(
                    pattern=regex_pb2.RegexMatcher(regex=rule.redirect_regex.match),
                    substitution=rule.redirect_regex.rewrite))
        route.redirect.CopyFrom(action)
        return
    if rule.direct_response is not None:
        d = rule.direct_response
        action = rc.DirectResponseAction(status=d.status)
        if d.body is not None and d.body.string:
            action.body.inline_string = d.body.string
        elif d.body is not None and d.body.bytes:
            action.body.inline_bytes = base64.b64decode(d.body.bytes)  # protobuf JSON writes bytes as base64
        route.direct_response.CopyFrom(action)
        return
    action = route.route
    dests = list(rule.route)
    if len(dests) == 1:
        action.cluster = destination_cluster(dests[0].destination, inputs)
        _apply_headers(route, dests[0].headers)  # a lone destination's header operations are the route's
    else:
        for d in dests:
            if d.weight <= 0:
                continue
            wc = action.weighted_clusters.clusters.add(name=destination_cluster(d.destination, inputs),
                                                       weight=wrappers_pb2.UInt32Value(value=d.weight))
            if d.headers is not None:
                holder = rc.Route()
                _apply_headers(holder, d.headers)
                wc.request_headers_to_add.extend(holder.request_headers_to_add)
                wc.request_headers_to_remove.extend(holder.request_headers_to_remove)
                wc.response_headers_to_add.extend(holder.response_headers_to_add)
                wc.response_headers_to_remove.extend(holder.response_headers_to_remove)
    if inputs.gateway_semantics:
        action.cluster_not_found_response_code = rc.RouteAction.INTERNAL_SERVER_ERROR
    action.timeout.CopyFrom(duration(parse_duration(rule.timeout) if rule.timeout else 0))
    rp = _retry(rule.retries, inputs.default_retry)
    if rp is not None:
        action.retry_policy.CopyFrom(rp)
    if rule.rewrite is not None:
        rw = rule.rewrite
        if rw.uri is not None:
            if match is not None and match.uri is not None and match.uri.exact is not None:
                action.regex_rewrite.CopyFrom(regex_pb2.RegexMatchAndSubstitute(
                    pattern=regex_pb2.RegexMatcher(regex=".*"), substitution=rw.uri))
            else:
                action.prefix_rewrite = rw.uri
        if rw.uri_regex_rewrite is not None:
            action.regex_rewrite.CopyFrom(regex_pb2.RegexMatchAndSubstitute(
                pattern=regex_pb2.RegexMatcher(regex=rw.uri_regex_rewrite.match),
                substitution=rw.uri_regex_rewrite.rewrite))
        if rw.authority:
            action.host_rewrite_literal = rw.authority
    if rule.mirror is not None:
        fraction = _mirror_fraction(rule.mirror_percentage, rule.mirror_percent)
        if fraction is not None:
            mp = action.request_mirror_policies.add(cluster=destination_cluster(rule.mirror, inputs))
            mp.runtime_fraction.default_value.CopyFrom(fraction)
    for mirror in rule.mirrors:
        fraction = _mirror_fraction(mirror.percentage, None)
        if fraction is not None:
            mp = action.request_mirror_policies.add(cluster=destination_cluster(mirror.destination, inputs))
            mp.runtime_fraction.default_value.CopyFrom(fraction)


def stateful_session(session) -> stateful_session_pb2.StatefulSessionPerRoute:
    """An HTTPRoute rule's sessionPersistence as the per-route stateful session: the first
    response sets the cookie (or header) naming the backend host it came from, and later requests
    carrying it go to that host while it is healthy (not strict: a gone host falls back to load
    balancing). A Session cookie has no TTL (Envoy then omits Max-Age); a Permanent one lives for
    absoluteTimeout, which Envoy also writes into the cookie and enforces."""
    if session.type == "Header":
        state = extension_pb2.TypedExtensionConfig(
            name="envoy.http.stateful_session.header",
            typed_config=pack(session_header_pb2.HeaderBasedSessionState(name=session.session_name)))
    else:
        cookie = cookie_pb2.Cookie(name=session.session_name, path="/")
        if session.absolute_timeout:
            cookie.ttl.CopyFrom(duration(parse_duration(session.absolute_timeout)))
        state = extension_pb2.TypedExtensionConfig(
            name="envoy.http.stateful_session.cookie",
            typed_config=pack(session_cookie_pb2.CookieBasedSessionState(cookie=cookie)))
    return stateful_session_pb2.StatefulSessionPerRoute(
        stateful_session=stateful_session_pb2.StatefulSession(session_state=state))


def _mirror_fraction(percentage, percent: int | None) -> percent_pb2.FractionalPercent | None:
    """istiod's MirrorPercent: mirrorPercentage, else the deprecated integer mirrorPercent, else
    every request; an explicit 0 means no mirror at all."""
    if percentage is not None:
        return _percent(percentage) if percentage.value > 0 else None
    if percent is not None:
        hundred = percent_pb2.FractionalPercent.HUNDRED
        return percent_pb2.FractionalPercent(numerator=percent, denominator=hundred) if percent > 0 else None
    return percent_pb2.FractionalPercent(numerator=100, denominator=percent_pb2.FractionalPercent.HUNDRED)


def http_rule_routes(rule, index: int, inputs: RouteInputs) -> list[rc.Route]:
    """One Envoy route per match of a rule (one for a rule without matches)."""
    matches = ([m for m in rule.match if (m.port is None or m.port == inputs.port) and _source_ok(m, inputs)
                and _gateway_ok(m, inputs)] if rule.match else [None])
    if rule.match and not matches:
        return []  # every match is for another port, or another client
    out = []
    for match in matches:
        name = rule.name or f"rule-{index}"
        if match is not None and match.name:  # istiod: RULE.MATCH
            name = f"{name}.{match.name}"
        route = rc.Route(name=name, match=route_match(match, inputs.gateway_semantics))
        if match is not None and match.stat_prefix:
            route.stat_prefix = match.stat_prefix
        _action(rule, inputs, route, match)
        _apply_headers(route, rule.headers)
        if rule.fault is not None:
            route.typed_per_filter_config[FAULT_FILTER].CopyFrom(pack(_fault(rule.fault)))
        if rule.cors_policy is not None:
            route.typed_per_filter_config[CORS_FILTER].CopyFrom(pack(_cors(rule.cors_policy)))
        if isinstance(rule, GatewayApiRule) and rule.session is not None:
            route.typed_per_filter_config[STATEFUL_SESSION_FILTER].CopyFrom(pack(stateful_session(rule.session)))
        # istiod's BuildConfigInfoMetadata: which object this route came from (istioctl's VIRTUAL
        # SERVICE column). A rule translated from Gateway API names its HTTPRoute/GRPCRoute.
        origin = rule.origin if isinstance(rule, GatewayApiRule) else ""
        path = metadata.origin_path(origin) if origin else inputs.config
        if path:
            route.metadata.CopyFrom(metadata.route_metadata(path))
        out.append(route)
    return out


def virtual_service_routes(rules, inputs: RouteInputs) -> list[rc.Route]:
    routes: list[rc.Route] = []
    for i, rule in enumerate(rules):
        routes.extend(http_rule_routes(rule, i, inputs))
    return routes
