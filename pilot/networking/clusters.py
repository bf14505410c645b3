"""CDS: outbound clusters per service port, plus BlackHoleCluster and PassthroughCluster."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import protocol_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import struct_pb2

from pilot.config.networking import DestinationRule
from pilot.model.locality import LocalityLb, in_force
from pilot.model.mesh_settings import ClusterSettings
from pilot.model.mtls import MeshTls
from pilot.model.networks import NetworkView
from pilot.model.services import EndpointAddress, Locality, MeshService, ServicePort
from pilot.model.store import Entry
from pilot.networking import metadata, names, tls
from pilot.networking.endpoints import cluster_load_assignment
from pilot.networking.protos import ads_config_source, duration, pack
from pilot.networking.traffic_policy import (
    DEFAULT_LB_POLICY,
    apply_default_circuit_breakers,
    apply_h2_upgrade,
    apply_policy,
    apply_proxy_protocol,
    effective_policy,
    should_h2_upgrade,
)

_HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def dns_lookup_family(families: tuple[bool, bool], dual_stack: bool) -> str:
    """istiod's SelectDNSLookupFamily for a proxy with these (IPv4, IPv6) address families:
    IPv6 only resolves AAAA (V6_ONLY); both, with ISTIO_DUAL_STACK, both (ALL: Envoy's Happy
    Eyeballs picks); else A records only (V4_ONLY: IPv4, or both without the knob)."""
    if families == (False, True):
        return "V6_ONLY"
    return "ALL" if dual_stack and families == (True, True) else "V4_ONLY"


def outbound_cluster(svc: MeshService, port: ServicePort, settings: ClusterSettings,
                     destination_rule: Entry[DestinationRule] | None = None, subset: str = "",
                     dns_targets: tuple[EndpointAddress, ...] = (),
                     mesh_tls: MeshTls | None = None, locality_lb: LocalityLb | None = None,
                     downstream_protocol: bool = False, network: NetworkView | None = None) -> cluster_pb2.Cluster:
    """`destination_rule` is the DestinationRule in force for this client (its traffic policy and,
    for a subset cluster, the subset's). ServiceEntries with DNS resolution resolve
    `dns_targets` in Envoy; with resolution NONE traffic goes where the client sent it.
    `mesh_tls`: Istio mTLS toward this cluster (see pilot.model.mtls), None for none.
    `locality_lb`: the client's locality load balancing of a DNS cluster's own endpoints.
    `network`: the client's network, for a DNS cluster's own endpoints (split horizon).
    `downstream_protocol`: a sniffed port seen by a sidecar: requests go upstream in the HTTP
    version they arrived in (h2c stays HTTP/2), as istiod's setUseDownstreamProtocol.
    (Proxyless gRPC clients get pilot.networking.grpc.cluster instead.)"""
    name = names.outbound_cluster_name(port.port, svc.hostname, subset)
    c = cluster_pb2.Cluster(
        name=name,
        connect_timeout=duration(settings.connect_timeout_s),
        lb_policy=DEFAULT_LB_POLICY,
    )
    if svc.resolution in ("DNS", "DNS_ROUND_ROBIN"):
        c.type = cluster_pb2.Cluster.STRICT_DNS if svc.resolution == "DNS" else cluster_pb2.Cluster.LOGICAL_DNS
        c.dns_lookup_family = cluster_pb2.Cluster.DnsLookupFamily.Value(settings.dns_lookup_family)
        targets = dns_targets or (EndpointAddress(svc.external_name or svc.hostname, port.port, Locality(), True),)
        if svc.resolution == "DNS_ROUND_ROBIN":
            targets = targets[:1]  # LOGICAL_DNS takes exactly one host
        c.load_assignment.CopyFrom(cluster_load_assignment(name, targets, locality_lb, network))
    elif svc.resolution == "NONE":
        c.type = cluster_pb2.Cluster.ORIGINAL_DST
        c.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
    else:
        c.type = cluster_pb2.Cluster.EDS
        c.eds_cluster_config.eds_config.CopyFrom(ads_config_source())
        c.eds_cluster_config.service_name = name
    if port.protocol.is_http2:
        opts = http_protocol_options_pb2.HttpProtocolOptions()
        opts.explicit_http_config.http2_protocol_options.CopyFrom(protocol_pb2.Http2ProtocolOptions())
        c.typed_extension_protocol_options[_HTTP_OPTIONS_KEY].CopyFrom(pack(opts))
    elif downstream_protocol:
        use_downstream_protocol(c)
    apply_default_circuit_breakers(c)  # istiod's, until a connection pool says otherwise
    sni = tls.outbound_sni(port.port, subset, svc.hostname)
    dr_path, dr_tls = "", None
    policy = None
    if destination_rule is not None:
        policy = effective_policy(destination_rule.obj.spec, subset, port.port)
    # istiod's order: the HTTP/2 upgrade first, so the pool's HTTP/2 settings find it.
    http2 = port.protocol.is_http2
    if should_h2_upgrade(policy["connection_pool"] if policy else None, settings.h2_upgrade, port.protocol.is_http):
        apply_h2_upgrade(c)
        http2 = True
    if destination_rule is not None and policy is not None:
        apply_policy(c, policy, svc.hostname, http2)
        dr_tls = policy["tls"]
        key = destination_rule.key
        dr_path = metadata.config_path(key.kind, key.namespace, key.name)
        if dr_tls is not None and dr_tls.mode == "ISTIO_MUTUAL" and dr_tls.sni:
            sni = dr_tls.sni  # istiod: a DestinationRule's sni wins for ISTIO_MUTUAL too
    lb_setting = in_force(settings.locality, policy["load_balancer"] if policy is not None else None,
                          policy["outlier_detection"] if policy is not None else None)
    if lb_setting is not None and (lb_setting.distribute or lb_setting.failover or lb_setting.failover_priority):
        # istiod's condition: the localities' weights count only with locality-weighted LB on
        # (outlier detection is implied for failover: in_force returns nothing without it).
        c.common_lb_config.locality_weighted_lb_config.SetInParent()
    if mesh_tls is not None:
        apply_mesh_tls(c, mesh_tls, sni, http2)  # ALPN h2 for an upgraded cluster too, as istiod
    if policy is not None and policy["proxy_protocol"] is not None:
        apply_proxy_protocol(c, policy["proxy_protocol"])  # around whichever TLS the cluster got
    # What istioctl's DESTINATION RULE column and telemetry read (pilot.networking.metadata).
    # A ServiceEntry host's short name is the host itself in istiod.
    short = svc.hostname if svc.kind == "ServiceEntry" else svc.name
    metadata.set_cluster_metadata(c.metadata, svc.hostname, short, svc.namespace, dr_path, subset,
                                  dr_tls.mode if dr_tls is not None else None)
    if svc.mesh_external and not subset:
        # istiod's applyDestinationRule marks only the default cluster (`istio.external: true`),
        # which telemetry and istioctl read to tell traffic leaving the mesh.
        c.metadata.filter_metadata[metadata.ISTIO].fields["external"].bool_value = True
    return c


def use_downstream_protocol(c: cluster_pb2.Cluster) -> None:
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    cfg = opts.use_downstream_protocol_config
    cfg.http_protocol_options.SetInParent()
    cfg.http2_protocol_options.SetInParent()
    c.typed_extension_protocol_options[_HTTP_OPTIONS_KEY].CopyFrom(pack(opts))


def apply_mesh_tls(c: cluster_pb2.Cluster, mesh_tls: MeshTls, sni: str, http2: bool) -> None:
    socket = tls.tls_socket(tls.istio_upstream_tls(sni, mesh_tls.sans, http2))
    if not mesh_tls.auto:
        c.transport_socket.CopyFrom(socket)
        return
    # Auto mTLS: EDS marks endpoints that run a sidecar; the rest are reached in plaintext.
    match = struct_pb2.Struct()
    match.update({"tlsMode": "istio"})
    c.transport_socket_matches.add(name="tlsMode-istio", match=match, transport_socket=socket)
    c.transport_socket_matches.add(name="tlsMode-disabled", match=struct_pb2.Struct(),
                                   transport_socket=tls.raw_socket())


def blackhole_cluster(settings: ClusterSettings) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(
        name=names.BLACKHOLE_CLUSTER,
        type=cluster_pb2.Cluster.STATIC,
        connect_timeout=duration(settings.connect_timeout_s),
    )


def sni_dnat_cluster(svc: MeshService, port: ServicePort, settings: ClusterSettings,
                     destination_rule: Entry[DestinationRule] | None = None, subset: str = "",
                     dns_targets: tuple[EndpointAddress, ...] = ()) -> cluster_pb2.Cluster:
    """A router's `outbound_.PORT_.SUBSET_.HOST` cluster (istiod's sni-dnat cluster): the
    outbound cluster's discovery and traffic policy, with no TLS of its own, because an
    AUTO_PASSTHROUGH server forwards the client's mTLS to it untouched."""
    c = outbound_cluster(svc, port, settings, destination_rule, subset, dns_targets)
    name = names.sni_dnat_cluster_name(port.port, svc.hostname, subset)
    c.name = name
    if c.type == cluster_pb2.Cluster.EDS:
        c.eds_cluster_config.service_name = name
    elif c.HasField("load_assignment"):
        c.load_assignment.cluster_name = name
    c.ClearField("transport_socket")
    c.ClearField("transport_socket_matches")
    c.typed_extension_protocol_options.pop(_HTTP_OPTIONS_KEY, None)  # raw TCP: no HTTP upstream
    return c


def passthrough_cluster(settings: ClusterSettings) -> cluster_pb2.Cluster:
    c = cluster_pb2.Cluster(
        name=names.PASSTHROUGH_CLUSTER,
        type=cluster_pb2.Cluster.ORIGINAL_DST,
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
        connect_timeout=duration(settings.connect_timeout_s),
    )
    apply_default_circuit_breakers(c)  # istiod's buildDefaultPassthroughCluster
    return c
