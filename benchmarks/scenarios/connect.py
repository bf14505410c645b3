"""`connect`: P proxies connect at once, with the server's default settings; the time until each
holds its full config (CDS, EDS for every cluster, LDS, RDS for every route, all ACKed),
measured from the moment of the burst. The floor then serves the same bytes (what proxy 0 was
sent of each type) to the same burst: `ratio` is our p99 over the floor's."""

from __future__ import annotations

from benchmarks import stats
from benchmarks.options import Options
from benchmarks.scenarios.harness import CpuWindow, Harness, floor_connect


async def run(opts: Options) -> dict:
    async with Harness(opts, "connect") as h:
        lg = await h.loadgen(h.server.grpc_port)
        window = CpuWindow(h.server.cpu_s)
        await lg.connect(0, opts.proxies)
        sync = await lg.synced(opts.timeout())
        window.close()
        t0 = window.t0
        ms = [(t - t0) * 1000 for t in sync["synced_at"]]
        lg_stats = await lg.stats()
        rss = h.server.rss_mb()
        captured = {t: h.workdir / f"{t}-response.bin" for t in ("cds", "eds", "lds", "rds")}
        for t, path in captured.items():
            await lg.capture(t, path)
        await lg.stop()
        await h.server_figures()
        await h.server.stop()  # free the CPU for the floor
        floor = await floor_connect(h, opts, captured)
        conv = stats.summary(ms)
        floor_p99 = floor["convergence_ms"]["p99"]
        return h.result(
            convergence_ms=conv,
            floor_ms=floor_p99,
            ratio=round(conv["p99"] / floor_p99, 3) if floor_p99 else None,
            floor=floor,
            floor_peak_rss_mb=floor["peak_rss_mb"],
            cpu_ratio=round(window.cpu / floor["cpu_s"], 3) if floor["cpu_s"] else None,
            all_synced_ms=max(ms, default=None),
            proxies_acked=sync["synced"],
            missing=sync["missing"],
            errors=sync["errors"],
            server_cpu_s=window.cpu,
            server_rss_mb=rss,
            bytes_received={"total_by_type": lg_stats["bytes"],
                            "per_proxy": sum(lg_stats["bytes"].values()) // max(1, opts.proxies)},
            responses=lg_stats["responses"],
            loadgen=lg_stats,
            note=f"all {sync['synced']} synced in {max(ms, default=0) / 1000:.2f} s; "
                 f"floor {(floor['all_synced_ms'] or 0) / 1000:.2f} s",
        )
