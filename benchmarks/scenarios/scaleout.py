"""`scaleout`: 1, 2 and 3 server replicas behind a real Envoy TCP load balancer on loopback
(benchmarks/lb.py), as istiod scales behind a Service (issue 17, target 7). 2,000 proxies with
--full (the reduced run uses --proxies), over 60 gRPC channels (TCP connections: the balancer
spreads connections, not streams, as a Kubernetes Service does).

Per replica count: how the proxies spread, each replica's CPU per full push (the mesh-wide
connectTimeout change, CDS then EDS, as in `push`) and RSS, and the push p99. With 2 and 3
replicas, one replica is stopped (SIGTERM: it drains its streams over PILOT_DRAIN_DURATION) and
its proxies, reconnecting as Envoy does, land on the others: `restart.convergence_ms` is from
the stop to each moved proxy holding its full config again; then the replica is started again.

The floor here is one replica behind the same balancer: `floor_ms` is its push p99, `ratio` the
largest replica count's p99 over it; `scaling` per replica count: the single replica's CPU per
push over the busiest replica's (2.0 for two replicas would be perfect sharing), and the single
replica's push p99 over this count's. All replicas share the machine's two cores with the load
generator and Envoy: what they can show is how the work divides, not more cores.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from benchmarks import stats
from benchmarks.lb import EnvoyLB
from benchmarks.options import Options
from benchmarks.scenarios.harness import CpuWindow, Harness, Loadgen, pooled
from benchmarks.server import ServerProcess

REPLICAS = (1, 2, 3)
CHANNELS = 60


async def _on(replica: ServerProcess) -> list[str]:
    return [r["proxy"] for r in await replica.debug("/debug/connections")]


async def _wait_reconnected(lg: Loadgen, at_least: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while (n := (await lg.stats())["reconnects"]) < at_least:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {n}/{at_least} proxies reconnected within {timeout:.0f}s")
        await asyncio.sleep(0.1)  # polling a condition, with a deadline
    return n


async def _one(opts: Options, count: int, last: bool) -> tuple[dict, Harness]:
    async with Harness(opts, "scaleout") as h:
        replicas = [h.server]
        h.server.grpc_port_wanted = h.server.grpc_port  # a restart binds the same port again
        try:
            for i in range(1, count):
                workdir = h.workdir / f"replica-{i}"
                workdir.mkdir()
                r = ServerProcess(workdir, h.mesh.root, dict(opts.server_env))
                replicas.append(r)
                await r.start(timeout=opts.timeout())
                r.grpc_port_wanted = r.grpc_port
            lb = EnvoyLB(h.workdir, [r.grpc_port for r in replicas])
            await lb.start()
            try:
                out = await _measure(h, opts, replicas, lb)
            finally:
                await lb.stop()
        finally:
            for r in replicas[1:]:
                await r.stop()
        out["figures"] = await h.server_figures()
        if last:
            h.result(**out)
        return out, h


async def _measure(h: Harness, opts: Options, replicas: list[ServerProcess], lb: EnvoyLB) -> dict:
    args = ["--target", f"127.0.0.1:{lb.port}", "--channels", str(CHANNELS), "--namespaces", str(opts.namespaces),
            "--reconnect", *(["--delta"] if opts.delta else [])]
    child, _ = await h.child("benchmarks.loadgen", args, "loadgen")
    lg = Loadgen(child, opts)
    t0 = time.time()
    sync = await h.connect_all(lg, opts.proxies)
    initial_ms = stats.summary((t - t0) * 1000 for t in sync["synced_at"])
    spread = [len(await _on(r)) for r in replicas]
    rounds = []
    for _ in range(opts.rounds):
        windows = [CpuWindow(r.cpu_s) for r in replicas]
        x = time.time()
        h.mesh.bump_connect_timeout()
        cds = (await lg.converge("cds", [(x, None)], opts.timeout()))["changes"][0]
        eds = (await lg.converge("eds", [(x, None)], opts.timeout()))["changes"][0]
        for w in windows:
            w.close()
        rounds.append({"cds": cds, "eds": eds, "cpu_s": [w.cpu for w in windows]})
    cpu_per_push = [sum(r["cpu_s"][i] for r in rounds) / len(rounds) for i in range(len(replicas))]
    out = {"replicas": len(replicas), "proxies_per_replica": spread,
           "initial_sync_ms": initial_ms,
           "convergence_ms": stats.summary(pooled([r["eds"] for r in rounds])),
           "cds_convergence_ms": stats.summary(pooled([r["cds"] for r in rounds])),
           "proxies_acked": min(r["eds"]["acked"] for r in rounds),
           "cpu_per_push_s": cpu_per_push, "cpu_per_push_total_s": sum(cpu_per_push),
           "cpu_per_push_max_s": max(cpu_per_push),
           "rss_mb": [r.rss_mb() for r in replicas], "peak_rss_mb": [r.peak_rss_mb() for r in replicas]}
    if len(replicas) > 1:
        out["restart"] = await _restart(lg, opts, replicas[-1])
    out["loadgen"] = await lg.stats()
    await lg.stop()
    return out


async def _restart(lg: Loadgen, opts: Options, victim: ServerProcess) -> dict:
    moved = set(await _on(victim))
    before = (await lg.stats())["reconnects"]
    t0 = time.time()
    await victim.stop()
    stopped_s = time.time() - t0
    await _wait_reconnected(lg, before + len(moved), opts.timeout())
    sync = await lg.synced(opts.timeout())
    ids = sync.get("ids")
    # Every proxy holds its full config again; the moved ones are those that reconnected.
    ms = sorted((t - t0) * 1000 for t in sync["synced_at"] if t > t0)
    await victim.start(timeout=opts.timeout())
    return {"moved": len(moved), "stop_s": stopped_s, "synced": sync["synced"], "proxies": sync["proxies"],
            "reconverged": len(ms), "convergence_ms": stats.summary(ms), "restarted": True,
            **({"ids": ids} if ids else {})}


async def run(opts: Options) -> dict:
    if opts.full:
        opts = replace(opts, proxies=2 * opts.proxies)  # 2,000: the size for replicas
    runs = {}
    h = None
    for n in REPLICAS:
        runs[n], h = await _one(opts, n, last=n == REPLICAS[-1])
    one = runs[1]
    scaling = {n: {"cpu_per_push": round(one["cpu_per_push_max_s"] / r["cpu_per_push_max_s"], 2)
                   if r["cpu_per_push_max_s"] else None,
                   "push_p99": round(one["convergence_ms"]["p99"] / r["convergence_ms"]["p99"], 2)
                   if r["convergence_ms"]["p99"] else None} for n, r in runs.items()}
    top = runs[REPLICAS[-1]]
    result = h._results[-1] if h is not None and h._results else {}
    floor_p99 = one["convergence_ms"]["p99"]
    result.update({
        "change": "mesh connectTimeout (full push) with 1, 2, 3 replicas behind an Envoy TCP balancer; "
                  "then one replica stopped and restarted",
        "by_replicas": runs, "scaling": scaling, "floor_ms": floor_p99,
        "ratio": round(top["convergence_ms"]["p99"] / floor_p99, 3) if floor_p99 else None,
        "server_cpu_s": top["cpu_per_push_max_s"], "server_rss_mb": max(top["rss_mb"]),
        "proxies_acked": min(min(r["proxies_acked"] for r in runs.values()),
                             *(r["restart"]["synced"] for r in runs.values() if "restart" in r)),
        "note": "; ".join(f"{n} replicas: spread {r['proxies_per_replica']}, max CPU/push "
                          f"{r['cpu_per_push_max_s']:.2f} s, p99 {r['convergence_ms']['p99']:.0f} ms"
                          + (f", restart moved {r['restart']['moved']} reconverged p99 "
                             f"{r['restart']['convergence_ms']['p99']} ms" if "restart" in r else "")
                          for n, r in runs.items()) + f"; scaling {scaling}",
    })
    return result
