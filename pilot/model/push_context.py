"""PushContext: an immutable snapshot of everything generators read for one push version.

Built from the Store once per debounced full push; an endpoint-only push derives a new context
that shares the services and replaces only the endpoint index.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from pilot.config.core import EndpointSlice, Node, Pod, Secret, Service
from pilot.config.extensions import WasmPlugin
from pilot.config.gateway_api import KubernetesGateway
from pilot.config.mesh import MeshConfig
from pilot.config.networking import (
    DestinationRule,
    EnvoyFilter,
    ServiceEntry,
    Sidecar,
    VirtualService,
    WorkloadEntry,
)
from pilot.config.proxy_tracing import ProxyTracing, parse_proxy_tracing
from pilot.config.security import AuthorizationPolicy
from pilot.model import auto_allocate
from pilot.model import dependencies as dep
from pilot.model import envoy_filters as ef
from pilot.model.ambient.index import AMBIENT_INPUT_KINDS, AmbientInputs
from pilot.model.ext_authz import resolve_providers
from pilot.model.gateway_api import EMPTY as NO_GATEWAY_API
from pilot.model.gateway_api import GatewayApiResult, translate
from pilot.model.gateways import GatewayIndex
from pilot.model.inbound import NO_INBOUND, InboundPlan, plan_inbound
from pilot.model.ingress import NO_INGRESS, IngressResult
from pilot.model.ingress import translate as translate_ingress
from pilot.model.labels import selects
from pilot.model.mesh_settings import DEFAULT_KNOBS, GenerationKnobs, MeshSettings
from pilot.model.mtls import spiffe_id
from pilot.model.proxy import Proxy
from pilot.model.security_policies import JwksSnapshot, SecurityIndex, jwks_uri_host_port
from pilot.model.services import (
    NO_LOCALITY,
    EndpointAddress,
    Locality,
    MeshService,
    endpoints_for_port,
    merge_endpoints,
    mesh_service,
    service_entry_endpoints,
    service_entry_services,
    workload_entry_endpoints,
)
from pilot.model.sidecar_scope import ServiceView, scoped_view, select_sidecar
from pilot.model.store import Entry, ObjT, Store
from pilot.model.telemetry import ProxyInfo, TelemetryIndex, TelemetryPlan, plan_for
from pilot.model.traffic import TrafficIndex, effective_policy
from pilot.model.wasm import NO_WASM, WasmPlan
from pilot.model.wasm import plan_for as wasm_plan_for

# Store kinds an endpoint-only refresh (`with_endpoints`) covers: a change of only these keeps
# every other index (services, traffic rules, gateways, policies) and rebuilds these.
ENDPOINT_KINDS = frozenset({"EndpointSlice", "Pod", "WorkloadEntry", "Node"})
# Every Store kind `build` reads, directly or through its indexes and translations (Gateway API
# reads Services, Secrets and Namespace labels too). Other kinds cannot change generated config.
CONTEXT_KINDS = ENDPOINT_KINDS | AMBIENT_INPUT_KINDS | frozenset({
    "Service", "ServiceEntry", "VirtualService", "DestinationRule", "Sidecar", "Gateway", "Secret", "EnvoyFilter",
    "PeerAuthentication", "AuthorizationPolicy", "RequestAuthentication", "Namespace",
    "GatewayClass", "KubernetesGateway", "ListenerSet", "HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute", "ReferenceGrant",
    "BackendTLSPolicy", "ConfigMap", "Ingress", "IngressClass", "Telemetry", "WasmPlugin"})


class _Recording:
    """`with ctx.recording() as deps:` without a generator's frame (it runs for every generated
    result and memoized sub-result of a push)."""

    __slots__ = ("deps", "stack")

    def __init__(self, stack: list, deps: dep.Deps) -> None:
        self.stack, self.deps = stack, deps

    def __enter__(self) -> dep.Deps:
        self.stack.append(self.deps)
        return self.deps

    def __exit__(self, *exc: object) -> None:
        self.stack.pop()


@dataclass(frozen=True)
class PushContext:
    version: str
    mesh: MeshConfig
    mesh_version: str
    domain: str
    services: tuple[MeshService, ...] = ()
    by_host: Mapping[str, MeshService] = field(default_factory=dict)
    # (namespace, service name) -> EndpointSlice entries for that service, in a stable order
    slices: Mapping[tuple[str, str], tuple[Entry[EndpointSlice], ...]] = field(default_factory=dict)
    # The MeshConfig slices builders read (the same objects while they do not change).
    settings: MeshSettings = field(default_factory=lambda: MeshSettings.of(MeshConfig()))
    traffic: TrafficIndex = field(default_factory=TrafficIndex)
    sidecars: Mapping[str, tuple[Entry[Sidecar], ...]] = field(default_factory=dict)  # by namespace, oldest first
    service_entries: Mapping[tuple[str, str], Entry[ServiceEntry]] = field(default_factory=dict)
    workload_entries_by_ns: Mapping[str, tuple[Entry[WorkloadEntry], ...]] = field(default_factory=dict)
    # Every service with its per-port indexes: what proxies without a Sidecar see.
    full_view: ServiceView = field(default_factory=lambda: ServiceView.of(()))
    _views: dict = field(default_factory=dict, compare=False, repr=False)  # per-push memo
    _memo: dict = field(default_factory=dict, compare=False, repr=False)  # per-push derived values
    pods: Mapping[tuple[str, str], Entry[Pod]] = field(default_factory=dict)
    gateways: GatewayIndex = field(default_factory=GatewayIndex)  # Gateways, their VirtualServices, Secrets
    security: SecurityIndex = field(default_factory=SecurityIndex)  # PeerAuthn, AuthorizationPolicy, RequestAuthn
    ambient: AmbientInputs = field(default_factory=AmbientInputs)  # what only ztunnel's config reads
    telemetry: TelemetryIndex = field(default_factory=TelemetryIndex)  # Telemetry API, by namespace
    wasm_plugins: Mapping[str, tuple[Entry[WasmPlugin], ...]] = field(default_factory=dict)  # by namespace, oldest first
    # Gateway API objects: the Istio config they become (also in `gateways`) and their status.
    gateway_api: GatewayApiResult = NO_GATEWAY_API
    # Kubernetes Ingress: its config (also in `gateways`), what is not served and why (a backend
    # port name no Service has), and the status.loadBalancer of each processed Ingress.
    ingress: IngressResult = NO_INGRESS
    # PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES: Kubernetes Services select WorkloadEntries too.
    k8s_select_workload_entries: bool = True
    # PILOT_ENABLE_IP_AUTOALLOCATE: (namespace, host) -> (IPv4, IPv6) of ServiceEntries without
    # addresses (pilot/model/auto_allocate.py), for proxies that capture DNS.
    auto_addresses: Mapping[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # EnvoyFilters by namespace (their patches apply last, in pilot/xds/generators/envoy_filter.py).
    envoy_filters: Mapping[str, tuple[Entry[EnvoyFilter], ...]] = field(default_factory=dict)
    # The Deps being recorded (innermost last) while a result is generated: see `recording`.
    _rec: list = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def build(cls, store: Store, mesh: MeshConfig, mesh_version: str, domain: str, version: str,
              previous: PushContext | None = None, jwks: JwksSnapshot | None = None,
              disabled_envoy_filters: frozenset = frozenset(),
              knobs: GenerationKnobs = DEFAULT_KNOBS, *,
              k8s_select_workload_entries: bool = True) -> PushContext:
        """Services whose Service object did not change are carried over from `previous` as the
        same objects, so cache keys built from them compare by identity, not field by field.
        `disabled_envoy_filters`: (key, revision) of EnvoyFilters left out because a proxy
        rejected what they produced."""
        old = previous.by_host if previous is not None and previous.domain == domain else {}

        def service(e: Entry[Service]) -> MeshService:
            prev = old.get(f"{e.key.name}.{e.key.namespace}.svc.{domain}")
            return prev if prev is not None and prev.revision == e.revision \
                else mesh_service(e, domain, knobs.dual_stack)

        kube = [service(e) for e in store.list(Service)]
        # A ServiceEntry host that is also a Kubernetes Service is that Service (istiod merges
        # them; we keep the Service and its endpoints). Between ServiceEntries the oldest wins.
        taken = {s.hostname for s in kube}
        entries = []
        for e in sorted(store.list(ServiceEntry), key=lambda e: (e.obj.metadata.creation_timestamp, e.key)):
            for se_svc in service_entry_services(e):
                if se_svc.hostname not in taken:
                    taken.add(se_svc.hostname)
                    entries.append(se_svc)
        services = tuple(sorted(kube + entries, key=lambda s: s.hostname))
        by_host = MappingProxyType({s.hostname: s for s in services})
        settings = MeshSettings.of(mesh, knobs)
        if previous is not None and previous.settings == settings:
            settings = previous.settings
        gateway_api = translate(store, domain, previous.gateway_api if previous is not None else None)
        ingress = translate_ingress(store, domain, mesh, knobs.ingress_namespace)
        return cls(
            version=version,
            mesh=mesh,
            mesh_version=mesh_version,
            domain=domain,
            services=services,
            by_host=by_host,
            slices=_index_slices(store),
            settings=settings,
            traffic=TrafficIndex.build(store, domain, mesh.root_namespace, gateway_api.mesh_virtual_services,
                                       knobs.enhanced_dr_merge, gateway_api.destination_rules),
            sidecars=_by_namespace(store.list(Sidecar), oldest_first=True),
            service_entries=MappingProxyType({(e.key.namespace, e.key.name): e for e in store.list(ServiceEntry)}),
            workload_entries_by_ns=_by_namespace(store.list(WorkloadEntry)),
            full_view=ServiceView.of(services, sniff=settings.listeners.sniff_outbound),
            pods=_index_pods(store),
            gateways=GatewayIndex.build(store, domain, (*gateway_api.gateways, *ingress.gateways),
                                        (*gateway_api.virtual_services, *ingress.virtual_services),
                                        knobs.scope_gateway_to_namespace),
            ingress=ingress,
            gateway_api=gateway_api,
            security=SecurityIndex.build(store, mesh.root_namespace, jwks,
                                         resolve_providers(mesh.extension_providers, by_host, domain),
                                         knobs.jwks_fetch_mode, lambda uri: _jwks_cluster(uri, by_host)),
            ambient=AmbientInputs.build(store),
            telemetry=TelemetryIndex.build(store, mesh),
            wasm_plugins=_by_namespace(store.list(WasmPlugin), oldest_first=True),
            k8s_select_workload_entries=k8s_select_workload_entries,
            auto_addresses=(auto_allocate.allocate(store.list(ServiceEntry), knobs.ip_autoallocate)
                            if knobs.ip_autoallocate else MappingProxyType({})),
            envoy_filters=MappingProxyType(ef.index(store.list(EnvoyFilter), disabled_envoy_filters)),
        )

    # --- dependency recording (pilot/model/dependencies.py) ------------------------------------
    def recording(self, deps: dep.Deps | None = None) -> _Recording:
        """Note into `deps` what the accessors are asked while the block runs (generation is
        synchronous, so a stack is enough; nested recordings note into the innermost)."""
        return _Recording(self._rec, dep.Deps() if deps is None else deps)

    def suspend_recording(self) -> list:
        """Detach the recording stack, for a generation that yields to the event loop between
        resources (pilot/xds/generated.py): what other tasks read meanwhile is not its input.
        Hand the result back to `resume_recording` when it continues."""
        saved = list(self._rec)
        self._rec.clear()
        return saved

    def resume_recording(self, saved: list) -> None:
        # Every other recording is synchronous, so none is open between two task steps.
        assert not self._rec, "resumed over an open recording"
        self._rec.extend(saved)

    def begin_resource(self, name: str) -> bool:
        """Within a recording: what is read until `end_resource` is the Deps of resource `name`
        alone (types pushed resource by resource: EDS). False, and nothing to end, otherwise."""
        rec = self._rec
        if not rec:
            return False
        top = rec[-1]
        if top.named is None:
            top.named = {}
        deps = top.named[name] = dep.Deps()
        rec.append(deps)
        return True

    def end_resource(self) -> None:
        self._rec.pop()

    def _note(self, *facets: tuple) -> None:
        rec = self._rec
        if rec:
            rec[-1].facets.update(facets)

    def _note_child(self, child: dep.Deps) -> None:
        rec = self._rec
        if rec:
            rec[-1].add_child(child)

    def memoized(self, key, compute):
        """`_memoized` for generators: a part of a result that proxies with different memo keys
        share within one push (CDS: one service's clusters, for every namespace)."""
        return self._memoized(key, compute)

    def _memoized(self, key, compute):
        """A per-push derived value with the Deps of computing it: a later caller that gets the
        memoized value still depends on everything the first computation read."""
        hit = self._memo.get(key)
        if hit is None:
            with self.recording() as deps:
                value = compute()
            hit = self._memo[key] = (value, deps)
        self._note_child(hit[1])
        return hit[0]

    def service(self, hostname: str) -> MeshService | None:
        """The service with this host (a Service, or a ServiceEntry's host), if any."""
        if self._rec:
            self._rec[-1].facets.add(("host", hostname))
        return self.by_host.get(hostname)

    def all_services(self) -> tuple[MeshService, ...]:
        self._note(dep.ALL_SERVICES)
        return self.services

    def destination_rule(self, host: str, client_namespace: str, service_namespace: str,
                         client_labels: Mapping[str, str] | None = None) -> Entry[DestinationRule] | None:
        """The rule in force for a client (`client_labels`: its workload's, for workloadSelector
        rules; the generation memo keys proxies by which selectors they match)."""
        if self._rec:  # (a wildcard DestinationRule's change meets every "dr" facet: Matcher)
            self._rec[-1].facets.add(("dr", host))
        return self.traffic.destination_rule(host, client_namespace, service_namespace, client_labels)

    def destination_rules(self) -> Mapping[str, tuple[Entry[DestinationRule], ...]]:
        """Every DestinationRule by host (consistent-hash policies are read across all)."""
        self._note(dep.DR_ALL, dep.DR_WILDCARD)
        return self.traffic.destination_rules

    def virtual_service(self, host: str, client_namespace: str = "") -> Entry[VirtualService] | None:
        if self._rec:  # (a wildcard VirtualService's change meets every "vs" facet: Matcher)
            self._rec[-1].facets.add(("vs", host))
        return self.traffic.virtual_service(host, client_namespace)

    def gateway_index(self) -> GatewayIndex:
        """Gateways and the VirtualServices bound to them (what routers are built from)."""
        self._note(dep.GATEWAYS)
        return self.gateways

    def gateway_secret(self, namespace: str, name: str) -> Entry[Secret] | None:
        self._note(dep.secret(namespace, name))
        return self.gateways.secret(namespace, name)

    def gateway_client_ca(self, proxy_namespace: str, kind: str, namespace: str, name: str,
                          sds_name: str) -> bytes | None:
        """The CA a Gateway of `proxy_namespace` verifies clients with (a ConfigMap's or Secret's
        ca.crt), if any."""
        self._note(dep.configmap(namespace, name) if kind == "ConfigMap" else dep.secret(namespace, name),
                   dep.GATEWAYS)
        return self.gateway_api.client_cas.get((proxy_namespace, sds_name))

    def allows_credential(self, proxy_namespace: str, namespace: str, name: str) -> bool:
        self._note(dep.GRANTS)
        return self.gateway_api.allows_credential(proxy_namespace, namespace, name)

    def mesh_sessions(self) -> bool:
        """Some mesh route sets a session (sidecars' outbound HCMs then carry the filter)."""
        self._note(dep.SESSIONS)
        return self.gateway_api.mesh_sessions

    def workload_policies(self, namespace: str, labels: Mapping[str, str]):
        """AuthorizationPolicies and RequestAuthentications selecting a workload."""
        self._note(dep.security(namespace), dep.security(self.mesh.root_namespace), dep.JWKS)
        found = self.security.for_workload(namespace, labels)
        if found.custom or (found.request_authentications and self.security.jwks_mode != "istiod"):
            # the provider's (or a JWKS server's) service appearing or going changes the filters
            self._note(dep.ALL_SERVICES)
        return found

    def authorization_policies(self) -> Mapping[str, tuple[Entry[AuthorizationPolicy], ...]]:
        self._note(dep.kind("AuthorizationPolicy"))
        return self.security.authorization_policies

    def note_ambient(self) -> None:
        """ztunnel's index reads whole kinds (AMBIENT_INPUT_KINDS): one facet stands for them."""
        self._note(dep.AMBIENT)

    def waypoint_gateways(self) -> tuple[Entry[KubernetesGateway], ...]:
        self._note(dep.kind("KubernetesGateway"), dep.kind("GatewayClass"))
        return self.ambient.gateways

    @property
    def conflicts(self) -> tuple[str, ...]:
        """Services that lost their port to another protocol (shown in /debug/push_status)."""
        return self.full_view.conflicts

    def sidecar_for(self, namespace: str, labels: Mapping[str, str]) -> Entry[Sidecar] | None:
        if self._rec:  # any Sidecar of these namespaces may take part in selection
            self._rec[-1].facets.update((("sidecars", namespace), ("sidecars", self.mesh.root_namespace)))
        if not self.sidecars:
            return None
        return select_sidecar(self.sidecars, namespace, labels, self.mesh.root_namespace)

    def envoy_patches(self, proxy: Proxy) -> ef.ProxyPatches:
        """The EnvoyFilter patches for this proxy, in application order (once per proxy and push)."""
        root = self.mesh.root_namespace
        if self._rec:  # an EnvoyFilter of these namespaces may select it, before or after a change
            self._rec[-1].facets.update((dep.envoy_filters(proxy.namespace), dep.envoy_filters(root)))
        if not self.envoy_filters:
            return ef.NO_PATCHES
        hit = self._memo.get(("envoy-patches", id(proxy)))
        if hit is not None and hit[0] is proxy and hit[1] is proxy.metadata:
            return hit[2]
        # Proxies that agree on what selection reads (namespace, labels, version, the metadata
        # keys some patch matches on) get the same patches: worked out once for all of them.
        meta_keys = self._memo.get("envoy-meta-keys")
        if meta_keys is None:
            meta_keys = self._memo["envoy-meta-keys"] = ef.metadata_keys(self.envoy_filters)
        meta = proxy.metadata
        key = ("envoy-select", proxy.namespace, frozenset(proxy.labels.items()), proxy.istio_version,
               tuple(str(meta.get(k, "")) for k in meta_keys))
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = ef.select(self.envoy_filters, root, proxy)
        self._memo[("envoy-patches", id(proxy))] = (proxy, proxy.metadata, out)
        return out

    def view(self, sidecar: Entry[Sidecar] | None, dns: tuple[bool, bool] | None = None) -> ServiceView:
        """What proxies under this Sidecar (None: no Sidecar) see; built once per push. `dns`:
        the proxy captures DNS, with (IPv4, IPv6) addresses: ServiceEntries without addresses
        carry their auto-allocated ones (of those families), as istiod's GetAddressForProxy."""
        if dns is not None and not (self.auto_addresses and any(dns)):
            dns = None
        hit = self._views.get((sidecar, dns))
        if hit is None:
            deps = dep.Deps()
            services = self.services
            if dns is not None:
                services = tuple(auto_allocate.with_addresses(s, self.auto_addresses, *dns) for s in services)
            sniff = self.settings.listeners.sniff_outbound
            if sidecar is None:
                deps.facets.add(dep.ALL_SERVICES)
                view = self.full_view if dns is None else ServiceView.of(services, sniff=sniff)
            else:  # every service its egress hosts name, before or after a change
                deps.scopes = [sidecar]
                view = scoped_view(sidecar, services, sniff)
            hit = self._views[(sidecar, dns)] = (view, deps)
        self._note_child(hit[1])
        return hit[0]

    def with_endpoints(self, store: Store, version: str) -> PushContext:
        return replace(self, version=version, slices=_index_slices(store), pods=_index_pods(store), _views={},
                       _memo={}, _rec=[], workload_entries_by_ns=_by_namespace(store.list(WorkloadEntry)),
                       ambient=AmbientInputs.build(store))

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
            return self._memoized(("sans", svc.hostname), lambda: self._service_accounts(svc))
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

    def services_in(self, namespace: str) -> tuple[MeshService, ...]:
        if self._rec:
            self._rec[-1].facets.add(("ns-services", namespace))
        key = ("ns-services", namespace)
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = tuple(s for s in self.services if s.namespace == namespace)
        return out

    def inbound_plan(self, proxy: Proxy) -> InboundPlan:
        """The ports the proxy's workload serves and their mTLS modes; shared by proxies whose
        inputs match (replicas of one deployment in iptables mode). A proxy without a mesh
        identity and without a Sidecar `ingress` serves nothing inbound: it gets the one empty
        plan at once (the common case of plaintext proxies costs no per-proxy work)."""
        labels = proxy.labels
        mesh_tls = proxy.traits.mesh_tls
        sidecar = self.sidecar_for(proxy.namespace, labels)
        if not mesh_tls and (sidecar is None or not sidecar.obj.spec.ingress):
            return NO_INBOUND
        key = ("inbound", proxy.namespace, frozenset(labels.items()), proxy.ip_addresses,
               proxy.interception_mode, mesh_tls)

        def plan() -> InboundPlan:
            made = plan_inbound(proxy, self.services_in(proxy.namespace), self.service_slices, sidecar,
                                lambda port: self.mtls_mode(proxy.namespace, labels, port), mesh_tls,
                                self.workload_policies(proxy.namespace, labels),
                                lambda svc, port: self._inbound_rule_pool(proxy.namespace, svc, port),
                                self.settings.listeners.sniff_inbound)
            return self._memo.setdefault(("plan", made), made)  # equal plans: one object

        return self._memoized(key, plan)

    def telemetry_plan(self, proxy: Proxy) -> TelemetryPlan:
        """What the proxy logs and traces, per listener class (pilot/model/telemetry.py); shared by
        proxies of one namespace with the same labels and traits."""
        index, root = self.telemetry, self.mesh.root_namespace
        defaults = self.mesh.default_providers
        tracing_raw = self._proxy_tracing_raw(proxy)
        if not (index.by_namespace.get(root) or index.by_namespace.get(proxy.namespace)
                or defaults.access_logging or defaults.tracing or (tracing_raw is not None and self.mesh.enable_tracing)):
            # The common case, no Telemetry for this proxy: MeshConfig's plan, without per-proxy work.
            self._note(dep.telemetry(root), dep.telemetry(proxy.namespace))
            shared = self._memo.get("telemetry-mesh")
            if shared is None:
                legacy = self.settings.listeners.telemetry
                shared = self._memo["telemetry-mesh"] = TelemetryPlan(legacy, legacy, ())
            return shared
        labels = proxy.labels
        md = proxy.metadata
        tracing_key = json.dumps(tracing_raw, sort_keys=True) if tracing_raw is not None else None
        info = ProxyInfo(proxy.namespace, labels, proxy.type == "router", str(md.get("CLUSTER_ID") or ""),
                         str(md.get("MESH_ID") or ""), proxy.cluster, self._proxy_tracing(tracing_key, tracing_raw))
        key = ("telemetry", info.namespace, frozenset(labels.items()), info.is_router, info.cluster_id,
               info.mesh_id, info.node_cluster, tracing_key)

        def plan() -> TelemetryPlan:
            self._note(dep.telemetry(self.mesh.root_namespace), dep.telemetry(proxy.namespace))
            return plan_for(self.telemetry, self.mesh, info, self._provider_cluster, [], self.settings.listeners.telemetry,
                            self.settings.knobs.trace_sampling)

        return self._memoized(key, plan)

    def _proxy_tracing_raw(self, proxy: Proxy) -> Any:
        """istiod's ProxyConfigOrDefault(mesh.defaultConfig).tracing: the proxy's PROXY_CONFIG
        when it sent one, else MeshConfig's defaultConfig (as written)."""
        pc = proxy.metadata.get("PROXY_CONFIG")
        if isinstance(pc, str):  # a JSON string, as istio-agent's ISTIO_META_PROXY_CONFIG may be
            try:
                pc = json.loads(pc)
            except ValueError:
                pc = None
        if isinstance(pc, Mapping):
            return pc.get("tracing")
        return (self.mesh.default_config.model_extra or {}).get("tracing")

    def _proxy_tracing(self, key: str | None, raw: Any) -> ProxyTracing | None:
        if key is None:
            return None
        memo_key = ("proxy-tracing", key)
        if memo_key not in self._memo:
            # Invalid PROXY_CONFIG tracing is refused by pilot-agent before Envoy starts; the mesh's
            # is reported with the MeshConfig (TelemetryIndex.problems). Either way: as if absent.
            self._memo[memo_key] = parse_proxy_tracing(raw, "PROXY_CONFIG tracing")[0]
        return self._memo[memo_key]

    def wasm_plan(self, proxy: Proxy) -> WasmPlan:
        """The WasmPlugins selecting the proxy, per listener class (pilot/model/wasm.py); shared
        by proxies of one namespace with the same labels."""
        root = self.mesh.root_namespace
        self._note(dep.wasm(root), dep.wasm(proxy.namespace))
        if not (self.wasm_plugins.get(root) or self.wasm_plugins.get(proxy.namespace)):
            return NO_WASM
        labels = proxy.labels
        key = ("wasm", proxy.namespace, frozenset(labels.items()))
        return self._memoized(key, lambda: wasm_plan_for(self.wasm_plugins, root, proxy.namespace, labels))

    def _provider_cluster(self, service: str, port: int) -> tuple[str, str] | None:
        """istiod's LookupCluster: `host` or `namespace/host` -> (hostname, outbound cluster)."""
        namespace, _, hostname = service.rpartition("/")
        svc = self.service(hostname)
        if svc is None or (namespace and svc.namespace != namespace):
            return None
        return svc.hostname, f"outbound|{port}||{svc.hostname}"

    @property
    def telemetry_problems(self) -> tuple[dict, ...]:
        """Telemetry (and defaultProviders) that cannot be applied, and providers whose service is
        not in the registry (shown in /debug/configz)."""
        out = list(self.telemetry.problems)
        for p in self.mesh.providers.values():
            settings = getattr(p, p.provider_kind)
            service, port = getattr(settings, "service", None), getattr(settings, "port", None)
            if isinstance(service, str) and isinstance(port, int) and self._provider_cluster(service, port) is None:
                out.append({"kind": "MeshConfig", "namespace": "", "name": "mesh",
                            "reason": f"extensionProviders {p.name!r}: service {service} is not in the registry; "
                                      "what uses it is not configured"})
        return tuple(out)

    def _inbound_rule_pool(self, namespace: str, svc: MeshService, port: int):
        """istiod's SidecarScope.DestinationRule(inbound, ...): the rule without a workloadSelector
        (selectors are honoured outbound only), its connection pool for the service port."""
        rule = self.destination_rule(svc.hostname, namespace, svc.namespace)
        if rule is None:
            return None
        return effective_policy(rule.obj.spec, "", port)["connection_pool"]

    def gateway_port_map(self, proxy: Proxy) -> tuple[tuple[int, int], ...]:
        """(port, targetPort) of the Services in a router's namespace that select it."""
        if self._rec:
            self._rec[-1].facets.add(("ns-services", proxy.namespace))
        key = ("gw-ports", proxy.namespace, frozenset(proxy.labels.items()))
        out = self._memo.get(key)
        if out is None:
            labels, ports = proxy.labels, dict[int, int]()
            for svc in self.services_in(proxy.namespace):
                if svc.kind == "Service" and svc.selector and selects(svc.selector, labels):
                    for p in svc.ports:
                        if isinstance(p.target_port, int) and p.target_port != p.port:
                            ports.setdefault(p.port, p.target_port)
            out = self._memo[key] = tuple(sorted(ports.items()))
        return out

    def mtls_mode(self, namespace: str, labels: Mapping[str, str], port: int) -> str:
        """PeerAuthentication's mode for a workload port (istiod's default: PERMISSIVE)."""
        self._note(dep.security(namespace), dep.security(self.mesh.root_namespace))
        return self.security.mtls_mode(namespace, labels, port)

    def destination_mtls_disabled(self, svc: MeshService, port: int) -> bool:
        """Does PeerAuthentication turn mTLS off for the destination's workloads (those the
        service selects)? Auto mTLS then sends plaintext, as istiod does."""
        if svc.kind != "Service":
            return False
        sp = svc.port(port)
        target = sp.target_port if sp is not None and isinstance(sp.target_port, int) else port
        self._note(dep.security(svc.namespace), dep.security(self.mesh.root_namespace))
        return self.security.mtls_mode(svc.namespace, dict(svc.selector), target) == "DISABLE"

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
            return service_entry_endpoints(entry, sp, self.workload_entries(svc), (), pods, self.nodes_of(pods))
        wes = self.service_workload_entries(svc)
        return merge_endpoints(endpoints_for_port(self.service_slices(svc), sp), workload_entry_endpoints(sp, wes))

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


def _by_namespace(entries: list[Entry[ObjT]], oldest_first: bool = False) -> Mapping[str, tuple[Entry[ObjT], ...]]:
    out: dict[str, list[Entry[ObjT]]] = defaultdict(list)
    for e in entries:
        out[e.key.namespace].append(e)

    def order(e: Entry) -> tuple:
        return (e.obj.metadata.creation_timestamp, e.key.name) if oldest_first else (e.key.name,)

    return MappingProxyType({ns: tuple(sorted(v, key=order)) for ns, v in out.items()})


def _index_pods(store: Store) -> Mapping[tuple[str, str], Entry[Pod]]:
    return MappingProxyType({(e.key.namespace, e.key.name): e for e in store.list(Pod)})


def _index_slices(store: Store) -> Mapping[tuple[str, str], tuple[Entry[EndpointSlice], ...]]:
    idx: dict[tuple[str, str], list[Entry[EndpointSlice]]] = defaultdict(list)
    for e in store.list(EndpointSlice):
        svc_name = e.obj.service_name
        if svc_name:
            idx[(e.key.namespace, svc_name)].append(e)
    return MappingProxyType({k: tuple(sorted(v, key=lambda e: e.key.name)) for k, v in idx.items()})


def _jwks_cluster(uri: str, by_host: Mapping[str, MeshService]) -> str | None:
    """istiod's LookupCluster for a jwksUri: the outbound cluster of the mesh service (with that
    port) the URI names, None when there is none."""
    hp = jwks_uri_host_port(uri)
    if hp is None:
        return None
    svc = by_host.get(hp[0])
    if svc is None or svc.port(hp[1]) is None:
        return None
    return f"outbound|{hp[1]}||{svc.hostname}"
