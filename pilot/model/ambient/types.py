"""What ztunnel is told, as plain frozen values: one per WDS Address or Authorization resource.

Each value holds exactly the fields its proto carries (pilot/networking/ztunnel_*.py turn them into
protos), so the value itself is the xDS cache key: equal inputs, equal bytes, shared by every
ztunnel.
"""

from __future__ import annotations

from dataclasses import dataclass

# istiod's cluster id when CLUSTER_ID is not set; workload uids start with it.
DEFAULT_CLUSTER_ID = "Kubernetes"
HBONE_PORT = 15008

# WorkloadType names (istio.workload.WorkloadType)
DEPLOYMENT, CRONJOB, POD, JOB = "DEPLOYMENT", "CRONJOB", "POD", "JOB"

PortMap = tuple[tuple[int, int], ...]  # (service port, target port), in service port order


@dataclass(frozen=True, slots=True)
class GatewayAddr:
    """A waypoint's address: a service hostname (preferred, as istiod does) or an IP."""

    namespace: str = ""
    hostname: str = ""
    network: str = ""
    ip: str = ""
    port: int = HBONE_PORT


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    uid: str
    name: str
    namespace: str
    addresses: tuple[str, ...] = ()  # IPs; empty when `hostname` names a DNS endpoint
    hostname: str = ""
    network: str = ""
    hbone: bool = False  # tunnel_protocol HBONE
    native_tunnel: bool = False
    trust_domain: str = ""  # empty: the mesh default (cluster.local)
    service_account: str = ""
    waypoint: GatewayAddr | None = None
    node: str = ""
    canonical_name: str = ""
    canonical_revision: str = ""
    workload_type: str = POD
    workload_name: str = ""
    # "namespace/hostname" -> ports this workload serves for that service, sorted by key
    services: tuple[tuple[str, PortMap], ...] = ()
    authorization_policies: tuple[str, ...] = ()
    healthy: bool = True
    cluster_id: str = DEFAULT_CLUSTER_ID
    locality: tuple[str, str, str] | None = None  # (region, zone, subzone)

    @property
    def resource_name(self) -> str:
        return self.uid

    @property
    def aliases(self) -> tuple[str, ...]:
        """The "network/IP" names an on-demand client may ask for."""
        return tuple(f"{self.network}/{ip}" for ip in self.addresses)


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    name: str
    namespace: str
    hostname: str
    addresses: tuple[tuple[str, str], ...] = ()  # (network, VIP)
    ports: PortMap = ()
    subject_alt_names: tuple[str, ...] = ()
    waypoint: GatewayAddr | None = None

    @property
    def resource_name(self) -> str:
        return f"{self.namespace}/{self.hostname}"

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(f"{network}/{ip}" for network, ip in self.addresses)


# --- Authorization -------------------------------------------------------------------------------
# StringMatch: ("exact" | "prefix" | "suffix" | "presence", value)
StringMatch = tuple[str, str]
Cidr = tuple[str, int]  # (address, prefix length)


@dataclass(frozen=True, slots=True)
class AuthzMatch:
    namespaces: tuple[StringMatch, ...] = ()
    not_namespaces: tuple[StringMatch, ...] = ()
    service_accounts: tuple[tuple[str, str], ...] = ()  # (namespace, service account)
    not_service_accounts: tuple[tuple[str, str], ...] = ()
    principals: tuple[StringMatch, ...] = ()
    not_principals: tuple[StringMatch, ...] = ()
    source_ips: tuple[Cidr, ...] = ()
    not_source_ips: tuple[Cidr, ...] = ()
    destination_ips: tuple[Cidr, ...] = ()
    not_destination_ips: tuple[Cidr, ...] = ()
    destination_ports: tuple[int, ...] = ()
    not_destination_ports: tuple[int, ...] = ()


# A rule (Group) is a tuple of parts (Rules); a part is a tuple of alternative matches.
AuthzRule = tuple[tuple[AuthzMatch, ...], ...]

SCOPE_GLOBAL, SCOPE_NAMESPACE, SCOPE_WORKLOAD_SELECTOR = "GLOBAL", "NAMESPACE", "WORKLOAD_SELECTOR"
ALLOW, DENY = "ALLOW", "DENY"


@dataclass(frozen=True, slots=True)
class AuthzPolicy:
    name: str
    namespace: str
    scope: str
    action: str
    rules: tuple[AuthzRule, ...] = ()

    @property
    def resource_name(self) -> str:
        return f"{self.namespace}/{self.name}"
