"""WorkloadEntry auto-registration (istiod's pilot/pkg/autoregistration/controller.go): a proxy that connects with node metadata `AUTO_REGISTER_GROUP: NAME` gets a WorkloadEntry made
from the WorkloadGroup NAME of its namespace, and loses it `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`
after its last connection closed (a reconnect within the grace period keeps it).

File mode (StoreWriter) puts the entry into the Store under its own source, so it is served like
any WorkloadEntry (endpoints of the ServiceEntries and Services that select it, /debug/configz)
and the file source's syncs, which own only what they loaded, leave it alone. Kubernetes mode
(KubeWriter) writes it to the apiserver, and the informer brings it back into the Store; every
instance registers the proxies connected to it, as istiod's controllers do.

Labels, as istiod merges them: the template's, then the group's metadata labels, then the proxy's
own LABELS (without istio-locality); annotations: the group's metadata annotations, plus
`istio.io/autoRegistrationGroup`, `istio.io/connectedAt` / `istio.io/disconnectedAt`.

Health (PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS): a proxy whose PROXY_CONFIG metadata has a
`readinessProbe` gets the `proxy.istio.io/health-checks-enabled` annotation, so its entry is no
endpoint until the agent reports healthy (pilot/agent/health.py); each report sets the entry's
`Healthy` condition (status), as istiod's health controller does.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Protocol

from pilot import logging as plog
from pilot.config.networking.service_entry import (
    HEALTH_CHECK_ANNOTATION,
    IstioCondition,
    WorkloadEntry,
    WorkloadEntryStatus,
)
from pilot.config.networking.workload_group import WorkloadGroup
from pilot.model.proxy import Proxy
from pilot.model.services import LOCALITY_LABEL
from pilot.model.store import ConfigKey, Entry, Store
from pilot.sources.kube.client import ApiError, Kube
from pilot.sources.kube.rbac import Rule

log = plog.get("autoregistration")

SOURCE = "autoregistration"
GROUP_META = "AUTO_REGISTER_GROUP"
GROUP_ANNOTATION = "istio.io/autoRegistrationGroup"
CONNECTED_AT = "istio.io/connectedAt"
DISCONNECTED_AT = "istio.io/disconnectedAt"
# KubeWriter: POST the entry (on 409 GET it and PUT ours over it), PUT the disconnect mark and the
# status (Healthy condition), DELETE.
RBAC = (Rule("cluster", "networking.istio.io", "workloadentries", frozenset({"create", "get", "update", "delete"})),
        # The Healthy condition (health checks) goes through the status subresource.
        Rule("cluster", "networking.istio.io", "workloadentries/status", frozenset({"update"})))


class Writer(Protocol):
    def owns(self, entry: Entry) -> bool: ...
    def put(self, obj: WorkloadEntry) -> None: ...
    def remove(self, key: ConfigKey) -> None: ...


class StoreWriter:
    """File mode: the entries live in the Store only."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def owns(self, entry: Entry) -> bool:
        return entry.source == SOURCE

    def put(self, obj: WorkloadEntry) -> None:
        self.store.apply(obj, SOURCE)

    def remove(self, key: ConfigKey) -> None:
        self.store.delete(key)


class KubeWriter:
    """Kubernetes mode: the entries are written to the apiserver, in order, off the caller's path."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._queue: asyncio.Queue[tuple[str, ConfigKey, WorkloadEntry | None]] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def owns(self, entry: Entry) -> bool:
        return GROUP_ANNOTATION in entry.obj.metadata.annotations

    def put(self, obj: WorkloadEntry) -> None:
        self._submit("put", ConfigKey.of(obj), obj)

    def remove(self, key: ConfigKey) -> None:
        self._submit("delete", key, None)

    def _submit(self, op: str, key: ConfigKey, obj: WorkloadEntry | None) -> None:
        self._queue.put_nowait((op, key, obj))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="autoregistration-writer")

    async def _drain(self) -> None:
        while not self._queue.empty():
            op, key, obj = self._queue.get_nowait()
            path = f"/apis/networking.istio.io/v1/namespaces/{key.namespace}/workloadentries"
            try:
                if op == "delete":
                    try:
                        await self.kube.request("DELETE", f"{path}/{key.name}")
                    except ApiError as e:
                        if e.status != 404:
                            raise
                    continue
                assert obj is not None
                body = obj.model_dump(mode="json", by_alias=True, exclude_defaults=True)
                body["apiVersion"], body["kind"] = "networking.istio.io/v1", "WorkloadEntry"
                try:
                    existing = await self.kube.request("POST", path, body=body)
                except ApiError as e:
                    if e.status != 409:
                        raise
                    existing = await self.kube.request("GET", f"{path}/{key.name}")
                    body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                    existing = await self.kube.request("PUT", f"{path}/{key.name}", body=body)
                if obj.status is not None:
                    # The status subresource: a create or update of the object leaves status alone.
                    body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                    await self.kube.request("PUT", f"{path}/{key.name}/status", body=body)
            except Exception as e:  # noqa: BLE001 - one failed write must not stop the others
                log.warning("auto-registration: writing the WorkloadEntry failed", entry=str(key), op=op,
                            error=str(e))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


def entry_name(group: str, ip: str, network: str = "") -> str:
    # ':' (IPv6) is not allowed in object names. istiod appends the proxy's network when it has one.
    return "-".join((group, ip, network) if network else (group, ip)).replace(":", "-")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def health_checked(proxy: Proxy) -> bool:
    config = proxy.metadata.get("PROXY_CONFIG")
    return isinstance(config, dict) and config.get("readinessProbe") is not None


def workload_entry(group: WorkloadGroup, proxy: Proxy, connected_at: str,
                   health_checks: bool = False) -> WorkloadEntry:
    """The entry istiod's workloadEntryFromGroup makes (pure but for the timestamp given)."""
    spec = group.spec.template.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
    labels = {**group.spec.template.labels, **group.spec.metadata.labels, **proxy.labels}
    labels.pop(LOCALITY_LABEL, None)
    spec["labels"] = labels
    spec["address"] = proxy.ip_addresses[0]
    if proxy.network:  # istiod's: the proxy's NETWORK is where its entry is reached
        spec["network"] = proxy.network
    annotations = {**group.spec.metadata.annotations, GROUP_ANNOTATION: group.metadata.name,
                   CONNECTED_AT: connected_at}
    if health_checks and health_checked(proxy):
        annotations[HEALTH_CHECK_ANNOTATION] = "true"
    return WorkloadEntry.model_validate({
        "apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
        "metadata": {"name": entry_name(group.metadata.name, proxy.ip_addresses[0], proxy.network),
                     "namespace": proxy.namespace, "labels": labels, "annotations": annotations},
        "spec": spec})


