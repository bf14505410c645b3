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


class WorkloadGroupSpec(StrictModel):
    metadata: WorkloadGroupObjectMeta = Field(default_factory=WorkloadGroupObjectMeta)
    template: WorkloadGroupTemplate = Field(default_factory=WorkloadGroupTemplate)
    # Readiness from the agent's health probes (PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS) is not
    # implemented: a registered workload is always ready, so a probe is refused, not ignored.
    probe: Unsupported = None


class WorkloadGroup(K8sObject):
    kind: Literal["WorkloadGroup"] = "WorkloadGroup"
    spec: WorkloadGroupSpec = Field(default_factory=WorkloadGroupSpec)
