"""Networks of a multi-network mesh (one cluster, several networks), as istiod's NetworkManager
and split-horizon EDS see them (pure: no I/O, no DNS).

Which network an endpoint is on (istiod's order): a WorkloadEntry's (or ServiceEntry endpoint's)
`network`, else the workload's `topology.istio.io/network` label, else that label on the system
namespace, else MeshNetworks (`fromRegistry` naming this cluster, then `fromCidr`). A proxy's
network is its node metadata NETWORK (ISTIO_META_NETWORK).

Network gateways come from MeshNetworks (`address`, or `registryServiceName` for a network whose
endpoints come `fromRegistry` this cluster) and from Services labelled `topology.istio.io/network`
(port: label `networking.istio.io/gatewayPort`, else 15443, and only if the Service has it); a
gateway's addresses are the Service's LoadBalancer ingress IPs and externalIPs. Hostname
addresses are not resolved here (istiod resolves them with RESOLVE_HOSTNAME_GATEWAYS): they
are left out with a warning.

Multi-network is in force once any gateway is known (istiod's IsMultiNetworkEnabled); only then
does EDS depend on the client's network (`NetworkView`), so until then every proxy shares bytes.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from pilot import logging as plog
from pilot.config.core import Namespace, Service
from pilot.config.mesh_networks import NO_MESH_NETWORKS, MeshNetworks
from pilot.config.networking.validation import is_ip
from pilot.model.services import EndpointAddress
from pilot.model.store import Entry

NETWORK_LABEL = "topology.istio.io/network"
GATEWAY_PORT_LABEL = "networking.istio.io/gatewayPort"
DEFAULT_GATEWAY_PORT = 15443  # istiod's DefaultNetworkGatewayPort
ISTIO_TLS_MODE = "istio"
_MAX = 2**32 - 1

log = plog.get("networks")


@dataclass(frozen=True, slots=True, order=True)
class NetworkGateway:
    address: str
    port: int
    network: str
    cluster: str = ""  # "" for MeshNetworks `address` gateways (istiod has no cluster for them)


@dataclass(frozen=True)
class NetworkIndex:
    """What split-horizon EDS needs to know of the mesh's networks, compared by value so an
    unchanged index keeps EDS cache keys equal across pushes."""

    gateways: tuple[NetworkGateway, ...] = ()
    cluster_id: str = "Kubernetes"
    system_network: str = ""  # the system namespace's topology.istio.io/network label
    registry_network: str = ""  # MeshNetworks: the network whose endpoints come fromRegistry this cluster
    cidrs: tuple[tuple[str, str], ...] = ()  # MeshNetworks fromCidr: (CIDR, network), in config order
    # derived, for lookups
    _by_network: Mapping[str, tuple[NetworkGateway, ...]] = field(default_factory=dict, compare=False, repr=False)
    _by_network_cluster: Mapping[tuple[str, str], tuple[NetworkGateway, ...]] = field(
        default_factory=dict, compare=False, repr=False)
    _nets: tuple = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        by_net: dict[str, list[NetworkGateway]] = {}
        by_nc: dict[tuple[str, str], list[NetworkGateway]] = {}
        for g in sorted(self.gateways):
            by_net.setdefault(g.network, []).append(g)
            by_nc.setdefault((g.network, g.cluster), []).append(g)
        object.__setattr__(self, "_by_network", {k: tuple(v) for k, v in by_net.items()})
        object.__setattr__(self, "_by_network_cluster", {k: tuple(v) for k, v in by_nc.items()})
        object.__setattr__(self, "_nets", tuple((ipaddress.ip_network(c, strict=False), n) for c, n in self.cidrs))

    @property
    def multi_network(self) -> bool:
        return bool(self.gateways)

    @property
    def scale_factor(self) -> int:
        """istiod's GetLBWeightScaleFactor: the least common multiple of the gateway counts per
        network and per (network, cluster), so an endpoint's weight splits evenly over them."""
        counts = [len(v) for v in self._by_network.values()] + [len(v) for v in self._by_network_cluster.values()]
        return math.lcm(*counts) if counts else 1

    def gateways_for(self, network: str) -> tuple[NetworkGateway, ...]:
        """istiod's selectNetworkGateways: this cluster's gateways of that network, else all of it
        (endpoints here are all of this one cluster)."""
        return self._by_network_cluster.get((network, self.cluster_id)) or self._by_network.get(network, ())

    def network_of(self, address: str, own: str) -> str:
        """An endpoint's network: `own` (its `network` field or label), else the defaults."""
        if own:
            return own
        if self.system_network:
            return self.system_network
        if self.registry_network:
            return self.registry_network
        if self._nets and address:
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                return ""
            for net, name in self._nets:
                if ip.version == net.version and ip in net:
                    return name
        return ""


NO_NETWORKS = NetworkIndex()


