"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Only the leader runs singleton controllers (the root-cert ConfigMap writer, later status
writers); every replica serves xDS regardless. The lease is released on shutdown so another
replica takes over at once instead of waiting out the lease.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from pilot import logging as plog
from pilot.sources.kube.client import ApiError, Kube
from pilot.sources.kube.rbac import Rule

log = plog.get("leader")

LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
# What _try_acquire_or_renew and release call, in the system namespace only (see rbac.py):
# GET the lease, POST it when absent, PUT it to renew, take over or release.
RBAC = (Rule("namespace", "coordination.k8s.io", "leases", frozenset({"get", "create", "update"})),)


def _now() -> datetime:
    return datetime.now(UTC)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


class LeaderElection:
    def __init__(self, kube: Kube, namespace: str, name: str, identity: str, *,
                 lease_duration: float = 30.0, renew_deadline: float = 15.0, retry_period: float = 7.5,
                 on_started: Callable[[], Awaitable[None]] | None = None,
                 on_stopped: Callable[[], Awaitable[None]] | None = None) -> None:
        self.kube = kube
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.on_started, self.on_stopped = on_started, on_stopped
        self.is_leader = False
        self.transitions = 0
        self._lease: dict | None = None
        self._task: asyncio.Task | None = None  # run(), stopped by release()

    @property
    def _path(self) -> str:
        return LEASE_PATH.format(ns=self.namespace)

    async def run(self) -> None:
        self._task = asyncio.current_task()
        try:
            while True:
                await self._acquire()
                await self._renew_until_lost()
        finally:
            if self.is_leader:
                await self._lose()

    async def _acquire(self) -> None:
        while True:
            if await self._try_acquire_or_renew():
                self.is_leader = True
                self.transitions += 1
                log.info("became leader", lease=self.name, identity=self.identity)
                if self.on_started is not None:
                    await self.on_started()
                return
            await asyncio.sleep(self.retry_period * random.uniform(1.0, 1.2))  # jitter, like client-go

    async def _renew_until_lost(self) -> None:
        last_renew = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(self.retry_period / 2)
            now = asyncio.get_running_loop().time()
            if await self._try_acquire_or_renew():
                last_renew = now
            elif now - last_renew > self.renew_deadline:
                log.warning("lost leadership (could not renew in time)", lease=self.name)
                await self._lose()
                return

    async def _lose(self) -> None:
        self.is_leader = False
        if self.on_stopped is not None:
            await self.on_stopped()

    async def _try_acquire_or_renew(self) -> bool:
        now = _now()
        try:
            lease = await self.kube.request("GET", f"{self._path}/{self.name}")
        except ApiError as e:
            if e.status != 404:
                log.debug("lease read failed", error=str(e))
                return False
            lease = None
        except Exception as e:  # noqa: BLE001 - the apiserver is away: keep leading only within renew_deadline
            log.debug("lease read failed", error=str(e))
            return False
        spec_now = {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration),
                    "renewTime": _fmt(now)}
        try:
            if lease is None:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": {**spec_now, "acquireTime": _fmt(now), "leaseTransitions": 0}}
                self._lease = await self.kube.request("POST", self._path, body=body)
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
            duration = spec.get("leaseDurationSeconds") or self.lease_duration
            expired = renewed is None or now > renewed + timedelta(seconds=duration)
            if holder and holder != self.identity and not expired:
                return False
            new_spec = {**spec, **spec_now}
            if holder != self.identity:
                new_spec["acquireTime"] = _fmt(now)
                new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            # The resourceVersion makes this a compare-and-swap: two replicas cannot both win.
            lease = {**lease, "spec": new_spec}
            self._lease = await self.kube.request("PUT", f"{self._path}/{self.name}", body=lease)
            return True
        except ApiError as e:
            if e.status != 409:
                log.debug("lease write failed", error=str(e))
            return False
        except Exception as e:  # noqa: BLE001 - any failure here is retried or reported, never fatal
            log.debug("lease write failed", error=str(e))
            return False

    async def release(self) -> None:
        """Give the lease up (shutdown): another replica can take it at its next retry.

        The renew loop is stopped first: left running, its next round would find the lease
        free and take it straight back, and the other replicas would wait out the lease
        duration after all. The lease is then read again, so a renewal cut short after
        the apiserver applied it cannot leave a stale resourceVersion to conflict with."""
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        # What the apiserver says, not is_leader: a lease won while the loop was being
        # stopped is released too.
        try:
            lease = await self.kube.request("GET", f"{self._path}/{self.name}", timeout=5)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease = {**lease, "spec": {**lease["spec"], "holderIdentity": "",
                                           "leaseDurationSeconds": 1, "renewTime": _fmt(_now())}}
                await self.kube.request("PUT", f"{self._path}/{self.name}", body=lease, timeout=5)
                log.info("released leadership", lease=self.name)
        except ApiError as e:
            if e.status != 404:  # no lease: nothing to give up
                log.warning("could not release the lease", error=str(e))
        except Exception as e:  # noqa: BLE001 - any failure here is retried or reported, never fatal
            log.warning("could not release the lease", error=str(e))
        if self.is_leader:
            await self._lose()
