"""What the leader-only status writers (Gateway API, Ingress) share: one pass reconciles every
object, a failed pass is retried soon, and each write PUTs the status subresource with the
resourceVersion the informer saw. A conflict (someone wrote meanwhile) or an apiserver away fails
the pass; the next one starts from the informer's newer copy. A write is remembered with the
resourceVersion it was made over, so it is not repeated before the informer sees it."""

from __future__ import annotations

import asyncio
from collections.abc import Container
from typing import Any

from pilot import logging as plog
from pilot.config.kinds import BY_NAME
from pilot.model.store import ConfigKey
from pilot.sources.kube.client import ApiError, Kube
from pilot.sources.kube.leader_worker import LeaderWorker
from pilot.sources.kube.rbac import Rule

log = plog.get("status")
RETRY_S = 1.0
# The status PUT's rules are its users' (status_writer, ingress_status): each names the kinds it writes.
RBAC: tuple[Rule, ...] = ()


class StatusPutWorker(LeaderWorker):
    def __init__(self, kube: Kube) -> None:
        super().__init__()
        self.kube = kube
        self.writes = 0
        self.conflicts = 0
        self._written: dict[ConfigKey, tuple[str, Any]] = {}  # key -> (resourceVersion written over, status)

    async def reconcile_all(self) -> bool:
        """One pass over everything; False when some write must be retried."""
        raise NotImplementedError

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self.reconcile_all():
                await asyncio.sleep(RETRY_S)  # failed writes: retry soon, not in a hot loop
                self._wake.set()

    def _forget_except(self, keep: Container[ConfigKey]) -> None:
        """Forget the writes of objects no longer desired (deleted ones)."""
        self._written = {k: v for k, v in self._written.items() if k in keep}

    async def _put(self, key: ConfigKey, resource_version: str, status: dict) -> bool:
        """PUT `status` over `resource_version`; True when written (or already, or the object is
        gone), False when the pass must be retried."""
        if self._written.get(key) == (resource_version, status):
            return True  # written already; the informer has not seen it yet
        kind = BY_NAME[key.kind]
        body = {"apiVersion": kind.api_version, "kind": kind.kind,
                "metadata": {"name": key.name, **({"namespace": key.namespace} if kind.namespaced else {}),
                             "resourceVersion": resource_version},
                "status": status}
        try:
            await self.kube.request("PUT", kind.path(key.namespace or None, key.name) + "/status", body=body)
        except ApiError as e:
            if e.status == 409:
                self.conflicts += 1
                return False
            if e.status == 404:
                return True
            log.warning("could not write status", object=str(key), status=e.status, reason=e.reason)
            return False
        except Exception as e:  # noqa: BLE001 - the apiserver is away (any transport error): retried
            log.warning("could not write status", object=str(key), error=f"{type(e).__name__}: {e}")
            return False
        self._written[key] = (resource_version, status)
        self.writes += 1
        log.debug("wrote status", object=str(key))
        return True
