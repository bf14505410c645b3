"""RequestAuthentication (istiod's ValidateRequestAuthentication and validateJwtRule): which JWT
issuers a workload accepts, where tokens are read from and what is forwarded."""

from __future__ import annotations

import json
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from pilot.config.base import StrictModel, StrictObject
from pilot.config.networking.validation import Duration, _raise_if
from pilot.config.security.common import PolicyTargetReference, Selector, selector_problems

_STRICT_HEADER_NAME = re.compile(r"^[-a-zA-Z0-9]+$")


class JWTHeader(StrictModel):
    name: str = ""
    prefix: str = ""


class ClaimToHeader(StrictModel):
    header: str = ""
    claim: str = ""


def jwks_uri_problem(uri: str) -> str | None:
    """istio security.ParseJwksURI: http or https, with a numeric port if one is given."""
    try:
        parts = urlsplit(uri)
        _ = parts.port  # raises for a non-numeric or out-of-range port
    except ValueError as e:
        return f"jwksUri {uri!r}: {e}"
    if parts.scheme not in ("http", "https"):
        return f"jwksUri {uri!r}: URI scheme {parts.scheme!r} is not supported"
    return None


def jwks_problem(text: str) -> str | None:
    """A JWK set (`{"keys": [...]}`) or a single JWK, each key an object with a `kty`."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        return f"jwks parse error: not JSON: {e}"
    keys = doc.get("keys") if isinstance(doc, dict) and "keys" in doc else [doc]
    if not isinstance(keys, list):
        return 'jwks parse error: "keys" must be a list'
    for i, k in enumerate(keys):
        if not isinstance(k, dict) or not isinstance(k.get("kty"), str) or not k["kty"]:
            return f"jwks parse error: key {i} has no \"kty\""
    return None


class JWTRule(StrictModel):
    issuer: str = ""
    audiences: list[str] = Field(default_factory=list)
    jwks_uri: str = ""
    jwks: str = ""
    from_headers: list[JWTHeader | None] = Field(default_factory=list)
    from_params: list[str] = Field(default_factory=list)
    from_cookies: list[str] = Field(default_factory=list)
    output_payload_to_header: str = ""
    forward_original_token: bool = False
    output_claim_to_headers: list[ClaimToHeader | None] = Field(default_factory=list)
    space_delimited_claims: list[str] | None = None
    timeout: Duration | None = None

    def problems(self, i: int) -> list[str]:
        errs = []
        if any(not a for a in self.audiences):
            errs.append("audience must be non-empty string")
        if not self.issuer and not self.jwks_uri:
            errs.append("issuer or jwksUri must be non-empty string")
        if self.jwks_uri and (err := jwks_uri_problem(self.jwks_uri)):
            errs.append(err)
        if self.jwks and (err := jwks_problem(self.jwks)):
            errs.append(err)
        for h in self.from_headers:
            if h is None:
                errs.append("location header name must be non-null")
            elif not h.name:
                errs.append("location header name must be non-empty string")
        if any(not p for p in self.from_params):
            errs.append("location query must be non-empty string")
        if any(not c for c in self.from_cookies):
            errs.append("cookie name must be non-empty string")
        if any(not c for c in self.space_delimited_claims or ()):
            errs.append("spaceDelimitedClaims must be non-empty strings")
        for ch in self.output_claim_to_headers:
            if ch is None:
                errs.append("outputClaimToHeaders must not be null")
            elif not ch.claim or not ch.header:
                errs.append("outputClaimToHeaders header and claim value must be non-empty string")
            elif not _STRICT_HEADER_NAME.match(ch.header):
                errs.append(f"outputClaimToHeaders: header name {ch.header} is not a valid header name")
        return [f"jwtRules[{i}]: {e}" for e in errs]


class RequestAuthenticationSpec(StrictModel):
    selector: Selector | None = None
    target_ref: PolicyTargetReference | None = None
    target_refs: list[PolicyTargetReference] = Field(default_factory=list)
    jwt_rules: list[JWTRule | None] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> RequestAuthenticationSpec:
        errs = selector_problems(self.selector, self.target_ref, self.target_refs)
        for i, rule in enumerate(self.jwt_rules):
            if rule is None:  # the CRD's schema: each rule is an object
                errs.append(f"jwtRules[{i}]: must be an object, not null")
            else:
                errs += rule.problems(i)
        _raise_if(errs)
        return self

    @property
    def target_references(self) -> list[PolicyTargetReference]:
        return ([self.target_ref] if self.target_ref is not None else []) + list(self.target_refs)

    @property
    def rules(self) -> list[JWTRule]:
        return [r for r in self.jwt_rules if r is not None]


class RequestAuthentication(StrictObject):
    kind: Literal["RequestAuthentication"] = "RequestAuthentication"
    spec: RequestAuthenticationSpec = RequestAuthenticationSpec()
