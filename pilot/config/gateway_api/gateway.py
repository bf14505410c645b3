"""GatewayClass and Gateway (gateway.networking.k8s.io): classes name their controller; a Gateway
lists listeners (port, protocol, hostname, TLS, which routes may attach)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from pilot.config.base import Model
from pilot.config.gateway_api.common import (
    GatewayApiObject,
    Hostname,
    PortNumber,
    SecretObjectReference,
    SectionName,
)
from pilot.config.mesh import LabelSelector
from pilot.config.networking.validation import _fail, _raise_if


class ParametersReference(Model):
    group: str
    kind: str
    name: str
    namespace: str | None = None


class GatewayClassSpec(Model):
    controller_name: str = Field(min_length=1, max_length=253)
    parameters_ref: ParametersReference | None = None
    description: str | None = None


class GatewayClass(GatewayApiObject):
    kind: Literal["GatewayClass"] = "GatewayClass"
    spec: GatewayClassSpec


class RouteGroupKind(Model):
    group: str = "gateway.networking.k8s.io"
    kind: str

    def key(self) -> tuple[str, str]:
        return (self.group, self.kind)


class RouteNamespaces(Model):
    from_: Literal["All", "Same", "Selector"] = Field(default="Same", alias="from")
    selector: LabelSelector | None = None

    @model_validator(mode="after")
    def _selector(self) -> RouteNamespaces:
        if self.from_ == "Selector" and self.selector is None:
            _fail("selector must be specified when from is Selector")
        return self


class AllowedRoutes(Model):
    namespaces: RouteNamespaces = Field(default_factory=RouteNamespaces)
    kinds: list[RouteGroupKind] = Field(default_factory=list)


class GatewayTLSConfig(Model):
    mode: Literal["Terminate", "Passthrough"] = "Terminate"
    certificate_refs: list[SecretObjectReference] = Field(default_factory=list)
    options: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _refs(self) -> GatewayTLSConfig:
        if self.mode == "Terminate" and not self.certificate_refs and not self.options:
            _fail("certificateRefs or options must be specified when mode is Terminate")
        if len(self.certificate_refs) > 64:
            _fail("at most 64 certificateRefs")
        return self


class Listener(Model):
    name: SectionName
    hostname: Hostname | None = None
    port: PortNumber
    protocol: str = Field(min_length=1, max_length=255)
    tls: GatewayTLSConfig | None = None
    allowed_routes: AllowedRoutes = Field(default_factory=AllowedRoutes)

    @model_validator(mode="after")
    def _cel(self) -> Listener:
        # The CRD's CEL rules for a listener.
        errs = []
        if self.protocol in ("HTTP", "TCP", "UDP") and self.tls is not None:
            errs.append(f"tls must not be specified for protocol {self.protocol}")
        if self.protocol == "HTTPS" and (self.tls is None or self.tls.mode != "Terminate"):
            errs.append("tls mode must be Terminate for protocol HTTPS")
        if self.protocol == "TLS" and self.tls is None:
            errs.append("tls must be specified for protocol TLS")
        if self.protocol in ("TCP", "UDP") and self.hostname is not None:
            errs.append(f"hostname must not be specified for protocol {self.protocol}")
        _raise_if(errs)
        return self


class GatewayAddress(Model):
    type: str = "IPAddress"
    value: str = Field(min_length=1, max_length=253)


class GatewaySpec(Model):
    gateway_class_name: str = Field(min_length=1, max_length=253)
    listeners: list[Listener] = Field(min_length=1, max_length=64)
    addresses: list[GatewayAddress] = Field(default_factory=list)

    @field_validator("listeners")
    @classmethod
    def _unique(cls, listeners: list[Listener]) -> list[Listener]:
        names = [ln.name for ln in listeners]
        if len(set(names)) != len(names):
            _fail("Listener name must be unique within the Gateway")
        combos = [(ln.port, ln.protocol, ln.hostname or "") for ln in listeners]
        if len(set(combos)) != len(combos):
            _fail("Combination of port, protocol and hostname must be unique for each listener")
        return listeners


class KubernetesGateway(GatewayApiObject):
    """gateway.networking.k8s.io Gateway, filed in the Store as `KubernetesGateway` (istiod's
    name) so it never collides with networking.istio.io's Gateway."""

    CONFIG_KIND: ClassVar[str] = "KubernetesGateway"
    kind: Literal["Gateway"] = "Gateway"
    spec: GatewaySpec
