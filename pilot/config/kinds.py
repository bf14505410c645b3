"""The registry of kinds the control plane understands: API group/version, plural and model."""

from __future__ import annotations

from dataclasses import dataclass

from pilot.config.base import K8sObject
from pilot.config.core import ConfigMap, EndpointSlice, Namespace, Pod, Service


@dataclass(frozen=True)
class Kind:
    group: str
    versions: tuple[str, ...]
    kind: str
    plural: str
    namespaced: bool
    model: type[K8sObject]

    def accepts(self, api_version: str) -> bool:
        group, _, version = api_version.rpartition("/")
        return group == self.group and version in self.versions


KINDS: tuple[Kind, ...] = (
    Kind("", ("v1",), "Service", "services", True, Service),
    Kind("discovery.k8s.io", ("v1",), "EndpointSlice", "endpointslices", True, EndpointSlice),
    Kind("", ("v1",), "Pod", "pods", True, Pod),
    Kind("", ("v1",), "Namespace", "namespaces", False, Namespace),
    Kind("", ("v1",), "ConfigMap", "configmaps", True, ConfigMap),
)

BY_NAME: dict[str, Kind] = {k.kind: k for k in KINDS}


def lookup(api_version: str, kind: str) -> Kind | None:
    k = BY_NAME.get(kind)
    if k is not None and k.accepts(api_version):
        return k
    return None
