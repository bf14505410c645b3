"""The slices of MeshConfig each builder family reads.

Builders take these instead of the whole MeshConfig so a cache key holds exactly what a resource
depends on: changing connectTimeout rebuilds clusters, not every route and listener too.
"""

from __future__ import annotations

from dataclasses import dataclass

from pilot.config.mesh import HttpRetryPolicy, MeshConfig
from pilot.model.locality import ENABLED, LocalitySetting, mesh_setting
from pilot.model.telemetry import NO_TELEMETRY, ModeTelemetry, legacy_access_logs
from pilot.model.wasm import WasmFilter


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    connect_timeout_s: float
    # MeshConfig localityLbSetting (None: disabled): DestinationRules without one inherit it.
    locality: LocalitySetting | None = ENABLED
    h2_upgrade: bool = False  # MeshConfig h2UpgradePolicy UPGRADE: HTTP ports talk HTTP/2 upstream
    # The DNS clusters' dns_lookup_family for the proxy's IP families, istiod's
    # SelectDNSLookupFamily (pilot.networking.clusters.dns_lookup_family): the generators put it
    # in for DNS clusters only, so other clusters' keys stay those of every proxy.
    dns_lookup_family: str = "V4_ONLY"


@dataclass(frozen=True, slots=True)
class RouteSettings:
    retry: HttpRetryPolicy
    registry_only: bool  # outboundTrafficPolicy REGISTRY_ONLY: unknown hosts get 502, not passthrough


@dataclass(frozen=True, slots=True)
class GenerationKnobs:
    """The environment knobs (pilot/features.py) that change generated config, as builders read
    them: part of MeshSettings, so every cache key that holds the settings holds them too."""

    sniff_outbound: bool = True  # PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_OUTBOUND
    sniff_inbound: bool = True  # PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_INBOUND
    http10: bool = False  # PILOT_HTTP10
    # INBOUND_PROTOCOL_DETECTION_TIMEOUT when set (seconds): wins over MeshConfig's for inbound.
    inbound_detection_timeout_s: float | None = None
    send_unhealthy_endpoints: bool = False  # PILOT_SEND_UNHEALTHY_ENDPOINTS
    cluster_id: str = "Kubernetes"  # CLUSTER_ID
    scope_gateway_to_namespace: bool = False  # PILOT_SCOPE_GATEWAY_TO_NAMESPACE
    filter_gateway_clusters: bool = False  # PILOT_FILTER_GATEWAY_CLUSTER_CONFIG
    # PILOT_ENABLE_IP_AUTOALLOCATE: the (IPv4, IPv6) prefixes ServiceEntry addresses are allocated
    # from (PILOT_IP_AUTOALLOCATE_IPV4_PREFIX / _IPV6_PREFIX); None when the knob is off.
    ip_autoallocate: tuple[str, str] | None = ("240.240.0.0/16", "2001:2::/48")
    trace_sampling: float = 1.0  # PILOT_TRACE_SAMPLING: percent traced when no Telemetry says
    jwks_fetch_mode: str = "istiod"  # PILOT_JWT_ENABLE_REMOTE_JWKS: istiod, hybrid or envoy
    enhanced_dr_merge: bool = True  # ENABLE_ENHANCED_DESTINATIONRULE_MERGE
    dual_stack: bool = False  # ISTIO_DUAL_STACK
    ingress_namespace: str = "istio-system"  # K8S_INGRESS_NS: where Ingress Gateways live


DEFAULT_KNOBS = GenerationKnobs()


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    registry_only: bool
    # What the listener's class (CLIENT: outbound, gateway; SERVER: inbound) logs and traces: the
    # MeshConfig accessLogFile here; the generators put the proxy's Telemetry plan in its place.
    telemetry: ModeTelemetry = NO_TELEMETRY
    sniff_outbound: bool = True
    sniff_inbound: bool = True
    http10: bool = False  # HCMs accept HTTP/1.0, and sniffing matches it
    # MeshConfig protocolDetectionTimeout (seconds; 0 = wait for the client's first bytes for ever),
    # the listener filter timeout of listeners that sniff.
    detection_timeout_s: float = 0.0
    inbound_detection_timeout_s: float = 0.0
    # The WasmPlugins of the proxy for this listener class (pilot/model/wasm.py), put in by the generators.
    wasm: tuple[WasmFilter, ...] = ()
    # ISTIO_DUAL_STACK and a proxy with both IP families (the generators put it in): wildcard
    # listeners bind :: as an additional address beside 0.0.0.0.
    dual_stack: bool = False
    # An iptables-mode sidecar whose addresses are all IPv6 (the generators put it in): wildcard
    # listeners bind :: instead of 0.0.0.0 (istiod's wildcard for IPMode IPv6, `::_PORT` names).
    ipv6_only: bool = False
    # HCMs carry the (empty) stateful session filter, for routes whose sessionPersistence configures
    # it: set by the generators only where such a route may be served (istiod adds the filter only
    # with PILOT_ENABLE_PERSISTENT_SESSION_FILTER; an empty one on every HCM was config for nothing).
    session_filter: bool = False


@dataclass(frozen=True, slots=True)
class MeshSettings:
    clusters: ClusterSettings
    routes: RouteSettings
    listeners: ListenerSettings
    knobs: GenerationKnobs = DEFAULT_KNOBS  # the rest of the knobs, for builders no slice above covers

    @classmethod
    def of(cls, mesh: MeshConfig, knobs: GenerationKnobs = DEFAULT_KNOBS) -> MeshSettings:
        registry_only = mesh.outbound_traffic_policy.mode == "REGISTRY_ONLY"
        detection = mesh.protocol_detection_timeout_seconds
        inbound_detection = (knobs.inbound_detection_timeout_s if knobs.inbound_detection_timeout_s is not None
                             else detection)
        return cls(ClusterSettings(mesh.connect_timeout_seconds, locality=mesh_setting(mesh.locality_lb_setting),
                                   h2_upgrade=mesh.h2_upgrade_policy == "UPGRADE"),
                   RouteSettings(mesh.default_http_retry_policy, registry_only),
                   ListenerSettings(registry_only, legacy_access_logs(mesh), knobs.sniff_outbound,
                                    knobs.sniff_inbound, knobs.http10, detection, inbound_detection),
                   knobs)
