"""Sidecar (istiod's ValidateSidecar): ingress and egress listeners, outbound traffic policy and the
inbound connection pool."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pilot.config.base import K8sObject, StrictModel, Unsupported
from pilot.config.networking.common import UNIX_PREFIX, NetworkingWorkloadSelector
from pilot.config.networking.destination_rule import ConnectionPoolSettings
from pilot.config.networking.validation import (
    _fail,
    _raise_if,
    _unix_address,
    is_dns1123_label,
    is_ip,
    validate_namespace_slash_host,
    validate_port,
    validate_protocol,
)


# --- Sidecar ----------------------------------------------------------------------------------------
class SidecarPort(StrictModel):
    number: int = 0
    protocol: str = ""
    name: str = ""
    target_port: Unsupported = None  # deprecated in istio

    def problems(self) -> list[str]:
        errs = []
        if self.name and not is_dns1123_label(self.name):
            errs.append(f"port.name: invalid port name: {self.name!r}")
        if err := validate_protocol(self.protocol):
            errs.append(f"port.protocol: {err}")
        return errs


CaptureMode = Literal["DEFAULT", "IPTABLES", "NONE"]


class IstioIngressListener(StrictModel):
    port: SidecarPort | None = Field(default=None, validate_default=True)
    bind: str | None = None
    capture_mode: CaptureMode | None = None
    default_endpoint: str = ""
    tls: Unsupported = None  # not generated: the inbound listener would serve plaintext
    connection_pool: ConnectionPoolSettings | None = None  # this port's inbound cluster (over the Sidecar's)

    @field_validator("port")
    @classmethod
    def _required(cls, port: SidecarPort | None) -> SidecarPort | None:
        if port is None:
            _fail("sidecar: port is required for ingress listeners")
        return port

    @model_validator(mode="after")
    def _valid(self) -> IstioIngressListener:
        assert self.port is not None
        errs = self.port.problems()
        if err := validate_port(self.port.number):
            errs.append(f"port.number: {err}")
        if self.bind and not is_ip(self.bind):
            errs.append(f"bind: {self.bind} is not a valid IP")
        ep = self.default_endpoint
        if ep.startswith(UNIX_PREFIX):
            if err := _unix_address(ep[len(UNIX_PREFIX):]):
                errs.append(f"defaultEndpoint: {err}")
        elif ep:
            host, sep, port = ep.rpartition(":")
            host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
            if not sep:
                errs.append(f"defaultEndpoint: {ep!r}: missing port")
            elif host not in ("", "127.0.0.1", "0.0.0.0", "::1", "::"):
                errs.append("defaultEndpoint: must be of form 127.0.0.1:<port>, 0.0.0.0:<port>, [::1]:<port>, "
                            "[::]:<port>, unix://filepath or unset")
            elif not port.isdigit():
                errs.append(f"defaultEndpoint: port ({port}) is not a number")
            elif err := validate_port(int(port)):
                errs.append(f"defaultEndpoint: {err}")
        _raise_if(errs)
        return self


class IstioEgressListener(StrictModel):
    port: SidecarPort | None = None
    bind: str | None = None
    capture_mode: CaptureMode | None = None
    hosts: list[str] = Field(default_factory=list, validate_default=True)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        if not hosts:
            _fail("sidecar: egress listener must contain at least one host")
        _raise_if([f"[{i}] {h!r}: {e}" for i, h in enumerate(hosts)
                   for e in validate_namespace_slash_host(h, is_gateway=False)])
        return hosts

    @model_validator(mode="after")
    def _port(self) -> IstioEgressListener:
        if self.port is None:
            return self
        errs = self.port.problems()
        if self.port.protocol.upper() == "HTTP_PROXY":
            # istiod: a generic forward-proxy listener (absolute URLs, every service's routes).
            errs.append("port.protocol: HTTP_PROXY is not supported")
        bind = self.bind or ""
        if self.port.number == 0:  # a Unix domain socket listener
            if not bind.startswith(UNIX_PREFIX):
                errs.append("bind: ports with 0 value must have a unix domain socket bind address")
            elif err := _unix_address(bind[len(UNIX_PREFIX):]):
                errs.append(f"bind: {err}")
            if self.capture_mode not in (None, "DEFAULT", "NONE"):
                errs.append("captureMode: must be DEFAULT/NONE for unix domain socket listeners")
            if not errs:  # valid for istiod, which binds it; no listener here would (nor scope the hosts)
                errs.append("bind: a unix domain socket egress listener is not supported")
        else:
            if err := validate_port(self.port.number):
                errs.append(f"port.number: {err}")
            if bind and not is_ip(bind):
                errs.append(f"bind: {bind} is not a valid IP")
        _raise_if(errs)
        return self


class OutboundTrafficPolicy(StrictModel):
    """The Sidecar's own message (not MeshConfig's): its zero value is REGISTRY_ONLY, so
    `outboundTrafficPolicy: {}` is the stricter mode, as in istio."""

    mode: Literal["ALLOW_ANY", "REGISTRY_ONLY"] = "REGISTRY_ONLY"
    egress_proxy: Unsupported = None  # forwarding unknown destinations to an egress proxy: not generated


class SidecarSpec(StrictModel):
    workload_selector: NetworkingWorkloadSelector | None = None
    ingress: list[IstioIngressListener] = Field(default_factory=list)
    egress: list[IstioEgressListener] = Field(default_factory=list)
    outbound_traffic_policy: OutboundTrafficPolicy | None = None
    inbound_connection_pool: ConnectionPoolSettings | None = None  # every inbound cluster's limits

    @field_validator("ingress")
    @classmethod
    def _ingress(cls, ingress: list[IstioIngressListener]) -> list[IstioIngressListener]:
        ports: set[int] = set()
        for listener in ingress:
            assert listener.port is not None
            if listener.port.number in ports:
                _fail(f"sidecar: ports on IP bound listeners must be unique (port {listener.port.number})")
            ports.add(listener.port.number)
        return ingress

    @field_validator("egress")
    @classmethod
    def _egress(cls, egress: list[IstioEgressListener]) -> list[IstioEgressListener]:
        errs = []
        ports: set[int] = set()
        sockets: set[str] = set()
        for i, listener in enumerate(egress):
            if listener.port is None:
                if i != len(egress) - 1:
                    errs.append(f"[{i}]: the egress listener with empty port should be the last listener in the list")
                continue
            if listener.port.number == 0:
                if (listener.bind or "") in sockets:
                    errs.append(f"[{i}]: unix domain socket values for listeners must be unique")
                sockets.add(listener.bind or "")
            else:
                if listener.port.number in ports:
                    errs.append(f"[{i}]: ports on IP bound listeners must be unique (port {listener.port.number})")
                ports.add(listener.port.number)
        _raise_if(errs)
        return egress

    @model_validator(mode="after")
    def _something(self) -> SidecarSpec:
        if (not self.egress and not self.ingress and self.outbound_traffic_policy is None
                and self.inbound_connection_pool is None):
            _fail("sidecar: empty configuration provided")
        return self


class Sidecar(K8sObject):
    kind: Literal["Sidecar"] = "Sidecar"
    spec: SidecarSpec
