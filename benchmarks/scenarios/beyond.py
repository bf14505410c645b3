"""`beyond`: past 1,000 proxies (issue 17, target 8). Proxies are added a step at a time, each
step on a load generator process of its own (one process cannot read 5,000 proxies' pushes), up
to 5 steps: with --full 1,000 services and steps of 1,000 proxies (5,000), reduced the run's
--services and steps of --proxies. After each step: the time until the new proxies hold their
full config, the server's RSS, and one full push (the mesh connectTimeout: CDS then EDS to
every proxy) with its p99 and the server's CPU.

`curve` lists those per step; `per_proxy` gives the slopes, RSS KB and CPU ms per push per
proxy, from the first step to each later one: linear growth keeps them flat. The floor for the
push is the first step's (1,000 proxies with --full): `floor_ms` is its push p99 per proxy
times the last step's proxies (what a linear server would need), `ratio` ours over it.
`peak_rss_mb` is the kernel's high-water mark over the whole run (target: at most 1 GB).
"""

from __future__ import annotations

import time

from benchmarks import stats
from benchmarks.options import Options
from benchmarks.scenarios.harness import CpuWindow, Harness, pooled

STEPS = 5


async def run(opts: Options) -> dict:
    step = opts.proxies  # 1,000 with --full
    total = step * STEPS
    async with Harness(opts, "beyond") as h:
        loadgens, curve = [], []
        for k in range(STEPS):
            lg = await h.loadgen(h.server.grpc_port, label=f"loadgen-{k}")
            loadgens.append(lg)
            t0 = time.time()
            sync = await h.connect_all(lg, step, start=k * step)
            connect_ms = stats.summary((t - t0) * 1000 for t in sync["synced_at"])
            rss = h.server.rss_mb()
            window = CpuWindow(h.server.cpu_s)
            x = time.time()
            h.mesh.bump_connect_timeout()
            eds = [(await g.converge("eds", [(x, None)], opts.timeout(per_proxy_s=0.05 * (k + 1))))["changes"][0]
                   for g in loadgens]
            window.close()
            proxies = (k + 1) * step
            acked = sum(c["acked"] for c in eds)
            curve.append({"proxies": proxies, "connect_ms": connect_ms, "rss_mb": rss,
                          "push_ms": stats.summary(pooled(eds)), "push_cpu_s": window.cpu, "acked": acked,
                          "loadgen_cpu_s": [(await g.stats())["cpu_s"] for g in loadgens]})
        first, last = curve[0], curve[-1]
        per_proxy = [{"proxies": c["proxies"],
                      "rss_kb": round((c["rss_mb"] - first["rss_mb"]) * 1024 / (c["proxies"] - first["proxies"]), 1),
                      "push_cpu_ms": round((c["push_cpu_s"] - first["push_cpu_s"]) * 1000
                                           / (c["proxies"] - first["proxies"]), 3)}
                     for c in curve[1:]]
        linear_p99 = first["push_ms"]["p99"] * last["proxies"] / first["proxies"] if first["push_ms"]["p99"] else None
        return h.result(
            change=f"proxies added {step} at a time to {total}; one full push (connectTimeout) after each step",
            proxies=total,
            curve=curve, per_proxy=per_proxy,
            convergence_ms=last["push_ms"],
            floor_ms=linear_p99,
            ratio=round(last["push_ms"]["p99"] / linear_p99, 3) if linear_p99 else None,
            proxies_acked=last["acked"],
            server_cpu_s=last["push_cpu_s"],
            server_rss_mb=last["rss_mb"],
            note="RSS " + ", ".join(f"{c['rss_mb']:.0f}" for c in curve) + " MB; push CPU "
                 + ", ".join(f"{c['push_cpu_s']:.2f}" for c in curve) + " s; push p99 "
                 + ", ".join(f"{c['push_ms']['p99']:.0f}" for c in curve) + " ms at "
                 + ", ".join(str(c["proxies"]) for c in curve) + " proxies",
        )
