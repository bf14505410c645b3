"""Builders for WDS: a WorkloadInfo or ServiceInfo in, an istio.workload.Address out (pure)."""

from __future__ import annotations

import ipaddress

from pilot.gen.workloadapi import workload_pb2 as wapi
from pilot.model.ambient.types import GatewayAddr, PortMap, ServiceInfo, WorkloadInfo


def _ip(text: str) -> bytes:
    return ipaddress.ip_address(text).packed


def _ports(ports: PortMap) -> list[wapi.Port]:
    return [wapi.Port(service_port=sp, target_port=tp) for sp, tp in ports]


def gateway_address(g: GatewayAddr) -> wapi.GatewayAddress:
    if g.hostname:
        return wapi.GatewayAddress(hostname=wapi.NamespacedHostname(namespace=g.namespace, hostname=g.hostname),
                                   hbone_mtls_port=g.port)
    return wapi.GatewayAddress(address=wapi.NetworkAddress(network=g.network, address=_ip(g.ip)),
                               hbone_mtls_port=g.port)


def workload_address(w: WorkloadInfo) -> wapi.Address:
    wl = wapi.Workload(
        uid=w.uid, name=w.name, namespace=w.namespace, addresses=[_ip(a) for a in w.addresses],
        hostname=w.hostname, network=w.network,
        tunnel_protocol=wapi.HBONE if w.hbone else wapi.NONE, native_tunnel=w.native_tunnel,
        trust_domain=w.trust_domain, service_account=w.service_account, node=w.node,
        canonical_name=w.canonical_name, canonical_revision=w.canonical_revision,
        workload_type=w.workload_type, workload_name=w.workload_name,
        authorization_policies=list(w.authorization_policies),
        status=wapi.HEALTHY if w.healthy else wapi.UNHEALTHY, cluster_id=w.cluster_id)
    if w.waypoint is not None:
        wl.waypoint.CopyFrom(gateway_address(w.waypoint))
    for key, ports in w.services:
        wl.services[key].ports.extend(_ports(ports))
    if w.locality is not None:
        wl.locality.CopyFrom(wapi.Locality(region=w.locality[0], zone=w.locality[1], subzone=w.locality[2]))
    return wapi.Address(workload=wl)


def service_address(s: ServiceInfo) -> wapi.Address:
    svc = wapi.Service(
        name=s.name, namespace=s.namespace, hostname=s.hostname,
        addresses=[wapi.NetworkAddress(network=n, address=_ip(ip)) for n, ip in s.addresses],
        ports=_ports(s.ports), subject_alt_names=list(s.subject_alt_names))
    if s.waypoint is not None:
        svc.waypoint.CopyFrom(gateway_address(s.waypoint))
    return wapi.Address(service=svc)
