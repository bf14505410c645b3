"""The service registry: mesh services and their endpoints, derived from Store entries.

These are plain frozen values so a PushContext can share them freely between pushes and proxies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pilot.config.core import EndpointSlice, Node, Pod, Service
from pilot.config.networking import ServiceEntry, WorkloadEntry
from pilot.model.labels import selects
from pilot.model.protocol import Protocol, select_protocol
from pilot.model.store import Entry

TLS_MODE_LABEL = "security.istio.io/tlsMode"
NETWORK_LABEL = "topology.istio.io/network"  # a workload's network (pilot/model/networks.py)
LOCALITY_LABEL = "istio-locality"  # region.zone.subzone on a Pod (or a proxy), as istiod reads it
REGION_LABEL, ZONE_LABEL, SUBZONE_LABEL = ("topology.kubernetes.io/region", "topology.kubernetes.io/zone",
                                           "topology.istio.io/subzone")


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
    # istiod's MeshExternal: a ServiceEntry with location MESH_EXTERNAL, or an ExternalName Service.
    mesh_external: bool = False

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

    @classmethod
    def parse(cls, text: str, sep: str = "/") -> Locality:
        """"region/zone/subzone" (or, with sep ".", the `istio-locality` label's spelling)."""
        parts = ([p.strip() for p in text.split(sep, 2)] + ["", "", ""])[:3] if text else ["", "", ""]
        return cls(parts[0], parts[1], parts[2])

    @classmethod
    def of_node(cls, node: Entry[Node] | None) -> Locality | None:
        """A Node's topology labels, or None when it carries none."""
        if node is None:
            return None
        labels = node.obj.metadata.labels
        loc = cls(labels.get(REGION_LABEL, ""), labels.get(ZONE_LABEL, ""), labels.get(SUBZONE_LABEL, ""))
        return loc if loc != NO_LOCALITY else None

    def topology_labels(self) -> tuple[tuple[str, str], ...]:
        """The labels istiod adds to an endpoint (and a proxy) for failoverPriority to match."""
        return tuple((k, v) for k, v in ((REGION_LABEL, self.region), (ZONE_LABEL, self.zone),
                                         (SUBZONE_LABEL, self.subzone)) if v)


NO_LOCALITY = Locality()


@dataclass(frozen=True, slots=True)
class EndpointAddress:
    address: str
    port: int
    locality: Locality
    ready: bool
    tls_mode: str = ""  # "istio" when the workload runs a sidecar (auto mTLS sends it mTLS)
    weight: int = 1  # a WorkloadEntry's weight (Envoy's load_balancing_weight, at least 1)
    # The workload's labels with its topology labels (what failoverPriority compares), sorted.
    labels: tuple[tuple[str, str], ...] = ()
    # ISTIO_DUAL_STACK: the same Pod's address in the other family (its IPv6 EndpointSlice):
    # Envoy's `additional_addresses`, tried by Happy Eyeballs beside `address`.
    extra_addresses: tuple[str, ...] = ()
    # The network its workload says it is on (a WorkloadEntry's `network`, else its
    # topology.istio.io/network label); "" leaves it to the mesh's defaults (NetworkIndex.network_of).
    # An endpoint without an address (a WorkloadEntry with only a `network`) is reached through
    # that network's gateways or not at all.
    network: str = ""


def _with_topology(labels: dict[str, str] | None, locality: Locality) -> tuple[tuple[str, str], ...]:
    merged = dict(labels or {})
    merged.update(locality.topology_labels())
    return tuple(sorted(merged.items()))


def pod_locality(labels: dict[str, str] | None, node: Entry[Node] | None, zone: str | None) -> Locality:
    """istiod's order: the Pod's `istio-locality` label, then its Node's topology labels, then
    the zone the EndpointSlice reports."""
    if labels and labels.get(LOCALITY_LABEL):
        return Locality.parse(labels[LOCALITY_LABEL], ".")
    return Locality.of_node(node) or Locality(zone=zone or "")


def mesh_service(entry: Entry[Service], domain: str) -> MeshService:
    """Every `clusterIPs` address is the service's (clusterIP first), as istiod takes them with
    or without ISTIO_DUAL_STACK; each proxy sees those of its IP families (`for_families`)."""
    svc = entry.obj
    ns, name = svc.metadata.namespace, svc.metadata.name
    cluster_ip = svc.spec.cluster_ip if svc.spec.cluster_ip not in (None, "", "None") else None
    extra: tuple[str, ...] = ()
    if cluster_ip is not None:
        extra = tuple(dict.fromkeys(a for a in svc.spec.cluster_ips if a not in ("", "None", cluster_ip)))
    ports = tuple(
        ServicePort(p.name, p.port, select_protocol(p.name, p.app_protocol, p.protocol), p.target_port)
        for p in svc.spec.ports
    )
    selector = tuple(sorted((svc.spec.selector or {}).items()))
    if svc.spec.type == "ExternalName" and svc.spec.external_name:
        return MeshService(f"{name}.{ns}.svc.{domain}", name, ns, None, ports, entry.revision, resolution="DNS",
                           external_name=svc.spec.external_name.rstrip("."), mesh_external=True)
    return MeshService(f"{name}.{ns}.svc.{domain}", name, ns, cluster_ip, ports, entry.revision, selector=selector,
                       extra_addresses=extra)


def for_families(svc: MeshService, ipv4: bool, ipv6: bool, every_family: bool) -> MeshService:
    """A Kubernetes Service's cluster IPs as a proxy of those IP families sees them, istiod's
    GetAllAddressesForProxy: all of them with `every_family` (ISTIO_DUAL_STACK and a dual-stack
    proxy); else those of the proxy's family, and for a dual-stack proxy without the knob those
    of the first address's family. With none of its family left a service keeps its first
    address, the listener address istiod's GetAddressForProxy falls back to. ServiceEntries keep
    theirs (istiod filters only Kubernetes cluster IPs). Unchanged services are returned as
    they are: proxies of every family share them, and their cache keys."""
    if svc.kind != "Service" or not svc.extra_addresses or every_family:
        return svc
    addresses = svc.addresses
    v6 = (":" in addresses[0]) if ipv4 and ipv6 else ipv6
    kept = tuple(a for a in addresses if (":" in a) == v6) or addresses[:1]
    if kept == addresses:
        return svc
    return replace(svc, cluster_ip=kept[0], extra_addresses=kept[1:])


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
                       pods: tuple[Entry[Pod], ...] = (),
                       nodes: tuple[Entry[Node], ...] = (), unhealthy: bool = False,
                       dual_stack: bool = False) -> tuple[EndpointAddress, ...]:
    """Ready endpoints of one service port across all its slices, deduplicated, stable order;
    with `unhealthy` (PILOT_SEND_UNHEALTHY_ENDPOINTS) not-ready ones too, with ready False, as
    istiod sends them (terminating ones never).
    With `subset_labels`, only endpoints whose Pod (in `pods`) carries all those labels. A Pod's
    `security.istio.io/tlsMode` label becomes its endpoint's tls_mode; its locality comes from
    `pod_locality` (`nodes`: the Nodes the endpoints run on).
    With `dual_stack` (ISTIO_DUAL_STACK) a Pod's addresses on one port from its IPv4 and IPv6
    slices are one endpoint (IPv4 first, the other as an extra address), as istiod merges them;
    without, each address is an endpoint of its own."""
    pod_labels = {(p.key.namespace, p.key.name): p.obj.metadata.labels for p in pods}
    pod_nodes = {(p.key.namespace, p.key.name): p.obj.spec.node_name for p in pods}
    by_node = {n.key.name: n for n in nodes}
    seen: set[tuple[str, int]] = set()
    out: list[EndpointAddress] = []
    of_pod: dict[tuple[str, str, int], int] = {}  # dual_stack: (pod namespace, name, port) -> index in out
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
            node_name = ep.node_name or (pod_nodes.get((ref.namespace or entry.key.namespace, ref.name))
                                         if ref and ref.kind == "Pod" else None)
            locality = pod_locality(labels, by_node.get(node_name) if node_name else None, ep.zone)
            ep_labels = _with_topology(labels, locality)
            pod_key = (ref.namespace or entry.key.namespace, ref.name, port) if dual_stack and ref \
                and ref.kind == "Pod" else None
            for addr in ep.addresses:
                if (addr, port) in seen:
                    continue
                seen.add((addr, port))
                i = of_pod.get(pod_key) if pod_key is not None else None
                if i is not None:
                    out[i] = _with_other_family(out[i], addr)
                    continue
                if pod_key is not None:
                    of_pod[pod_key] = len(out)
                out.append(EndpointAddress(addr, port, locality, ep.is_ready, tls_mode, labels=ep_labels,
                                           network=labels.get(NETWORK_LABEL, "") if labels else ""))
    out.sort(key=lambda e: (e.locality.label(), e.address, e.port))
    return tuple(out)


