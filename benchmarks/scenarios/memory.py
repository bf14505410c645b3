"""`memory`: the server's RSS with S services and 0, P and 2P connected proxies (each step
waits until every proxy holds its full config). The growth per proxy is what a proxy costs the
server: its connection state, not its config, if bytes are shared. The floor (a bare grpc.aio
server streaming the bytes proxy 0 was sent) is then measured the same way: its growth per proxy
is gRPC's own per-stream share, and `per_proxy_kb_beyond_floor` what our server adds to it."""

from __future__ import annotations

import time

from benchmarks import stats
from benchmarks.options import Options
from benchmarks.scenarios.harness import CpuWindow, Harness, floor_memory


async def run(opts: Options) -> dict:
    async with Harness(opts, "memory", probe=True) as h:
        steps = [{"proxies": 0, "rss_mb": h.server.rss_mb(), "heap": await h.server.heap()}]
        lg = await h.loadgen(h.server.grpc_port)
        window = CpuWindow(h.server.cpu_s)
        last = None
        for total in (opts.proxies, 2 * opts.proxies):
            connected = steps[-1]["proxies"]
            began = time.time()
            last = await h.connect_all(lg, total - connected, start=connected)
            # The step's own lag, read before the probe: its full collection (benchmarks/heapprobe)
            # stalls the server's loop too, and the scenario's `loop_lag_ms` includes it.
            lag = await h.server.loop_lag(began)
            steps.append({"proxies": total, "rss_mb": h.server.rss_mb(), "heap": await h.server.heap(),
                          "synced_ms": stats.summary(last["synced_ms"]), "loop_lag_ms": lag})
        window.close()
        lg_stats = await lg.stats()
        p = max(1, opts.proxies)
        per_proxy_kb = (steps[2]["rss_mb"] - steps[1]["rss_mb"]) * 1024 / p
        # The same difference less the free memory glibc holds for reuse (benchmarks/heapprobe):
        # what the added proxies keep, without the burst's leftovers.
        in_use_per_proxy_kb = (steps[2]["heap"]["in_use_kb"] - steps[1]["heap"]["in_use_kb"]) / p
        captured = {t: h.workdir / f"{t}-response.bin" for t in ("cds", "eds", "lds", "rds")}
        for t, path in captured.items():
            await lg.capture(t, path)
        await lg.stop()
        await h.server_figures()
        await h.server.stop()  # free the CPU and memory for the floor
        floor = await floor_memory(h, opts, captured)
        return h.result(
            proxies=2 * opts.proxies,
            rss_mb_by_proxies={str(s["proxies"]): round(s["rss_mb"], 1) for s in steps},
            per_proxy_kb=round(per_proxy_kb, 1),
            in_use_per_proxy_kb=round(in_use_per_proxy_kb, 1),
            in_use_mb_by_proxies={str(s["proxies"]): round(s["heap"]["in_use_kb"] / 1024, 1) for s in steps},
            floor=floor,
            floor_per_proxy_kb=floor["per_proxy_kb"],
            per_proxy_kb_beyond_floor=round(per_proxy_kb - floor["per_proxy_kb"], 1),
            floor_in_use_per_proxy_kb=floor["in_use_per_proxy_kb"],
            floor_peak_rss_mb=floor["peak_rss_mb"],
            steps=steps,
            connect_loop_lag_ms=[s["loop_lag_ms"] for s in steps[1:]],
            convergence_ms=stats.summary(last["synced_ms"]) if last else stats.summary([]),
            proxies_acked=last["synced"] if last else 0,
            server_cpu_s=window.cpu,
            server_rss_mb=steps[-1]["rss_mb"],
            bytes_received={"total_by_type": lg_stats["bytes"]},
            loadgen=lg_stats,
            note=f"RSS {steps[0]['rss_mb']:.0f}/{steps[1]['rss_mb']:.0f}/{steps[2]['rss_mb']:.0f} MB "
                 f"at 0/{opts.proxies}/{2 * opts.proxies} proxies; KB per proxy {per_proxy_kb:.0f} "
                 f"(in use {in_use_per_proxy_kb:.0f}), floor {floor['per_proxy_kb']:.0f} "
                 f"(in use {floor['in_use_per_proxy_kb']:.0f})",
        )
