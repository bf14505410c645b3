"""The Kubernetes core kinds the control plane reads (only the fields it uses)."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from pilot.config.base import K8sObject, Model, ObjectMeta

# RFC 1123 subdomain, as Kubernetes validates a Service's externalName (a trailing dot allowed).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_NAME = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*\.?$")


class ServicePort(Model):
    name: str = ""
    port: int = Field(ge=1, le=65535)
    target_port: int | str | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    app_protocol: str | None = None


class ServiceSpec(Model):
    ports: list[ServicePort] = Field(default_factory=list)
    selector: dict[str, str] | None = None
    cluster_ip: str | None = Field(default=None, alias="clusterIP")
    # A dual-stack Service's addresses, one per family (clusterIPs[0] is clusterIP); read with ISTIO_DUAL_STACK.
    cluster_ips: list[str] = Field(default_factory=list, alias="clusterIPs")
    type: str = "ClusterIP"
    external_name: str | None = None
    # Only Ingress status reads these (the ingress Service's addresses, pilot/model/ingress.py).
    external_ips: list[str] = Field(default_factory=list, alias="externalIPs")

    @field_validator("ports")
    @classmethod
    def _unique_ports(cls, ports: list[ServicePort]) -> list[ServicePort]:
        seen: set[tuple[int, str]] = set()
        for p in ports:
            if (p.port, p.protocol) in seen:
                raise ValueError(f"duplicate port {p.port}/{p.protocol}")
            seen.add((p.port, p.protocol))
        if len(ports) > 1 and any(not p.name for p in ports):
            raise ValueError("every port must have a name when a Service has more than one port")
        return ports

    @model_validator(mode="after")
    def _external_name(self) -> ServiceSpec:
        # An ExternalName Service becomes a DNS cluster to that name: it must be one.
        if self.type == "ExternalName":
            name = self.external_name or ""
            if not name:
                raise ValueError("externalName: required for type ExternalName")
            if len(name.rstrip(".")) > 253 or not _DNS_NAME.match(name):
                raise ValueError(f"externalName: {name!r} is not a DNS name (RFC 1123: lowercase letters, "
                                 "digits, '-' and '.')")
        return self


class LoadBalancerIngress(Model):
    ip: str = ""
    hostname: str = ""


class LoadBalancerStatus(Model):
    ingress: list[LoadBalancerIngress] = Field(default_factory=list)


class ServiceStatus(Model):
    load_balancer: LoadBalancerStatus = Field(default_factory=LoadBalancerStatus)


class Service(K8sObject):
    kind: Literal["Service"] = "Service"
    spec: ServiceSpec = Field(default_factory=ServiceSpec)
    # Its load balancer addresses: Ingress status (the ingress Service's), and a network
    # gateway's addresses (pilot/model/networks.py): the Store keeps a status update, and only a
    # gateway's pushes (pilot/model/events.py).
    status: ServiceStatus = Field(default_factory=ServiceStatus,
                                  description="load balancer addresses: Ingress status, network gateways")


class EndpointConditions(Model):
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None


class EndpointRef(Model):
    kind: str = ""
    name: str = ""
    namespace: str = ""


class Endpoint(Model):
    addresses: list[str] = Field(min_length=1)
    conditions: EndpointConditions = Field(default_factory=EndpointConditions)
    hostname: str | None = None
    node_name: str | None = None
    zone: str | None = None
    target_ref: EndpointRef | None = None

    @property
    def is_ready(self) -> bool:
        # Kubernetes: a nil ready condition means "unknown" and consumers should treat it as ready.
        return self.conditions.ready is not False


class EndpointPort(Model):
    name: str = ""
    port: int | None = Field(default=None, ge=1, le=65535)
    protocol: str = "TCP"
    app_protocol: str | None = None


class EndpointSlice(K8sObject):
    kind: Literal["EndpointSlice"] = "EndpointSlice"
    address_type: Literal["IPv4", "IPv6", "FQDN"] = "IPv4"
    endpoints: list[Endpoint] = Field(default_factory=list)
    ports: list[EndpointPort] | None = None

    @model_validator(mode="after")
    def _addresses_match_type(self) -> EndpointSlice:
        # The apiserver enforces this; without it an address such as "localhost" in an IPv4 slice
        # reaches Envoy, which NACKs the whole EDS response ("malformed IP address") instead of
        # this one object being rejected here with its name.
        if self.address_type == "FQDN":
            return self
        want = ipaddress.IPv4Address if self.address_type == "IPv4" else ipaddress.IPv6Address
        for i, ep in enumerate(self.endpoints):
            for addr in ep.addresses:
                try:
                    ok = isinstance(ipaddress.ip_address(addr), want)
                except ValueError:
                    ok = False
                if not ok:
                    raise ValueError(f"endpoints[{i}].addresses: {addr!r} is not an {self.address_type} address")
        return self

    @property
    def service_name(self) -> str | None:
        return self.metadata.labels.get("kubernetes.io/service-name")


class ContainerPort(Model):
    name: str = ""
    container_port: int = 0
    protocol: str = "TCP"


class Container(Model):
    name: str = ""
    # Named targetPorts of Services resolve through these (ambient WDS port mappings).
    ports: list[ContainerPort] = Field(default_factory=list)


class PodSpec(Model):
    service_account_name: str = "default"
    node_name: str = ""
    host_network: bool = False
    containers: list[Container] = Field(default_factory=list)


class PodCondition(Model):
    """Only type and status: probe and transition times change on every kubelet sync and would
    turn each into a Store event."""

    type: str = ""
    status: str = ""


class PodIP(Model):
    ip: str = ""


class PodStatus(Model):
    pod_ip: str = Field(default="", alias="podIP")
    # Every address of a dual-stack Pod (podIPs[0] is podIP); read with ISTIO_DUAL_STACK.
    pod_ips: list[PodIP] = Field(default_factory=list, alias="podIPs")
    phase: str = ""
    conditions: list[PodCondition] = Field(default_factory=list)

    @property
    def ready(self) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in self.conditions)


class OwnerReference(Model):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class PodMeta(ObjectMeta):
    # The controller (ReplicaSet, Job...) names the workload in ambient telemetry fields.
    owner_references: list[OwnerReference] = Field(default_factory=list)


class Pod(K8sObject):
    kind: Literal["Pod"] = "Pod"
    metadata: PodMeta
    spec: PodSpec = Field(default_factory=PodSpec)
    status: PodStatus = Field(default_factory=PodStatus)


class Namespace(K8sObject):
    kind: Literal["Namespace"] = "Namespace"


class ConfigMap(K8sObject):
    kind: Literal["ConfigMap"] = "ConfigMap"
    data: dict[str, str] = Field(default_factory=dict)


LOCALITY_LABELS = ("topology.kubernetes.io/region", "topology.kubernetes.io/zone",
                   "topology.istio.io/subzone")


class NodeAddress(Model):
    type: str = ""
    address: str = ""


class NodeStatus(Model):
    addresses: list[NodeAddress] = Field(default_factory=list)


class Node(K8sObject):
    """Only locality labels and addresses are kept: a big cluster's node objects are large and
    change often (heartbeats), and nothing else in them shapes proxy config."""

    kind: Literal["Node"] = "Node"
    status: NodeStatus = Field(default_factory=NodeStatus)

    @model_validator(mode="before")
    @classmethod
    def _keep_locality_only(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("metadata"), dict):
            meta = data["metadata"]
            labels = meta.get("labels") or {}
            data = {**data, "metadata": {**meta, "annotations": {},
                                         "labels": {k: v for k, v in labels.items() if k in LOCALITY_LABELS}}}
        return data


TLS_SECRET_KEYS = ("tls.crt", "tls.key", "ca.crt", "cert", "key", "cacert")
# A registry credential (WasmPlugin imagePullSecret), kept only in Secrets of its type.
DOCKER_CONFIG_TYPE = "kubernetes.io/dockerconfigjson"
DOCKER_CONFIG_KEY = ".dockerconfigjson"


class Secret(K8sObject):
    """Gateway credentials and registry credentials (the `.dockerconfigjson` of a
    kubernetes.io/dockerconfigjson Secret, for WasmPlugin pull secrets). Secrets that cannot be
    either keep no data at all.

    Nothing of a Secret's content can reach a log, a debug view or an error: the values are
    SecretStr (shown as "**********" by repr and by every model_dump), and annotations are not
    kept at all, because `kubectl apply` stores the whole object, keys included, in
    `kubectl.kubernetes.io/last-applied-configuration` (managedFields and stringData are never
    modelled). Only `reveal()` gives the values, to the credential parser."""

    kind: Literal["Secret"] = "Secret"
    type: str = "Opaque"
    data: dict[str, SecretStr] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _only_tls_material(cls, data: object) -> object:
        if isinstance(data, dict):
            payload = data.get("data") or {}
            wanted = TLS_SECRET_KEYS + ((DOCKER_CONFIG_KEY,) if data.get("type") == DOCKER_CONFIG_TYPE else ())
            keep = {k: v for k, v in payload.items() if k in wanted} if isinstance(payload, dict) else {}
            data = {**data, "data": keep}
            data.pop("stringData", None)
            meta = data.get("metadata")
            if isinstance(meta, dict) and meta.get("annotations"):
                data["metadata"] = {**meta, "annotations": {}}
        return data

    def reveal(self) -> dict[str, str]:
        """The base64 values, for the credential parser only: never log or show the result."""
        return {k: v.get_secret_value() for k, v in self.data.items()}