def _with_other_family(ep: EndpointAddress, addr: str) -> EndpointAddress:
    """A Pod's endpoint with its address of the other family added; IPv4 stays the main one."""
    if ":" not in addr and ":" in ep.address:
        return replace(ep, address=addr, extra_addresses=(ep.address, *ep.extra_addresses))
    return replace(ep, extra_addresses=(*ep.extra_addresses, addr))


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
                        kind="ServiceEntry", resolution=spec.resolution, extra_addresses=extra,
                        mesh_external=spec.location == "MESH_EXTERNAL")
            for host in spec.hosts]


def _single_address(address: str) -> str:
    """istiod's conversion: a CIDR of one address (/32, /128) is that address."""
    ip, slash, bits = address.partition("/")
    if slash and bits == ("128" if ":" in ip else "32"):
        return ip
    return address


def service_entry_endpoints(entry: Entry[ServiceEntry], port: ServicePort,
                            workload_entries: tuple[Entry[WorkloadEntry], ...] = (),
                            subset_labels: tuple[tuple[str, str], ...] = (),
                            pods: tuple[Entry[Pod], ...] = (),
                            nodes: tuple[Entry[Node], ...] = (),
                            dual_stack: bool = False) -> tuple[EndpointAddress, ...]:
    """(`dual_stack`, ISTIO_DUAL_STACK: a selected Pod's other `podIPs` are extra addresses of
    its endpoint, as istiod takes every pod IP.)
    Inline endpoints of a ServiceEntry, or the WorkloadEntries and `pods` its
    workloadSelector picks (with `subset_labels`, only those carrying them). An endpoint's port
    is its `ports[port name]`, else the port's targetPort, else its number; a Pod's the
    targetPort, else the number (istiod's). `pods`: the ready Pods the selector picks (see
    PushContext.selected_pods), `nodes` their Nodes (locality)."""
    spec = entry.obj.spec
    workloads = list(spec.endpoints)
    if spec.workload_selector is not None:
        selector = spec.workload_selector.match_labels
        for we in workload_entries:
            labels = we.obj.spec.labels
            if selects(selector, labels) and we.obj.is_healthy():  # unhealthy: no endpoint (istiod's)
                workloads.append(we.obj.spec)
    out: list[EndpointAddress] = []
    for w in workloads:
        if (not w.address and not w.network) or w.address.startswith("unix://"):
            continue
        if any(w.labels.get(k) != v for k, v in subset_labels):
            continue
        number = w.ports.get(port.name) or (port.target_port if isinstance(port.target_port, int) else None) or port.port
        locality = Locality.parse(w.locality)
        out.append(EndpointAddress(w.address, number, locality, True, w.labels.get(TLS_MODE_LABEL, ""),
                                   w.weight or 1, _with_topology(w.labels, locality),
                                   network=w.network or w.labels.get(NETWORK_LABEL, "")))
    if pods and spec.workload_selector is not None:
        by_node = {n.key.name: n for n in nodes}
        number = port.target_port if isinstance(port.target_port, int) else port.port
        for p in pods:
            labels = p.obj.metadata.labels
            if not selects(spec.workload_selector.match_labels, labels) or \
                    any(labels.get(k) != v for k, v in subset_labels):
                continue
            locality = pod_locality(labels, by_node.get(p.obj.spec.node_name), None)
            status = p.obj.status
            extra = tuple(dict.fromkeys(a.ip for a in status.pod_ips if a.ip and a.ip != status.pod_ip)) \
                if dual_stack else ()
            out.append(EndpointAddress(status.pod_ip, number, locality, True, labels.get(TLS_MODE_LABEL, ""),
                                       labels=_with_topology(labels, locality), extra_addresses=extra,
                                       network=labels.get(NETWORK_LABEL, "")))
    return tuple(sorted(set(out), key=lambda e: (e.locality.label(), e.address, e.port)))


