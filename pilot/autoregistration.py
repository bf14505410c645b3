"""WorkloadEntry auto-registration (istiod's pilot/pkg/autoregistration/controller.go), file mode:
a proxy that connects with node metadata `AUTO_REGISTER_GROUP: NAME` gets a WorkloadEntry made
from the WorkloadGroup NAME of its namespace, and loses it `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`
after its last connection closed (a reconnect within the grace period keeps it).

The entry is put into the Store under its own source, so it is served like any WorkloadEntry
(endpoints of the ServiceEntries and Services that select it, /debug/configz) and the file source's
syncs, which own only what they loaded, leave it alone. Kubernetes mode (writing the entry to the
apiserver) is not wired yet: there the controller is not started.

Labels, as istiod merges them: the template's, then the group's metadata labels, then the proxy's
own LABELS (without istio-locality); annotations: the group's metadata annotations, plus
`istio.io/autoRegistrationGroup`, `istio.io/connectedAt` / `istio.io/disconnectedAt`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pilot import logging as plog
from pilot.config.networking.service_entry import WorkloadEntry
from pilot.config.networking.workload_group import WorkloadGroup
from pilot.model.proxy import Proxy
from pilot.model.services import LOCALITY_LABEL
from pilot.model.store import ConfigKey, Store

log = plog.get("autoregistration")

SOURCE = "autoregistration"
GROUP_META = "AUTO_REGISTER_GROUP"
GROUP_ANNOTATION = "istio.io/autoRegistrationGroup"
CONNECTED_AT = "istio.io/connectedAt"
DISCONNECTED_AT = "istio.io/disconnectedAt"


def entry_name(group: str, ip: str) -> str:
    # ':' (IPv6) is not allowed in object names.
    return f"{group}-{ip}".replace(":", "-")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def workload_entry(group: WorkloadGroup, proxy: Proxy, connected_at: str) -> WorkloadEntry:
    """The entry istiod's workloadEntryFromGroup makes (pure but for the timestamp given)."""
    spec = group.spec.template.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
    labels = {**group.spec.template.labels, **group.spec.metadata.labels, **proxy.labels}
    labels.pop(LOCALITY_LABEL, None)
    spec["labels"] = labels
    spec["address"] = proxy.ip_addresses[0]
    annotations = {**group.spec.metadata.annotations, GROUP_ANNOTATION: group.metadata.name,
                   CONNECTED_AT: connected_at}
    return WorkloadEntry.model_validate({
        "apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
        "metadata": {"name": entry_name(group.metadata.name, proxy.ip_addresses[0]),
                     "namespace": proxy.namespace, "labels": labels, "annotations": annotations},
        "spec": spec})


class AutoRegistration:
    """Told of every xDS connection and disconnection (DiscoveryServer.connection_listeners)."""

    def __init__(self, store: Store, grace_period: float) -> None:
        self.store = store
        self.grace_period = grace_period
        self._connections: dict[ConfigKey, int] = {}
        self._cleanup: dict[ConfigKey, asyncio.TimerHandle] = {}

    def _key(self, proxy: Proxy) -> tuple[str, ConfigKey] | None:
        group = str(proxy.metadata.get(GROUP_META) or "")
        if not group or not proxy.ip_addresses:
            return None
        return group, ConfigKey("WorkloadEntry", proxy.namespace, entry_name(group, proxy.ip_addresses[0]))

    def connected(self, proxy: Proxy) -> None:
        found = self._key(proxy)
        if found is None:
            return
        group_name, key = found
        entry = self.store.get(ConfigKey("WorkloadGroup", proxy.namespace, group_name), WorkloadGroup)
        if entry is None:
            # istiod refuses the connection; here the proxy is served, unregistered, and told so in the log.
            log.warning("auto-registration: no such WorkloadGroup", group=f"{proxy.namespace}/{group_name}",
                        proxy=proxy.id)
            return
        existing = self.store.get(key)
        if existing is not None and existing.source != SOURCE:
            log.warning("auto-registration: a WorkloadEntry of that name exists and is not ours", entry=str(key))
            return
        if (timer := self._cleanup.pop(key, None)) is not None:
            timer.cancel()
        self._connections[key] = self._connections.get(key, 0) + 1
        self.store.apply(workload_entry(entry.obj, proxy, _now()), SOURCE)
        log.info("auto-registered", entry=f"{key.namespace}/{key.name}", proxy=proxy.id)

    def disconnected(self, proxy: Proxy) -> None:
        found = self._key(proxy)
        if found is None:
            return
        _, key = found
        left = self._connections.get(key, 0) - 1
        if left < 0:
            return  # never registered (no group when it connected)
        if left > 0:
            self._connections[key] = left
            return
        del self._connections[key]
        current = self.store.get(key, WorkloadEntry)
        if current is not None and current.source == SOURCE:
            meta = current.obj.metadata
            marked = meta.model_copy(update={"annotations": {**meta.annotations, DISCONNECTED_AT: _now()}})
            self.store.apply(current.obj.model_copy(update={"metadata": marked}), SOURCE)
        self._cleanup[key] = asyncio.get_running_loop().call_later(self.grace_period, self._remove, key)

    def _remove(self, key: ConfigKey) -> None:
        self._cleanup.pop(key, None)
        if self._connections.get(key):
            return
        current = self.store.get(key)
        if current is not None and current.source == SOURCE:
            self.store.delete(key)
            log.info("auto-registration: removed after the grace period", entry=f"{key.namespace}/{key.name}")

    def close(self) -> None:
        for timer in self._cleanup.values():
            timer.cancel()
        self._cleanup.clear()
