"""The slices of MeshConfig each builder family reads.

Builders take these instead of the whole MeshConfig so a cache key holds exactly what a resource
depends on: changing connectTimeout rebuilds clusters, not every route and listener too.
"""

from __future__ import annotations

from dataclasses import dataclass

from pilot.config.mesh import HttpRetryPolicy, MeshConfig
from pilot.model.locality import ENABLED, LocalitySetting, mesh_setting
from pilot.model.telemetry import NO_TELEMETRY, ModeTelemetry, legacy_access_logs


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    connect_timeout_s: float
    # MeshConfig localityLbSetting (None: disabled): DestinationRules without one inherit it.
    locality: LocalitySetting | None = ENABLED
    h2_upgrade: bool = False  # MeshConfig h2UpgradePolicy UPGRADE: HTTP ports talk HTTP/2 upstream


@dataclass(frozen=True, slots=True)
class RouteSettings:
    retry: HttpRetryPolicy
    registry_only: bool  # outboundTrafficPolicy REGISTRY_ONLY: unknown hosts get 502, not passthrough


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    registry_only: bool
    # What the listener's class (CLIENT: outbound, gateway; SERVER: inbound) logs and traces: the
    # MeshConfig accessLogFile here; the generators put the proxy's Telemetry plan in its place.
    telemetry: ModeTelemetry = NO_TELEMETRY


@dataclass(frozen=True, slots=True)
class MeshSettings:
    clusters: ClusterSettings
    routes: RouteSettings
    listeners: ListenerSettings

    @classmethod
    def of(cls, mesh: MeshConfig) -> MeshSettings:
        registry_only = mesh.outbound_traffic_policy.mode == "REGISTRY_ONLY"
        return cls(ClusterSettings(mesh.connect_timeout_seconds, locality=mesh_setting(mesh.locality_lb_setting),
                                   h2_upgrade=mesh.h2_upgrade_policy == "UPGRADE"),
                   RouteSettings(mesh.default_http_retry_policy, registry_only),
                   ListenerSettings(registry_only, legacy_access_logs(mesh)))