def workload_entry_endpoints(svc_port: ServicePort, entries: tuple[Entry[WorkloadEntry], ...],
                             subset_labels: tuple[tuple[str, str], ...] = ()) -> tuple[EndpointAddress, ...]:
    """The WorkloadEntries a Kubernetes Service selects, as its endpoints (istiod's
    serviceInstanceFromWorkloadInstance): the port is the entry's `ports[name]` for the
    targetPort's name (or, for a numeric targetPort, the service port's name), else the
    numeric targetPort, else the port; a named targetPort the entry lacks leaves it out."""
    explicit = isinstance(svc_port.target_port, str)
    name = svc_port.target_port if isinstance(svc_port.target_port, str) else svc_port.name
    number = svc_port.target_port if isinstance(svc_port.target_port, int) else svc_port.port
    out: list[EndpointAddress] = []
    for e in entries:
        w = e.obj.spec
        if (not w.address and not w.network) or w.address.startswith("unix://") or not e.obj.is_healthy():
            continue
        if any(w.labels.get(k) != v for k, v in subset_labels):
            continue
        port = w.ports.get(name) if name else None
        if port is None and explicit:
            continue
        locality = Locality.parse(w.locality)
        out.append(EndpointAddress(w.address, port or number, locality, True, w.labels.get(TLS_MODE_LABEL, ""),
                                   w.weight or 1, _with_topology(w.labels, locality),
                                   network=w.network or w.labels.get(NETWORK_LABEL, "")))
    return tuple(out)


def merge_endpoints(*parts: tuple[EndpointAddress, ...]) -> tuple[EndpointAddress, ...]:
    """One endpoint per (address, port), the first part's winning, in the registry's order."""
    seen: set[tuple[str, int]] = set()
    out: list[EndpointAddress] = []
    for part in parts:
        for ep in part:
            if not ep.address:  # only a network (reached through its gateways): one each
                out.append(ep)
            elif (ep.address, ep.port) not in seen:
                seen.add((ep.address, ep.port))
                out.append(ep)
    out.sort(key=lambda e: (e.locality.label(), e.address, e.port))
    return tuple(out)
