"""Pods, WorkloadEntries and ServiceEntry endpoints as WDS Workloads (istiod's ambient/workloads.go).

Which workloads ztunnel tunnels to (tunnel_protocol HBONE): istio-cni marks a pod it captured with
`ambient.istio.io/redirection: enabled`, and pods labelled `networking.istio.io/tunnel: http`
speak HBONE themselves. There is no istio-cni here, so its decision is taken from the labels it
reads: a pod labelled `istio.io/dataplane-mode=ambient`, or in a namespace labelled so, unless the
pod says `istio.io/dataplane-mode: none` or runs a sidecar (`sidecar.istio.io/status`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from functools import lru_cache

from pilot.config.core import Node, Pod
from pilot.config.networking import ServiceEntry, WorkloadEntry
from pilot.model.ambient.services import ServiceSource
from pilot.model.ambient.types import (
    CRONJOB,
    DEPLOYMENT,
    JOB,
    POD,
    GatewayAddr,
    PortMap,
    WorkloadInfo,
)
from pilot.model.store import Entry

DATAPLANE_MODE = "istio.io/dataplane-mode"
REDIRECTION = "ambient.istio.io/redirection"
TUNNEL_LABEL = "networking.istio.io/tunnel"
SIDECAR_STATUS = "sidecar.istio.io/status"
NETWORK_LABEL = "topology.istio.io/network"
_CRONJOB_NAME = re.compile(r"^(.+)-\d{8,10}$")  # a Job a CronJob created: NAME-<schedule time>

Policies = Callable[[str, Mapping[str, str]], tuple[str, ...]]  # (namespace, labels) -> policy names
Waypoint = Callable[[str, Mapping[str, str]], GatewayAddr | None]  # workload waypoint, if any


def canonical(labels: Mapping[str, str], workload_name: str) -> tuple[str, str]:
    name = (labels.get("service.istio.io/canonical-name") or labels.get("app.kubernetes.io/name")
            or labels.get("app") or workload_name)
    revision = (labels.get("service.istio.io/canonical-revision") or labels.get("app.kubernetes.io/version")
                or labels.get("version") or "latest")
    return name, revision


def tunnel(labels: Mapping[str, str], annotations: Mapping[str, str],
           namespace_labels: Mapping[str, str]) -> tuple[bool, bool]:
    """(HBONE, native tunnel)."""
    if labels.get(TUNNEL_LABEL) == "http":
        return True, True
    if annotations.get(REDIRECTION) == "enabled":
        return True, False
    mode = labels.get(DATAPLANE_MODE)
    if mode == "ambient":
        return True, False
    if mode is None and namespace_labels.get(DATAPLANE_MODE) == "ambient" and SIDECAR_STATUS not in annotations:
        return True, False
    return False, False


def workload_name_and_type(pod) -> tuple[str, str]:
    """The controller that owns the pod, as istiod's GetDeployMetaFromPod reads it."""
    meta = pod.metadata
    owner = next((o for o in meta.owner_references if o.controller), None) or \
        (meta.owner_references[0] if meta.owner_references else None)
    if owner is None:
        return meta.name, POD
    if owner.kind == "ReplicaSet":
        pth = meta.labels.get("pod-template-hash")
        if pth and owner.name.endswith("-" + pth):
            return owner.name[:-len(pth) - 1], DEPLOYMENT
        return meta.name, POD
    if owner.kind == "Job":
        m = _CRONJOB_NAME.match(owner.name)
        return (m.group(1), CRONJOB) if m else (owner.name, JOB)
    return meta.name, POD


@lru_cache(maxsize=65536)
def _valid_ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _pod_ports(pod, svc: ServiceSource) -> PortMap:
    out = []
    names = {sp: target_name for sp, _, target_name in svc.port_names}
    for sp, tp in svc.info.ports:
        target_name = names.get(sp, "")
        if target_name:
            tp = next((cp.container_port for c in pod.spec.containers for cp in c.ports
                       if cp.name == target_name and cp.protocol == "TCP"), 0)
            if not tp:
                continue  # the pod does not serve this named port
        out.append((sp, tp))
    return tuple(out)


def _entry_ports(ports: Mapping[str, int], svc: ServiceSource) -> PortMap:
    """A WorkloadEntry's `ports` override by name: for a Service, its named targetPort; for a
    ServiceEntry, the port's own name."""
    out = []
    names = {sp: (port_name, target_name) for sp, port_name, target_name in svc.port_names}
    for sp, tp in svc.info.ports:
        port_name, target_name = names.get(sp, ("", ""))
        if svc.kind == "Service":
            if target_name:
                if target_name not in ports:
                    continue
                tp = ports[target_name]
        elif port_name in ports:
            tp = ports[port_name]
        out.append((sp, tp))
    return tuple(out)


def _locality(text: str) -> tuple[str, str, str] | None:
    parts = (text.split("/") + ["", "", ""])[:3] if text else ["", "", ""]
    return (parts[0], parts[1], parts[2]) if any(parts) else None


def node_locality(node: Entry[Node] | None) -> tuple[str, str, str] | None:
    if node is None:
        return None
    labels = node.obj.metadata.labels
    loc = (labels.get("topology.kubernetes.io/region", ""), labels.get("topology.kubernetes.io/zone", ""),
           labels.get("topology.istio.io/subzone", ""))
    return loc if any(loc) else None


def selecting_services(services: list[ServiceSource], labels: Mapping[str, str]) -> list[ServiceSource]:
    """The services of a namespace whose selector picks these labels: Kubernetes Services first."""
    return [s for s in services if s.kind == "Service" and s.selects(labels)] + \
        [s for s in services if s.kind == "ServiceEntry" and s.selects(labels)]


