"""EDS: ClusterLoadAssignments grouped by locality.

Every locality carries `load_balancing_weight`: grpcio's xDS client ACKs a CLA without it and
then fails every RPC, and Envoy ignores it unless locality-weighted LB is on, so it is always set.
With locality load balancing (`lb`), groups get the client's priorities or weights
(pilot/networking/locality.py).
"""

from __future__ import annotations

from collections import defaultdict

from envoy.config.core.v3 import address_pb2, base_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from google.protobuf import struct_pb2, wrappers_pb2

from pilot.model.locality import LocalityLb
from pilot.model.networks import NetworkView, only_mtls, split_horizon
from pilot.model.services import EndpointAddress, Locality
from pilot.networking import locality as loc
from pilot.networking.tls import TRANSPORT_SOCKET_MATCH

_MAX = 2**32 - 1


def cluster_load_assignment(cluster_name: str, endpoints: tuple[EndpointAddress, ...],
                            lb: LocalityLb | None = None, view: NetworkView | None = None,
                            sni_dnat: str = "") -> endpoint_pb2.ClusterLoadAssignment:
    """`view`: the client's network (split-horizon EDS, pilot/model/networks.py), None when the
    mesh has no network gateways. `sni_dnat`: for a router's `outbound_.PORT_.SUBSET_.HOST` cluster,
    how the mesh sends to its endpoints (NetworkView.mtls): only those that take mTLS are offered."""
    by_locality: dict[Locality, list[EndpointAddress]] = defaultdict(list)
    for ep in endpoints:
        if ep.address or view is not None:  # address-less: only a gateway can stand in for it
            by_locality[ep.locality].append(ep)
    if view is not None:
        by_locality = defaultdict(list, {k: split for k, v in by_locality.items() if (split := split_horizon(v, view))})
    if sni_dnat:
        by_locality = defaultdict(list, {k: kept for k, v in by_locality.items() if (kept := only_mtls(v, sni_dnat))})
    groups = [loc.Group(locality, by_locality[locality], sum(ep.weight for ep in by_locality[locality]))
              for locality in sorted(by_locality, key=Locality.label)]
    if lb is not None:
        groups = loc.apply(groups, lb)
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster_name)
    for g in groups:
        locality = g.locality
        group = cla.endpoints.add(
            locality=base_pb2.Locality(region=locality.region, zone=locality.zone, sub_zone=locality.subzone),
            load_balancing_weight=wrappers_pb2.UInt32Value(value=min(g.weight, _MAX)),
            priority=g.priority,
        )
        for ep in g.endpoints:
            lbe = endpoint_components_pb2.LbEndpoint(
                endpoint=endpoint_components_pb2.Endpoint(address=address_pb2.Address(
                    socket_address=address_pb2.SocketAddress(address=ep.address, port_value=ep.port))),
                health_status=health_check_pb2.HEALTHY if ep.ready else health_check_pb2.UNHEALTHY,
                load_balancing_weight=wrappers_pb2.UInt32Value(value=ep.weight),
            )
            for extra in ep.extra_addresses:  # ISTIO_DUAL_STACK: the Pod's other family
                lbe.endpoint.additional_addresses.add().address.socket_address.CopyFrom(
                    address_pb2.SocketAddress(address=extra, port_value=ep.port))
            if ep.tls_mode:
                # What auto mTLS clusters' transport_socket_matches select on.
                lbe.metadata.filter_metadata[TRANSPORT_SOCKET_MATCH].CopyFrom(_tls_mode(ep.tls_mode))
            group.lb_endpoints.append(lbe)
    return cla


def _tls_mode(mode: str) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update({"tlsMode": mode})
    return s
