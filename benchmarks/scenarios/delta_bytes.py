"""`delta_bytes`: bytes a delta proxy is sent per push, for one change of each kind (issue 17,
target 6): add one Service (with its EndpointSlice), change one Service (its cluster IP, which
only its virtual host reads), remove that added Service, move one endpoint. Always delta.

Per change, `per_proxy_bytes` is what the load generator read over all proxies (by type)
divided by the proxies, from the change until the push is over (every response the server wrote
has been read and no proxy waits for a name it subscribed to). Proxy 0 keeps a ledger
(benchmarks/ledger.py) of every resource it was sent against what it already held:

- the floor (`needed_bytes`) is what proxy 0 was sent less every resource entry whose bytes it
  already held (what a delta server that sends only changes must send, envelopes included);
  `ratio` is proxy 0's bytes over it: 1.0 when nothing unchanged was sent.
  `changed_payload_bytes` is the serialised resources alone, without envelopes;
- `split`: for each changed route configuration, the virtual hosts whose bytes changed, as VHDS
  resources (`vhds_bytes`) or as route configurations of their own (`per_service_route_bytes`),
  and `split_ratio`, what we send over what VHDS would (the saving a split would bring).

All services share port 8080 (benchmarks/mesh.py), so one route configuration per namespace of
the proxy holds every service's virtual host: the case the issue asks to measure.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from benchmarks import stats
from benchmarks.mesh import PORT
from benchmarks.options import Options
from benchmarks.scenarios.harness import CpuWindow, Harness, Loadgen

ROUTE = str(PORT)  # the shared route configuration's name (rds.route_config_name of 0.0.0.0_8080)


async def settled(h: Harness, lg: Loadgen, timeout: float) -> dict:
    """Until the push is over: the server writes nothing and has nothing queued, every response
    it wrote was read by a proxy, and no proxy waits for a name it subscribed to (a request on
    the wire shows there). Returns the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await h.server.debug("/debug/connections")
        mine = await lg.child.request("quiet")
        sent = sum(r["responsesSent"] for r in rows)
        busy = [r["proxy"] for r in rows if r["state"] != "idle" or r["requestsQueued"] or r["pushPending"]]
        reading = {"server_responses": sent, "loadgen_responses": mine["responses"], "busy": len(busy),
                   "waiting": mine["waiting"], "open": mine["open"]}
        if not busy and not mine["waiting"] and sent == mine["responses"]:
            return reading
        if time.monotonic() > deadline:
            errors = (await lg.stats())["errors"]
            raise RuntimeError(f"push not over within {timeout:.0f}s: {reading}, proxy errors {errors}")
        await asyncio.sleep(0.05)  # polling a condition, with a deadline


def _kb(n: float) -> float:
    return round(n / 1024, 2)


async def _step(h: Harness, lg: Loadgen, opts: Options, kind: str, change, type_: str) -> dict:
    """`change()` makes the change and returns the resource name of type `type_` that carries
    it (None: any response of that type after the change)."""
    before = (await lg.stats())["bytes"]
    window = CpuWindow(h.server.cpu_s)
    x = time.time()
    name = change()
    conv = (await lg.converge(type_, [(x, name)], opts.timeout()))["changes"][0]
    await settled(h, lg, opts.timeout())
    window.close()
    after = (await lg.stats())["bytes"]
    ledger = await lg.child.request("ledger", reset=True)
    per_proxy = {t: round((n - before.get(t, 0)) / opts.proxies) for t, n in after.items()
                 if n != before.get(t, 0)}
    by_type = ledger["by_type"]
    sent = sum(t["bytes"] for t in by_type.values())
    # The floor: what was sent, less every resource the proxy already held with the same bytes.
    needed = sent - sum(t["unchanged_entry_bytes"] for t in by_type.values())
    payload = sum(t["changed_bytes"] for t in by_type.values())
    split = ledger["split"]
    # What a split would send: everything but the changed route configurations, plus their
    # changed virtual hosts as VHDS resources.
    vhds_total = sent - split["route_config_bytes"] + split["vhds_bytes"]
    return {"kind": kind, "convergence_ms": stats.summary(conv["ack_ms"]), "ack_ms": conv["ack_ms"], "acked": conv["acked"],
            "server_cpu_s": window.cpu, "per_proxy_bytes": per_proxy,
            "per_proxy_total_bytes": sum(per_proxy.values()),
            "proxy0": {"sent_bytes": sent, "needed_bytes": needed, "changed_payload_bytes": payload, "by_type": by_type, "split": split,
                       "with_vhds_bytes": vhds_total},
            "ratio": round(sent / needed, 3) if needed else None,
            "split_ratio": round(sent / vhds_total, 1) if vhds_total else None}


async def run(opts: Options) -> dict:
    opts = replace(opts, delta=True)
    async with Harness(opts, "delta_bytes") as h:
        lg = await h.loadgen(h.server.grpc_port)
        await h.connect_all(lg, opts.proxies)
        await settled(h, lg, opts.timeout())
        await lg.child.request("ledger", reset=True)
        mesh = h.mesh
        changed = mesh.services[1 % len(mesh.services)]
        moved = mesh.services[2 % len(mesh.services)]
        added = []

        def add() -> str:
            added.append(mesh.add_service())
            return added[0].cluster

        def change() -> str:
            mesh.move_cluster_ip(changed)
            return ROUTE

        def remove() -> None:
            mesh.remove_service(added[0])

        def endpoint() -> str:
            mesh.move_endpoint(moved)
            return moved.cluster

        results = [await _step(h, lg, opts, kind, fn, type_) for kind, fn, type_ in (
            ("add_service", add, "cds"), ("change_service", change, "rds"),
            ("remove_service", remove, "cds"), ("endpoint_change", endpoint, "eds"))]
        lg_stats = await lg.stats()
        pooled = [v for r in results for v in r.pop("ack_ms")]
        by_kind = {r["kind"]: r for r in results}
        note = "; ".join(f"{r['kind']} {_kb(r['per_proxy_total_bytes'])} KB/proxy (needed "
                         f"{_kb(r['proxy0']['needed_bytes'])}, with VHDS {_kb(r['proxy0']['with_vhds_bytes'])})"
                         for r in results)
        return h.result(
            change="add, change, remove one Service; move one endpoint (delta proxies)",
            convergence_ms=stats.summary(pooled),
            floor_bytes={k: r["proxy0"]["needed_bytes"] for k, r in by_kind.items()},
            bytes_per_proxy={k: r["per_proxy_total_bytes"] for k, r in by_kind.items()},
            ratio=max((r["ratio"] for r in results if r["ratio"]), default=None),
            ratios={k: r["ratio"] for k, r in by_kind.items()},
            split_ratios={k: r["split_ratio"] for k, r in by_kind.items()},
            proxies_acked=min(r["acked"] for r in results),
            server_cpu_s=sum(r["server_cpu_s"] for r in results) / len(results),
            server_rss_mb=h.server.rss_mb(),
            steps=results,
            bytes_received={"total_by_type": lg_stats["bytes"]},
            loadgen=lg_stats,
            note=note,
        )
