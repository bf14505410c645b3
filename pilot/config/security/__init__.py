"""The security.istio.io kinds (PeerAuthentication, AuthorizationPolicy, RequestAuthentication)
with istiod's validation-webhook rules (`pkg/config/validation`, `pkg/config/security`).

As for the networking kinds, fields are the API's names in snake_case read from camelCase; what
istiod rejects is rejected with a reason naming the field, what it only warns about is accepted.
Layout: `common` (group, selectors, targetRefs, value checks), then one module per kind.
"""

from __future__ import annotations

from pilot.config.base import K8sObject
from pilot.config.security.authorization_policy import (
    Action,
    AuthorizationPolicy,
    AuthorizationPolicySpec,
    Condition,
    From,
    Operation,
    Rule,
    Source,
    To,
    attribute_problem,
)
from pilot.config.security.common import GROUP, VERSIONS, PolicyTargetReference, Provider, Selector
from pilot.config.security.peer_authentication import (
    MtlsMode,
    PeerAuthentication,
    PeerAuthenticationMutualTLS,
    PeerAuthenticationSpec,
)
from pilot.config.security.request_authentication import (
    ClaimToHeader,
    JWTHeader,
    JWTRule,
    RequestAuthentication,
    RequestAuthenticationSpec,
)

SECURITY_KINDS: tuple[type[K8sObject], ...] = (PeerAuthentication, AuthorizationPolicy, RequestAuthentication)

__all__ = [
    "GROUP",
    "SECURITY_KINDS",
    "VERSIONS",
    "Action",
    "AuthorizationPolicy",
    "AuthorizationPolicySpec",
    "ClaimToHeader",
    "Condition",
    "From",
    "JWTHeader",
    "JWTRule",
    "MtlsMode",
    "Operation",
    "PeerAuthentication",
    "PeerAuthenticationMutualTLS",
    "PeerAuthenticationSpec",
    "PolicyTargetReference",
    "Provider",
    "RequestAuthentication",
    "RequestAuthenticationSpec",
    "Rule",
    "Selector",
    "Source",
    "To",
    "attribute_problem",
]
