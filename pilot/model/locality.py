"""Locality load balancing settings in a hashable form (cache-key inputs), and which one is in
force for a cluster: istiod's GetLocalityLbSetting and the outlier-detection trigger."""

from __future__ import annotations

from dataclasses import dataclass

from pilot.config.networking.locality import LocalityLbSetting
from pilot.model.services import Locality


@dataclass(frozen=True, slots=True)
class LocalitySetting:
    distribute: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()
    failover: tuple[tuple[str, str], ...] = ()
    failover_priority: tuple[str, ...] = ()

    @classmethod
    def of(cls, s: LocalityLbSetting) -> LocalitySetting:
        return cls(tuple((d.from_, tuple(d.to.items())) for d in s.distribute),
                   tuple((f.from_, f.to) for f in s.failover), tuple(s.failover_priority))


ENABLED = LocalitySetting()  # istiod's mesh default: `localityLbSetting: {enabled: true}`


def mesh_setting(s: LocalityLbSetting | None) -> LocalitySetting | None:
    """MeshConfig's setting; unset is istiod's default (enabled, nothing distributed)."""
    if s is None:
        return ENABLED
    return None if s.enabled is False else LocalitySetting.of(s)


def in_force(mesh: LocalitySetting | None, load_balancer, outlier_detection) -> LocalitySetting | None:
    """The setting a cluster gets (the DestinationRule's over the mesh's, `enabled: false`
    turning it off), or None when it changes nothing: failover needs outlier detection, as in
    istiod (Envoy never leaves a priority whose hosts are not ejected)."""
    dr = load_balancer.locality_lb_setting if load_balancer is not None else None
    if dr is not None:
        if dr.enabled is False:
            return None
        setting: LocalitySetting | None = LocalitySetting.of(dr)
    else:
        setting = mesh
    if setting is None:
        return None
    if setting.distribute or outlier_detection is not None:
        return setting
    return None


@dataclass(frozen=True, slots=True)
class LocalityLb:
    """Locality load balancing of one cluster for one client: the EDS builder's input."""

    setting: LocalitySetting
    client: Locality
    # The client's labels with its topology labels, only when failoverPriority reads them.
    client_labels: tuple[tuple[str, str], ...] = ()
