"""The security filters of a workload's inbound side, for the inbound listener builder to put
in front of its router (HTTP) or tcp_proxy (TCP): authentication first, so the RBAC filters can
read the verified JWT, then authorization.

Both take the workload's `WorkloadPolicies` (hashable: pass it as a cache-key argument) and the
mesh's trust domain, or the tuple of it and its aliases (`MeshConfig.trust_domains`): principals
and trust domains naming one of them (or `cluster.local`, for principals) stand for all."""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from pilot.model.security_policies import WorkloadPolicies
from pilot.networking.authz import http_rbac_filters, network_rbac_filters
from pilot.networking.jwt_authn import jwt_authn_filter

TrustDomains = str | tuple[str, ...]


def _split(trust_domain: TrustDomains, aliases: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    if isinstance(trust_domain, str):
        return trust_domain, tuple(aliases)
    return trust_domain[0], (*trust_domain[1:], *aliases)


def inbound_http_filters(policies: WorkloadPolicies, trust_domain: TrustDomains,
                         trust_domain_aliases: Sequence[str] = ()) -> list[hcm_pb2.HttpFilter]:
    """jwt_authn (when a RequestAuthentication selects the workload), then the RBAC filters;
    no router."""
    jwt = jwt_authn_filter(policies)
    rbac = http_rbac_filters(policies, *_split(trust_domain, trust_domain_aliases))
    return ([jwt] if jwt is not None else []) + rbac


def inbound_network_filters(policies: WorkloadPolicies, trust_domain: TrustDomains,
                            trust_domain_aliases: Sequence[str] = ()) -> list[listener_components_pb2.Filter]:
    """The network RBAC filters; no tcp_proxy."""
    return network_rbac_filters(policies, *_split(trust_domain, trust_domain_aliases))
