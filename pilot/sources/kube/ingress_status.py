"""Ingress status written to the apiserver, by the leader only (istiod's ingress status
collection): each processed Ingress gets `status.loadBalancer.ingress` = the ingress gateway's
addresses (pilot/model/ingress.py computes them per PushContext).

The writer compares with the status the informer last saw and PUTs the status subresource only
where it differs (so an unchanged status is never written again), with the resourceVersion the
informer saw: a conflict is retried once the informer has the newer object. An Ingress that stops
being processed keeps the status it has, as in istiod. The Ingress model leaves `status` out of
`spec_equal`, so a status write never causes a push.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from pilot import logging as plog
from pilot.config.base import K8sObject
from pilot.config.ingress import Ingress
from pilot.config.kinds import BY_NAME
from pilot.model.store import ConfigKey
from pilot.sources.kube.client import ApiError, Kube
from pilot.sources.kube.leader_worker import LeaderWorker
from pilot.sources.kube.rbac import Rule

log = plog.get("status")

KIND = BY_NAME["Ingress"]
RBAC = (Rule("cluster", KIND.group, f"{KIND.plural}/status", frozenset({"update"})),)
RETRY_S = 1.0

Addresses = tuple[dict[str, str], ...]


class IngressStatusWriter(LeaderWorker):
    task_name = "ingress-status-writer"

    def __init__(self, kube: Kube, lookup: Callable[[ConfigKey], K8sObject | None],
                 fresh_addresses: Callable[[], Addresses | None] = lambda: None) -> None:
        """`lookup(key)`: the informer's latest copy of an Ingress (status, resourceVersion).
        `fresh_addresses()`: the ingressService's addresses as its informer last saw them (a
        status-only Service update is no Store change, so the PushContext's may be older), or
        None to use the PushContext's (the gateway pods' nodes)."""
        super().__init__()
        self.kube = kube
        self.lookup = lookup
        self.fresh_addresses = fresh_addresses
        self.writes = 0
        self._desired: Mapping[ConfigKey, Addresses] = {}
        self._written: dict[ConfigKey, tuple[str, Addresses]] = {}

    def offer(self, desired: Mapping[ConfigKey, Addresses]) -> None:
        """The statuses a new PushContext computed."""
        if desired is self._desired:
            return
        self._desired = desired
        if self.active:
            self._wake.set()

    def poke(self) -> None:
        """The ingress Service changed (its informer saw it): check the statuses again."""
        if self.active:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self.reconcile_all():
                await asyncio.sleep(RETRY_S)  # failed writes: retry soon, not in a hot loop
                self._wake.set()

    async def reconcile_all(self) -> bool:
        desired = self._desired
        fresh = self.fresh_addresses() if desired else None
        ok = True
        for key, addresses in desired.items():
            ok &= await self._reconcile(key, addresses if fresh is None else fresh)
        self._written = {k: v for k, v in self._written.items() if k in desired}
        return ok

    async def _reconcile(self, key: ConfigKey, addresses: Addresses) -> bool:
        obj = self.lookup(key)
        if not isinstance(obj, Ingress):
            return True  # gone, or not seen yet: its next event brings another push
        current = ((obj.status.get("loadBalancer") or {}).get("ingress")) or []
        want = [dict(a) for a in addresses]
        if _normal(current) == _normal(want):
            return True
        rv = obj.metadata.resource_version
        if self._written.get(key) == (rv, addresses):
            return True  # written already; the informer has not seen it yet
        status = {**obj.status, "loadBalancer": {**(obj.status.get("loadBalancer") or {}), "ingress": want}}
        body = {"apiVersion": KIND.api_version, "kind": KIND.kind,
                "metadata": {"name": key.name, "namespace": key.namespace, "resourceVersion": rv},
                "status": status}
        try:
            await self.kube.request("PUT", KIND.path(key.namespace, key.name) + "/status", body=body)
        except ApiError as e:
            if e.status == 404:
                return True
            if e.status != 409:
                log.warning("could not write Ingress status", object=str(key), status=e.status, reason=e.reason)
            return False
        except Exception as e:  # noqa: BLE001 - the apiserver is away (any transport error): retried
            log.warning("could not write Ingress status", object=str(key), error=f"{type(e).__name__}: {e}")
            return False
        self._written[key] = (rv, addresses)
        self.writes += 1
        log.debug("wrote Ingress status", object=str(key))
        return True


def _normal(entries: list) -> list[tuple[str, str]]:
    # Compared as istiod's ingressSliceEqual after sorting: hostname and ip only (ports and
    # other fields another writer may set are not ours to compare).
    return sorted((str(e.get("hostname") or ""), str(e.get("ip") or "")) for e in entries if isinstance(e, dict))
