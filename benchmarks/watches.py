"""Waiting, inside the load generator, until every proxy has seen something.

A watch is offered each response as its ACK is written, so waiting costs O(responses), not
O(proxies) per response; when created it first replays what the proxies already recorded, so a
question asked after the fact ("did everyone get the change made at time X?") is answered the
same way as one asked before.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from benchmarks.proxy import Received, SimProxy


class ChangeWatch:
    """For each change (wall time X, resource name or None for "any"), the first response of one
    type that each proxy received at or after X and that carries that resource, once ACKed."""

    def __init__(self, type_: str, changes: list[tuple[float, str | None]], proxies: list[SimProxy]) -> None:
        self.type = type_
        self.changes = changes
        self.proxies = {p.index: p for p in proxies}
        self.by_name: dict[str | None, list[int]] = defaultdict(list)
        for i, (_, name) in enumerate(changes):
            self.by_name[name].append(i)
        # proxy index -> change index -> the response that delivered it
        self.hits: dict[int, dict[int, Received]] = {p.index: {} for p in proxies}
        self.remaining = len(changes) * len(proxies)
        self.failed: set[int] = set()
        self.done = asyncio.Event()
        for p in proxies:
            for ev in p.history:
                self.offer(p, ev)
            if p.closed:
                self.fail(p)
        self._check()

    def offer(self, proxy: SimProxy, ev: Received) -> None:
        if ev.type != self.type:
            return
        hits = self.hits.get(proxy.index)
        if hits is None:
            return
        wanted = [self.by_name.get(None, ())]
        if len(ev.contents.names) < len(self.by_name):
            wanted.extend(self.by_name.get(n, ()) for n in ev.contents.names)
        else:
            names = ev.contents.name_set
            wanted.extend(idx for n, idx in self.by_name.items() if n is not None and n in names)
        for indexes in wanted:
            for i in indexes:
                if i not in hits and ev.recv >= self.changes[i][0]:
                    hits[i] = ev
                    self.remaining -= 1
        self._check()

    def fail(self, proxy: SimProxy) -> None:
        """A proxy whose stream ended can never deliver: stop waiting for it."""
        if proxy.index in self.proxies and proxy.index not in self.failed:
            self.failed.add(proxy.index)
            self.remaining -= len(self.changes) - len(self.hits[proxy.index])
            self._check()

    def _check(self) -> None:
        if self.remaining <= 0:
            self.done.set()

    def result(self) -> dict:
        """Per change: per-proxy milliseconds from X to receipt and to ACK, in proxy order."""
        out = []
        for i, (since, name) in enumerate(self.changes):
            ack_ms, recv_ms, sizes, resources = [], [], [], []
            for idx in sorted(self.hits):
                ev = self.hits[idx].get(i)
                if ev is None:
                    continue
                ack_ms.append(round((ev.ack - since) * 1000, 3))
                recv_ms.append(round((ev.recv - since) * 1000, 3))
                sizes.append(ev.size)
                resources.append(len(ev.contents.names))
            missing = [self.proxies[idx].node.id for idx, h in self.hits.items() if i not in h]
            out.append({"since": since, "name": name, "acked": len(ack_ms), "ack_ms": ack_ms,
                        "recv_ms": recv_ms, "bytes": sum(sizes), "max_bytes": max(sizes, default=0),
                        "resources_max": max(resources, default=0),
                        "resources_min": min(resources, default=0), "missing": missing[:10],
                        "missing_count": len(missing)})
        return {"proxies": len(self.proxies), "changes": out}


class SyncWatch:
    """Every proxy holds its full config (CDS, EDS, LDS, RDS all received and ACKed)."""

    def __init__(self, proxies: list[SimProxy]) -> None:
        self.proxies = proxies
        self.pending = {p.index for p in proxies if p.synced_at is None and not p.closed}
        self.done = asyncio.Event()
        self._check()

    def offer(self, proxy: SimProxy, ev: Received) -> None:
        if proxy.synced_at is not None:
            self.pending.discard(proxy.index)
            self._check()

    def fail(self, proxy: SimProxy) -> None:
        self.pending.discard(proxy.index)
        self._check()

    def _check(self) -> None:
        if not self.pending:
            self.done.set()

    def result(self) -> dict:
        synced = [p for p in self.proxies if p.synced_at is not None]
        return {"proxies": len(self.proxies), "synced": len(synced),
                "synced_ms": [round((p.synced_at - p.started_at) * 1000, 3) for p in synced],
                "synced_at": [p.synced_at for p in synced],
                "started_at": min((p.started_at for p in self.proxies), default=0.0),
                "missing": [p.node.id for p in self.proxies if p.synced_at is None][:10],
                "errors": sorted({p.error for p in self.proxies if p.error})[:10]}
