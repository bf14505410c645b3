"""ServiceEntry and WorkloadEntry (istiod's ValidateServiceEntry, ValidateWorkloadEntry): a
ServiceEntry's inline endpoints are WorkloadEntry specs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pilot.config.base import K8sObject, Model, StrictModel
from pilot.config.networking.common import UNIX_PREFIX, NetworkingWorkloadSelector
from pilot.config.networking.validation import (
    _HTTP_PROTOCOLS,
    _TLS_PROTOCOLS,
    Labels,
    Port,
    _fail,
    _raise_if,
    _subnets,
    _unix_address,
    is_dns1123_label,
    is_ip,
    validate_export_to,
    validate_fqdn,
    validate_port,
    validate_protocol,
    validate_wildcard_domain,
)


# --- WorkloadEntry / ServiceEntry -----------------------------------------------------------------
class WorkloadEntrySpec(StrictModel):
    address: str = ""
    ports: dict[str, int] = Field(default_factory=dict)
    labels: Labels = Field(default_factory=dict)
    # The network it is on: clients of other networks reach it through that network's gateways
    # (pilot/model/networks.py); with no address, only through them.
    network: str = ""
    locality: str = ""
    weight: int | None = Field(default=None, ge=0, le=4294967295)  # the EDS load_balancing_weight; 0: 1
    service_account: str = ""

    @property
    def is_unix(self) -> bool:
        return self.address.startswith(UNIX_PREFIX)

    @field_validator("ports")
    @classmethod
    def _ports(cls, ports: dict[str, int]) -> dict[str, int]:
        errs = []
        for name, number in ports.items():
            if not is_dns1123_label(name):
                errs.append(f"invalid port name: {name!r}")
            if err := validate_port(number):
                errs.append(f"{name}: {err}")
        _raise_if(errs)
        return ports

    @model_validator(mode="after")
    def _address(self) -> WorkloadEntrySpec:
        addr = self.address
        if not addr:
            if not self.network:
                _fail("address is required")
        elif self.is_unix:
            if err := _unix_address(addr[len(UNIX_PREFIX):]):
                _fail(f"address: {err}")
            if self.ports:
                _fail(f"unix endpoint {addr} must not include ports")
        elif not is_ip(addr) and validate_fqdn(addr) is not None:
            _fail(f"address: endpoint address {addr!r} is not a valid FQDN or an IP address")
        return self


class IstioCondition(Model):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_probe_time: str = ""
    last_transition_time: str = ""


class WorkloadEntryStatus(Model):
    """Written by the control plane (auto-registration health), read for endpoint health."""

    conditions: tuple[IstioCondition, ...] = ()


# istiod's status.WorkloadEntryHealthCheckAnnotation: with it, only Healthy=True is an endpoint.
HEALTH_CHECK_ANNOTATION = "proxy.istio.io/health-checks-enabled"


class WorkloadEntry(K8sObject):
    kind: Literal["WorkloadEntry"] = "WorkloadEntry"
    spec: WorkloadEntrySpec
    status: WorkloadEntryStatus | None = None

    def is_healthy(self) -> bool:
        """istiod's isHealthy: health checked entries count only once a probe said so."""
        if self.metadata.annotations.get(HEALTH_CHECK_ANNOTATION, "").lower() not in ("true", "1"):
            return True
        for c in self.status.conditions if self.status is not None else ():
            if c.type == "Healthy":
                return c.status == "True"
        return False


class ServiceEntryPort(StrictModel):
    number: Port
    protocol: str = ""
    name: str
    target_port: Port | None = None

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, protocol: str) -> str:
        if err := validate_protocol(protocol):
            _fail(err)
        return protocol

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not is_dns1123_label(name):
            _fail(f"invalid port name: {name!r}")
        return name


