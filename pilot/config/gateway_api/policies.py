"""BackendTLSPolicy (gateway.networking.k8s.io/v1, Gateway API v1.5 standard): how gateways and
the mesh originate TLS to a Service (apis/v1/backendtlspolicy_types.go, with its CEL rules, which
the apiserver enforces in Kubernetes and these validators in file mode).

What the policy means (targets, conflicts, CA references, status) is
pilot/model/gateway_api/backend_tls.py's business.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pilot.config.base import StrictModel, Unsupported
from pilot.config.gateway_api.common import (
    GatewayApiObject,
    Group,
    Hostname,
    Kind,
    LocalObjectReference,
    ObjectName,
    PreciseHostname,
    SectionName,
)
from pilot.config.networking.validation import _fail

# The CRD's AbsoluteURI: a scheme and a scheme-specific part (RFC 3986 section 4.3).
_ABSOLUTE_URI = re.compile(r"^(([^:/?#]+):)(//([^/?#]*))([^?#]*)(\?([^#]*))?(#(.*))?")
_WELL_KNOWN = re.compile(r"^(System|([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                         r"/([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]))$")


def _absolute_uri(uri: str) -> str:
    if not 1 <= len(uri) <= 253 or not _ABSOLUTE_URI.match(uri):
        _fail(f"{uri!r} is not an absolute URI (a scheme and a scheme-specific part)")
    return uri


def _well_known(name: str) -> str:
    if not 1 <= len(name) <= 253 or not _WELL_KNOWN.match(name):
        _fail(f"{name!r} is not a wellKnownCACertificates name (System, or DOMAIN/NAME)")
    return name


class LocalPolicyTargetReferenceWithSectionName(StrictModel):
    group: Group
    kind: Kind
    name: ObjectName
    section_name: SectionName | None = None

    def key(self) -> tuple[str, str, str, str]:
        """What two targetRefs must not share (the CRD's distinctness rule; "" for no section)."""
        return (self.group, self.kind, self.name, self.section_name or "")


class SubjectAltName(StrictModel):
    type: Literal["Hostname", "URI"]
    hostname: Hostname | None = None
    uri: Annotated[str, Field(max_length=253)] | None = Field(default=None, alias="uri")

    @field_validator("uri")
    @classmethod
    def _uri(cls, uri: str | None) -> str | None:
        return _absolute_uri(uri) if uri else uri

    @model_validator(mode="after")
    def _one(self) -> SubjectAltName:
        # The CRD's four CEL rules: the field named by `type` is set, the other is not.
        if self.type == "Hostname" and not self.hostname:
            _fail("SubjectAltName element must contain Hostname, if Type is set to Hostname")
        if self.type != "Hostname" and self.hostname:
            _fail("SubjectAltName element must not contain Hostname, if Type is not set to Hostname")
        if self.type == "URI" and not self.uri:
            _fail("SubjectAltName element must contain URI, if Type is set to URI")
        if self.type != "URI" and self.uri:
            _fail("SubjectAltName element must not contain URI, if Type is not set to URI")
        return self


class BackendTLSPolicyValidation(StrictModel):
    ca_certificate_refs: list[LocalObjectReference] = Field(default_factory=list, max_length=8,
                                                            alias="caCertificateRefs")
    well_known_ca_certificates: str | None = Field(default=None, alias="wellKnownCACertificates")
    hostname: PreciseHostname
    subject_alt_names: list[SubjectAltName] = Field(default_factory=list, max_length=5)

    @field_validator("well_known_ca_certificates")
    @classmethod
    def _wk(cls, name: str | None) -> str | None:
        return _well_known(name) if name else name

    @model_validator(mode="after")
    def _ca_source(self) -> BackendTLSPolicyValidation:
        if self.ca_certificate_refs and self.well_known_ca_certificates:
            _fail("must not contain both CACertificateRefs and WellKnownCACertificates")
        if not self.ca_certificate_refs and not self.well_known_ca_certificates:
            _fail("must specify either CACertificateRefs or WellKnownCACertificates")
        return self


class BackendTLSPolicySpec(StrictModel):
    target_refs: list[LocalPolicyTargetReferenceWithSectionName] = Field(min_length=1, max_length=16)
    validation: BackendTLSPolicyValidation
    # Implementation-specific key/values (minimum TLS version, cipher suites...): istiod reads
    # none, so one written here would be silently without effect; refused instead.
    options: Unsupported = None

    @field_validator("target_refs")
    @classmethod
    def _distinct(cls, refs: list[LocalPolicyTargetReferenceWithSectionName]) -> list:
        # The CRD's two CEL rules: the same target twice needs a sectionName on every entry,
        # and distinct ones.
        by_target: dict[tuple[str, str, str], list[str]] = {}
        for r in refs:
            by_target.setdefault(r.key()[:3], []).append(r.section_name or "")
        for sections in by_target.values():
            if len(sections) > 1 and "" in sections:
                _fail("sectionName must be specified when targetRefs includes 2 or more references to the same target")
            if len(set(sections)) != len(sections):
                _fail("sectionName must be unique when targetRefs includes 2 or more references to the same target")
        return refs


class BackendTLSPolicy(GatewayApiObject):
    kind: Literal["BackendTLSPolicy"] = "BackendTLSPolicy"
    spec: BackendTLSPolicySpec
