"""`connect`: P proxies connect at once; the time until each holds its full config (CDS, EDS for
every cluster, LDS, RDS for every route, all ACKed), measured from the moment of the burst."""

from __future__ import annotations

from benchmarks import stats
from benchmarks.options import Options
from benchmarks.scenarios.harness import CpuWindow, Harness


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
        return h.result(
            convergence_ms=stats.summary(ms),
            all_synced_ms=max(ms, default=None),
            proxies_acked=sync["synced"],
            missing=sync["missing"],
            errors=sync["errors"],
            server_cpu_s=window.cpu,
            server_rss_mb=h.server.rss_mb(),
            bytes_received={"total_by_type": lg_stats["bytes"],
                            "per_proxy": sum(lg_stats["bytes"].values()) // max(1, opts.proxies)},
            responses=lg_stats["responses"],
            loadgen=lg_stats,
            note=f"all {sync['synced']} synced in {max(ms, default=0) / 1000:.2f} s",
        )
