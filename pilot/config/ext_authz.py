"""MeshConfig `extensionProviders` of the ext_authz kinds: `envoyExtAuthzHttp`, `envoyExtAuthzGrpc`.

A CUSTOM AuthorizationPolicy names one of these providers; pilot/model/ext_authz.py resolves it
against the service registry and pilot/networking/ext_authz.py turns it into Envoy's ext_authz
filter, as istiod's pilot/pkg/security/authz/builder/extauthz.go does.

Only the shape is checked here. What istiod checks when it builds the filter (port range,
`statusOnError` a known HTTP status, `pathPrefix` starting with `/`, a lone `*` header pattern,
the service resolving) is checked at resolution, so a bad provider makes the CUSTOM policies
naming it deny (fail closed, reported with the reason) instead of refusing the whole MeshConfig.

Kept in its own module, apart from the telemetry provider kinds, so each is modelled on its own;
`ExtAuthzProviderKinds` is the part of MeshConfig's ExtensionProvider these kinds add.
"""

from __future__ import annotations

from pydantic import Field

from pilot.config.base import StrictModel, Unsupported


class ExtAuthzRequestBody(StrictModel):
    """`includeRequestBodyInCheck`: Envoy's BufferSettings (`with_request_body`)."""

    max_request_bytes: int = Field(default=0, ge=0, le=2**32 - 1)
    allow_partial_message: bool = False
    pack_as_bytes: bool = False


class _ExtAuthzProvider(StrictModel):
    # `ns/name` of a Kubernetes Service, or a hostname (FQDN) of a service in the registry.
    service: str = ""
    port: int = 0
    # How long Envoy waits for the check; istiod's default is 600s.
    timeout: str | None = None
    fail_open: bool = False
    # The HTTP status Envoy answers when the check itself fails (default 403).
    status_on_error: str = ""
    include_request_body_in_check: ExtAuthzRequestBody | None = None
    # istio 1.30 fields not applied here
    clear_route_cache: Unsupported = None


class EnvoyExtAuthzHttpProvider(_ExtAuthzProvider):
    path_prefix: str = ""
    # Header names (a leading or trailing `*` is a suffix or prefix match, case-insensitive)
    include_request_headers_in_check: tuple[str, ...] = ()
    include_headers_in_check: tuple[str, ...] = Field(
        default=(), description="deprecated: used only when includeRequestHeadersInCheck is empty")
    include_additional_headers_in_check: dict[str, str] = Field(default_factory=dict)
    headers_to_upstream_on_allow: tuple[str, ...] = ()
    headers_to_downstream_on_deny: tuple[str, ...] = ()
    headers_to_downstream_on_allow: tuple[str, ...] = ()

    def __hash__(self) -> int:  # the dict field would make the generated hash fail
        return hash(self.model_dump_json())


class EnvoyExtAuthzGrpcProvider(_ExtAuthzProvider):
    pass


class ExtAuthzProviderKinds(StrictModel):
    """The ext_authz kinds of one MeshConfig ExtensionProvider (at most one kind is set)."""

    envoy_ext_authz_http: EnvoyExtAuthzHttpProvider | None = None
    envoy_ext_authz_grpc: EnvoyExtAuthzGrpcProvider | None = None

    @property
    def ext_authz(self) -> EnvoyExtAuthzHttpProvider | EnvoyExtAuthzGrpcProvider | None:
        return self.envoy_ext_authz_http or self.envoy_ext_authz_grpc