def pod_workload(pod_entry: Entry[Pod], *, namespace_labels: Mapping[str, str], selecting: list[ServiceSource],
                 policies: Policies, waypoint: Waypoint, is_waypoint_instance: bool, trust_domain: str,
                 cluster_id: str, locality: tuple[str, str, str] | None) -> WorkloadInfo | None:
    """None for pods ztunnel cannot reach: not running (or pending), no valid IP, host network.
    `selecting`: the services whose selector picks the pod (selecting_services)."""
    pod = pod_entry.obj
    phase = pod.status.phase
    if phase not in ("Running", "Pending", "") or pod.spec.host_network:
        return None
    ip = _valid_ip(pod.status.pod_ip)
    if ip is None:
        return None
    meta = pod.metadata
    ns, name, labels = meta.namespace, meta.name, meta.labels
    hbone, native = tunnel(labels, meta.annotations, namespace_labels)
    wl_name, wl_type = workload_name_and_type(pod)
    cname, crev = canonical(labels, wl_name)
    return WorkloadInfo(
        uid=f"{cluster_id}//Pod/{ns}/{name}", name=name, namespace=ns, addresses=(ip,),
        network=labels.get(NETWORK_LABEL) or namespace_labels.get(NETWORK_LABEL, ""),
        hbone=hbone, native_tunnel=native, trust_domain=trust_domain,
        service_account=pod.spec.service_account_name,
        waypoint=None if is_waypoint_instance else waypoint(ns, labels),
        node=pod.spec.node_name,
        canonical_name=cname, canonical_revision=crev, workload_type=wl_type, workload_name=wl_name,
        services=tuple(sorted((s.info.resource_name, _pod_ports(pod, s)) for s in selecting)),
        authorization_policies=policies(ns, labels),
        healthy=pod.status.ready,
        cluster_id=cluster_id, locality=locality)


def workload_entry_workload(entry: Entry[WorkloadEntry], *, namespace_labels: Mapping[str, str], services: list[ServiceSource],
                            policies: Policies, waypoint: Waypoint, trust_domain: str,
                            cluster_id: str) -> WorkloadInfo | None:
    we = entry.obj
    spec = we.spec
    ns, name = entry.key.namespace, entry.key.name
    labels = {**we.metadata.labels, **spec.labels}
    ip = _valid_ip(spec.address)
    if ip is None:
        return None  # DNS-named WorkloadEntries are not resolved for ztunnel (istiod skips them too)
    selecting = [s for s in services if s.selects(labels)]
    hbone, native = tunnel(labels, we.metadata.annotations, {})
    cname, crev = canonical(labels, name)
    return WorkloadInfo(
        uid=f"{cluster_id}/networking.istio.io/WorkloadEntry/{ns}/{name}", name=name, namespace=ns,
        addresses=(ip,), network=spec.network or namespace_labels.get(NETWORK_LABEL, ""), hbone=hbone,
        native_tunnel=native, trust_domain=trust_domain, service_account=spec.service_account,
        waypoint=waypoint(ns, labels), canonical_name=cname, canonical_revision=crev, workload_type=POD,
        workload_name=name,
        services=tuple(sorted((s.info.resource_name, _entry_ports(spec.ports, s)) for s in selecting)),
        authorization_policies=policies(ns, labels), healthy=True, cluster_id=cluster_id,
        locality=_locality(spec.locality))


def service_entry_workloads(entry: Entry[ServiceEntry], own_services: list[ServiceSource], *,
                            namespace_labels: Mapping[str, str], policies: Policies, waypoint: Waypoint,
                            trust_domain: str, cluster_id: str) -> list[WorkloadInfo]:
    """Inline `endpoints`; a DNS ServiceEntry without endpoints or selector gets one workload per
    host, named by the host."""
    se = entry.obj
    spec = se.spec
    ns, name = entry.key.namespace, entry.key.name
    implicit = not spec.endpoints and spec.resolution in ("DNS", "DNS_ROUND_ROBIN") and spec.workload_selector is None
    if implicit:
        endpoints = [(s.info.hostname, dict[str, int](), "", "", "", [s]) for s in own_services]
    else:
        endpoints = [(ep.address, ep.ports, ep.service_account, ep.network, ep.locality, own_services)
                     for ep in spec.endpoints]
    cname, crev = canonical(se.metadata.labels, name)
    hbone, native = tunnel(se.metadata.labels, se.metadata.annotations, {})
    out = []
    for address, ports, sa, network, locality, services in endpoints:
        if address.startswith("unix://"):
            continue
        ip = _valid_ip(address)
        out.append(WorkloadInfo(
            uid=f"{cluster_id}/networking.istio.io/ServiceEntry/{ns}/{name}/{address}", name=name, namespace=ns,
            addresses=(ip,) if ip else (), hostname="" if ip else address,
            network=network or namespace_labels.get(NETWORK_LABEL, ""), hbone=hbone, native_tunnel=native,
            trust_domain=trust_domain, service_account=sa,
            waypoint=None if implicit else waypoint(ns, se.metadata.labels),
            canonical_name=cname, canonical_revision=crev, workload_type=POD, workload_name=name,
            services=tuple(sorted((s.info.resource_name, _entry_ports(ports, s)) for s in services)),
            authorization_policies=policies(ns, se.metadata.labels), healthy=True, cluster_id=cluster_id,
            locality=_locality(locality)))
    return out
