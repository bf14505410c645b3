"""RequestAuthentication -> envoy.filters.http.jwt_authn, with Istio's semantics (istiod's
authn policy_applier convertToEnvoyJwtConfig):

- a request carrying a token must carry a valid one: an invalid, expired or wrongly-signed token,
  or one for a wrong audience, is answered 401 by Envoy;
- a request without a token passes: only an AuthorizationPolicy (requestPrincipals, or
  notRequestPrincipals in a DENY) makes a token required;
- with several issuers, each token found is checked by its own provider, and providers sharing a
  location may each accept it (requires_any over the providers OR requires_all of
  "provider or missing");
- the verified payload goes to dynamic metadata (`envoy.filters.http.jwt_authn` -> `payload`),
  where the RBAC filter reads `iss`, `sub`, `aud`, `azp` and claims; `scope` and `permission`
  (plus `spaceDelimitedClaims`) are split into lists first.

Keys: inline `jwks`, else the keys the control plane fetched from `jwksUri` or by the issuer's
OpenID discovery (the index carries them, see pilot/security/jwks.py), else — not fetched yet — a
JWKS no token can match, so tokens of that issuer get 401 rather than passing unchecked (what
istiod does while a fetch fails).
"""

from __future__ import annotations

import json

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import empty_pb2

from pilot.durations import parse_duration
from pilot.model.security_policies import WorkloadPolicies, jwks_source
from pilot.networking.protos import duration, pack
from pilot.networking.rbac_matchers import JWT_FILTER, JWT_PAYLOAD

DEFAULT_SPACE_DELIMITED_CLAIMS = ("permission", "scope")

# The public half of a key whose private half was thrown away: a well-formed JWKS that verifies
# no token at all.
FAKE_JWKS = json.dumps({"keys": [{
    "kty": "RSA", "alg": "RS256", "use": "sig", "kid": "istio-unfetched-jwks", "e": "AQAB",
    "n": "mzvgimkjOvDRly-1vdIbA-bK99k8s9G69O2ANKJmXD177_K438SnVrQWOk3QyGx54LNHnePM4qrqpjGEE0w7nRCAZPtn8rdpDD6p4t"
         "IOyevc_YjYZ-d8F4babZEUMXdF5VKfbDgiOevkGm6VmciG9VAykx-c6KJIwxd--V43q3M9viK05bN3cCDnfW2blbNkbP79XdXgZLMq"
         "HoJv5KF0WdeXlORDI8y5SPwRRmMgA_J4ObYHaUf4wNrRnQC-CoLzwdODeCa39VqAPPVxbtRnG4K98Gt_O3lN6W2pZgGDSgg50R_fRx"
         "ivVl-V1xB2ujFrROz_X_xo4MRrNL4Oetk82w"}]}, separators=(",", ":"))


def _space_delimited(extra: list[str] | None) -> list[str]:
    return sorted(set(DEFAULT_SPACE_DELIMITED_CLAIMS) | set(extra or ()))


def _provider(rule, policies: WorkloadPolicies) -> jwt_pb2.JwtProvider:
    source = jwks_source(rule)
    remote = policies.remote_cluster(rule.jwks_uri) if rule.jwks_uri and not rule.jwks else None
    keys = rule.jwks or (policies.jwks_for(source) if source else None) or FAKE_JWKS
    provider = jwt_pb2.JwtProvider(
        issuer=rule.issuer,
        audiences=rule.audiences,
        forward=rule.forward_original_token,
        forward_payload_header=rule.output_payload_to_header,
        payload_in_metadata=JWT_PAYLOAD,
        normalize_payload_in_metadata=jwt_pb2.JwtProvider.NormalizePayload(
            space_delimited_claims=_space_delimited(rule.space_delimited_claims)),
        claim_to_headers=[jwt_pb2.JwtClaimToHeader(header_name=c.header, claim_name=c.claim)
                          for c in rule.output_claim_to_headers if c is not None],
        from_headers=[jwt_pb2.JwtHeader(name=h.name, value_prefix=h.prefix) for h in rule.from_headers if h is not None],
        from_params=rule.from_params,
        from_cookies=rule.from_cookies,
    )
    if remote is None:
        provider.local_jwks.CopyFrom(base_pb2.DataSource(inline_string=keys))
    else:
        # PILOT_JWT_ENABLE_REMOTE_JWKS: Envoy fetches the keys itself, as istiod configures it
        # (the rule's timeout, default 5s; keys cached 5 minutes).
        remote_jwks = provider.remote_jwks
        remote_jwks.http_uri.uri = rule.jwks_uri
        remote_jwks.http_uri.cluster = remote
        remote_jwks.http_uri.timeout.CopyFrom(duration(parse_duration(rule.timeout) if rule.timeout else 5.0))
        remote_jwks.cache_duration.CopyFrom(duration(300.0))
    return provider


def _requires(name: str) -> jwt_pb2.JwtRequirement:
    return jwt_pb2.JwtRequirement(provider_name=name)


def jwt_authn_config(policies: WorkloadPolicies) -> jwt_pb2.JwtAuthentication | None:
    rules = [r for e in policies.request_authentications for r in e.obj.spec.rules]
    if not rules:
        return None
    rules.sort(key=lambda r: r.issuer)  # stable: equal issuers keep the policies' age order
    providers: dict[str, jwt_pb2.JwtProvider] = {}
    each_valid_or_missing = []
    any_provider = []
    for i, rule in enumerate(rules):
        name = f"origins-{i}"
        providers[name] = _provider(rule, policies)
        each_valid_or_missing.append(jwt_pb2.JwtRequirement(requires_any=jwt_pb2.JwtRequirementOrList(
            requirements=[_requires(name), jwt_pb2.JwtRequirement(allow_missing=empty_pb2.Empty())])))
        any_provider.append(_requires(name))
    if len(each_valid_or_missing) == 1:
        requirement = each_valid_or_missing[0]
    else:
        all_of = jwt_pb2.JwtRequirement(requires_all=jwt_pb2.JwtRequirementAndList(requirements=each_valid_or_missing))
        requirement = jwt_pb2.JwtRequirement(requires_any=jwt_pb2.JwtRequirementOrList(
            requirements=[*any_provider, all_of]))
    return jwt_pb2.JwtAuthentication(
        rules=[jwt_pb2.RequirementRule(match=route_components_pb2.RouteMatch(prefix="/"), requires=requirement)],
        providers=providers,
        bypass_cors_preflight=True,
    )


def jwt_authn_filter(policies: WorkloadPolicies) -> hcm_pb2.HttpFilter | None:
    config = jwt_authn_config(policies)
    if config is None:
        return None
    return hcm_pb2.HttpFilter(name=JWT_FILTER, typed_config=pack(config))
