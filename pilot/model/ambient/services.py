"""Services and ServiceEntries as WDS Services, plus what workload derivation needs from them
(which workloads they select and how their ports map), as istiod's ambient/services.go does."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from pilot.config.core import Service
from pilot.config.networking import ServiceEntry
from pilot.model.ambient.types import PortMap, ServiceInfo
from pilot.model.ambient.waypoints import Waypoint, WaypointIndex
from pilot.model.labels import selects
from pilot.model.store import Entry


@dataclass(frozen=True, slots=True)
class ServiceSource:
    info: ServiceInfo
    kind: str  # "Service" or "ServiceEntry"
    selector: tuple[tuple[str, str], ...]  # empty: selects no workloads
    # (service port, port name, target port name): named targets resolve per workload
    port_names: tuple[tuple[int, str, str], ...]
    waypoint: Waypoint | None
    origin: str

    def selects(self, labels) -> bool:
        return bool(self.selector) and selects(self.selector, labels)


def kubernetes_service(entry: Entry[Service], domain: str, network: str, waypoints: WaypointIndex) -> ServiceSource:
    svc = entry.obj
    spec = svc.spec
    ns, name = entry.key.namespace, entry.key.name
    ports: list[tuple[int, int]] = []
    names = []
    for p in spec.ports:
        target = p.target_port
        if isinstance(target, str):
            ports.append((p.port, 0))  # named: resolved per workload
            names.append((p.port, p.name, target))
        else:
            # The apiserver defaults targetPort to port; file-mode Services may leave it out.
            ports.append((p.port, target or p.port))
            names.append((p.port, p.name, ""))
    addresses: tuple[tuple[str, str], ...] = ()
    if spec.cluster_ip not in (None, "", "None"):
        addresses = ((network, spec.cluster_ip),)
    wp = waypoints.for_target(ns, svc.metadata.labels, service=True)
    info = ServiceInfo(name, ns, f"{name}.{ns}.svc.{domain}", addresses, tuple(ports),
                       waypoint=wp.address if wp else None)
    return ServiceSource(info, "Service", tuple(sorted((spec.selector or {}).items())), tuple(names), wp,
                         f"Service/{ns}/{name}")


def service_entry_services(entry: Entry[ServiceEntry], network: str, waypoints: WaypointIndex) -> list[ServiceSource]:
    """One per host. A ServiceEntry whose addresses include a CIDR wider than one IP gives none
    (ztunnel matches single addresses only), as in istiod."""
    se = entry.obj
    spec = se.spec
    ns, name = entry.key.namespace, entry.key.name
    addresses = []
    for a in spec.addresses:
        try:
            net = ipaddress.ip_network(a, strict=False)
        except ValueError:
            return []
        if net.num_addresses != 1:
            return []
        addresses.append((network, str(net.network_address)))
    ports: PortMap = tuple((p.number, p.target_port or p.number) for p in spec.ports)
    names = tuple((p.number, p.name, "") for p in spec.ports)
    wp = waypoints.for_target(ns, se.metadata.labels, service=True)
    selector = tuple(sorted(spec.workload_selector.match_labels.items())) if spec.workload_selector else ()
    return [ServiceSource(ServiceInfo(name, ns, host, tuple(addresses), ports, tuple(spec.subject_alt_names),
                                      waypoint=wp.address if wp else None),
                          "ServiceEntry", selector, names, wp, f"ServiceEntry/{ns}/{name}")
            for host in spec.hosts]