class ServiceEntrySpec(StrictModel):
    hosts: list[str] = Field(default_factory=list, validate_default=True)
    addresses: Annotated[list[str], AfterValidator(_subnets)] = Field(default_factory=list)
    ports: list[ServiceEntryPort] = Field(default_factory=list)
    location: Literal["MESH_EXTERNAL", "MESH_INTERNAL"] = "MESH_EXTERNAL"
    resolution: Literal["NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN"] = "NONE"
    endpoints: list[WorkloadEntrySpec] = Field(default_factory=list)
    workload_selector: NetworkingWorkloadSelector | None = None
    export_to: list[str] = Field(default_factory=list)
    subject_alt_names: list[str] = Field(default_factory=list)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        if not hosts:
            _fail("service entry must have at least one host")
        errs = []
        for i, h in enumerate(hosts):
            if h == "*":
                errs.append(f"[{i}]: invalid host * (a full wildcard is not allowed in a service entry)")
            elif err := validate_wildcard_domain(h):
                errs.append(f"[{i}]: {err}")
        _raise_if(errs)
        return hosts

    @field_validator("ports")
    @classmethod
    def _unique_ports(cls, ports: list[ServiceEntryPort]) -> list[ServiceEntryPort]:
        names: set[str] = set()
        numbers: set[int] = set()
        errs = []
        for p in ports:
            if p.name in names:
                errs.append(f"service entry port name {p.name!r} already defined")
            if p.number in numbers:
                errs.append(f"service entry port {p.number} already defined")
            names.add(p.name)
            numbers.add(p.number)
        _raise_if(errs)
        return ports

    @model_validator(mode="after")
    def _valid(self) -> ServiceEntrySpec:
        errs: list[str] = []
        if self.workload_selector is not None and self.endpoints:
            errs.append("only one of workloadSelector or endpoints is allowed in a service entry")
        if any("/" in a for a in self.addresses) and self.resolution not in ("NONE", "STATIC"):
            errs.append("addresses: CIDR addresses are allowed only for NONE/STATIC resolution types")
        port_names = {p.name for p in self.ports}
        if self.resolution == "NONE":
            if self.endpoints:
                errs.append("endpoints: no endpoints should be provided for resolution type NONE")
        elif self.resolution == "STATIC":
            # Older istiod's rule, kept: a STATIC entry must say where its endpoints are (inline or
            # through workloadSelector); current istiod accepts an empty one that can never route.
            if not self.endpoints and self.workload_selector is None:
                errs.append("endpoints: endpoints (or a workloadSelector) must be provided for resolution type STATIC")
            for i, ep in enumerate(self.endpoints):
                if ep.address and not ep.is_unix and not is_ip(ep.address):
                    errs.append(f"endpoints[{i}].address: endpoint address {ep.address!r} is not a valid IP address")
                if ep.is_unix and len(self.ports) != 1:
                    errs.append(f"endpoints[{i}]: exactly 1 service port required for unix endpoints")
        else:  # DNS, DNS_ROUND_ROBIN
            if not self.endpoints:
                for i, h in enumerate(self.hosts):
                    if validate_fqdn(h) is not None:
                        errs.append(f"hosts[{i}]: hosts must be FQDN if no endpoints are provided for resolution "
                                    f"mode {self.resolution} (got {h!r})")
            if self.resolution == "DNS_ROUND_ROBIN" and len(self.endpoints) > 1:
                errs.append(f"endpoints: there must only be 0 or 1 endpoint for resolution mode {self.resolution}")
            for i, ep in enumerate(self.endpoints):
                if ep.is_unix:
                    errs.append(f"endpoints[{i}].address: unix endpoints need resolution STATIC")
        for i, ep in enumerate(self.endpoints):
            for name in ep.ports:
                if name not in port_names:
                    errs.append(f"endpoints[{i}].ports: endpoint port {name!r} is not defined by the service entry")
        if self.resolution != "NONE" and len(self.hosts) > 1:
            for p in self.ports:
                proto = p.protocol.lower()
                if proto not in _HTTP_PROTOCOLS and proto not in _TLS_PROTOCOLS:
                    errs.append("multiple hosts provided with non-HTTP, non-TLS ports")
                    break
        _raise_if(errs)
        return self


class ServiceEntry(K8sObject):
    kind: Literal["ServiceEntry"] = "ServiceEntry"
    spec: ServiceEntrySpec

    @model_validator(mode="after")
    def _export_to(self) -> ServiceEntry:
        _raise_if([f"spec.{e}" for e in validate_export_to(self.metadata.namespace, self.spec.export_to,
                                                            service_entry=True)])
        # The registry shows every ServiceEntry to every namespace: a narrower exportTo would be
        # silently wider, so it is refused until visibility is generated per namespace.
        if self.spec.export_to and "*" not in self.spec.export_to:
            _fail("spec.exportTo: exporting a ServiceEntry to fewer than all namespaces is not supported "
                  "(only \"*\" or none)")
        return self
