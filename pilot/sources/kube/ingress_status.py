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

from collections.abc import Callable, Mapping

from pilot.config.base import K8sObject
from pilot.config.ingress import Ingress
from pilot.config.kinds import BY_NAME
from pilot.model.store import ConfigKey
from pilot.sources.kube.client import Kube
from pilot.sources.kube.rbac import Rule
from pilot.sources.kube.status_put import StatusPutWorker

KIND = BY_NAME["Ingress"]
RBAC = (Rule("cluster", KIND.group, f"{KIND.plural}/status", frozenset({"update"})),)

Addresses = tuple[dict[str, str], ...]


class IngressStatusWriter(StatusPutWorker):
    task_name = "ingress-status-writer"

    def __init__(self, kube: Kube, lookup: Callable[[ConfigKey], K8sObject | None],
                 fresh_addresses: Callable[[], Addresses | None] = lambda: None) -> None:
        """`lookup(key)`: the informer's latest copy of an Ingress (status, resourceVersion).
        `fresh_addresses()`: the ingressService's addresses as its informer last saw them (a
        status-only Service update is no Store change, so the PushContext's may be older), or
        None to use the PushContext's (the gateway pods' nodes)."""
        super().__init__(kube)
        self.lookup = lookup
        self.fresh_addresses = fresh_addresses
        self._desired: Mapping[ConfigKey, Addresses] = {}

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

    async def reconcile_all(self) -> bool:
        desired = self._desired
        fresh = self.fresh_addresses() if desired else None
        ok = True
        for key, addresses in desired.items():
            ok &= await self._reconcile(key, addresses if fresh is None else fresh)
        self._forget_except(desired)
        return ok

    async def _reconcile(self, key: ConfigKey, addresses: Addresses) -> bool:
        obj = self.lookup(key)
        if not isinstance(obj, Ingress):
            return True  # gone, or not seen yet: its next event brings another push
        current = ((obj.status.get("loadBalancer") or {}).get("ingress")) or []
        want = [dict(a) for a in addresses]
        if _normal(current) == _normal(want):
            return True
        status = {**obj.status, "loadBalancer": {**(obj.status.get("loadBalancer") or {}), "ingress": want}}
        return await self._put(key, obj.metadata.resource_version, status)


def _normal(entries: list) -> list[tuple[str, str]]:
    # Compared as istiod's ingressSliceEqual after sorting: hostname and ip only (ports and
    # other fields another writer may set are not ours to compare).
    return sorted((str(e.get("hostname") or ""), str(e.get("ip") or "")) for e in entries if isinstance(e, dict))
