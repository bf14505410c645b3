"""PushContext: an immutable snapshot of everything generators read for one push version.

Built from the Store once per debounced full push; an endpoint-only push derives a new context
that shares the services and replaces only the endpoint index.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from pilot.config.core import EndpointSlice, Namespace, Pod, Secret, Service
from pilot.config.extensions import WasmPlugin
from pilot.config.gateway_api import KubernetesGateway
from pilot.config.mesh import MeshConfig
from pilot.config.mesh_networks import NO_MESH_NETWORKS, MeshNetworks
from pilot.config.networking import (
    DestinationRule,
    EnvoyFilter,
    ServiceEntry,
    Sidecar,
    VirtualService,
    WorkloadEntry,
)
from pilot.config.security import AuthorizationPolicy
from pilot.model import auto_allocate
from pilot.model import dependencies as dep
from pilot.model import envoy_filters as ef
from pilot.model.ambient.index import AMBIENT_INPUT_KINDS, AmbientInputs
from pilot.model.ext_authz import resolve_providers
from pilot.model.gateway_api import EMPTY as NO_GATEWAY_API
from pilot.model.gateway_api import GatewayApiResult, translate
from pilot.model.gateways import GatewayIndex
from pilot.model.ingress import NO_INGRESS, IngressResult
from pilot.model.ingress import translate as translate_ingress
from pilot.model.mesh_settings import DEFAULT_KNOBS, GenerationKnobs, MeshSettings
from pilot.model.networks import NO_NETWORKS, NetworkIndex, build_index
from pilot.model.push_proxy_plans import ProxyPlans
from pilot.model.security_policies import JwksSnapshot, SecurityIndex, jwks_uri_host_port
from pilot.model.services import (
    MeshService,
    for_families,
    mesh_service,
    service_entry_services,
)
from pilot.model.sidecar_scope import ServiceView, scoped_view, select_sidecar
from pilot.model.store import ConfigKey, Entry, ObjT, Store
from pilot.model.telemetry import TelemetryIndex
from pilot.model.traffic import TrafficIndex

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


@dataclass(frozen=True)
class PushContext(ProxyPlans):
    """The snapshot's fields and the accessors of config (services, traffic rules, gateways,
    policies, Sidecar views), each noting what it was asked. The rest of its methods are its
    bases, one concern each: per-proxy plans (push_proxy_plans.py), workload and endpoint
    queries (push_endpoints.py), dependency recording and the per-push memo (push_recording.py)."""

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
    # The mesh's networks: gateways and endpoint network defaults (pilot/model/networks.py).
    networks: NetworkIndex = NO_NETWORKS
    # EnvoyFilters by namespace (their patches apply last, in pilot/xds/generators/envoy_filter.py).
    envoy_filters: Mapping[str, tuple[Entry[EnvoyFilter], ...]] = field(default_factory=dict)
    # The Deps being recorded (innermost last) while a result is generated: see `recording`.
    _rec: list = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def build(cls, store: Store, mesh: MeshConfig, mesh_version: str, domain: str, version: str,
              previous: PushContext | None = None, jwks: JwksSnapshot | None = None,
              disabled_envoy_filters: frozenset = frozenset(),
              knobs: GenerationKnobs = DEFAULT_KNOBS, *,
              k8s_select_workload_entries: bool = True, mesh_networks: MeshNetworks = NO_MESH_NETWORKS,
              system_namespace: str = "istio-system") -> PushContext:
        """Services whose Service object did not change are carried over from `previous` as the
        same objects, so cache keys built from them compare by identity, not field by field.
        `disabled_envoy_filters`: (key, revision) of EnvoyFilters left out because a proxy
        rejected what they produced."""
        old = previous.by_host if previous is not None and previous.domain == domain else {}

        def service(e: Entry[Service]) -> MeshService:
            prev = old.get(f"{e.key.name}.{e.key.namespace}.svc.{domain}")
            return prev if prev is not None and prev.revision == e.revision \
                else mesh_service(e, domain)

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
        settings = MeshSettings.of(mesh, knobs)
        if previous is not None and previous.settings == settings:
            settings = previous.settings
        sniff = settings.listeners.sniff_outbound
        # A push that changed no Service keeps the previous context's services tuple, host index
        # and full view (a third of a context build at 1,000 services): the same service objects
        # in the same order make the same view, and cache keys holding the tuple compare by identity.
        kept = previous if previous is not None and previous.domain == domain \
            and len(previous.services) == len(services) and all(map(operator.is_, previous.services, services)) \
            else None
        if kept is not None:
            services, by_host = kept.services, kept.by_host
        else:
            by_host = MappingProxyType({s.hostname: s for s in services})
        view_kept = kept is not None and kept.settings.listeners.sniff_outbound == sniff
        gateway_api = translate(store, domain, previous.gateway_api if previous is not None else None)
        ingress = translate_ingress(store, domain, mesh, knobs.ingress_namespace)
        service_entries = MappingProxyType({(e.key.namespace, e.key.name): e for e in store.list(ServiceEntry)})
        networks = build_index(store.list(Service), mesh_networks,
                               store.get(ConfigKey("Namespace", "", system_namespace), Namespace),
                               knobs.cluster_id, domain)
        if previous is not None and previous.networks == networks:
            networks = previous.networks
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
            service_entries=service_entries,
            workload_entries_by_ns=_by_namespace(store.list(WorkloadEntry)),
            full_view=kept.full_view if kept is not None and view_kept else ServiceView.of(services, sniff=sniff),
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
            auto_addresses=_auto_addresses(service_entries, knobs, previous),
            envoy_filters=MappingProxyType(ef.index(store.list(EnvoyFilter), disabled_envoy_filters)),
            networks=networks,
        )

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

    def wasm_pull_secret(self, namespace: str, name: str) -> Entry[Secret] | None:
        """The Secret a WasmPlugin names as imagePullSecret (read, so its change reaches the proxy)."""
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

    def view(self, sidecar: Entry[Sidecar] | None, dns: tuple[bool, bool] | None = None,
             families: tuple[bool, bool] = (True, False)) -> ServiceView:
        """What proxies under this Sidecar (None: no Sidecar) see; built once per push. `dns`:
        the proxy captures DNS, with (IPv4, IPv6) addresses: ServiceEntries without addresses
        carry their auto-allocated ones (of those families), as istiod's GetAddressForProxy.
        `families`: the proxy's (IPv4, IPv6) address families; dual-stack Services show it the
        cluster IPs of those (services.for_families), the same view for every family set
        where no Service has an address to leave out."""
        if dns is not None and not (self.auto_addresses and any(dns)):
            dns = None
        family_key = families if self._filters_addresses(families) else None
        hit = self._views.get((sidecar, dns, family_key))
        if hit is None:
            deps = dep.Deps()
            services = self.services
            if dns is not None:
                services = tuple(auto_allocate.with_addresses(s, self.auto_addresses, *dns) for s in services)
            if family_key is not None:
                every = self.settings.knobs.dual_stack and families == (True, True)
                services = tuple(for_families(s, *families, every) for s in services)
            sniff = self.settings.listeners.sniff_outbound
            if sidecar is None:
                deps.facets.add(dep.ALL_SERVICES)
                view = self.full_view if dns is None and family_key is None else ServiceView.of(services, sniff=sniff)
            else:  # every service its egress hosts name, before or after a change
                deps.scopes = [sidecar]
                view = scoped_view(sidecar, services, sniff)
            hit = self._views[(sidecar, dns, family_key)] = (view, deps)
        self._note_child(hit[1])
        return hit[0]

    def _filters_addresses(self, families: tuple[bool, bool]) -> bool:
        """Whether a proxy of these families sees some Service with fewer addresses (once per push
        and family set: a single-stack mesh never copies its services)."""
        key = ("filters-addresses", families)
        found = self._memo.get(key)
        if found is None:
            every = self.settings.knobs.dual_stack and families == (True, True)
            found = self._memo[key] = any(for_families(s, *families, every) is not s for s in self.services)
        return bool(found)

    def with_endpoints(self, store: Store, version: str) -> PushContext:
        return replace(self, version=version, slices=_index_slices(store), pods=_index_pods(store), _views={},
                       _memo={}, _rec=[], workload_entries_by_ns=_by_namespace(store.list(WorkloadEntry)),
                       ambient=AmbientInputs.build(store))

    def services_in(self, namespace: str) -> tuple[MeshService, ...]:
        if self._rec:
            self._rec[-1].facets.add(("ns-services", namespace))
        key = ("ns-services", namespace)
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = tuple(s for s in self.services if s.namespace == namespace)
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


def _auto_addresses(service_entries: Mapping[tuple[str, str], Entry[ServiceEntry]], knobs: GenerationKnobs,
                    previous: PushContext | None) -> Mapping[tuple[str, str], tuple[str, str]]:
    """The ServiceEntries' auto-allocated addresses; the previous context's (the same object)
    while no ServiceEntry changed: the allocation is a function of them alone (the knobs are the
    process's), and hashing every host on each full push cost ~14 ms per 1000 entries."""
    if not knobs.ip_autoallocate:
        return MappingProxyType({})
    if previous is not None and previous.auto_addresses and previous.service_entries.keys() == service_entries.keys() \
            and all(previous.service_entries[k].revision == e.revision for k, e in service_entries.items()):
        return previous.auto_addresses
    return auto_allocate.allocate(service_entries.values(), knobs.ip_autoallocate)
