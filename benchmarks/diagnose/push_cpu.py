"""Server CPU per full push, build against build (docs/performance.md, round 8).

    python -m benchmarks.diagnose.push_cpu --tree /tmp/base --tree $PWD --runs 2 --pushes 12

Each run starts a fresh server from one source tree (its PYTHONPATH), connects the benchmark's
SotW proxies (benchmarks/loadgen.py, in its own process) and makes `--pushes` full pushes the
way the `push` scenario does (the mesh ConfigMap's connectTimeout), each waited on until every
proxy ACKed its CDS and then its EDS. Per push it reads the server's process CPU (every thread,
grpc's included) and its main thread's CPU (the event loop, where our per-stream work runs),
both from /proc through psutil, so other load on the machine shifts them little. Runs alternate
between the trees (A B A B ...), so a drift in the machine hits both. Prints one JSON line per
run and, at the end, the median per push of every tree over all its runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import psutil

from benchmarks.options import Options
from benchmarks.scenarios.harness import Harness


def _cpu(ps: psutil.Process) -> tuple[float, float]:
    """(process CPU s, main-thread CPU s): the main thread's id is the process id."""
    t = ps.cpu_times()
    main = next((th for th in ps.threads() if th.id == ps.pid), None)
    return t.user + t.system, (main.user_time + main.system_time) if main is not None else 0.0


async def one_run(tree: str, opts: Options, pushes: int) -> dict:
    opts = Options(**{**opts.__dict__, "server_env": (("PYTHONPATH", tree),)})
    async with Harness(opts, "push-cpu") as h:
        lg = await h.loadgen(h.server.grpc_port)
        await h.connect_all(lg, opts.proxies)
        ps = psutil.Process(h.server.proc.pid)
        process, main = [], []
        for _ in range(pushes):
            p0, m0 = _cpu(ps)
            x = time.time()
            h.mesh.bump_connect_timeout()
            cds = (await lg.converge("cds", [(x, None)], opts.timeout()))["changes"][0]
            eds = (await lg.converge("eds", [(x, None)], opts.timeout()))["changes"][0]
            p1, m1 = _cpu(ps)
            if len(cds["ack_ms"]) != opts.proxies or len(eds["ack_ms"]) != opts.proxies:
                raise RuntimeError(f"push not ACKed by every proxy: cds {len(cds['ack_ms'])}, eds {len(eds['ack_ms'])}")
            process.append(p1 - p0)
            main.append(m1 - m0)
        await lg.stop()
    return {"tree": tree, "process_cpu_s": process, "main_thread_cpu_s": main}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="a source tree to run the server from")
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--proxies", type=int, default=1000)
    ap.add_argument("--pushes", type=int, default=12, help="full pushes measured per run")
    ap.add_argument("--runs", type=int, default=2, help="runs per tree, alternating")
    a = ap.parse_args()
    opts = Options(services=a.services, proxies=a.proxies, full=True)
    per_tree: dict[str, dict[str, list[float]]] = {t: {"process_cpu_s": [], "main_thread_cpu_s": []} for t in a.tree}
    for _ in range(a.runs):
        for tree in a.tree:
            run = await one_run(tree, opts, a.pushes)
            print(json.dumps({k: ([round(x, 3) for x in v] if isinstance(v, list) else v) for k, v in run.items()}),
                  flush=True)
            for k in per_tree[tree]:
                per_tree[tree][k] += run[k]
    print(json.dumps({t: {k: round(statistics.median(v), 3) for k, v in figs.items()} | {"pushes": len(figs["process_cpu_s"])}
                      for t, figs in per_tree.items()}))


if __name__ == "__main__":
    asyncio.run(main())
