"""The service registry: mesh services and their endpoints, derived from Store entries.

These are plain frozen values so a PushContext can share them freely between pushes and proxies.
"""

from __future__ import annotations

from dataclasses import dataclass

from pilot.config.core import EndpointSlice, Pod, Service
from pilot.config.networking import ServiceEntry, WorkloadEntry
from pilot.model.labels import selects
from pilot.model.protocol import Protocol, select_protocol
from pilot.model.store import Entry

TLS_MODE_LABEL = "security.istio.io/tlsMode"


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    port: int
    protocol: Protocol
    target_port: int | str | None


@dataclass(frozen=True, slots=True)
class MeshService:
    hostname: str  # FQDN: name.namespace.svc.domain
    name: str
    namespace: str
    cluster_ip: str | None
    ports: tuple[ServicePort, ...]
    revision: int  # store revision of the Service object: the cache-key input
    kind: str = "Service"  # or "ServiceEntry"
    resolution: str = ""  # ServiceEntry resolution: NONE, STATIC, DNS, DNS_ROUND_ROBIN
    selector: tuple[tuple[str, str], ...] = ()  # a Kubernetes Service's pod selector (inbound side)
    # An ExternalName Service's target: istiod's DNSLB resolution (resolution "DNS"), its
    # clusters resolve this name, mesh-external (no mTLS).
    external_name: str = ""
    # A ServiceEntry's other `addresses` (IPs and CIDRs; `cluster_ip` is its first IP): istiod makes
    # one service per (host, address), so traffic to any of them reaches the service.
    extra_addresses: tuple[str, ...] = ()

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every address a client may dial the service at (cluster IP first)."""
        return ((self.cluster_ip,) if self.cluster_ip else ()) + self.extra_addresses

    @property
    def origin(self) -> str:
        """The config object it comes from, as debug views name it."""
        return f"{self.kind}/{self.namespace}/{self.name}"

    def port(self, number: int) -> ServicePort | None:
        for p in self.ports:
            if p.port == number:
                return p
        return None


@dataclass(frozen=True, slots=True)
class Locality:
    region: str = ""
    zone: str = ""
    subzone: str = ""

    def label(self) -> str:
        return f"{self.region}/{self.zone}/{self.subzone}".rstrip("/")


@dataclass(frozen=True, slots=True)
class EndpointAddress:
    address: str
    port: int
    locality: Locality
    ready: bool
    tls_mode: str = ""  # "istio" when the workload runs a sidecar (auto mTLS sends it mTLS)
    weight: int = 1  # a WorkloadEntry's weight (Envoy's load_balancing_weight, at least 1)


def mesh_service(entry: Entry[Service], domain: str) -> MeshService:
    svc = entry.obj
    ns, name = svc.metadata.namespace, svc.metadata.name
    cluster_ip = svc.spec.cluster_ip if svc.spec.cluster_ip not in (None, "", "None") else None
    ports = tuple(
        ServicePort(p.name, p.port, select_protocol(p.name, p.app_protocol, p.protocol), p.target_port)
        for p in svc.spec.ports
    )
    selector = tuple(sorted((svc.spec.selector or {}).items()))
    if svc.spec.type == "ExternalName" and svc.spec.external_name:
        return MeshService(f"{name}.{ns}.svc.{domain}", name, ns, None, ports, entry.revision, resolution="DNS",
                           external_name=svc.spec.external_name.rstrip("."))
    return MeshService(f"{name}.{ns}.svc.{domain}", name, ns, cluster_ip, ports, entry.revision, selector=selector)


def _slice_port(slice_: EndpointSlice, svc_port: ServicePort) -> int | None:
    """The endpoint port serving a service port: matched by port name, as kube-proxy does."""
    for p in slice_.ports or ():
        if p.name == svc_port.name and p.port is not None:
            return p.port
    # A slice without a named match but with a numeric targetPort still tells us where to go.
    if isinstance(svc_port.target_port, int) and not slice_.ports:
        return svc_port.target_port
    return None


def endpoints_for_port(slices: tuple[Entry[EndpointSlice], ...], svc_port: ServicePort,
                       subset_labels: tuple[tuple[str, str], ...] = (),
                       pods: tuple[Entry[Pod], ...] = (), unhealthy: bool = False) -> tuple[EndpointAddress, ...]:
    """Ready endpoints of one service port across all its slices, deduplicated, stable order;
    with `unhealthy` (PILOT_SEND_UNHEALTHY_ENDPOINTS) not-ready ones too, with ready False, as
    istiod sends them (terminating ones never).
    With `subset_labels`, only endpoints whose Pod (in `pods`) carries all those labels. A Pod's
    `security.istio.io/tlsMode` label becomes its endpoint's tls_mode."""
    pod_labels = {(p.key.namespace, p.key.name): p.obj.metadata.labels for p in pods}
    seen: set[tuple[str, int]] = set()
    out: list[EndpointAddress] = []
    for entry in slices:
        s = entry.obj
        if s.address_type == "FQDN":
            continue
        port = _slice_port(s, svc_port)
        if port is None:
            continue
        for ep in s.endpoints:
            if not ep.is_ready and (not unhealthy or ep.conditions.terminating):
                continue
            ref = ep.target_ref
            labels = pod_labels.get((ref.namespace or entry.key.namespace, ref.name)) \
                if ref and ref.kind == "Pod" and pod_labels else None
            if subset_labels and (labels is None or any(labels.get(k) != v for k, v in subset_labels)):
                continue
            tls_mode = labels.get(TLS_MODE_LABEL, "") if labels else ""
            locality = Locality(zone=ep.zone or "")
            for addr in ep.addresses:
                if (addr, port) in seen:
                    continue
                seen.add((addr, port))
                out.append(EndpointAddress(addr, port, locality, ep.is_ready, tls_mode))
    out.sort(key=lambda e: (e.locality.label(), e.address, e.port))
    return tuple(out)


