"""Sidecar resources: which services a proxy sees (egress hosts) and its outbound policy.

Selection follows istiod: a Sidecar in the proxy's namespace whose workloadSelector matches the
proxy's labels (oldest first), else that namespace's Sidecar without a selector, else the root
namespace's Sidecar without a selector, else no scoping at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pilot.config.networking import Sidecar
from pilot.model.labels import selects
from pilot.model.ports import PortPlan, plan_ports, port_is_http
from pilot.model.protocol import Protocol, select_protocol
from pilot.model.services import MeshService
from pilot.model.store import Entry
from pilot.model.traffic import host_matches


def select_sidecar(sidecars: Mapping[str, tuple[Entry[Sidecar], ...]], namespace: str, labels: Mapping[str, str],
                   root_namespace: str) -> Entry[Sidecar] | None:
    local = sidecars.get(namespace, ())
    for e in local:
        selector = e.obj.spec.workload_selector
        if selector is not None and selector.match_labels and selects(selector.match_labels, labels):
            return e
    for e in local:
        selector = e.obj.spec.workload_selector
        if selector is None or not selector.match_labels:
            return e
    for e in sidecars.get(root_namespace, ()):
        selector = e.obj.spec.workload_selector
        if selector is None or not selector.match_labels:
            return e
    return None


def egress_visible(sidecar: Entry[Sidecar], svc: MeshService) -> bool:
    """Does any egress `namespace/host` of the Sidecar name this service?"""
    return egress_names(sidecar, svc.namespace, svc.hostname)


def egress_names(sidecar: Entry[Sidecar], namespace: str, hostname: str) -> bool:
    spec = sidecar.obj.spec
    if not spec.egress:
        return True  # a Sidecar without egress listeners does not limit what is seen
    return any(_listener_names(listener, sidecar.key.namespace, namespace, hostname) for listener in spec.egress)


def _listener_names(listener, own: str, namespace: str, hostname: str) -> bool:
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
    # Ports whose outbound listener binds a real address (a Sidecar egress listener with `bind`
    # or `captureMode: NONE`): port -> address, "" for the proxy's loopback (127.0.0.1, ::1 or
    # both by its IP families, istiod's actualLocalHosts: the LDS generator knows the proxy).
    binds: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, services: tuple[MeshService, ...], registry_only: bool | None = None,
           port_visible=None, binds: Mapping[int, str] | None = None,
           protocols: Mapping[int, Protocol] | None = None, sniff: bool = True) -> ServiceView:
        """`port_visible(svc, port)`: whether the service is reached on that port (a Sidecar's
        port-specific egress listener narrows who is behind its port); `protocols`: the ports
        whose listener protocol that egress listener gives. `sniff`: ports naming no protocol are
        sniffed (their services get HTTP routes too), else they are TCP."""
        by_port: dict[int, list[MeshService]] = {}
        for svc in services:
            for p in svc.ports:
                if port_visible is None or port_visible(svc, p.port):
                    by_port.setdefault(p.port, []).append(svc)
        ports = MappingProxyType({p: tuple(v) for p, v in sorted(by_port.items())})
        plans, conflicts = plan_ports(ports, protocols, sniff)
        given = protocols or {}
        http = MappingProxyType({p: (v if given[p].is_http or (sniff and given[p].is_unsupported) else ())
                                 if p in given else tuple(s for s in v if port_is_http(s, p, sniff))
                                 for p, v in ports.items()})
        return cls(services, ports, http, tuple(plans), registry_only, tuple(conflicts),
                   MappingProxyType(dict(binds or {})))



# An egress listener without `bind` binds the proxy's loopback, of its families (see binds).
PROXY_LOOPBACK = ""


def scoped_view(sidecar: Entry[Sidecar], services: tuple[MeshService, ...], sniff: bool = True) -> ServiceView:
    """istiod's egress listeners: one with a port owns that port (only its hosts are reached
    there, on its `bind` address when set); the one without a port covers every other port."""
    spec = sidecar.obj.spec
    policy = spec.outbound_traffic_policy
    registry_only = None if policy is None else policy.mode == "REGISTRY_ONLY"
    if not spec.egress:
        return ServiceView.of(services, registry_only, sniff=sniff)
    own = sidecar.key.namespace
    by_port = {listener.port.number: listener for listener in spec.egress if listener.port and listener.port.number}
    catch_all = [listener for listener in spec.egress if not (listener.port and listener.port.number)]

    def port_visible(svc: MeshService, port: int) -> bool:
        listener = by_port.get(port)
        chosen = [listener] if listener is not None else catch_all
        return any(_listener_names(c, own, svc.namespace, svc.hostname) for c in chosen)

    visible = tuple(s for s in services if any(port_visible(s, p.port) for p in s.ports))
    binds = {port: listener.bind or PROXY_LOOPBACK for port, listener in by_port.items()
             if listener.bind or listener.capture_mode == "NONE"}
    # The listener without a port binds the same way every port it serves (istiod's listenerBinding
    # is per egress listener), the ports a port-specific listener owns excepted.
    for listener in catch_all:
        if listener.bind or listener.capture_mode == "NONE":
            for svc in visible:
                for p in svc.ports:
                    if p.port not in by_port:
                        binds.setdefault(p.port, listener.bind or PROXY_LOOPBACK)
    # istiod builds a port-specific egress listener with the protocol it declares, whatever the
    # services' own ports say (their clusters keep the services' protocols).
    protocols = {port: select_protocol(p.name, p.protocol.lower())
                 for port, listener in by_port.items() if (p := listener.port) is not None and p.protocol}
    return ServiceView.of(visible, registry_only, port_visible, binds, protocols, sniff)
