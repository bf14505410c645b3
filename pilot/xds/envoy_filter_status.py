"""pilot_envoy_filter_status, as istiod's (pilot/pkg/networking/core/envoyfilter/monitoring.go):
per EnvoyFilter (`name` NS/NAME) and patch type, 1 once a patch met a generated resource, 0
once its output was NACKed and it was left out (see DiscoveryServer._reject_envoy_filters).

Fed from the generators through XdsCache.on_patch, which is told only when a patch set's
decision for a resource is first worked out, so this costs nothing per proxy on the hot path.
istiod gates the gauge behind PILOT_ENVOY_FILTER_STATS (off by default); it is always on here,
being that cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import Gauge

from pilot.model.envoy_filters import PatchRef
from pilot.model.store import ConfigKey, Entry

# istiod's PatchType names (it has none for extension configs).
PATCH_TYPES = {"LISTENER": "listener", "LISTENER_FILTER": "listener", "FILTER_CHAIN": "filterchain",
               "NETWORK_FILTER": "networkfilter", "HTTP_FILTER": "httpfilter", "ROUTE_CONFIGURATION": "route",
               "VIRTUAL_HOST": "vhost", "HTTP_ROUTE": "route", "CLUSTER": "cluster",
               "EXTENSION_CONFIG": "extensionconfig", "BOOTSTRAP": "bootstrap"}


class EnvoyFilterStatus:
    def __init__(self, gauge: Gauge, rejected: Callable[[ConfigKey, int], bool]) -> None:
        self.gauge = gauge
        self.rejected = rejected
        self._values: dict[tuple[str, str], int] = {}

    def applied(self, refs: Iterable[PatchRef]) -> None:
        for ref in refs:
            e = ref.entry
            if not self.rejected(e.key, e.revision):
                self._set(f"{e.key.namespace}/{e.key.name}", PATCH_TYPES[ref.patch.apply_to], 1)

    def errored(self, entry: Entry) -> None:
        name = f"{entry.key.namespace}/{entry.key.name}"
        for p in entry.obj.spec.config_patches:  # type: ignore[attr-defined]
            self._set(name, PATCH_TYPES[p.apply_to], 0)

    def prune(self, exists: Callable[[ConfigKey], bool]) -> None:
        """Drop the series of EnvoyFilters that are gone."""
        for name, kind in list(self._values):
            ns, _, n = name.partition("/")
            if not exists(ConfigKey("EnvoyFilter", ns, n)):
                del self._values[(name, kind)]
                self.gauge.remove(name, kind)

    def _set(self, name: str, kind: str, value: int) -> None:
        if self._values.get((name, kind)) != value:
            self._values[(name, kind)] = value
            self.gauge.labels(name, kind).set(value)
