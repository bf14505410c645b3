"""A resolved ext_authz provider (pilot/model/ext_authz.py) as Envoy's ext_authz filters, as
istiod's pilot/pkg/security/authz/builder/extauthz.go generates them.

The filter calls the provider's service through the outbound cluster of that service and port
(`outbound|PORT||HOST`), which the proxy already has. It is enabled per request by
`filter_enabled_metadata`: the RBAC filter in front of it evaluates the CUSTOM policies' rules as
shadow rules named `istio-ext-authz-...`, and Envoy records the matching rule's name in the RBAC
filter's dynamic metadata (`istio_ext_authz_shadow_effective_policy_id`). Only a request some rule
matches is sent to the provider; every other request passes unchecked.

An HTTP provider has no TCP form: as in istiod, a TCP filter chain gets no ext_authz at all.
"""

from __future__ import annotations

from envoy.config.core.v3 import config_source_pb2, grpc_service_pb2, http_uri_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2 as http_pb2
from envoy.extensions.filters.network.ext_authz.v3 import ext_authz_pb2 as network_pb2
from envoy.type.matcher.v3 import metadata_pb2, string_pb2

from pilot.config.ext_authz import EnvoyExtAuthzHttpProvider
from pilot.durations import parse_duration
from pilot.model.ext_authz import ResolvedExtAuthz
from pilot.networking.names import outbound_cluster_name
from pilot.networking.protos import duration

HTTP_EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
NETWORK_EXT_AUTHZ_FILTER = "envoy.filters.network.ext_authz"
MATCH_PREFIX = "istio-ext-authz"  # the CUSTOM rules' names start with it
SHADOW_STAT_PREFIX = "istio_ext_authz_"  # the RBAC filter's shadow prefix: names its metadata key
SHADOW_POLICY_KEY = "shadow_effective_policy_id"
DEFAULT_TIMEOUT_S = 600.0  # istiod's default


def _matcher(rbac_filter: str) -> metadata_pb2.MetadataMatcher:
    """True when the RBAC filter's CUSTOM shadow rules matched the request."""
    m = metadata_pb2.MetadataMatcher(filter=rbac_filter)
    m.path.add(key=SHADOW_STAT_PREFIX + SHADOW_POLICY_KEY)
    m.value.string_match.prefix = MATCH_PREFIX
    return m


def _headers(values: tuple[str, ...]) -> string_pb2.ListStringMatcher | None:
    """istiod's header patterns: `*x` a suffix, `x*` a prefix, otherwise exact; case-insensitive."""
    if not values:
        return None
    out = string_pb2.ListStringMatcher()
    for h in values:
        if h.startswith("*"):
            out.patterns.add(suffix=h[1:], ignore_case=True)
        elif h.endswith("*"):
            out.patterns.add(prefix=h[:-1], ignore_case=True)
        else:
            out.patterns.add(exact=h, ignore_case=True)
    return out


def _timeout(r: ResolvedExtAuthz) -> float:
    assert r.provider is not None
    return parse_duration(r.provider.timeout) if r.provider.timeout is not None else DEFAULT_TIMEOUT_S


def _grpc_service(r: ResolvedExtAuthz, cluster: str) -> grpc_service_pb2.GrpcService:
    # `|` is not valid in a gRPC authority and the server would refuse the stream; without an
    # authority Envoy sends the cluster name.
    return grpc_service_pb2.GrpcService(
        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=cluster, authority=cluster.replace("|", "_.")),
        timeout=duration(_timeout(r)))


def http_ext_authz(r: ResolvedExtAuthz, rbac_filter: str) -> http_pb2.ExtAuthz:
    p = r.provider
    assert p is not None and not r.error
    cluster = outbound_cluster_name(r.port, r.hostname)
    config = http_pb2.ExtAuthz(failure_mode_allow=p.fail_open, transport_api_version=config_source_pb2.V3)
    config.filter_enabled_metadata.CopyFrom(_matcher(rbac_filter))
    if p.status_on_error:
        config.status_on_error.code = int(p.status_on_error)
    body = p.include_request_body_in_check
    if body is not None:
        config.with_request_body.CopyFrom(http_pb2.BufferSettings(
            max_request_bytes=body.max_request_bytes, allow_partial_message=body.allow_partial_message,
            pack_as_bytes=body.pack_as_bytes))
    if not isinstance(p, EnvoyExtAuthzHttpProvider):
        config.grpc_service.CopyFrom(_grpc_service(r, cluster))
        return config
    service = config.http_service
    service.path_prefix = p.path_prefix
    service.server_uri.CopyFrom(http_uri_pb2.HttpUri(uri=f"http://{r.hostname}", cluster=cluster,
                                                     timeout=duration(_timeout(r))))
    # The deprecated field counts only when the new one is empty (istiod).
    allowed = _headers(p.include_request_headers_in_check) or _headers(p.include_headers_in_check)
    if allowed is not None:
        # AuthorizationRequest.allowed_headers is deprecated in Envoy; this is its replacement.
        config.allowed_headers.CopyFrom(allowed)
    for k in sorted(p.include_additional_headers_in_check):
        service.authorization_request.headers_to_add.add(key=k, value=p.include_additional_headers_in_check[k])
    for target, values in ((service.authorization_response.allowed_upstream_headers, p.headers_to_upstream_on_allow),
                           (service.authorization_response.allowed_client_headers, p.headers_to_downstream_on_deny),
                           (service.authorization_response.allowed_client_headers_on_success,
                            p.headers_to_downstream_on_allow)):
        matcher = _headers(values)
        if matcher is not None:
            target.CopyFrom(matcher)
    return config


def network_ext_authz(r: ResolvedExtAuthz, rbac_filter: str) -> network_pb2.ExtAuthz | None:
    """The TCP form, for a gRPC provider only (None for HTTP: no check on TCP, as istiod)."""
    p = r.provider
    assert p is not None and not r.error
    if not r.grpc:
        return None
    config = network_pb2.ExtAuthz(stat_prefix="tcp.", failure_mode_allow=p.fail_open, transport_api_version=config_source_pb2.V3,
                                  grpc_service=_grpc_service(r, outbound_cluster_name(r.port, r.hostname)))
    config.filter_enabled_metadata.CopyFrom(_matcher(rbac_filter))
    return config
