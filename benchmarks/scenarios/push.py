"""`push`: a mesh-wide change reaches every proxy's CDS; compared with the floor in the same run.

The change is the mesh ConfigMap's connectTimeout, which is part of every outbound cluster, so
each proxy must get a new CDS (and, as Envoy needs to re-warm changed clusters, their EDS).
Convergence runs from the file write to each proxy's CDS ACK, so it includes the file watch and
the debounce; `first_receipt_ms` (the first proxy's CDS) says how much of it passed before the
push began, and `after_first_receipt_ms` is the part a bare server could be compared with.
Then the same load generator measures the floor (benchmarks/floor.py) streaming the very CDS
bytes our server sent, to the same number of clients: `ratio` is our p99 over the floor's p99.

A full push is not CDS alone: the EDS of every re-created cluster must follow (a real Envoy holds
the CDS ACK until it arrives), so the floor runs a second time streaming the same CDS and then
the same EDS bytes, and `full_push` compares the whole push: the time until each proxy ACKed its
EDS (`eds_ack_ms`), ours over the floor's, plus the CDS ratio against that floor.
"""

from __future__ import annotations

import time

from benchmarks import stats
from benchmarks.options import Options
from benchmarks.scenarios.harness import CpuWindow, Harness, Loadgen, floor_rounds, pooled


async def _server_rounds(h: Harness, lg: Loadgen, opts: Options) -> list[dict]:
    rounds = []
    for _ in range(opts.rounds):
        window = CpuWindow(h.server.cpu_s)
        x = time.time()
        h.mesh.bump_connect_timeout()
        cds = (await lg.converge("cds", [(x, None)], opts.timeout()))["changes"][0]
        window.close()
        # The push goes on with EDS for the changed clusters; let it finish before the next round
        # so rounds never overlap, and report the whole push's cost too.
        eds = (await lg.converge("eds", [(x, None)], opts.timeout()))["changes"][0]
        rounds.append({"cds": cds, "eds": eds, "eds_ack_ms": stats.summary(eds["ack_ms"]), "server_cpu_s": window.cpu,
                       "server_cpu_with_eds_s": h.server.cpu_s() - window.cpu0,
                       # Seen from the proxies: the file watch, the debounce and the context build
                       # are over when the first proxy receives its CDS.
                       "first_receipt_ms": min(cds["recv_ms"], default=None),
                       "server_push": await h.last_push()})
    return rounds


async def run(opts: Options) -> dict:
    async with Harness(opts, "push") as h:
        lg = await h.loadgen(h.server.grpc_port)
        setup = await h.connect_all(lg, opts.proxies)
        setup_lag = await h.server.loop_lag(h.started_at)
        t_rounds = time.time()
        rounds = await _server_rounds(h, lg, opts)
        rounds_lag = await h.server.loop_lag(t_rounds)
        rounds_control_lag = h.control_lag(t_rounds, time.time())
        rss = h.server.rss_mb()
        captured = {t: h.workdir / f"{t}-response.bin" for t in ("cds", "eds")}
        cds_bytes = await lg.capture("cds", captured["cds"])
        eds_bytes = await lg.capture("eds", captured["eds"])  # the last push's: every cluster
        lg_stats = await lg.stats()
        await lg.stop()
        await h.server_figures()
        await h.server.stop()  # free the CPU for the floor
        floor = await floor_rounds(h, opts, {"cds": captured["cds"]}, "floor", measure=("cds",))
        floor_full = await floor_rounds(h, opts, captured, "floor-full-push", measure=("cds", "eds"))

        cds = [r["cds"] for r in rounds]
        conv = stats.summary(pooled(cds))
        floor_p99 = floor["convergence_ms"]["p99"]
        # What follows the push start, comparable with the floor, which has no watch or debounce.
        after_first = stats.summary([v - r["first_receipt_ms"] for r in rounds for v in r["cds"]["ack_ms"]])
        eds_ack = stats.summary(pooled([r["eds"] for r in rounds]))
        full_floor_cds, full_floor_eds = (floor_full["ack_ms"][t]["p99"] for t in ("cds", "eds"))
        return h.result(
            change="mesh ConfigMap connectTimeout (every outbound cluster)",
            convergence_ms=conv,
            proxies_acked=min(c["acked"] for c in cds),
            server_cpu_s=sum(r["server_cpu_s"] for r in rounds) / len(rounds),
            server_cpu_with_eds_s=sum(r["server_cpu_with_eds_s"] for r in rounds) / len(rounds),
            server_rss_mb=rss,
            floor_ms=floor_p99,
            ratio=round(conv["p99"] / floor_p99, 3) if floor_p99 else None,
            first_receipt_ms=stats.summary(r["first_receipt_ms"] for r in rounds)["p50"],
            after_first_receipt_ms=after_first,
            ratio_after_first_receipt=round(after_first["p99"] / floor_p99, 3) if floor_p99 else None,
            floor=floor,
            floor_peak_rss_mb=floor_full["peak_rss_mb"],
            # CPU of a whole push (CDS then EDS of every changed cluster) over the floor's for the same bytes.
            cpu_ratio=round(sum(r["server_cpu_with_eds_s"] for r in rounds) / len(rounds) / floor_full["cpu_s"], 3)
            if floor_full["cpu_s"] else None,
            full_push={"eds_ack_ms": eds_ack, "floor_eds_ack_ms": floor_full["ack_ms"]["eds"],
                       "ratio": round(eds_ack["p99"] / full_floor_eds, 3) if full_floor_eds else None,
                       "cds_ratio": round(conv["p99"] / full_floor_cds, 3) if full_floor_cds else None,
                       "floor": floor_full},
            cds_response_bytes=cds_bytes,
            eds_response_bytes=eds_bytes,
            bytes_received={"cds_per_push": sum(c["bytes"] for c in cds) // len(cds),
                            "total_by_type": lg_stats["bytes"]},
            setup_ms=stats.summary(setup["synced_ms"]),
            # Event-loop lag while the proxies connected (cold cache) and during the pushes alone.
            setup_loop_lag_ms=setup_lag,
            rounds_loop_lag_ms=rounds_lag,
            rounds_control_loop_lag_ms=rounds_control_lag,
            rounds=[{**{k: v for k, v in stats.summary(r["cds"]["ack_ms"]).items() if k in ("min", "p50", "p99", "max")},
                     "acked": r["cds"]["acked"], "first_receipt_ms": r["first_receipt_ms"],
                     "server_cpu_s": r["server_cpu_s"], "server_cpu_with_eds_s": r["server_cpu_with_eds_s"],
                     "eds_ack_ms": r["eds_ack_ms"], "server_push": r["server_push"]} for r in rounds],
            loadgen=lg_stats,
            note=f"floor p99 {floor_p99} ms; full push (EDS ACK) p99 {eds_ack['p99']} ms vs floor {full_floor_eds} ms",
        )
