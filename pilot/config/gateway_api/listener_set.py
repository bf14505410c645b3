"""ListenerSet (gateway.networking.k8s.io/v1, standard since Gateway API v1.5): listeners that a
namespace adds to a Gateway whose `spec.allowedListeners` lets it. istiod reads this v1 kind (its
experimental predecessor XListenerSet, gateway.networking.x-k8s.io/v1alpha1, it no longer reads:
refused by name in pilot.config.validation)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from pilot.config.base import StrictModel
from pilot.config.gateway_api.common import GROUP, GatewayApiObject, Group, Kind, Namespace, ObjectName
from pilot.config.gateway_api.gateway import Listener, unique_listeners


class ParentGatewayReference(StrictModel):
    group: Group = GROUP
    kind: Kind = "Gateway"
    name: ObjectName
    namespace: Namespace | None = None

    def refers_to_gateway(self) -> bool:
        return self.group == GROUP and self.kind == "Gateway"


class ListenerEntry(Listener):
    """A Gateway listener, except that HTTPS may omit `tls` (the ListenerSet CRD's CEL allows it;
    istiod then refuses that listener: Accepted False, UnsupportedProtocol)."""

    TLS_REQUIRED_FOR_HTTPS: ClassVar[bool] = False


class ListenerSetSpec(StrictModel):
    parent_ref: ParentGatewayReference
    listeners: list[ListenerEntry] = Field(min_length=1, max_length=64)

    @field_validator("listeners")
    @classmethod
    def _unique(cls, listeners: list[ListenerEntry]) -> list[ListenerEntry]:
        unique_listeners(listeners)
        return listeners


class ListenerSet(GatewayApiObject):
    kind: Literal["ListenerSet"] = "ListenerSet"
    spec: ListenerSetSpec
