"""Envoy RBAC permissions and principals for each AuthorizationPolicy attribute, as istiod's
pilot/pkg/security/authz/model generates them.

Values follow Istio's string syntax: `*` alone is "present", a leading `*` a suffix match, a
trailing `*` a prefix match, anything else exact. JWT attributes (request principal, audiences,
presenter, claims) are read from the dynamic metadata the jwt_authn filter writes
(`envoy.filters.http.jwt_authn` -> `payload`), which `jwt_authn.py` configures on every provider.

A generator raises `HttpOnly` for an HTTP attribute asked for a TCP (network) filter; what that
means for the rule depends on the action and is decided in `authz.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeAlias

from envoy.config.core.v3 import address_pb2, extension_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.path.match.uri_template.v3 import uri_template_match_pb2
from envoy.type.matcher.v3 import metadata_pb2, path_pb2, regex_pb2, string_pb2, value_pb2
from google.protobuf import wrappers_pb2

from pilot.networking.protos import pack

JWT_FILTER = "envoy.filters.http.jwt_authn"
JWT_PAYLOAD = "payload"  # the payload_in_metadata key of every jwt_authn provider
SPIFFE_PREFIX = "spiffe://"
AUTHORITY, METHOD = ":authority", ":method"
MATCH_ONE_TEMPLATE, MATCH_ANY_TEMPLATE = "{*}", "{**}"

Permission: TypeAlias = rbac_pb2.Permission
Principal: TypeAlias = rbac_pb2.Principal


class HttpOnly(ValueError):
    """An HTTP attribute cannot be evaluated by a network (TCP) RBAC filter."""


# --- matchers --------------------------------------------------------------------------------------
_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def quote_meta(text: str) -> str:
    """Go's regexp.QuoteMeta: escape exactly RE2's metacharacters."""
    return _RE2_SPECIAL.sub(r"\\\1", text)


def regex(expr: str) -> string_pb2.StringMatcher:
    return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=expr))


def string_match(value: str, prefix: str = "", ignore_case: bool = False) -> string_pb2.StringMatcher:
    """Istio's StringMatcherWithPrefix: `prefix` is prepended (e.g. `spiffe://` for principals)."""
    if value == "*":
        return regex(".+")
    if value.startswith("*"):
        if prefix:
            return regex(quote_meta(prefix) + ".*" + quote_meta(value[1:]))
        return string_pb2.StringMatcher(suffix=value[1:], ignore_case=ignore_case)
    if value.endswith("*"):
        return string_pb2.StringMatcher(prefix=prefix + value[:-1], ignore_case=ignore_case)
    return string_pb2.StringMatcher(exact=prefix + value, ignore_case=ignore_case)


def header_match(name: str, value: str, ignore_case: bool = False) -> route_components_pb2.HeaderMatcher:
    if value == "*":
        return route_components_pb2.HeaderMatcher(name=name, present_match=True)
    return route_components_pb2.HeaderMatcher(name=name, string_match=string_match(value, ignore_case=ignore_case))


def cidr(value: str) -> address_pb2.CidrRange:
    """An address is a /32 (/128); a CIDR keeps the address as written (istio AddrStrToCidrRange)."""
    address, slash, length = value.partition("/")
    bits = int(length) if slash else (128 if ":" in address else 32)
    return address_pb2.CidrRange(address_prefix=address, prefix_len=wrappers_pb2.UInt32Value(value=bits))


def _value_string(value: str) -> value_pb2.ValueMatcher:
    return value_pb2.ValueMatcher(string_match=string_match(value))


def _claim_value(value: str) -> value_pb2.ValueMatcher:
    """A claim may be a string or a list of strings (after jwt_authn's space-delimited
    normalisation, `scope` is a list): match either shape."""
    one = _value_string(value)
    as_list = value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=one))
    return value_pb2.ValueMatcher(or_match=value_pb2.OrMatcher(value_matchers=[as_list, one]))


