"""What a PushContext answers about workloads: the endpoints behind a service (EndpointSlices,
WorkloadEntries, Pods a ServiceEntry selects), the Pods and Nodes behind them, their identities
(SANs), and locality (of proxies, and whether locality load balancing is in force). A mixin of
PushContext: these run per cluster and per endpoint, so they stay methods of the class.
"""

from __future__ import annotations

from collections.abc import Mapping

from pilot.config.core import EndpointSlice, Node, Pod
from pilot.config.mesh import MeshConfig
from pilot.config.networking import ServiceEntry, WorkloadEntry
from pilot.model import dependencies as dep
from pilot.model.ambient.index import AmbientInputs
from pilot.model.labels import selects
from pilot.model.mesh_settings import MeshSettings
from pilot.model.mtls import spiffe_id
from pilot.model.networks import NetworkIndex, NetworkView
from pilot.model.proxy import Proxy
from pilot.model.push_recording import RecordingMixin
from pilot.model.services import (
    NO_LOCALITY,
    EndpointAddress,
    Locality,
    MeshService,
    endpoints_for_port,
    merge_endpoints,
    service_entry_endpoints,
    workload_entry_endpoints,
)
from pilot.model.store import Entry
from pilot.model.traffic import TrafficIndex


class EndpointQueries(RecordingMixin):
    """PushContext's questions about workloads, endpoints, identities and locality."""

    # PushContext's fields these read (declared for the type checker; see push_context.py)
    mesh: MeshConfig
    services: tuple[MeshService, ...]
    slices: Mapping[tuple[str, str], tuple[Entry[EndpointSlice], ...]]
    settings: MeshSettings
    traffic: TrafficIndex
    pods: Mapping[tuple[str, str], Entry[Pod]]
    service_entries: Mapping[tuple[str, str], Entry[ServiceEntry]]
    workload_entries_by_ns: Mapping[str, tuple[Entry[WorkloadEntry], ...]]
    ambient: AmbientInputs
    k8s_select_workload_entries: bool
    networks: NetworkIndex

    def pods_of(self, slices: tuple[Entry[EndpointSlice], ...]) -> tuple[Entry[Pod], ...]:
        """The Pods behind these slices' endpoints (their labels decide subset membership)."""
        out: dict[tuple[str, str], Entry[Pod]] = {}
        rec = self._rec[-1] if self._rec else None
        for s in slices:
            for ep in s.obj.endpoints:
                ref = ep.target_ref
                if ref is not None and ref.kind == "Pod":
                    key = (ref.namespace or s.key.namespace, ref.name)
                    if rec is not None:  # a Pod that arrives after its EndpointSlice meets this
                        rec.facets.add(("pod", *key))
                    pod = self.pods.get(key)
                    if pod is not None:
                        out[key] = pod
        return tuple(out[k] for k in sorted(out))

    def service_pods(self, svc: MeshService) -> tuple[Entry[Pod], ...]:
        """The Pods behind a Kubernetes service's endpoints, computed once per push (EDS asks
        once per cluster: the hit path is kept short)."""
        hit = self._memo.get(("pods", svc.namespace, svc.name))
        if hit is None:
            with self.recording() as deps:
                hit = self._memo[("pods", svc.namespace, svc.name)] = (self.pods_of(self.service_slices(svc)), deps)
        rec = self._rec
        if rec:
            rec[-1].add_child(hit[1])
        return hit[0]

    def service_nodes(self, svc: MeshService) -> tuple[Entry[Node], ...]:
        """The Nodes a Kubernetes service's endpoints run on (their topology labels are the
        endpoints' locality), noted by name so a relabelled Node reaches the result."""
        names: set[str] = set()
        for s in self.service_slices(svc):
            names.update(ep.node_name for ep in s.obj.endpoints if ep.node_name)
        for p in self.service_pods(svc):
            if p.obj.spec.node_name:
                names.add(p.obj.spec.node_name)
        if not names:
            return ()
        rec = self._rec[-1] if self._rec else None
        nodes = self.ambient.nodes
        out = []
        for n in sorted(names):
            if rec is not None:
                rec.facets.add(dep.node(n))
            e = nodes.get(n)
            if e is not None:
                out.append(e)
        return tuple(out)

    def proxy_locality(self, proxy: Proxy) -> Locality:
        """Where a proxy runs: what it says (node.locality, its istio-locality label), else,
        as istiod fills it in, the topology labels of its Pod's Node."""
        return self.proxy_locality_source(proxy)[0]

    def proxy_locality_source(self, proxy: Proxy) -> tuple[Locality, str]:
        """`proxy_locality` and what it came from: "" (the proxy itself), "node/NAME", or
        "pending" (no Pod, or one not scheduled yet). Proxies that share an output share its
        recorded reads, so a generation memo keys them by this source as well; pending ones
        (of a namespace) share one output that any Pod change in their namespace meets."""
        own = proxy.locality
        if own != NO_LOCALITY:
            return own, ""
        pod = self.pods.get((proxy.namespace, proxy.pod_name))
        name = pod.obj.spec.node_name if pod is not None else ""
        if not name:
            self._note(dep.ns_pods(proxy.namespace))
            return NO_LOCALITY, "pending"
        if self._rec:
            self._rec[-1].facets.add(dep.node(name))
        return Locality.of_node(self.ambient.nodes.get(name)) or NO_LOCALITY, f"node/{name}"

    def locality_lb_in_use(self) -> bool:
        """Could locality load balancing change any cluster's endpoints? Only then does EDS
        depend on the client's locality (and read DestinationRules for clusters without a
        subset). True when the mesh distributes, or any DestinationRule has outlier detection
        (the failover trigger) or a distribute setting."""
        return self._locality_use()[0]

    def dns_locality_in_use(self) -> bool:
        """Does locality load balancing reorder some DNS cluster's own endpoints (a DNS
        ServiceEntry whose endpoints name localities)? Only then is CDS per client locality."""
        if not self.locality_lb_in_use():
            return False
        self._note(dep.ALL_SERVICES)
        hit = self._memo.get("dns-locality")
        if hit is None:
            hit = self._memo["dns-locality"] = any(
                e.locality != NO_LOCALITY
                for svc in self.services if svc.kind == "ServiceEntry" and svc.resolution in ("DNS", "DNS_ROUND_ROBIN")
                for p in svc.ports[:1] for e in self.endpoints(svc, p.port))
        return hit

    def dns_networks_in_use(self) -> bool:
        """Does split-horizon reach some DNS cluster's own endpoints (the mesh has gateways and a
        DNS ServiceEntry has endpoints on a network)? Only then is CDS per client network."""
        if not self.networks.multi_network:
            self._note(dep.NETWORKS)
            return False
        self._note(dep.NETWORKS, dep.ALL_SERVICES)
        hit = self._memo.get("dns-networks")
        if hit is None:
            index = self.networks
            hit = self._memo["dns-networks"] = any(
                index.network_of(e.address, e.network)
                for svc in self.services if svc.kind == "ServiceEntry" and svc.resolution in ("DNS", "DNS_ROUND_ROBIN")
                for p in svc.ports for e in self.endpoints(svc, p.port))
        return hit

    def locality_reads_labels(self) -> bool:
        """Does any setting in force rank endpoints by the client's labels (failoverPriority)?"""
        return self._locality_use()[1]

    def _locality_use(self) -> tuple[bool, bool]:
        self._note(dep.DR_ALL, dep.DR_WILDCARD)
        hit = self._memo.get("locality-in-use")
        if hit is None:
            mesh = self.settings.clusters.locality
            specs = [e.obj.spec for rules in self.traffic.destination_rules.values() for e in rules]
            uses = [u for u in (_locality_relevant(s) for s in specs) if u is not None]
            in_use = (mesh is not None and bool(mesh.distribute)) or bool(uses)
            labels = in_use and ((mesh is not None and bool(mesh.failover_priority)) or any(uses))
            hit = self._memo["locality-in-use"] = (in_use, labels)
        return hit

    def service_accounts(self, svc: MeshService) -> tuple[str, ...]:
        """The SPIFFE identities a service's workloads run as (what mTLS clients verify): the
        service accounts of its Pods or WorkloadEntries, and a ServiceEntry's subjectAltNames."""
        if svc.kind == "ServiceEntry":
            return self.memoized(("sans", svc.hostname), lambda: self._service_accounts(svc))
        # A Kubernetes service's identities come from its endpoints' Pods, which change often;
        # what the result depends on is the set itself: an endpoint push compares it before and
        # after (dependencies.change_of) and only a new set meets this, so an endpoint change
        # regenerates only the ClusterLoadAssignments it touches, mTLS clients' CDS included.
        if self._rec:
            self._rec[-1].facets.add(("sans", svc.hostname))
        key = ("sans", svc.hostname)
        sans = self._memo.get(key)
        if sans is None:
            with self.recording():  # its reads are summarised by the one facet above
                sans = self._memo[key] = self._service_accounts(svc)
        return sans

    def _service_accounts(self, svc: MeshService) -> tuple[str, ...]:
        td = self.mesh.trust_domain
        out: set[str] = set()
        if svc.kind == "ServiceEntry":
            entry = self.service_entry(svc)
            if entry is not None:
                spec = entry.obj.spec
                out.update(spec.subject_alt_names)
                for w in spec.endpoints + [we.obj.spec for we in self._selected_workload_entries(svc, entry)]:
                    if w.service_account:
                        out.add(spiffe_id(td, svc.namespace, w.service_account))
                for p in self.service_entry_pods(svc, entry):
                    out.add(spiffe_id(td, p.key.namespace, p.obj.spec.service_account_name))
        else:
            for pod in self.service_pods(svc):
                out.add(spiffe_id(td, pod.key.namespace, pod.obj.spec.service_account_name))
            for we in self.service_workload_entries(svc):
                if we.obj.spec.service_account:
                    out.add(spiffe_id(td, svc.namespace, we.obj.spec.service_account))
        return tuple(sorted(out))


    def _selected_workload_entries(self, svc: MeshService, entry: Entry[ServiceEntry]) -> list[Entry[WorkloadEntry]]:
        selector = entry.obj.spec.workload_selector
        if selector is None:
            return []
        return [we for we in self.workload_entries(svc)
                if selects(selector.match_labels, we.obj.spec.labels)]

    def service_slices(self, svc: MeshService) -> tuple[Entry[EndpointSlice], ...]:
        if self._rec:
            self._rec[-1].facets.add(("slices", svc.namespace, svc.name))
        return self.slices.get((svc.namespace, svc.name), ())

    def endpoints(self, svc: MeshService, port: int) -> tuple[EndpointAddress, ...]:
        sp = svc.port(port)
        if sp is None:
            return ()
        if svc.kind == "ServiceEntry":
            entry = self.service_entry(svc)
            if entry is None:
                return ()
            pods = self.service_entry_pods(svc, entry)
            eps = service_entry_endpoints(entry, sp, self.workload_entries(svc), (), pods, self.nodes_of(pods))
        else:
            wes = self.service_workload_entries(svc)
            eps = merge_endpoints(endpoints_for_port(self.service_slices(svc), sp), workload_entry_endpoints(sp, wes))
        # Endpoints known only by their network (no address) exist for split-horizon EDS alone.
        return eps if all(e.address for e in eps) else tuple(e for e in eps if e.address)

    def service_workload_entries(self, svc: MeshService) -> tuple[Entry[WorkloadEntry], ...]:
        """The WorkloadEntries a Kubernetes Service's selector picks in its namespace (istiod's
        PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES; an entry without labels is never selected)."""
        if svc.kind != "Service" or not svc.selector or not self.k8s_select_workload_entries:
            return ()
        entries = self.workload_entries(svc)
        if not entries:
            return ()
        key = ("svc-wes", svc.namespace, svc.selector)
        hit = self._memo.get(key)
        if hit is None:
            selector = dict(svc.selector)
            hit = self._memo[key] = tuple(e for e in entries if e.obj.spec.labels
                                          and selects(selector, e.obj.spec.labels))
        return hit

    def selected_pods(self, namespace: str, selector: Mapping[str, str]) -> tuple[Entry[Pod], ...]:
        """The ready Pods with an IP in `namespace` that `selector` picks (a ServiceEntry's
        workloadSelector selects Pods as well as WorkloadEntries, as istiod's does). Any Pod
        change in the namespace meets it: a new Pod may match."""
        self._note(dep.ns_pods(namespace))
        key = ("selected-pods", namespace, tuple(sorted(selector.items())))
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = tuple(
                p for (ns, _), p in sorted(self.pods.items())
                if ns == namespace and p.obj.status.pod_ip and p.obj.status.ready
                and selects(selector, p.obj.metadata.labels))
        return hit

    def nodes_of(self, pods: tuple[Entry[Pod], ...]) -> tuple[Entry[Node], ...]:
        names = sorted({p.obj.spec.node_name for p in pods if p.obj.spec.node_name})
        rec = self._rec[-1] if self._rec else None
        out = []
        for n in names:
            if rec is not None:
                rec.facets.add(dep.node(n))
            e = self.ambient.nodes.get(n)
            if e is not None:
                out.append(e)
        return tuple(out)

    def service_entry_pods(self, svc: MeshService, entry: Entry[ServiceEntry] | None) -> tuple[Entry[Pod], ...]:
        selector = entry.obj.spec.workload_selector if entry is not None else None
        return self.selected_pods(svc.namespace, selector.match_labels) if selector is not None else ()

    def service_entry(self, svc: MeshService) -> Entry[ServiceEntry] | None:
        self._note(dep.service_entry(svc.namespace, svc.name))
        return self.service_entries.get((svc.namespace, svc.name))

    def workload_entries(self, svc: MeshService) -> tuple[Entry[WorkloadEntry], ...]:
        """WorkloadEntries in the ServiceEntry's namespace (its workloadSelector picks among them)."""
        self._note(dep.workload_entries(svc.namespace))
        return self.workload_entries_by_ns.get(svc.namespace, ())

    def network_view(self, proxy: Proxy, mtls: str = "auto") -> NetworkView | None:
        """The client's view of the mesh's networks for one cluster (see pilot/model/networks.py),
        None while no network gateway is known: then EDS reads nothing of the client's network
        and every client shares bytes. Reads the gateways, the system namespace's network label and
        MeshNetworks (one facet: their index), and the client's NETWORK metadata."""
        self._note(dep.NETWORKS)
        if not self.networks.multi_network:
            return None
        return NetworkView(self.networks, proxy.network, mtls)

    def endpoints_version(self, svc: MeshService) -> tuple[int, ...]:
        """Revisions of the slices behind a service: the EDS cache-key input."""
        return tuple(e.revision for e in self.service_slices(svc))


def _locality_relevant(spec) -> bool | None:
    """None when no part of this rule can turn locality load balancing on; else whether one
    of its parts names failoverPriority (ranking by the client's labels)."""
    relevant, priority = False, False
    for tp in (spec.traffic_policy, *(s.traffic_policy for s in spec.subsets)):
        if tp is None:
            continue
        for layer in (tp, *tp.port_level_settings):
            lb = layer.load_balancer
            setting = lb.locality_lb_setting if lb is not None else None
            if layer.outlier_detection is not None or (setting is not None and setting.distribute):
                relevant = True
            if setting is not None and setting.failover_priority:
                priority = True
    return (relevant and priority) if relevant else None
