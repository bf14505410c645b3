"""Singleton writers run by the leader only.

RootCertWriter keeps a ConfigMap `istio-ca-root-cert` (key `root-cert.pem`) in every watched
namespace, as istiod's namespace controller does, and repairs it when someone edits or deletes
it. Workloads mount it to trust the mesh CA.
"""

from __future__ import annotations

import asyncio

from pilot import logging as plog
from pilot.config.core import ConfigMap
from pilot.model.store import ConfigKey, Event, Store
from pilot.sources.kube.client import ApiError, Kube
from pilot.sources.kube.leader_worker import LeaderWorker
from pilot.sources.kube.rbac import Rule

log = plog.get("rootcert")

CONFIGMAP = "istio-ca-root-cert"
KEY = "root-cert.pem"
LABELS = {"istio.io/config": "true"}
# What _reconcile calls, in every namespace (see rbac.py): POST the ConfigMap, and on 409 GET
# it and PUT the corrected copy. Reads of ConfigMaps otherwise come from the informer.
RBAC = (Rule("cluster", "", "configmaps", frozenset({"create", "get", "update"})),)


class RootCertWriter(LeaderWorker):
    task_name = "root-cert-writer"

    def __init__(self, kube: Kube, store: Store, root_pem: str,
                 namespace_selected=lambda _ns: True) -> None:
        super().__init__()
        self.kube = kube
        self.store = store
        self.root_pem = root_pem
        self.namespace_selected = namespace_selected
        self.writes = 0
        self._dirty: set[str] = set()
        store.subscribe(self._on_events)

    def _on_start(self) -> None:
        self._dirty = {e.key.name for e in self.store.list("Namespace")}

    def set_root(self, root_pem: str) -> None:
        """A new root (a reloaded plugged-in CA): rewrite every namespace's ConfigMap."""
        if root_pem == self.root_pem:
            return
        self.root_pem = root_pem
        if self.active:
            self._dirty |= {e.key.name for e in self.store.list("Namespace")}
            self._wake.set()

    def _on_events(self, events: list[Event]) -> None:
        if not self.active:
            return
        for e in events:
            if e.key.kind == "Namespace" and e.op != "delete":
                self._dirty.add(e.key.name)
            elif e.key.kind == "ConfigMap" and e.key.name == CONFIGMAP:
                self._dirty.add(e.key.namespace)
        if self._dirty:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._dirty = self._dirty, set()
            for ns in sorted(batch):
                try:
                    await self._reconcile(ns)
                except Exception as e:  # noqa: BLE001 - retried on the next change or leadership; never fatal
                    log.warning("could not write the root cert ConfigMap", namespace=ns, error=str(e))
                    self._dirty.add(ns)
            if self._dirty:
                await asyncio.sleep(1.0)  # failed writes: retry soon, not in a hot loop
                self._wake.set()

    async def _reconcile(self, namespace: str) -> None:
        if self.store.get(ConfigKey("Namespace", "", namespace)) is None or not self.namespace_selected(namespace):
            return
        current = self.store.get(ConfigKey("ConfigMap", namespace, CONFIGMAP), ConfigMap)
        if current is not None and current.obj.data.get(KEY) == self.root_pem:
            return
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": CONFIGMAP, "namespace": namespace, "labels": LABELS},
                "data": {KEY: self.root_pem}}
        try:
            await self.kube.request("POST", path, body=body)
        except ApiError as e:
            if e.status != 409:
                raise
            existing = await self.kube.request("GET", f"{path}/{CONFIGMAP}")
            if (existing.get("data") or {}).get(KEY) == self.root_pem:
                return
            existing["data"] = {**(existing.get("data") or {}), KEY: self.root_pem}
            await self.kube.request("PUT", f"{path}/{CONFIGMAP}", body=existing)
        self.writes += 1
        log.info("wrote root cert ConfigMap", namespace=namespace)
