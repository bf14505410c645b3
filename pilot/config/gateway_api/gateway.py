"""GatewayClass and Gateway (gateway.networking.k8s.io): classes name their controller; a Gateway
lists listeners (port, protocol, hostname, TLS, which routes may attach)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from pilot.config.base import StrictModel, Unsupported
from pilot.config.gateway_api.common import (
    ControllerName,
    GatewayApiObject,
    Group,
    Hostname,
    Kind,
    Namespace,
    ObjectName,
    PortNumber,
    SecretObjectReference,
    SectionName,
    hostname_problem,
)
from pilot.config.mesh import LabelSelector
from pilot.config.networking.validation import _fail, _raise_if, is_ip


class GatewayClassSpec(StrictModel):
    controller_name: ControllerName
    # istiod reads a ConfigMap here to customise the gateway Deployments it creates (strategic-merge
    # overlays); this control plane's deployments take no overlays, so the settings could not take effect.
    parameters_ref: Unsupported = None
    description: str | None = Field(default=None, description="free text for people; nothing to apply")


class GatewayClass(GatewayApiObject):
    kind: Literal["GatewayClass"] = "GatewayClass"
    spec: GatewayClassSpec


class RouteGroupKind(StrictModel):
    group: Group = "gateway.networking.k8s.io"
    kind: Kind

    def key(self) -> tuple[str, str]:
        return (self.group, self.kind)


class FromNamespaces(StrictModel):
    """Which namespaces a Gateway admits (routes to a listener, ListenerSets to the Gateway):
    `from`, with the label `selector` that `Selector` needs. Each use narrows `from`."""

    from_: Literal["All", "Same", "Selector", "None"] = Field(default="Same", alias="from")
    selector: LabelSelector | None = None

    @model_validator(mode="after")
    def _selector(self) -> FromNamespaces:
        if self.from_ == "Selector" and self.selector is None:
            _fail("selector must be specified when from is Selector")
        return self


class RouteNamespaces(FromNamespaces):
    from_: Literal["All", "Same", "Selector"] = Field(default="Same", alias="from")


class AllowedRoutes(StrictModel):
    namespaces: RouteNamespaces = Field(default_factory=RouteNamespaces)
    kinds: list[RouteGroupKind] = Field(default_factory=list)


TLS_TERMINATE_MODE = "gateway.istio.io/tls-terminate-mode"
# istiod's values: MUTUAL / OPTIONAL_MUTUAL verify client certificates against the CA of the
# listener's Secret (`ca.crt`, or a Secret NAME-cacert); ISTIO_MUTUAL terminates mesh mTLS with
# the router's own workload certificate (no certificateRefs needed).
TLS_TERMINATE_MODES = ("MUTUAL", "OPTIONAL_MUTUAL", "ISTIO_MUTUAL")


class GatewayTLSConfig(StrictModel):
    mode: Literal["Terminate", "Passthrough"] = "Terminate"
    certificate_refs: list[SecretObjectReference] = Field(default_factory=list)
    # Of the options istiod reads, only gateway.istio.io/tls-terminate-mode is applied; any
    # other (cipher suites...) is refused by name: ignoring it would serve other TLS than asked.
    options: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _refs(self) -> GatewayTLSConfig:
        if self.mode == "Terminate" and not self.certificate_refs and not self.options:
            _fail("certificateRefs or options must be specified when mode is Terminate")
        if len(self.certificate_refs) > 64:
            _fail("at most 64 certificateRefs")
        if len(self.options) > 16:
            _fail("at most 16 options")
        for key, value in self.options.items():
            if key != TLS_TERMINATE_MODE:
                _fail(f"options[{key!r}]: not supported (only {TLS_TERMINATE_MODE} is)")
            if self.mode != "Terminate":
                _fail(f"options[{key!r}]: applies to mode Terminate only")
            if value not in TLS_TERMINATE_MODES:
                _fail(f"options[{key!r}]: {value!r} is not supported (one of {', '.join(TLS_TERMINATE_MODES)}; "
                      "ISTIO_SIMPLE's built-in certificate is not)")
        return self

    @property
    def terminate_mode(self) -> str:
        """The server's TLS mode when terminating: SIMPLE unless the option says otherwise."""
        return self.options.get(TLS_TERMINATE_MODE, "SIMPLE")


