"""`envoyfilter`: the `push` change (mesh connectTimeout: every proxy's CDS) without and then with
20 EnvoyFilters in the same run, on the same server and proxies.

Half of the EnvoyFilters select a few workloads each (a `bench-workload` label shared by 1 proxy
in 50, in one namespace: a Lua HTTP filter before the router and a cluster MERGE); half are
mesh-wide (root namespace, no selector: a cluster MERGE or a route configuration header). Per
phase: server CPU per push (CDS only, and with the EDS that follows), convergence, and how much of
what the proxies hold is shared: over every proxy's last CDS, LDS and RDS response, the bytes of
distinct resources against the bytes held (`shared_fraction` 0.99 means 99% of the bytes the
proxies hold are copies of resources another proxy holds too, i.e. built and serialised once).
SotW only: a delta proxy holds no whole response to read back.
"""

from __future__ import annotations

import statistics
import time

from benchmarks import stats
from benchmarks.options import Options
from benchmarks.proxy import WORKLOADS
from benchmarks.scenarios.harness import Harness, Loadgen, pooled
from benchmarks.scenarios.push import _server_rounds

SELECTIVE, MESH_WIDE = 10, 10


async def _phase(h: Harness, lg: Loadgen, opts: Options) -> dict:
    rounds = await _server_rounds(h, lg, opts)
    cds = [r["cds"] for r in rounds]
    sharing = await lg.sharing()
    cache = await h.server.debug("/debug/cachez")
    return {
        "convergence_ms": stats.summary(pooled(cds)),
        "proxies_acked": min(c["acked"] for c in cds),
        "server_cpu_s_per_push": round(sum(r["server_cpu_s"] for r in rounds) / len(rounds), 4),
        "server_cpu_with_eds_s_per_push": round(sum(r["server_cpu_with_eds_s"] for r in rounds) / len(rounds), 4),
        # The first push after a change of EnvoyFilters also builds what they patch: the median
        # says what a push costs in steady state.
        "server_cpu_s_per_push_median": round(statistics.median(r["server_cpu_s"] for r in rounds), 4),
        "cds_bytes_per_push": sum(c["bytes"] for c in cds) // len(cds),
        "sharing": sharing,
        "cache": cache,
        "rounds": [{"server_cpu_s": r["server_cpu_s"], "server_cpu_with_eds_s": r["server_cpu_with_eds_s"],
                    "p99_ms": stats.summary(r["cds"]["ack_ms"])["p99"], "server_push": r["server_push"]}
                   for r in rounds],
    }


async def run(opts: Options) -> dict:
    if opts.delta:
        raise ValueError("envoyfilter measures sharing from whole SotW responses: run it without --delta")
    async with Harness(opts, "envoyfilter") as h:
        lg = await h.loadgen(h.server.grpc_port)
        setup = await h.connect_all(lg, opts.proxies, capture_all=True)
        without = await _phase(h, lg, opts)

        x = time.time()
        files = h.mesh.write_envoy_filters(SELECTIVE, MESH_WIDE)
        window_start = h.server.cpu_s()
        # Mesh-wide cluster merges reach every proxy's CDS: wait until each took one after the
        # write, then until every proxy holds its full config again (LDS, RDS, EDS).
        applied = (await lg.converge("cds", [(x, None)], opts.timeout()))["changes"][0]
        await lg.synced(opts.timeout())
        apply_cpu = h.server.cpu_s() - window_start
        with_filters = await _phase(h, lg, opts)
        lg_stats = await lg.stats()

        def ratio(key: str) -> float | None:
            a, b = without[key], with_filters[key]
            return round(b / a, 3) if a else None

        sharing_delta = {t: {"without": without["sharing"][t]["shared_fraction"],
                             "with": with_filters["sharing"][t]["shared_fraction"]}
                         for t in without["sharing"]}
        return h.result(
            change="mesh ConfigMap connectTimeout (every outbound cluster), without then with EnvoyFilters",
            envoy_filters={"selective": SELECTIVE, "mesh_wide": MESH_WIDE, "files": len(files),
                           "proxies_per_selective": f"1 in {WORKLOADS} (bench-workload label), in one namespace"},
            convergence_ms=with_filters["convergence_ms"],
            proxies_acked=min(without["proxies_acked"], with_filters["proxies_acked"], applied["acked"]),
            server_cpu_s=with_filters["server_cpu_s_per_push"],
            without=without,
            with_filters=with_filters,
            apply_filters={"convergence_ms": stats.summary(applied["ack_ms"]), "server_cpu_s": round(apply_cpu, 4)},
            cpu_per_push_ratio=ratio("server_cpu_s_per_push"),
            cpu_with_eds_per_push_ratio=ratio("server_cpu_with_eds_s_per_push"),
            cpu_per_push_median_ratio=ratio("server_cpu_s_per_push_median"),
            shared_fraction=sharing_delta,
            setup_ms=stats.summary(setup["synced_ms"]),
            loadgen=lg_stats,
            note=(f"CPU per push (median) {without['server_cpu_s_per_push_median']} s without, "
                  f"{with_filters['server_cpu_s_per_push_median']} s with {SELECTIVE + MESH_WIDE} EnvoyFilters; "
                  f"shared bytes {sharing_delta}"),
        )
