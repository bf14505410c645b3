"""`recording`: the `push` scenario's mesh-wide push, with and without dependency recording
(PILOT_RECORD_DEPENDENCIES), in one run: what recording what each result read costs per push.

The servers run one after the other, alternating (on, off, on, off) so that drift in the
machine's load falls on both sides; each is a fresh server with the same mesh and proxies. The
figure is the server's CPU seconds per push (the CDS window, and with the EDS that follows),
the mean over every round of a mode, and their ratio (on / off; the budget is 1.05), and the
ratio of the medians (one round thrown off by a busy machine cannot move it). Without
recording every change pushes every watched type to every proxy; a mesh-wide change does that
anyway, so both sides do the same pushing and differ only in the recording.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from benchmarks.options import Options
from benchmarks.scenarios.harness import Harness, environment
from benchmarks.scenarios.push import _server_rounds

MODES = ("true", "false", "true", "false")


async def _one(opts: Options, record: str) -> tuple[list[dict], int]:
    env = tuple(kv for kv in opts.server_env if kv[0] != "PILOT_RECORD_DEPENDENCIES")
    o = replace(opts, server_env=(*env, ("PILOT_RECORD_DEPENDENCIES", record)))
    async with Harness(o, "recording") as h:
        lg = await h.loadgen(h.server.grpc_port)
        await h.connect_all(lg, o.proxies)
        rounds = await _server_rounds(h, lg, o)
        await lg.stop()
        return rounds, min(r["cds"]["acked"] for r in rounds)


def _side(rounds: list[dict]) -> dict:
    cds = [r["server_cpu_s"] for r in rounds]
    full = [r["server_cpu_with_eds_s"] for r in rounds]
    return {"server_cpu_s": round(statistics.mean(cds), 3),
            "server_cpu_s_median": round(statistics.median(cds), 3),
            "server_cpu_with_eds_s": round(statistics.mean(full), 3),
            "server_cpu_with_eds_s_median": round(statistics.median(full), 3),
            "rounds_cpu_s": cds, "rounds_cpu_with_eds_s": full}


async def run(opts: Options) -> dict:
    by_mode: dict[str, list[dict]] = {"true": [], "false": []}
    acked = opts.proxies
    for record in MODES:
        rounds, got = await _one(opts, record)
        by_mode[record].extend(rounds)
        acked = min(acked, got)
    on, off = _side(by_mode["true"]), _side(by_mode["false"])
    ratio = round(on["server_cpu_s"] / off["server_cpu_s"], 3) if off["server_cpu_s"] else None
    ratio_eds = round(on["server_cpu_with_eds_s"] / off["server_cpu_with_eds_s"], 3) \
        if off["server_cpu_with_eds_s"] else None
    # CPU times tick in 10 ms steps and a busy machine throws single rounds off: the ratio of
    # medians is the figure that one slow round cannot move.
    median_ratio = _ratio(on["server_cpu_s_median"], off["server_cpu_s_median"])
    median_ratio_eds = _ratio(on["server_cpu_with_eds_s_median"], off["server_cpu_with_eds_s_median"])
    note = (f"server CPU per push with/without recording: {on['server_cpu_s']} / {off['server_cpu_s']} s "
            f"(x{ratio}); with EDS x{ratio_eds}; medians x{median_ratio}, with EDS x{median_ratio_eds}")
    return {"scenario": "recording", "params": opts.public(), "environment": environment(),
            "proxies": opts.proxies, "change": "mesh ConfigMap connectTimeout (every outbound cluster)",
            "proxies_acked": acked, "server_cpu_s": on["server_cpu_s"], "with_recording": on,
            "without_recording": off, "cpu_ratio": ratio, "cpu_ratio_with_eds": ratio_eds,
            "cpu_ratio_of_medians": median_ratio, "cpu_ratio_of_medians_with_eds": median_ratio_eds, "note": note}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None
