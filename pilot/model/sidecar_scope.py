"""Sidecar resources: which services a proxy sees (egress hosts) and its outbound policy.

Selection follows istiod: a Sidecar in the proxy's namespace whose workloadSelector matches the
proxy's labels (oldest first), else that namespace's Sidecar without a selector, else the root
namespace's Sidecar without a selector, else no scoping at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pilot.model.ports import PortPlan, plan_ports
from pilot.model.services import MeshService
from pilot.model.store import Entry
from pilot.model.traffic import host_matches


def select_sidecar(sidecars: Mapping[str, tuple[Entry, ...]], namespace: str, labels: Mapping[str, str],
                   root_namespace: str) -> Entry | None:
    local = sidecars.get(namespace, ())
    for e in local:
        selector = e.obj.spec.workload_selector  # type: ignore[attr-defined]
        if selector is not None and selector.match_labels and all(
                labels.get(k) == v for k, v in selector.match_labels.items()):
            return e
    for e in local:
        selector = e.obj.spec.workload_selector  # type: ignore[attr-defined]
        if selector is None or not selector.match_labels:
            return e
    for e in sidecars.get(root_namespace, ()):
        selector = e.obj.spec.workload_selector  # type: ignore[attr-defined]
        if selector is None or not selector.match_labels:
            return e
    return None


def egress_visible(sidecar: Entry, svc: MeshService) -> bool:
    """Does any egress `namespace/host` of the Sidecar name this service?"""
    return egress_names(sidecar, svc.namespace, svc.hostname)


def egress_names(sidecar: Entry, namespace: str, hostname: str) -> bool:
    spec = sidecar.obj.spec  # type: ignore[attr-defined]
    if not spec.egress:
        return True  # a Sidecar without egress listeners does not limit what is seen
    own = sidecar.key.namespace
    for listener in spec.egress:
        for item in listener.hosts:
            ns, _, host = item.partition("/")
            if ns == "~":
                continue
            if ns not in ("*", namespace) and not (ns == "." and namespace == own):
                continue
            if host_matches(host, hostname):
                return True
    return False


@dataclass(frozen=True)
class ServiceView:
    """The services one group of proxies sees, with the indexes generators need."""

    services: tuple[MeshService, ...]
    by_port: Mapping[int, tuple[MeshService, ...]]
    http_by_port: Mapping[int, tuple[MeshService, ...]]
    port_plans: tuple[PortPlan, ...]
    registry_only: bool | None  # the Sidecar's outboundTrafficPolicy, None = the mesh's
    conflicts: tuple[str, ...] = ()  # services that lost their port to another protocol

    @classmethod
    def of(cls, services: tuple[MeshService, ...], registry_only: bool | None = None) -> ServiceView:
        by_port: dict[int, list[MeshService]] = {}
        for svc in services:
            for p in svc.ports:
                by_port.setdefault(p.port, []).append(svc)
        ports = MappingProxyType({p: tuple(v) for p, v in sorted(by_port.items())})
        plans, conflicts = plan_ports(ports)
        http = MappingProxyType({p: tuple(s for s in v if s.port(p).protocol.is_http) for p, v in ports.items()})
        return cls(services, ports, http, tuple(plans), registry_only, tuple(conflicts))



def scoped_view(sidecar: Entry, services: tuple[MeshService, ...]) -> ServiceView:
    spec = sidecar.obj.spec  # type: ignore[attr-defined]
    visible = tuple(s for s in services if egress_visible(sidecar, s)) if spec.egress else services
    policy = spec.outbound_traffic_policy
    return ServiceView.of(visible, None if policy is None else policy.mode == "REGISTRY_ONLY")