class AutoRegistration:
    """Told of every xDS connection and disconnection (DiscoveryServer.connection_listeners)."""

    def __init__(self, store: Store, grace_period: float, writer: Writer | None = None,
                 health_checks: bool = False) -> None:
        self.store = store
        self.health_checks = health_checks
        self.writer: Writer = writer or StoreWriter(store)
        self.grace_period = grace_period
        self._connections: dict[ConfigKey, int] = {}
        self._cleanup: dict[ConfigKey, asyncio.TimerHandle] = {}

    def _key(self, proxy: Proxy) -> tuple[str, ConfigKey] | None:
        group = str(proxy.metadata.get(GROUP_META) or "")
        if not group or not proxy.ip_addresses:
            return None
        return group, ConfigKey("WorkloadEntry", proxy.namespace,
                                entry_name(group, proxy.ip_addresses[0], proxy.network))

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
        if existing is not None and not self.writer.owns(existing):
            log.warning("auto-registration: a WorkloadEntry of that name exists and is not ours", entry=str(key))
            return
        if (timer := self._cleanup.pop(key, None)) is not None:
            timer.cancel()
        self._connections[key] = self._connections.get(key, 0) + 1
        self.writer.put(workload_entry(entry.obj, proxy, _now(), self.health_checks))
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
        if current is not None and self.writer.owns(current):
            meta = current.obj.metadata
            marked = meta.model_copy(update={"annotations": {**meta.annotations, DISCONNECTED_AT: _now()}})
            self.writer.put(current.obj.model_copy(update={"metadata": marked}))
        self._cleanup[key] = asyncio.get_running_loop().call_later(self.grace_period, self._remove, key)

    def health(self, proxy: Proxy, healthy: bool, message: str) -> None:
        """An istio.io/health report: the entry's Healthy condition, written only when it changes."""
        found = self._key(proxy)
        if found is None or not self.health_checks or not self._connections.get(found[1]):
            return
        current = self.store.get(found[1], WorkloadEntry)
        if current is None or not self.writer.owns(current) or \
                HEALTH_CHECK_ANNOTATION not in current.obj.metadata.annotations:
            return  # istiod's IsEligibleForHealthStatusUpdates
        status = "True" if healthy else "False"
        old = current.obj.status.conditions if current.obj.status is not None else ()
        previous = next((c for c in old if c.type == "Healthy"), None)
        if previous is not None and previous.status == status and previous.message == message:
            return
        now = _now()
        cond = IstioCondition(type="Healthy", status=status, message=message, last_probe_time=now,
                              last_transition_time=now if previous is None or previous.status != status
                              else previous.last_transition_time)
        conditions = (*(c for c in old if c.type != "Healthy"), cond)
        self.writer.put(current.obj.model_copy(update={"status": WorkloadEntryStatus(conditions=conditions)}))
        log.info("workload health", entry=f"{found[1].namespace}/{found[1].name}", healthy=healthy,
                 message=message)

    def _remove(self, key: ConfigKey) -> None:
        self._cleanup.pop(key, None)
        if self._connections.get(key):
            return
        current = self.store.get(key)
        if current is not None and self.writer.owns(current):
            self.writer.remove(key)
            log.info("auto-registration: removed after the grace period", entry=f"{key.namespace}/{key.name}")

    def close(self) -> None:
        for timer in self._cleanup.values():
            timer.cancel()
        self._cleanup.clear()
        if isinstance(self.writer, KubeWriter):
            self.writer.close()