class Listener(StrictModel):
    name: SectionName
    hostname: Hostname | None = None
    port: PortNumber
    protocol: str = Field(min_length=1, max_length=255)
    tls: GatewayTLSConfig | None = None
    allowed_routes: AllowedRoutes = Field(default_factory=AllowedRoutes)

    # The Gateway CRD requires `tls` on an HTTPS listener; a ListenerSet's may leave it out (and
    # istiod then refuses that one listener in status), see ListenerEntry.
    TLS_REQUIRED_FOR_HTTPS: ClassVar[bool] = True

    @model_validator(mode="after")
    def _cel(self) -> Listener:
        # The CRD's CEL rules for a listener.
        errs = []
        if self.protocol in ("HTTP", "TCP", "UDP") and self.tls is not None:
            errs.append(f"tls must not be specified for protocol {self.protocol}")
        if self.protocol == "HTTPS" and (self.tls.mode != "Terminate" if self.tls is not None
                                         else self.TLS_REQUIRED_FOR_HTTPS):
            errs.append("tls mode must be Terminate for protocol HTTPS")
        if self.protocol == "TLS" and self.tls is None:
            errs.append("tls must be specified for protocol TLS")
        if self.protocol in ("TCP", "UDP") and self.hostname is not None:
            errs.append(f"hostname must not be specified for protocol {self.protocol}")
        _raise_if(errs)
        return self


def unique_listeners(listeners: Sequence[Listener]) -> None:
    """The CRDs' CEL rules over a list of listeners (a Gateway's or a ListenerSet's)."""
    names = [ln.name for ln in listeners]
    if len(set(names)) != len(names):
        _fail("Listener name must be unique within the Gateway")
    combos = [(ln.port, ln.protocol, ln.hostname or "") for ln in listeners]
    if len(set(combos)) != len(combos):
        _fail("Combination of port, protocol and hostname must be unique for each listener")


class ListenerNamespaces(FromNamespaces):
    from_: Literal["All", "Same", "Selector", "None"] = Field(default="None", alias="from")


class AllowedListeners(StrictModel):
    """Which namespaces' ListenerSets may add listeners to this Gateway (none by default)."""

    namespaces: ListenerNamespaces = Field(default_factory=ListenerNamespaces)


_ADDRESS_TYPE = re.compile(r"^Hostname|IPAddress|NamedAddress|[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                           r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")


class GatewayAddress(StrictModel):
    type: str = Field(default="IPAddress", min_length=1, max_length=253)
    value: str = Field(min_length=1, max_length=253)

    @model_validator(mode="after")
    def _valid(self) -> GatewayAddress:
        if not _ADDRESS_TYPE.match(self.type):
            _fail(f"type {self.type!r} is not Hostname, IPAddress, NamedAddress or DOMAIN/PATH")
        if self.type == "IPAddress" and not is_ip(self.value):
            _fail(f"value {self.value!r} is not an IPv4 or IPv6 address")
        if self.type == "Hostname" and (err := hostname_problem(self.value)):
            _fail(err)
        return self


_INFRA_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class GatewayInfrastructure(StrictModel):
    """Labels and annotations for the resources deployed for the Gateway (pilot/gateway_deploy)."""

    labels: dict[str, str] = Field(default_factory=dict, max_length=8)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=8)
    # A ConfigMap of overlays in istiod; not applied here (see GatewayClassSpec.parameters_ref).
    parameters_ref: Unsupported = None

    @field_validator("labels", "annotations")
    @classmethod
    def _keys(cls, value: dict[str, str]) -> dict[str, str]:
        for k, v in value.items():
            if not _INFRA_KEY.match(k):
                _fail(f"key {k!r} is not a qualified name (PREFIX/NAME)")
            if len(v) > 4096:
                _fail(f"value of {k!r} is longer than 4096 characters")
        return value