def service_entry_services(entry: Entry[ServiceEntry]) -> list[MeshService]:
    """One MeshService per host of a ServiceEntry; `name` is the ServiceEntry's."""
    se = entry.obj
    spec = se.spec
    ports = tuple(ServicePort(p.name, p.number, select_protocol(p.name, p.protocol.lower() or None), p.target_port)
                  for p in spec.ports)
    addresses = [_single_address(a) for a in spec.addresses]
    address = next((a for a in addresses if "/" not in a), None)
    extra = tuple(a for a in addresses if a != address)
    return [MeshService(host, se.metadata.name, se.metadata.namespace, address, ports, entry.revision,
                        kind="ServiceEntry", resolution=spec.resolution, extra_addresses=extra)
            for host in spec.hosts]


def _single_address(address: str) -> str:
    """istiod's conversion: a CIDR of one address (/32, /128) is that address."""
    ip, slash, bits = address.partition("/")
    if slash and bits == ("128" if ":" in ip else "32"):
        return ip
    return address


def service_entry_endpoints(entry: Entry[ServiceEntry], port: ServicePort,
                            workload_entries: tuple[Entry[WorkloadEntry], ...] = (),
                            subset_labels: tuple[tuple[str, str], ...] = ()) -> tuple[EndpointAddress, ...]:
    """Inline endpoints of a ServiceEntry, or the WorkloadEntries its workloadSelector picks
    (with `subset_labels`, only those carrying them). An endpoint's port is its
    `ports[port name]`, else the port's targetPort, else its number."""
    spec = entry.obj.spec
    workloads = list(spec.endpoints)
    if spec.workload_selector is not None:
        selector = spec.workload_selector.match_labels
        for we in workload_entries:
            labels = we.obj.spec.labels
            if selects(selector, labels):
                workloads.append(we.obj.spec)
    out: list[EndpointAddress] = []
    for w in workloads:
        if not w.address or w.address.startswith("unix://"):
            continue
        if any(w.labels.get(k) != v for k, v in subset_labels):
            continue
        number = w.ports.get(port.name) or (port.target_port if isinstance(port.target_port, int) else None) or port.port
        parts = (w.locality.split("/") + ["", "", ""])[:3]
        out.append(EndpointAddress(w.address, number, Locality(*parts), True, w.labels.get(TLS_MODE_LABEL, ""),
                                   w.weight or 1))
    return tuple(sorted(set(out), key=lambda e: (e.locality.label(), e.address, e.port)))