def _metadata(filter_name: str, path: list[str], value: value_pb2.ValueMatcher) -> metadata_pb2.MetadataMatcher:
    return metadata_pb2.MetadataMatcher(
        filter=filter_name, path=[metadata_pb2.MetadataMatcher.PathSegment(key=k) for k in path], value=value)


def _jwt_claim(path: list[str], value: value_pb2.ValueMatcher) -> Principal:
    return Principal(metadata=_metadata(JWT_FILTER, [JWT_PAYLOAD, *path], value))


def _authenticated(m: string_pb2.StringMatcher) -> Principal:
    return Principal(authenticated=Principal.Authenticated(principal_name=m))


# --- permissions (what is asked for) ----------------------------------------------------------------
def _http(key: str, for_tcp: bool) -> None:
    if for_tcp:
        raise HttpOnly(f"{key!r} is HTTP only")


def host_permission(value: str, for_tcp: bool) -> Permission:
    """:authority, case-insensitive, as written: `example.com` does not match `example.com:8080`;
    Istio's documented form for any port is `example.com:*` (istiod adds no port tolerance)."""
    _http("hosts", for_tcp)
    return Permission(header=header_match(AUTHORITY, value, ignore_case=True))


def method_permission(value: str, for_tcp: bool) -> Permission:
    _http("methods", for_tcp)
    return Permission(header=header_match(METHOD, value))


def path_permission(value: str, for_tcp: bool) -> Permission:
    _http("paths", for_tcp)
    if MATCH_ONE_TEMPLATE in value or MATCH_ANY_TEMPLATE in value:
        template = value.replace(MATCH_ANY_TEMPLATE, "**").replace(MATCH_ONE_TEMPLATE, "*")
        config = uri_template_match_pb2.UriTemplateMatchConfig(path_template=template)
        return Permission(uri_template=extension_pb2.TypedExtensionConfig(
            name="uri-template", typed_config=pack(config)))
    return Permission(url_path=path_pb2.PathMatcher(path=string_match(value)))


def port_permission(value: str, _for_tcp: bool) -> Permission:
    return Permission(destination_port=int(value))


def destination_ip_permission(value: str, _for_tcp: bool) -> Permission:
    return Permission(destination_ip=cidr(value))


def sni_permission(value: str, _for_tcp: bool) -> Permission:
    return Permission(requested_server_name=string_match(value))


def envoy_filter_permission(key: str) -> Callable[[str, bool], Permission]:
    """`experimental.envoy.filters.a.b[c]`: dynamic metadata of filter `envoy.filters.a.b`, key
    `c`; a value written `[v]` matches inside a list."""
    filter_name, _, rest = key.removeprefix("experimental.").removesuffix("]").partition("[")

    def gen(value: str, _for_tcp: bool) -> Permission:
        if value.startswith("[") and value.endswith("]"):
            inner = _value_string(value[1:-1])
            matcher = value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=inner))
        else:
            matcher = _value_string(value)
        return Permission(metadata=_metadata(filter_name, [rest], matcher))

    return gen


# --- principals (who asks) ----------------------------------------------------------------------------
def principal_principal(value: str, _for_tcp: bool) -> Principal:
    """The peer certificate's URI SAN (`spiffe://` + the principal); `*` needs any mTLS peer."""
    return _authenticated(string_match(value, SPIFFE_PREFIX))


def namespace_principal(value: str, _for_tcp: bool) -> Principal:
    return _authenticated(regex(f".*/ns/{value.replace('*', '.*')}/.*"))


def trust_domain_principal(value: str, _for_tcp: bool) -> Principal:
    """The trust domain of the peer's SPIFFE URI SAN (istiod's srcTrustDomainGenerator): `*` any
    SPIFFE identity, an exact value `spiffe://TD/` as a prefix (the `/` keeps `td` from matching
    `td-other`), one leading or trailing `*` any characters within the trust domain only."""
    if value == "*":
        return _authenticated(string_pb2.StringMatcher(prefix=SPIFFE_PREFIX))
    if "*" not in value:
        return _authenticated(string_pb2.StringMatcher(prefix=f"{SPIFFE_PREFIX}{value}/"))
    before, _, after = value.partition("*")
    return _authenticated(regex(f"spiffe://{quote_meta(before)}[^/]*{quote_meta(after)}/.*"))


