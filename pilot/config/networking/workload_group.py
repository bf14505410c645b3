"""WorkloadGroup (networking.istio.io v1): the template of the WorkloadEntries the control plane
creates for VMs that connect naming the group (auto-registration, pilot/autoregistration.py),
with istiod's ValidateWorkloadGroup rules."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pilot.config.base import K8sObject, StrictModel, Unsupported
from pilot.config.networking.service_entry import WorkloadEntrySpec
from pilot.config.networking.validation import Labels, _fail


class WorkloadGroupObjectMeta(StrictModel):
    labels: Labels = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class WorkloadGroupTemplate(WorkloadEntrySpec):
    """A WorkloadEntry spec without its address: the connecting proxy's IP is the address."""

    # Same name as WorkloadEntrySpec's validator: replaces it (an empty address is the rule here).
    @model_validator(mode="after")
    def _address(self) -> WorkloadGroupTemplate:
        if self.address:
            _fail("address must not be set in the template: each registered workload has its own")
        return self


class HttpHeader(StrictModel):
    name: str
    value: str = ""


class HttpGetProbe(StrictModel):
    path: str = ""
    port: int = Field(ge=1, le=65535)
    host: str = ""
    scheme: Literal["HTTP", "HTTPS", ""] = ""
    http_headers: tuple[HttpHeader, ...] = ()


class TcpSocketProbe(StrictModel):
    host: str = ""
    port: int = Field(ge=1, le=65535)


class GrpcProbe(StrictModel):
    port: int = Field(ge=1, le=65535)
    service: str = ""


class ReadinessProbe(StrictModel):
    """Run by the VM's agent (pilot/agent/health.py), which reports the result over xDS: the
    auto-registered entry's Healthy condition and whether it is an endpoint follow it."""

    initial_delay_seconds: int = Field(default=0, ge=0)
    timeout_seconds: int = Field(default=0, ge=0)
    period_seconds: int = Field(default=0, ge=0)
    success_threshold: int = Field(default=0, ge=0)
    failure_threshold: int = Field(default=0, ge=0)
    http_get: HttpGetProbe | None = None
    tcp_socket: TcpSocketProbe | None = None
    grpc: GrpcProbe | None = None
    # The agent runs no commands for the control plane's config: refused, not ignored.
    exec: Unsupported = None

    @model_validator(mode="after")
    def _one(self) -> ReadinessProbe:
        if sum(x is not None for x in (self.http_get, self.tcp_socket, self.grpc)) != 1:
            _fail("exactly one of httpGet, tcpSocket, grpc must be set")
        return self


class WorkloadGroupSpec(StrictModel):
    metadata: WorkloadGroupObjectMeta = Field(default_factory=WorkloadGroupObjectMeta)
    template: WorkloadGroupTemplate = Field(default_factory=WorkloadGroupTemplate)
    # Delivered to the VM in mesh.yaml's readinessProbe by `pilotctl x workload entry configure`.
    probe: ReadinessProbe | None = None


class WorkloadGroup(K8sObject):
    kind: Literal["WorkloadGroup"] = "WorkloadGroup"
    spec: WorkloadGroupSpec = Field(default_factory=WorkloadGroupSpec)