def build_index(services: Iterable[Entry[Service]], mesh_networks: MeshNetworks = NO_MESH_NETWORKS,
                system_namespace: Entry[Namespace] | None = None, cluster_id: str = "Kubernetes",
                domain: str = "cluster.local") -> NetworkIndex:
    gateways: set[NetworkGateway] = set()
    registry_network = ""
    cidrs: list[tuple[str, str]] = []
    # registryServiceName FQDN -> [(network, port)]: only for networks fromRegistry this cluster
    by_service: dict[str, list[tuple[str, int]]] = {}
    for name in sorted(mesh_networks.networks):
        net = mesh_networks.networks[name]
        from_here = any(e.from_registry == cluster_id for e in net.endpoints)
        cidrs.extend((e.from_cidr, name) for e in net.endpoints if e.from_cidr)
        if from_here and not registry_network:
            registry_network = name
        for gw in net.gateways:
            if gw.address:
                if is_ip(gw.address):
                    gateways.add(NetworkGateway(gw.address, gw.port, name))
                else:
                    log.warning("meshNetworks gateway address is not an IP; hostnames are not resolved, left out",
                                network=name, address=gw.address)
            elif from_here:
                by_service.setdefault(gw.registry_service_name, []).append((name, gw.port))
    for e in services:
        svc = e.obj
        fqdn = f"{svc.metadata.name}.{svc.metadata.namespace}.svc.{domain}"
        label_net = svc.metadata.labels.get(NETWORK_LABEL, "")
        wanted: list[tuple[str, int]]
        if label_net:
            port = _gateway_port(svc)
            if not any(p.port == port for p in svc.spec.ports):
                log.warning("Service is labelled as a network gateway but has no such port; not a gateway",
                            service=f"{svc.metadata.namespace}/{svc.metadata.name}", port=port)
                continue
            wanted = [(label_net, port)]
        else:
            wanted = by_service.get(fqdn, [])
        if not wanted:
            continue
        addresses = [i.ip for i in svc.status.load_balancer.ingress if i.ip] if svc.spec.type == "LoadBalancer" else []
        addresses += list(svc.spec.external_ips)
        for a in dict.fromkeys(addresses):
            if not is_ip(a):
                continue
            for network, port in wanted:
                gateways.add(NetworkGateway(a, port, network, cluster_id))
    system_network = system_namespace.obj.metadata.labels.get(NETWORK_LABEL, "") if system_namespace else ""
    return NetworkIndex(tuple(sorted(gateways)), cluster_id, system_network, registry_network, tuple(cidrs))


def may_be_gateway(svc: Service, mesh_networks: MeshNetworks, domain: str = "cluster.local") -> bool:
    """Whether build_index could read this Service's status (its load balancer addresses):
    labelled as a network's gateway, or named by a meshNetworks gateway's registryServiceName.
    Other Services' status changes generate nothing (pilot/model/events.py pushes none)."""
    if svc.metadata.labels.get(NETWORK_LABEL):
        return True
    fqdn = f"{svc.metadata.name}.{svc.metadata.namespace}.svc.{domain}"
    return any(gw.registry_service_name == fqdn for net in mesh_networks.networks.values() for gw in net.gateways)


def _gateway_port(svc: Service) -> int:
    text = svc.metadata.labels.get(GATEWAY_PORT_LABEL, "")
    if text:
        try:
            return int(text)
        except ValueError:
            log.warning("bad gateway port label; using the default", label=GATEWAY_PORT_LABEL, value=text,
                        service=f"{svc.metadata.namespace}/{svc.metadata.name}", default=DEFAULT_GATEWAY_PORT)
    return DEFAULT_GATEWAY_PORT


@dataclass(frozen=True, slots=True)
class NetworkView:
    """What one cluster's endpoints look like from a client's network (an EDS builder input,
    hence a cache-key part): the index, the client's network, and whether the cluster sends
    Istio mTLS to an endpoint (`mtls`: "always" when a DestinationRule says ISTIO_MUTUAL,
    "never" when it sets another mode or mTLS is off for the destination, "auto" to follow the
    endpoint's tlsMode), since only mTLS can cross a gateway: its SNI is the route."""

    index: NetworkIndex
    network: str
    mtls: str = "auto"

    def mtls_to(self, ep: EndpointAddress) -> bool:
        return self.mtls == "always" or (self.mtls == "auto" and ep.tls_mode == ISTIO_TLS_MODE)


def split_horizon(endpoints: list[EndpointAddress], view: NetworkView) -> list[EndpointAddress]:
    """istiod's EndpointsByNetworkFilter for sidecars, over one locality's endpoints: those the
    client reaches directly stay (weights scaled); those on another network that has gateways
    become those gateways, each carrying the sum of the weights it stands for (mTLS endpoints
    only: others are dropped). An endpoint of a network without gateways is sent as it is, as
    istiod does for sidecars (it may be routable); one without an address is then dropped."""
    index = view.index
    scale = index.scale_factor
    out: list[EndpointAddress] = []
    weights: dict[NetworkGateway, int] = {}
    for ep in endpoints:
        network = index.network_of(ep.address, ep.network)
        gateways = index.gateways_for(network) if network else ()
        weight = min(max(ep.weight, 1) * scale, _MAX)
        # A client without a network reaches networked endpoints that have gateways through them
        # (istiod's forceGateway); otherwise "" on either side is the same network.
        force_gateway = not view.network and bool(network) and bool(gateways)
        if not force_gateway and (not network or network == view.network or not gateways):
            if ep.address:
                out.append(replace(ep, weight=weight) if weight != ep.weight else ep)
            continue
        if not view.mtls_to(ep):
            continue  # the gateway routes on the mTLS SNI: plaintext cannot cross it
        share = weight // len(gateways)
        for g in gateways:
            weights[g] = weights.get(g, 0) + share
    if weights:
        locality = endpoints[0].locality
        for g in sorted(weights):
            out.append(EndpointAddress(g.address, g.port, locality, True, ISTIO_TLS_MODE, min(max(weights[g], 1), _MAX),
                                       network=g.network))
    return out


def only_mtls(endpoints: list[EndpointAddress], mtls: str) -> list[EndpointAddress]:
    """istiod's EndpointsWithMTLSFilter, for a router's sni-dnat clusters: an AUTO_PASSTHROUGH
    server cannot tell mTLS from other TLS, so only endpoints that take mTLS are offered."""
    return [ep for ep in endpoints if mtls == "always" or (mtls == "auto" and ep.tls_mode == ISTIO_TLS_MODE)]
