"""AmbientIndex: every WDS Address and Authorization resource of one PushContext, with lookups.

Built lazily, once per PushContext, from the context and the few Store kinds only ambient reads
(AmbientInputs): a control plane that never serves a ztunnel never builds it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pilot import logging as plog
from pilot.config.core import Namespace, Node, Service
from pilot.config.gateway_api import GatewayClass, KubernetesGateway
from pilot.model.ambient import policies as pol
from pilot.model.ambient.services import ServiceSource, kubernetes_service, service_entry_services
from pilot.model.ambient.types import AuthzPolicy, ServiceInfo, WorkloadInfo
from pilot.model.ambient.waypoints import GATEWAY_KIND, WaypointIndex
from pilot.model.ambient.workloads import (
    node_locality,
    pod_workload,
    selecting_services,
    service_entry_workloads,
    workload_entry_workload,
)
from pilot.model.store import Entry, ObjT, Store

log = plog.get("ambient")


def _by_key(entries: list[Entry[ObjT]]) -> Mapping[tuple[str, str], Entry[ObjT]]:
    return MappingProxyType({(e.key.namespace, e.key.name): e for e in entries})


# Every Store kind the index below reads, directly (AmbientInputs) or through the PushContext
# (pods, workload entries, service entries, security policies): ztunnel's Deps name the index
# as a whole, and a change of any of these kinds meets it (pilot/model/dependencies.py).
AMBIENT_INPUT_KINDS = frozenset({"Namespace", "Node", "Service", GATEWAY_KIND, "GatewayClass", "Pod",
                                 "WorkloadEntry", "ServiceEntry", "AuthorizationPolicy", "PeerAuthentication"})


@dataclass(frozen=True)
class AmbientInputs:
    """The Store kinds only ambient reads, captured with each PushContext."""

    namespaces: Mapping[str, Entry[Namespace]] = field(default_factory=dict)
    nodes: Mapping[str, Entry[Node]] = field(default_factory=dict)
    services: Mapping[tuple[str, str], Entry[Service]] = field(default_factory=dict)
    gateways: tuple[Entry[KubernetesGateway], ...] = ()  # gateway.networking.k8s.io Gateways
    gateway_classes: Mapping[str, Entry[GatewayClass]] = field(default_factory=dict)

    @classmethod
    def build(cls, store: Store) -> AmbientInputs:
        return cls(MappingProxyType({e.key.name: e for e in store.list(Namespace)}),
                   MappingProxyType({e.key.name: e for e in store.list(Node)}),
                   _by_key(store.list(Service)),
                   tuple(sorted(store.list(KubernetesGateway), key=lambda e: e.key)),
                   MappingProxyType({e.key.name: e for e in store.list(GatewayClass)}))


@dataclass(frozen=True)
class AmbientIndex:
    workloads: Mapping[str, WorkloadInfo]  # by uid
    services: Mapping[str, ServiceInfo]  # by "namespace/hostname"
    policies: Mapping[str, AuthzPolicy]  # by "namespace/name"
    aliases: Mapping[str, tuple[str, ...]]  # "network/IP" -> Address resource names
    service_workloads: Mapping[str, tuple[str, ...]]  # "namespace/hostname" -> workload uids
    origins: Mapping[str, tuple[str, ...]]  # resource name -> config objects it comes from
    statuses: tuple[pol.PolicyStatus, ...] = ()
    waypoints: WaypointIndex | None = None
    # (namespace, name) of a waypoint -> "namespace/hostname" of the services it serves
    waypoint_services: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def build(cls, ctx, inputs: AmbientInputs) -> AmbientIndex:
        domain, mesh = ctx.domain, ctx.mesh
        root = mesh.root_namespace
        # The default trust domain is left out of each Workload, as istiod does.
        trust_domain = "" if mesh.trust_domain == "cluster.local" else mesh.trust_domain
        cluster_id = ctx.settings.knobs.cluster_id  # CLUSTER_ID: where every discovered workload runs
        ns_labels = {name: e.obj.metadata.labels for name, e in inputs.namespaces.items()}
        service_hosts = {(ns, name): f"{name}.{ns}.svc.{domain}" for ns, name in inputs.services}
        waypoints = WaypointIndex.build(inputs.gateways, inputs.gateway_classes, inputs.namespaces,
                                        service_hosts, ctx.pods)

        # Services, by namespace: a workload is an endpoint of the services of its own namespace.
        sources: dict[str, list[ServiceSource]] = defaultdict(list)
        for e in sorted(inputs.services.values(), key=lambda e: e.key):
            sources[e.key.namespace].append(kubernetes_service(e, domain, "", waypoints))
        se_sources: dict[tuple[str, str], list[ServiceSource]] = {}
        taken = {s.info.hostname for ss in sources.values() for s in ss}
        for key, e in sorted(ctx.service_entries.items()):
            own = [s for s in service_entry_services(e, "", waypoints) if s.info.hostname not in taken]
            se_sources[key] = own
            sources[e.key.namespace].extend(own)

        # Authorization: converted AuthorizationPolicies, PeerAuthentication-derived policies.
        policies: dict[str, AuthzPolicy] = {}
        origins: dict[str, tuple[str, ...]] = {}
        statuses = []
        sent_selector: set[str] = set()
        for entries in ctx.security.authorization_policies.values():
            for e in entries:
                converted, status = pol.convert_authorization_policy(e, root)
                if status is not None:
                    statuses.append(status)
                if converted is not None:
                    policies[converted.resource_name] = converted
                    origins[converted.resource_name] = (f"AuthorizationPolicy/{e.key.namespace}/{e.key.name}",)
                    if converted.scope == "WORKLOAD_SELECTOR":
                        sent_selector.add(converted.resource_name)
        pas = ctx.security.peer_authentications
        if any(pas.values()):
            strict = pol.static_strict_policy(root)
            policies[strict.resource_name] = strict
            for entries in pas.values():
                for e in entries:
                    converted = pol.convert_peer_authentication(e, pas, root)
                    if converted is not None:
                        policies[converted.resource_name] = converted
                        origins[converted.resource_name] = (f"PeerAuthentication/{e.key.namespace}/{e.key.name}",)

        def workload_policies(namespace: str, labels) -> tuple[str, ...]:
            selected = ctx.security.for_workload(namespace, labels).authorization_policies
            names = sorted(n for e in selected if (n := f"{e.key.namespace}/{e.key.name}") in sent_selector)
            derived = pol.workload_peer_authentication_policies(pas, namespace, labels, root) if any(pas.values()) else ()
            return tuple(names) + tuple(d for d in derived if d in policies)

        def workload_waypoint(namespace: str, labels):
            wp = waypoints.for_target(namespace, labels, service=False)
            return wp.address if wp is not None else None

        workloads: dict[str, WorkloadInfo] = {}

        def add(w: WorkloadInfo | None, origin: str) -> None:
            if w is not None:
                workloads[w.uid] = w
                origins[w.uid] = (origin,)

        # Replicas share labels: which services select them is worked out once per label set.
        selected: dict[tuple[str, frozenset], list[ServiceSource]] = {}
        for (ns, name), pod in sorted(ctx.pods.items()):
            node = pod.obj.spec.node_name
            labels = pod.obj.metadata.labels
            key = (ns, frozenset(labels.items()))
            if key not in selected:
                selected[key] = selecting_services(sources.get(ns, []), labels)
            add(pod_workload(pod, namespace_labels=ns_labels.get(ns, {}), selecting=selected[key],
                             policies=workload_policies, waypoint=workload_waypoint,
                             is_waypoint_instance=waypoints.instance_of(ns, pod.obj.metadata.labels) is not None,
                             trust_domain=trust_domain, cluster_id=cluster_id,
                             locality=node_locality(inputs.nodes.get(node)) if node else None),
                f"Pod/{ns}/{name}")
        for ns, entries in sorted(ctx.workload_entries_by_ns.items()):
            for e in entries:
                add(workload_entry_workload(e, namespace_labels=ns_labels.get(ns, {}), services=sources.get(ns, []),
                                            policies=workload_policies, waypoint=workload_waypoint,
                                            trust_domain=trust_domain, cluster_id=cluster_id),
                    f"WorkloadEntry/{ns}/{e.key.name}")
        for key, e in sorted(ctx.service_entries.items()):
            for w in service_entry_workloads(e, se_sources.get(key, []), namespace_labels=ns_labels.get(key[0], {}),
                                             policies=workload_policies, waypoint=workload_waypoint,
                                             trust_domain=trust_domain, cluster_id=cluster_id):
                add(w, f"ServiceEntry/{key[0]}/{key[1]}")

        services: dict[str, ServiceInfo] = {}
        by_waypoint: dict[tuple[str, str], list[str]] = defaultdict(list)
        for ss in sources.values():
            for s in ss:
                services[s.info.resource_name] = s.info
                origins[s.info.resource_name] = (s.origin,)
                if s.waypoint is not None:
                    by_waypoint[(s.waypoint.namespace, s.waypoint.name)].append(s.info.resource_name)
        aliases: dict[str, list[str]] = defaultdict(list)
        service_workloads: dict[str, list[str]] = defaultdict(list)
        for uid, w in workloads.items():
            for a in w.aliases:
                aliases[a].append(uid)
            for key, _ in w.services:
                service_workloads[key].append(uid)
        for key, s in services.items():
            for a in s.aliases:
                aliases[a].append(key)
        return cls(MappingProxyType(workloads), MappingProxyType(services), MappingProxyType(policies),
                   MappingProxyType({k: tuple(v) for k, v in aliases.items()}),
                   MappingProxyType({k: tuple(sorted(v)) for k, v in service_workloads.items()}),
                   MappingProxyType(origins),
                   tuple(sorted(statuses, key=lambda s: (s.namespace, s.name))), waypoints,
                   MappingProxyType({k: tuple(sorted(v)) for k, v in by_waypoint.items()}))

    # --- lookups --------------------------------------------------------------------------------
    def resolve(self, name: str) -> tuple[str, ...]:
        """The Address resources an on-demand name stands for: a workload uid or service key
        itself, or a "network/IP" alias, where a service VIP brings the service's workloads too."""
        if name in self.workloads:
            return (name,)
        if name in self.services:
            return (name, *self.service_workloads.get(name, ()))
        out: list[str] = []
        for target in self.aliases.get(name, ()):
            out.append(target)
            if target in self.services:
                out.extend(self.service_workloads.get(target, ()))
        return tuple(dict.fromkeys(out))


def ambient_index(ctx) -> AmbientIndex:
    """The index of this PushContext, built on first use and kept for the context's lifetime."""
    ctx.note_ambient()
    memo = ctx._memo  # the context's per-push store for derived values
    index = memo.get("ambient")
    if index is None:
        index = memo["ambient"] = AmbientIndex.build(ctx, ctx.ambient)
    return index
