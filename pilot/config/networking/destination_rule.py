"""DestinationRule (istiod's ValidateDestinationRule): subsets and traffic policies — load
balancing, connection pools, outlier detection and client TLS."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pilot.config.base import K8sObject, StrictModel, Unsupported
from pilot.config.networking.common import PortSelector, WorkloadSelector
from pilot.config.networking.locality import LocalityLbSetting
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
class CookieAttribute(StrictModel):
    name: str = Field(default="", validate_default=True)
    value: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name:
            _fail("cookie attribute name is required")
        return name


class HTTPCookie(StrictModel):
    name: str = Field(default="", validate_default=True)
    path: str | None = None
    ttl: DurationOrZero | None = None
    attributes: list[CookieAttribute] = Field(default_factory=list)  # set on a cookie Envoy generates

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not name:
            _fail("name required for HttpCookie")
        return name


class RingHash(StrictModel):
    minimum_ring_size: int | None = Field(default=None, ge=0)


class MagLev(StrictModel):
    table_size: int | None = Field(default=None, ge=0)

    @field_validator("table_size")
    @classmethod
    def _prime(cls, size: int | None) -> int | None:
        # Envoy's own rule (istiod copies it): a prime below 5000011.
        if size:
            if size >= 5000011:
                _fail("tableSize must be less than 5000011 for maglev")
            if not _is_prime(size):
                _fail("tableSize must be a prime number for maglev")
        return size


def _is_prime(n: int) -> bool:
    if n < 4:
        return n != 0
    if n % 2 == 0:
        return False
    return all(n % f for f in range(3, int(n ** 0.5) + 1, 2))


class ConsistentHashLB(StrictModel):
    http_header_name: str | None = None
    http_cookie: HTTPCookie | None = None
    use_source_ip: bool | None = None
    http_query_parameter_name: str | None = None
    ring_hash: RingHash | None = None
    maglev: MagLev | None = None
    minimum_ring_size: int | None = Field(default=None, ge=0)  # deprecated: ringHash.minimumRingSize

    @model_validator(mode="after")
    def _one_key(self) -> ConsistentHashLB:
        keys = [k for k in ("httpHeaderName", "httpCookie", "useSourceIp", "httpQueryParameterName")
                if getattr(self, _snake(k)) is not None]
        if len(keys) > 1:
            _fail(f"only one hash key may be set, got {' and '.join(keys)}")
        if self.ring_hash is not None and self.maglev is not None:
            _fail("only one of ringHash or maglev may be set")
        return self


def _snake(camel: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), camel)


class WarmupConfiguration(StrictModel):
    duration: Duration | None = Field(default=None, validate_default=True)
    minimum_percent: float | None = Field(default=None, ge=0, le=100)
    aggression: float | None = Field(default=None, gt=0)

    @field_validator("duration")
    @classmethod
    def _required(cls, duration: str | None) -> str | None:
        if duration is None:
            _fail("duration is required")
        return duration


class LoadBalancerSettings(StrictModel):
    simple: Literal["UNSPECIFIED", "LEAST_CONN", "RANDOM", "PASSTHROUGH", "ROUND_ROBIN",
                    "LEAST_REQUEST"] | None = None
    consistent_hash: ConsistentHashLB | None = None
    # Per client locality in EDS (priorities, weights): pilot/networking/locality.py.
    locality_lb_setting: LocalityLbSetting | None = None
    warmup_duration_secs: Duration | None = None  # deprecated: warmup.duration
    warmup: WarmupConfiguration | None = None  # Envoy slow start (ROUND_ROBIN / LEAST_REQUEST)

    @model_validator(mode="after")
    def _one_of(self) -> LoadBalancerSettings:
        # A oneof in the API: istiod cannot even decode both. Neither is fine (locality settings only).
        if self.simple is not None and self.consistent_hash is not None:
            _fail("only one of simple or consistentHash may be set")
        return self


class TcpKeepalive(StrictModel):
    probes: int | None = Field(default=None, ge=0)
    time: Duration | None = None
    interval: Duration | None = None


class TCPSettings(StrictModel):
    max_connections: int | None = Field(default=None, ge=0)
    connect_timeout: Duration | None = None
    tcp_keepalive: TcpKeepalive | None = None
    max_connection_duration: Duration | None = None
    idle_timeout: DurationOrZero | None = None


class HTTPSettings(StrictModel):
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


class ConnectionPoolSettings(StrictModel):
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


class OutlierDetection(StrictModel):
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


class ClientTLSSettings(StrictModel):
    mode: Literal["DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"] = "DISABLE"
    client_certificate: OptStr = None
    private_key: OptStr = None
    ca_certificates: OptStr = None
    # A Secret of the client's namespace, served to it over SDS (pilot.xds.generators.sds).
    credential_name: OptStr = None
    subject_alt_names: list[str] = Field(default_factory=list)
    sni: str | None = None
    insecure_skip_verify: bool | None = None
    ca_crl: OptStr = None  # a CRL file, checked with caCertificates

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


class PortTrafficPolicy(StrictModel):
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


class ProxyProtocol(StrictModel):
    version: Literal["V1", "V2"] = "V1"


class RetryBudget(StrictModel):
    percent: float | None = Field(default=None, ge=0, le=100)  # istiod's default: 20
    min_retry_concurrency: int | None = Field(default=None, ge=0)  # istiod's default: 3


_TRAFFIC_POLICY_KEYS = {"loadBalancer", "load_balancer", "connectionPool", "connection_pool", "outlierDetection",
                        "outlier_detection", "tls", "portLevelSettings", "port_level_settings", "tunnel",
                        "proxyProtocol", "proxy_protocol", "retryBudget", "retry_budget"}


class TrafficPolicy(StrictModel):
    load_balancer: LoadBalancerSettings | None = None
    connection_pool: ConnectionPoolSettings | None = None
    outlier_detection: OutlierDetection | None = None
    tls: ClientTLSSettings | None = None
    port_level_settings: list[PortTrafficPolicy] = Field(default_factory=list)
    tunnel: Unsupported = None  # HTTP CONNECT tunnelling to an egress proxy
    proxy_protocol: ProxyProtocol | None = None  # PROXY protocol header on upstream connections
    retry_budget: RetryBudget | None = None  # Envoy's circuit-breaker retry budget

    @model_validator(mode="before")
    @classmethod
    def _something(cls, data: object) -> object:
        # Checked on the input: istiod counts a field that is present, even as an empty list.
        # An unknown key is left to the field check, so a misspelling is named as such.
        if isinstance(data, dict) and set(data) <= _TRAFFIC_POLICY_KEYS and not any(
                data.get(k) is not None for k in ("loadBalancer", "load_balancer", "connectionPool",
                                                  "connection_pool", "outlierDetection", "outlier_detection",
                                                  "tls", "portLevelSettings", "port_level_settings",
                                                  "tunnel", "proxyProtocol", "proxy_protocol",
                                                  "retryBudget", "retry_budget")):
            _fail("traffic policy must have at least one field")
        return data


class Subset(StrictModel):
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


class DestinationRuleSpec(StrictModel):
    host: str
    traffic_policy: TrafficPolicy | None = None
    subsets: list[Subset] = Field(default_factory=list)
    export_to: list[str] = Field(default_factory=list)
    # Only sidecars and gateways in the rule's namespace whose labels match get this rule
    # (pilot.model.traffic); it is never applied to anyone else.
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
