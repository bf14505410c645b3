"""python -m benchmarks SCENARIO [--services N] [--proxies M] [--out FILE] [--full]

SCENARIO is push, eds, churn, connect, memory, recording, gateway_api, envoyfilter, delta_bytes,
scaleout, beyond, sniffing (only when named) or all. Reduced sizes by default (200 services,
200 proxies, 10 s churn; `make bench` runs all of them in a few minutes); --full uses 1,000
services and 1,000 proxies (memory goes to 2,000) and a 60 s churn. Each scenario writes one
JSON (default benchmarks/results/SCENARIO.json; with `all`, --out is a directory) and a summary
table is printed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import traceback
from pathlib import Path

from benchmarks.options import FULL, REDUCED, Options
from benchmarks.report import summary_table, write_result
from benchmarks.scenarios import ON_DEMAND, SCENARIOS


def parse(argv: list[str]) -> tuple[list[str], Options]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[1])
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--services", type=int, help="services in the mesh (reduced 200, full 1000)")
    parser.add_argument("--proxies", type=int, help="simulated proxies (reduced 200, full 1000)")
    parser.add_argument("--full", action="store_true", help="the reference sizes of ARCHITECTURE.md")
    parser.add_argument("--delta", action="store_true", help="proxies use delta xDS (default SotW)")
    parser.add_argument("--channels", type=int, default=10, help="gRPC channels the proxies share")
    parser.add_argument("--namespaces", type=int, default=10, help="namespaces for services and proxies")
    parser.add_argument("--rounds", type=int, default=3, help="pushes measured by push and eds")
    parser.add_argument("--churn-seconds", type=float, help="churn duration (reduced 10, full 60)")
    parser.add_argument("--churn-rate", type=float, default=10.0, help="endpoint changes per second")
    parser.add_argument("--out", type=Path, help="result file (a directory with `all`)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep config, logs and captures")
    parser.add_argument("--port-name", default="http",
                        help="the services' port name (`web`: no protocol prefix, sniffed)")
    parser.add_argument("--repeats", type=int, default=3, help="sniffing: runs of each side, alternating")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment for the server under test, e.g. PILOT_ENABLE_EDS_DEBOUNCE=false")
    a = parser.parse_args(argv)
    if any("=" not in kv for kv in a.server_env):
        parser.error("--server-env takes NAME=VALUE")
    sizes = FULL if a.full else REDUCED
    opts = Options(services=a.services or sizes["services"], proxies=a.proxies or sizes["proxies"], full=a.full,
                   delta=a.delta, channels=a.channels, namespaces=a.namespaces, rounds=max(1, a.rounds),
                   churn_rate=a.churn_rate, churn_seconds=a.churn_seconds or sizes["churn_seconds"],
                   out=a.out, keep_workdir=a.keep_workdir, port_name=a.port_name, repeats=max(1, a.repeats),
                   server_env=tuple(tuple(kv.split("=", 1)) for kv in a.server_env))
    if opts.services < 1 or opts.proxies < 1:
        parser.error("--services and --proxies must be at least 1")
    return ([n for n in SCENARIOS if n not in ON_DEMAND] if a.scenario == "all" else [a.scenario]), opts


async def run(names: list[str], opts: Options) -> int:
    results, paths, failed = [], [], []
    for name in names:
        t0 = time.monotonic()
        print(f"== {name}: {opts.services} services, {opts.proxies} proxies "
              f"({'delta' if opts.delta else 'sotw'})", file=sys.stderr, flush=True)
        try:
            result = await SCENARIOS[name](opts)
        except Exception:  # noqa: BLE001 - report it, then run the other scenarios
            traceback.print_exc()
            failed.append(name)
            continue
        result["duration_s"] = round(time.monotonic() - t0, 2)
        # A number measured on part of the mesh is not the number asked for: say so, and fail.
        result["complete"] = result.get("proxies_acked") == result["proxies"]
        if not result["complete"]:
            result["note"] = f"INCOMPLETE: {result.get('proxies_acked')}/{result['proxies']} ACKed; " + result.get("note", "")
            failed.append(name)
        paths.append(write_result(opts.out_path(name, several=len(names) > 1), result))
        results.append(result)
        print(f"   done in {result['duration_s']} s", file=sys.stderr, flush=True)
    if results:
        print(summary_table(results))
        print()
        for p in paths:
            print(f"wrote {p}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    names, opts = parse(sys.argv[1:] if argv is None else argv)
    return asyncio.run(run(names, opts))


if __name__ == "__main__":
    sys.exit(main())
