"""Waypoints: Gateway API Gateways of class `istio-waypoint`, and who uses which.

As istiod (ambient/waypoints.go):
- `istio.io/use-waypoint: NAME` on a Service, ServiceEntry, Pod or WorkloadEntry (else on its
  Namespace) names the waypoint, in the object's namespace unless `istio.io/use-waypoint-namespace`
  says otherwise; the value `none` on the object opts it out of its namespace's waypoint.
- A waypoint serves service traffic unless `istio.io/waypoint-for` (on the Gateway, else its
  GatewayClass) says `workload`, `all` or `none`: a Service gets the waypoint only for `service`
  or `all`, a workload only for `workload` or `all`.
- The HBONE listener's allowedRoutes decides which namespaces may attach (default: the same one).
- Pods carrying `gateway.networking.k8s.io/gateway-name` are the waypoint's own instances; they
  never get a waypoint, and their service accounts are the waypoint's identities.

istiod learns a waypoint's address from the Gateway's status, which its deployment controller
writes once the waypoint's Deployment is ready: the hostname of the Service it creates, named like
the Gateway. Here nothing deploys waypoints, so the address is the Gateway's `spec.addresses`
(Hostname or IPAddress) when given, else that Service's hostname once the Service exists. Until
one of those exists the waypoint is not ready and nobody is pointed at it (as in istiod).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pilot.config.core import Namespace, Pod
from pilot.config.gateway_api import GatewayClass, KubernetesGateway
from pilot.config.security import AuthorizationPolicy
from pilot.model.ambient.types import HBONE_PORT, GatewayAddr
from pilot.model.security_policies import WorkloadPolicies
from pilot.model.store import Entry

WAYPOINT_CLASS = "istio-waypoint"
USE_WAYPOINT = "istio.io/use-waypoint"
USE_WAYPOINT_NAMESPACE = "istio.io/use-waypoint-namespace"
WAYPOINT_FOR = "istio.io/waypoint-for"
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
MANAGED_LABEL = "gateway.istio.io/managed"
MESH_CONTROLLER = "istio.io-mesh-controller"
SERVICE_TRAFFIC, WORKLOAD_TRAFFIC, ALL_TRAFFIC, NO_TRAFFIC = "service", "workload", "all", "none"
GATEWAY_KIND = "KubernetesGateway"  # the Store's name for gateway.networking.k8s.io Gateway


@dataclass(frozen=True, slots=True)
class Waypoint:
    namespace: str
    name: str
    address: GatewayAddr
    traffic_type: str
    allowed_from: str  # Same | All | Selector
    allowed_selector: tuple[tuple[str, str], ...] = ()  # matchLabels, for Selector
    service_accounts: tuple[str, ...] = ()

    @property
    def resource_name(self) -> str:
        return f"{self.namespace}/{self.name}"

    def allows(self, namespace: str, namespace_labels: Mapping[str, str]) -> bool:
        if self.allowed_from == "All":
            return True
        if self.allowed_from == "Selector":
            return all(namespace_labels.get(k) == v for k, v in self.allowed_selector)
        return namespace == self.namespace


@dataclass(frozen=True)
class WaypointIndex:
    by_name: Mapping[tuple[str, str], Waypoint]  # ready waypoints by (namespace, name)
    namespaces: Mapping[str, Entry[Namespace]]  # their labels may name a waypoint and gate attachment

    @classmethod
    def build(cls, gateways: tuple[Entry[KubernetesGateway], ...], classes: Mapping[str, Entry[GatewayClass]],
              namespaces: Mapping[str, Entry[Namespace]], service_hosts: Mapping[tuple[str, str], str],
              pods: Mapping[tuple[str, str], Entry[Pod]]) -> WaypointIndex:
        """`service_hosts`: (namespace, Service name) -> hostname, for waypoints without addresses."""
        instances: dict[tuple[str, str], set[str]] = {}
        for (ns, _), pod in pods.items():
            gw = pod.obj.metadata.labels.get(GATEWAY_NAME_LABEL)
            if gw:
                instances.setdefault((ns, gw), set()).add(pod.obj.spec.service_account_name)
        out: dict[tuple[str, str], Waypoint] = {}
        for e in gateways:
            spec = e.obj.spec
            if spec.gateway_class_name != WAYPOINT_CLASS:
                continue
            ns, name = e.key.namespace, e.key.name
            # The HBONE listener: istiod hard-codes 15008 ("TODO: look up the HBONE port"); the
            # Gateway's own listener port is used here, 15008 being the usual one.
            hbone = sorted((ln for ln in spec.listeners if ln.protocol == "HBONE"),
                           key=lambda ln: ln.port != HBONE_PORT)
            port = hbone[0].port if hbone else HBONE_PORT
            address = _address(spec, ns, service_hosts.get((ns, name)), port)
            if address is None:
                continue  # not ready
            traffic = SERVICE_TRAFFIC
            cls_entry = classes.get(spec.gateway_class_name)
            if cls_entry is not None:
                traffic = cls_entry.obj.metadata.labels.get(WAYPOINT_FOR, traffic)
            traffic = e.obj.metadata.labels.get(WAYPOINT_FOR, traffic)
            allowed, selector = "Same", ()
            if hbone:
                rn = hbone[0].allowed_routes.namespaces
                allowed = rn.from_
                if rn.selector is not None:
                    selector = tuple(sorted(rn.selector.match_labels.items()))
            out[(ns, name)] = Waypoint(ns, name, address, traffic, allowed, selector,
                                       tuple(sorted(instances.get((ns, name), ()))))
        return cls(out, namespaces)

    def instance_of(self, namespace: str, labels: Mapping[str, str]) -> Waypoint | None:
        name = labels.get(GATEWAY_NAME_LABEL)
        return self.by_name.get((namespace, name)) if name else None

    def for_target(self, namespace: str, labels: Mapping[str, str], *, service: bool) -> Waypoint | None:
        """The waypoint a service (service=True) or workload in `namespace` with `labels` uses."""
        if service and labels.get(MANAGED_LABEL) == MESH_CONTROLLER:
            return None  # a waypoint's own Service
        wp = self._lookup(namespace, labels)
        if wp is None:
            return None
        wanted = SERVICE_TRAFFIC if service else WORKLOAD_TRAFFIC
        return wp if wp.traffic_type in (wanted, ALL_TRAFFIC) else None

    def _lookup(self, namespace: str, labels: Mapping[str, str]) -> Waypoint | None:
        ns_entry = self.namespaces.get(namespace)
        ns_labels = ns_entry.obj.metadata.labels if ns_entry is not None else {}
        value = labels.get(USE_WAYPOINT)
        if value is not None:
            if value == "none":
                return None
            wp = self.by_name.get((labels.get(USE_WAYPOINT_NAMESPACE, namespace), value))
        else:
            value = ns_labels.get(USE_WAYPOINT)
            if not value or value == "none":
                return None
            wp = self.by_name.get((ns_labels.get(USE_WAYPOINT_NAMESPACE, namespace), value))
        if wp is None or not wp.allows(namespace, ns_labels):
            return None
        return wp


def _address(spec, namespace: str, service_host: str | None, port: int) -> GatewayAddr | None:
    for a in spec.addresses:
        if a.type == "Hostname":
            return GatewayAddr(namespace=namespace, hostname=a.value, port=port)
    for a in spec.addresses:
        if a.type in ("IPAddress", ""):
            return GatewayAddr(ip=a.value, port=port)
    if service_host:
        return GatewayAddr(namespace=namespace, hostname=service_host, port=port)
    return None


def waypoint_policies(authorization_policies: Mapping[str, tuple[Entry[AuthorizationPolicy], ...]], waypoint: Waypoint,
                      service_namespace: str, service_name: str, service_kind: str = "Service") -> WorkloadPolicies:
    """The AuthorizationPolicies a waypoint enforces for one service: those attached (targetRefs)
    to the waypoint's Gateway, and those attached to the service itself (istiod's policy
    attachment for waypoints); by action, oldest first."""
    by_action: dict[str, list[Entry[AuthorizationPolicy]]] = {"CUSTOM": [], "DENY": [], "ALLOW": [], "AUDIT": []}
    seen = set()
    for ns in dict.fromkeys((waypoint.namespace, service_namespace)):
        for e in authorization_policies.get(ns, ()):
            for ref in e.obj.spec.target_references:
                to_gateway = (ref.kind == "Gateway" and ref.group == "gateway.networking.k8s.io"
                              and ns == waypoint.namespace and ref.name == waypoint.name)
                to_service = (ref.kind == service_kind and ref.group in ("", "core", "networking.istio.io")
                              and ns == service_namespace and ref.name == service_name)
                if (to_gateway or to_service) and e.key not in seen:
                    seen.add(e.key)
                    by_action[e.obj.spec.action].append(e)
    custom, deny, allow, audit = (tuple(sorted(by_action[a], key=_age)) for a in ("CUSTOM", "DENY", "ALLOW", "AUDIT"))
    return WorkloadPolicies(custom, deny, allow, audit)


def _age(e: Entry) -> tuple[str, str, str]:
    return (e.obj.metadata.creation_timestamp, e.key.name, e.key.namespace)
