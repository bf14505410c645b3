"""`sniffing`: the `push` scenario on the same mesh with its ports named `http` and unnamed (`web`:
no protocol prefix, so sniffed: http_inspector, an HTTP and a TCP chain per port, clusters that
speak the client's HTTP version), in one run: does protocol sniffing change the push's cost
against the floor? (issue 15: "the push benchmark ratio unchanged within 5%").

Each side is a whole `push` run (fresh server, proxies and floor), the sides alternating
(named, sniffed, named, ...) `--repeats` times so that drift in the machine's load falls on both.
Per run: `cpu_ratio` (server CPU of a whole push, CDS then EDS, over the floor's for the same
bytes), `ratio` (CDS p99 over the floor's p99), `full_push_ratio` (EDS ACK p99 over the floor's),
the CDS bytes per proxy and the load average when it ended. Per side the median of each, and
`sniffed_over_named`: the sniffed median over the named one (1.0: no change).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import replace

from benchmarks.options import Options
from benchmarks.scenarios import push
from benchmarks.scenarios.harness import environment

SIDES = {"named": "http", "sniffed": "web"}
FIGURES = ("cpu_ratio", "ratio", "full_push_ratio")


def _figures(result: dict) -> dict:
    return {"cpu_ratio": result.get("cpu_ratio"), "ratio": result.get("ratio"),
            "full_push_ratio": (result.get("full_push") or {}).get("ratio"),
            "server_cpu_with_eds_s": result.get("server_cpu_with_eds_s"),
            "p99_ms": (result.get("convergence_ms") or {}).get("p99"), "floor_ms": result.get("floor_ms"),
            "cds_bytes_per_proxy": (result.get("bytes_received") or {}).get("cds_per_push", 0) // max(1, result["proxies"]),
            "proxies_acked": result.get("proxies_acked"),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


async def run(opts: Options) -> dict:
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for _ in range(max(1, opts.repeats)):
        for side, port_name in SIDES.items():
            result = await push.run(replace(opts, port_name=port_name))
            runs[side].append(_figures(result))
    medians = {side: {k: _median(rs, k) for k in (*FIGURES, "server_cpu_with_eds_s", "cds_bytes_per_proxy")}
               for side, rs in runs.items()}
    over = {k: round(s / n, 3) if (s := medians["sniffed"][k]) is not None and (n := medians["named"][k]) else None
            for k in FIGURES}
    acked = min(r["proxies_acked"] or 0 for rs in runs.values() for r in rs)
    # The figures on stdout as one JSON line too (the result file has them with the environment).
    print(json.dumps({"sniffed_over_named": over, "medians": medians, "runs": runs}), file=sys.stdout, flush=True)
    return {"scenario": "sniffing", "params": opts.public(), "environment": environment(), "proxies": opts.proxies,
            "proxies_acked": acked, "runs": runs, "medians": medians, "sniffed_over_named": over,
            "note": f"sniffed/named: cpu_ratio {over['cpu_ratio']}, p99 ratio {over['ratio']}"}
