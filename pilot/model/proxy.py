"""Proxy: who is on the other end of an xDS stream, parsed from its Node."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from google.protobuf import json_format

from pilot.config.networking.validation import is_ip
from pilot.model.services import LOCALITY_LABEL, NO_LOCALITY, Locality

PROXY_TYPES = ("sidecar", "router", "ztunnel")
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"


class InvalidNode(ValueError):
    pass


def shown(text: str, limit: int = 64) -> str:
    """What a client sent, safe to quote in an error or a log line: at most `limit` characters,
    escaped (repr), marked when cut. A client's megabyte or control characters never echo back."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


@dataclass(frozen=True)
class ProxyTraits:
    """The parts of a proxy that generated config depends on. Every cache key that can differ
    between proxies includes these, so two proxies with equal traits share bytes."""

    type: str
    namespace: str
    interception_mode: str
    generator: str  # "" for Envoy, "grpc" for proxyless gRPC clients
    mesh_tls: bool = False  # has a workload identity, hence certificates: gets mTLS config
    # The Gateway API Gateway it belongs to (its gateway-name label): a waypoint's config is its
    # own, and istiod's policy attachment reads the label on any proxy (targetRefs select by it),
    # so proxies of two Gateways never share a generated result, nor the reads recorded with it.
    gateway_name: str = ""


@dataclass
class Proxy:
    id: str
    type: str
    ip_addresses: tuple[str, ...]
    pod_name: str
    namespace: str
    dns_domain: str
    cluster: str = ""
    metadata: dict = field(default_factory=dict)
    # The SPIFFE identity the proxy proved on the secure port (15012); "" on plaintext 15010.
    # Only a proxy with an identity has certificates (from pilot-agent), so only it gets mTLS.
    identity: str = ""
    # Envoy's `node.locality` (istio-agent fills it from the Pod's Node); see `locality`.
    node_locality: Locality = NO_LOCALITY

    @property
    def locality(self) -> Locality:
        """Where the proxy runs: its Node message's locality, else its `istio-locality` label
        (region.zone.subzone), as istiod reads it. Locality load balancing ranks endpoints by it."""
        if self.node_locality != NO_LOCALITY:
            return self.node_locality
        label = self.labels.get(LOCALITY_LABEL)
        return Locality.parse(label, ".") if label else NO_LOCALITY

    @property
    def labels(self) -> dict[str, str]:
        labels = self.metadata.get("LABELS")
        return dict(labels) if isinstance(labels, dict) else {}

    @property
    def interception_mode(self) -> str:
        return str(self.metadata.get("INTERCEPTION_MODE") or "REDIRECT").upper()

    @property
    def network(self) -> str:
        """The network it is on: its NETWORK metadata (ISTIO_META_NETWORK), "" for none."""
        return str(self.metadata.get("NETWORK") or "")

    @property
    def generator(self) -> str:
        return str(self.metadata.get("GENERATOR") or "")

    @property
    def dns_capture(self) -> tuple[bool, bool] | None:
        """Its agent answers DNS (ISTIO_META_DNS_CAPTURE, istio's StringBool): the IP families
        it has, (IPv4, IPv6), for auto-allocated ServiceEntry addresses; None when it does not."""
        if str(self.metadata.get("DNS_CAPTURE", "")).lower() != "true":
            return None
        return self.ip_families

    @property
    def ip_families(self) -> tuple[bool, bool]:
        """(IPv4, IPv6): the families of its addresses, istiod's IPMode (SupportsIPv4/IPv6). The
        addresses are the agent's INSTANCE_IPS (every pod IP, comma-separated) when each is an
        IP, else the node id's, as istiod picks them; none at all counts as IPv4 (AllIPv4 of
        nothing is true)."""
        meta = self.metadata.get("INSTANCE_IPS")
        ips = [a.strip() for a in meta.split(",")] if isinstance(meta, str) and meta else []
        if not ips or not all(is_ip(a) for a in ips):
            ips = list(self.ip_addresses)
        v6 = any(":" in a for a in ips)
        return any(":" not in a for a in ips) or not v6, v6

    @property
    def ip_mode(self) -> str:
        """istiod's IPMode: "IPv4", "IPv6" or "Dual"."""
        return {(True, False): "IPv4", (False, True): "IPv6"}.get(self.ip_families, "Dual")

    @property
    def dual_stack(self) -> bool:
        """It has both an IPv4 and an IPv6 address: istiod's IPMode Dual."""
        return self.ip_families == (True, True)

    @property
    def is_grpc(self) -> bool:
        return self.generator == "grpc"

    @property
    def istio_version(self) -> str:
        return str(self.metadata.get("ISTIO_VERSION") or "")

    @property
    def mesh_tls(self) -> bool:
        """ProxyTraits.mesh_tls, without building the traits (asked per proxy and push)."""
        return bool(self.identity) and not self.is_grpc

    @property
    def traits(self) -> ProxyTraits:
        return ProxyTraits(self.type, self.namespace, self.interception_mode, self.generator, self.mesh_tls,
                           self.labels.get(GATEWAY_NAME_LABEL, ""))

    def mark_grpc(self) -> None:
        """grpcio clients rarely send GENERATOR metadata; a named host:port LDS request gives them away."""
        self.metadata = {**self.metadata, "GENERATOR": "grpc"}


def parse_node_id(node_id: str) -> tuple[str, tuple[str, ...], str, str, str]:
    """`TYPE~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN` -> (type, ips, pod, namespace, domain)."""
    parts = node_id.split("~")
    if len(parts) != 4:
        raise InvalidNode(f"node id {shown(node_id)} must have 4 '~'-separated parts: "
                          "TYPE~IP~POD.NAMESPACE~DOMAIN")
    ptype, ips, pod_ns, domain = parts
    if ptype not in PROXY_TYPES:
        raise InvalidNode(f"node id {shown(node_id)}: unknown proxy type {shown(ptype, 16)} "
                          f"(want one of {', '.join(PROXY_TYPES)})")
    addresses = tuple(a for a in ips.split(",") if a)
    for a in addresses:
        try:
            ipaddress.ip_address(a)
        except ValueError:
            raise InvalidNode(f"node id {shown(node_id)}: {shown(a, 46)} is not an IP address") from None
    # Pod names may contain dots (DNS subdomains); namespaces cannot (DNS labels): split at the last.
    pod, dot, namespace = pod_ns.rpartition(".")
    if not dot or not pod or not namespace:
        raise InvalidNode(f"node id {shown(node_id)}: third part must be POD.NAMESPACE")
    dns_domain = domain
    if domain.startswith(namespace + ".svc."):
        dns_domain = domain[len(namespace) + len(".svc."):]
    return ptype, addresses, pod, namespace, dns_domain


def proxy_from_node(node) -> Proxy:
    """Build a Proxy from an envoy.config.core.v3.Node."""
    ptype, ips, pod, namespace, domain = parse_node_id(node.id)
    metadata = json_format.MessageToDict(node.metadata) if node.HasField("metadata") else {}
    meta_ns = metadata.get("NAMESPACE")
    if meta_ns and meta_ns != namespace:
        raise InvalidNode(f"node id namespace {shown(namespace)} disagrees with metadata NAMESPACE "
                          f"{shown(str(meta_ns))}")
    loc = node.locality
    return Proxy(node.id, ptype, ips, pod, namespace, domain, node.cluster, metadata,
                 node_locality=Locality(loc.region, loc.zone, loc.sub_zone))