class ObjectReference(StrictModel):
    """A reference with no default kind (Gateway API's ObjectReference): group and kind required."""

    group: Group
    kind: Kind
    name: ObjectName
    namespace: Namespace | None = None


class FrontendTLSValidation(StrictModel):
    """Client certificates checked against a CA (a ConfigMap's or Secret's `ca.crt`).
    AllowValidOnly: a client without a valid certificate is refused in the handshake.
    AllowInsecureFallback: as istiod, OPTIONAL_MUTUAL accepting untrusted certificates (or none),
    reported by the Gateway's InsecureFrontendValidationMode condition."""

    ca_certificate_refs: list[ObjectReference] = Field(min_length=1, max_length=8)
    mode: Literal["AllowValidOnly", "AllowInsecureFallback"] = "AllowValidOnly"


class FrontendTLSConfig(StrictModel):
    validation: FrontendTLSValidation | None = None


class FrontendTLSPortConfig(StrictModel):
    port: PortNumber
    tls: FrontendTLSConfig


class FrontendTLS(StrictModel):
    """The validation each terminating listener applies: its port's `perPort` entry, else
    `default`."""

    default: FrontendTLSConfig
    per_port: list[FrontendTLSPortConfig] = Field(default_factory=list, max_length=64)

    @field_validator("per_port")
    @classmethod
    def _unique_ports(cls, per_port: list[FrontendTLSPortConfig]) -> list[FrontendTLSPortConfig]:
        ports = [p.port for p in per_port]
        if len(set(ports)) != len(ports):
            _fail("Port for TLS configuration must be unique within the Gateway")
        return per_port

    def for_port(self, port: int) -> FrontendTLSValidation | None:
        for p in self.per_port:
            if p.port == port:
                return p.tls.validation
        return self.default.validation


class GatewayTLS(StrictModel):
    frontend: FrontendTLS | None = None
    # The Gateway's own client certificate towards backends (GEP-3155): not applied, and dropping
    # it would send requests without the identity the backends expect.
    backend: Unsupported = None


class GatewaySpec(StrictModel):
    gateway_class_name: str = Field(min_length=1, max_length=253)
    listeners: list[Listener] = Field(min_length=1, max_length=64)
    addresses: list[GatewayAddress] = Field(default_factory=list, max_length=16)
    tls: GatewayTLS | None = None  # client certificate validation of terminating listeners
    infrastructure: GatewayInfrastructure | None = None  # labels/annotations of the deployed resources
    allowed_listeners: AllowedListeners | None = None  # ListenerSets attaching to this Gateway
    default_scope: Unsupported = None  # "All": routes that ask for default Gateways attach here

    @field_validator("addresses")
    @classmethod
    def _unique_addresses(cls, addresses: list[GatewayAddress]) -> list[GatewayAddress]:
        for kind in ("IPAddress", "Hostname"):
            values = [a.value for a in addresses if a.type == kind]
            if len(set(values)) != len(values):
                _fail(f"{kind} values must be unique")
        return addresses

    @field_validator("listeners")
    @classmethod
    def _unique(cls, listeners: list[Listener]) -> list[Listener]:
        unique_listeners(listeners)
        return listeners


class KubernetesGateway(GatewayApiObject):
    """gateway.networking.k8s.io Gateway, filed in the Store as `KubernetesGateway` (istiod's
    name) so it never collides with networking.istio.io's Gateway."""

    CONFIG_KIND: ClassVar[str] = "KubernetesGateway"
    kind: Literal["Gateway"] = "Gateway"
    spec: GatewaySpec