def service_account_principal(policy_namespace: str) -> Callable[[str, bool], Principal]:
    """`sa` (in the policy's namespace) or `ns/sa`; extra SPIFFE path segments are tolerated."""

    def gen(value: str, _for_tcp: bool) -> Principal:
        ns, slash, sa = value.partition("/")
        if not slash:
            ns, sa = policy_namespace, value
        return _authenticated(regex(f"spiffe://.+/ns/{quote_meta(ns)}/(.+/|)sa/{quote_meta(sa)}(/.+)?"))

    return gen


def source_ip_principal(value: str, _for_tcp: bool) -> Principal:
    """The connection's peer address (not X-Forwarded-For)."""
    return Principal(direct_remote_ip=cidr(value))


def remote_ip_principal(value: str, _for_tcp: bool) -> Principal:
    """The original client address (X-Forwarded-For / proxy protocol, as the HCM decides)."""
    return Principal(remote_ip=cidr(value))


_ANY = ".+"


def request_principal_principal(value: str, for_tcp: bool) -> Principal:
    """`ISS/SUB` of a validated JWT, split at the last `/` (issuers are often URLs), matched on
    the `iss` and `sub` claims, with istiod's wildcard rules for each side."""
    _http("requestPrincipals", for_tcp)
    idx = value.rfind("/")
    found = idx >= 0
    iss, sub = (value[:idx], value[idx + 1:]) if found else (value, "")
    if value == "*":
        match_iss, match_sub = regex(_ANY), regex(_ANY)
    elif value.startswith("*"):
        if found:
            match_iss = regex(_ANY) if iss == "*" else string_pb2.StringMatcher(suffix=iss[1:])
            match_sub = string_pb2.StringMatcher(exact=sub)
        else:
            match_iss, match_sub = regex(_ANY), string_pb2.StringMatcher(suffix=value[1:])
    elif value.endswith("*"):
        if found:
            match_iss = string_pb2.StringMatcher(exact=iss)
            match_sub = regex(_ANY) if sub == "*" else string_pb2.StringMatcher(prefix=sub[:-1])
        else:
            match_iss, match_sub = string_pb2.StringMatcher(prefix=value[:-1]), regex(_ANY)
    else:
        match_iss, match_sub = string_pb2.StringMatcher(exact=iss), string_pb2.StringMatcher(exact=sub)
    return Principal(and_ids=Principal.Set(ids=[
        _jwt_claim(["iss"], value_pb2.ValueMatcher(string_match=match_iss)),
        _jwt_claim(["sub"], value_pb2.ValueMatcher(string_match=match_sub))]))


def audience_principal(value: str, for_tcp: bool) -> Principal:
    _http("request.auth.audiences", for_tcp)
    return _jwt_claim(["aud"], _claim_value(value))


def presenter_principal(value: str, for_tcp: bool) -> Principal:
    _http("request.auth.presenter", for_tcp)
    return _jwt_claim(["azp"], _claim_value(value))


def nested_names(text: str) -> list[str]:
    """`[a][b]` -> ["a", "b"]; anything else is one bracketed name, `[a.b]` -> ["a.b"]."""
    names = re.findall(r"\[([^\[\]]*)\]", text)
    if names and "".join(f"[{n}]" for n in names) == text:
        return names
    return [text.removeprefix("[").removesuffix("]")]


def claim_principal(key: str) -> Callable[[str, bool], Principal]:
    path = nested_names(key.removeprefix("request.auth.claims"))

    def gen(value: str, for_tcp: bool) -> Principal:
        _http(key, for_tcp)
        return _jwt_claim(path, _claim_value(value))

    return gen


def request_header_principal(key: str) -> Callable[[str, bool], Principal]:
    name = key.removeprefix("request.headers").removeprefix("[").removesuffix("]")

    def gen(value: str, for_tcp: bool) -> Principal:
        _http(key, for_tcp)
        return Principal(header=header_match(name, value))

    return gen
