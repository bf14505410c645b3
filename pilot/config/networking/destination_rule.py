"""DestinationRule (istiod's ValidateDestinationRule): subsets and traffic policies — load
balancing, connection pools, outlier detection and client TLS."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pilot.config.base import K8sObject, Model
from pilot.config.networking.common import PortSelector, WorkloadSelector
from pilot.config.networking.validation import (
    Duration,
    DurationOrZero,
    Labels,
    OptStr,
    _fail,
    _raise_if,
    is_dns1123_label,
    validate_export_to,
    validate_wildcard_domain,
)


# --- DestinationRule ----------------------------------------------------------------------------------
class HTTPCookie(Model):
    name: str = Field(default="", validate_default=True)
    path: str | None = None
    ttl: DurationOrZero | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name:
            _fail("name required for HttpCookie")
        return name


class ConsistentHashLB(Model):
    http_header_name: str | None = None
    http_cookie: HTTPCookie | None = None
    use_source_ip: bool | None = None
    http_query_parameter_name: str | None = None
    minimum_ring_size: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_key(self) -> ConsistentHashLB:
        keys = [k for k in ("httpHeaderName", "httpCookie", "useSourceIp", "httpQueryParameterName")
                if getattr(self, _snake(k)) is not None]
        if len(keys) > 1:
            _fail(f"only one hash key may be set, got {' and '.join(keys)}")
        return self


def _snake(camel: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), camel)


class LocalityDistribute(Model):
    from_: str = Field(default="", alias="from")
    to: dict[str, int] = Field(default_factory=dict)


class LocalityFailover(Model):
    from_: str = Field(default="", alias="from")
    to: str = ""


def _localities(localities: list[str]) -> str | None:
    """istio validateLocalities: region[/zone[/subzone]], one trailing `*` at most, no overlap."""
    seen: dict[str, dict[str, set[str]]] = {}
    for loc in localities:
        stars = loc.count("*")
        if stars and (stars > 1 or not loc.endswith("*")):
            return f"locality {loc} wildcard '*' number can not exceed 1 and must be in the end"
        overlap = f"locality {loc} overlap with previous specified ones"
        if "*" in seen:
            return overlap
        parts = loc.split("/", 2)
        if any(p == "" for p in parts):
            return f"locality {loc} must not contain empty region/zone/subzone info"
        region = parts[0]
        if len(parts) == 1:
            if region in seen:
                return overlap
            seen[region] = {"*": {"*"}}
            continue
        zones = seen.setdefault(region, {})
        zone = parts[1]
        if "*" in zones:
            return overlap
        if len(parts) == 2:
            if zone in zones:
                return overlap
            zones[zone] = {"*"}
            continue
        subzones = zones.setdefault(zone, set())
        if "*" in subzones or parts[2] in subzones:
            return overlap
        subzones.add(parts[2])
    return None


class LocalityLoadBalancerSetting(Model):
    distribute: list[LocalityDistribute] = Field(default_factory=list)
    failover: list[LocalityFailover] = Field(default_factory=list)
    failover_priority: list[str] = Field(default_factory=list)
    enabled: bool | None = None

    @model_validator(mode="after")
    def _valid(self) -> LocalityLoadBalancerSetting:
        if self.distribute and self.failover:
            _fail("can not simultaneously specify 'distribute' and 'failover'")
        topology = {"topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone"}
        if self.failover and topology & set(self.failover_priority):
            _fail("can not simultaneously set 'failover' and topology labels in 'failoverPriority'")
        errs = []
        for i, d in enumerate(self.distribute):
            if any(not 1 <= w <= 100 for w in d.to.values()):
                errs.append(f"distribute[{i}].to: locality weight must be in range [1, 100]")
            elif sum(d.to.values()) != 100:
                errs.append(f"distribute[{i}].to: total locality weight {sum(d.to.values())} != 100")
            elif err := _localities(list(d.to)):
                errs.append(f"distribute[{i}].to: {err}")
        if err := _localities([d.from_ for d in self.distribute]):
            errs.append(f"distribute: {err}")
        for i, f in enumerate(self.failover):
            if f.from_ == f.to:
                errs.append(f"failover[{i}]: locality lb failover settings must specify different regions")
            if "/" in f.from_ or "/" in f.to:
                errs.append(f"failover[{i}]: locality lb failover only specify region")
            if "*" in f.from_ or "*" in f.to:
                errs.append(f"failover[{i}]: locality lb failover region should not contain '*' wildcard")
        _raise_if(errs)
        return self


class LoadBalancerSettings(Model):
    simple: Literal["UNSPECIFIED", "LEAST_CONN", "RANDOM", "PASSTHROUGH", "ROUND_ROBIN", "LEAST_REQUEST"] | None = None
    consistent_hash: ConsistentHashLB | None = None
    locality_lb_setting: LocalityLoadBalancerSetting | None = None
    warmup_duration_secs: Duration | None = None

    @model_validator(mode="after")
    def _one_of(self) -> LoadBalancerSettings:
        # A oneof in the API: istiod cannot even decode both. Neither is fine (locality settings only).
        if self.simple is not None and self.consistent_hash is not None:
            _fail("only one of simple or consistentHash may be set")
        return self


class TcpKeepalive(Model):
    probes: int | None = Field(default=None, ge=0)
    time: Duration | None = None
    interval: Duration | None = None


class TCPSettings(Model):
    max_connections: int | None = Field(default=None, ge=0)
    connect_timeout: Duration | None = None
    tcp_keepalive: TcpKeepalive | None = None
    max_connection_duration: Duration | None = None
    idle_timeout: DurationOrZero | None = None


class HTTPSettings(Model):
    http1_max_pending_requests: int | None = Field(default=None, ge=0)
    http2_max_requests: int | None = Field(default=None, ge=0)
    max_requests_per_connection: int | None = Field(default=None, ge=0)
    max_retries: int | None = Field(default=None, ge=0)
    idle_timeout: Duration | None = None
    h2_upgrade_policy: Literal["DEFAULT", "DO_NOT_UPGRADE", "UPGRADE"] | None = None
    use_client_protocol: bool | None = None
    max_concurrent_streams: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _upgrade(self) -> HTTPSettings:
        if self.h2_upgrade_policy == "UPGRADE" and self.use_client_protocol:
            _fail("useClientProtocol must not be true when h2UpgradePolicy is UPGRADE")
        return self


class ConnectionPoolSettings(Model):
    tcp: TCPSettings | None = None
    http: HTTPSettings | None = None

    @model_validator(mode="after")
    def _something(self) -> ConnectionPoolSettings:
        if self.tcp is None and self.http is None:
            _fail("connection pool must have at least one field")
        return self


def _percent_int(v: int | None) -> int | None:
    if v is not None and not 0 <= v <= 100:
        _fail(f"percentage {v} is not in range 0..100")
    return v


class OutlierDetection(Model):
    consecutive_errors: int | None = None  # deprecated (istiod warns): consecutive5xxErrors
    consecutive_5xx_errors: int | None = Field(default=None, ge=0, alias="consecutive5xxErrors")
    consecutive_gateway_errors: int | None = Field(default=None, ge=0)
    consecutive_local_origin_failures: int | None = Field(default=None, ge=0)
    split_external_local_origin_errors: bool | None = None
    interval: Duration | None = None
    base_ejection_time: Duration | None = None
    max_ejection_percent: Annotated[int | None, AfterValidator(_percent_int)] = None
    min_health_percent: Annotated[int | None, AfterValidator(_percent_int)] = None

    @model_validator(mode="after")
    def _split(self) -> OutlierDetection:
        if not self.split_external_local_origin_errors and (self.consecutive_local_origin_failures or 0) > 0:
            _fail("consecutiveLocalOriginFailures is set, but splitExternalLocalOriginErrors is false")
        return self


class ClientTLSSettings(Model):
    mode: Literal["DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"] = "DISABLE"
    client_certificate: OptStr = None
    private_key: OptStr = None
    ca_certificates: OptStr = None
    credential_name: OptStr = None
    subject_alt_names: list[str] = Field(default_factory=list)
    sni: str | None = None
    insecure_skip_verify: bool | None = None

    @model_validator(mode="after")
    def _valid(self) -> ClientTLSSettings:
        errs = []
        if self.insecure_skip_verify:
            if self.mode == "SIMPLE" and (self.ca_certificates or self.credential_name or self.subject_alt_names):
                errs.append("cannot specify caCertificates or credentialName or subjectAltNames when "
                            "insecureSkipVerify is set true")
            if self.mode == "MUTUAL" and (self.ca_certificates or self.subject_alt_names):
                errs.append("cannot specify caCertificates or subjectAltNames when insecureSkipVerify is set true")
        if self.mode in ("SIMPLE", "MUTUAL") and self.credential_name:
            if self.client_certificate or self.ca_certificates or self.private_key:
                errs.append("cannot specify client certificates or CA certificate if credentialName is set")
        elif self.mode == "MUTUAL":
            if not self.client_certificate:
                errs.append("client certificate required for mutual tls")
            if not self.private_key:
                errs.append("private key required for mutual tls")
        _raise_if(errs)
        return self


class PortTrafficPolicy(Model):
    port: PortSelector | None = Field(default=None, validate_default=True)
    load_balancer: LoadBalancerSettings | None = None
    connection_pool: ConnectionPoolSettings | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTLSSettings | None = None

    @field_validator("port")
    @classmethod
    def _port(cls, port: PortSelector | None) -> PortSelector | None:
        if port is None:
            _fail("portTrafficPolicy must have valid port")
        return port

    @model_validator(mode="after")
    def _something(self) -> PortTrafficPolicy:
        if (self.load_balancer is None and self.connection_pool is None and self.outlier_detection is None
                and self.tls is None):
            _fail("port traffic policy must have at least one field")
        return self


class TrafficPolicy(Model):
    load_balancer: LoadBalancerSettings | None = None
    connection_pool: ConnectionPoolSettings | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTLSSettings | None = None
    port_level_settings: list[PortTrafficPolicy] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _something(cls, data: object) -> object:
        # Checked on the input: istiod counts a field that is present, even as an empty list.
        if isinstance(data, dict) and not any(
                data.get(k) is not None for k in ("loadBalancer", "load_balancer", "connectionPool",
                                                  "connection_pool", "outlierDetection", "outlier_detection",
                                                  "tls", "portLevelSettings", "port_level_settings",
                                                  "tunnel", "proxyProtocol")):
            _fail("traffic policy must have at least one field")
        return data


class Subset(Model):
    name: str
    labels: Labels = Field(default_factory=dict)
    traffic_policy: TrafficPolicy | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name:
            _fail("subset name cannot be empty")
        if not is_dns1123_label(name):
            _fail(f"subset name is invalid: {name}")
        return name


class DestinationRuleSpec(Model):
    host: str
    traffic_policy: TrafficPolicy | None = None
    subsets: list[Subset] = Field(default_factory=list)
    export_to: list[str] = Field(default_factory=list)
    workload_selector: WorkloadSelector | None = None

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        if err := validate_wildcard_domain(host):
            _fail(err)
        return host

    @field_validator("subsets")
    @classmethod
    def _unique(cls, subsets: list[Subset]) -> list[Subset]:
        seen: set[str] = set()
        for s in subsets:
            if s.name in seen:
                _fail(f"duplicate subset names: {s.name}")
            seen.add(s.name)
        return subsets


class DestinationRule(K8sObject):
    kind: Literal["DestinationRule"] = "DestinationRule"
    spec: DestinationRuleSpec

    @model_validator(mode="after")
    def _export_to(self) -> DestinationRule:
        _raise_if([f"spec.{e}" for e in validate_export_to(
            self.metadata.namespace, self.spec.export_to, dr_with_selector=self.spec.workload_selector is not None)])
        return self
