"""Result files and the human summary: every JSON carries the environment and the commit it was
measured on, so numbers from different machines or revisions are never compared blindly."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from benchmarks.ipc import REPO_ROOT


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], check=False, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def environment() -> dict:
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "git_rev": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "pilot")),
        "grpcio": _version("grpcio"),
        "protobuf": _version("protobuf"),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _tidy(value):
    """Milliseconds to the microsecond, seconds to the millisecond: more digits are noise."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _tidy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tidy(v) for v in value]
    return value


def write_result(path: Path, result: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(_tidy(result), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def _fmt(v, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def summary_table(results: list[dict]) -> str:
    """One row per scenario: the headline numbers; details are in the JSON files."""
    head = ("scenario", "services", "proxies", "acked", "p50 ms", "p99 ms", "max ms", "floor ms", "ratio",
            "cpu s", "rss MB", "peak MB", "lag p99", "lag max", "ctl p99", "ctl max", "notes")
    rows = [head]
    for r in results:
        conv = r.get("convergence_ms") or {}
        rows.append((r["scenario"], _fmt(r["params"]["services"]), _fmt(r["proxies"]),
                     _fmt(r.get("proxies_acked")), _fmt(conv.get("p50"), 1), _fmt(conv.get("p99"), 1),
                     _fmt(conv.get("max"), 1), _fmt(r.get("floor_ms"), 1), _fmt(r.get("ratio"), 2),
                     _fmt(r.get("server_cpu_s"), 2), _fmt(r.get("server_rss_mb"), 1),
                     _fmt(r.get("server_peak_rss_mb"), 1), _fmt((r.get("loop_lag_ms") or {}).get("p99_ms"), 1),
                     _fmt((r.get("loop_lag_ms") or {}).get("max_ms"), 1),
                     _fmt((r.get("control_loop_lag_ms") or {}).get("p99_ms"), 1),
                     _fmt((r.get("control_loop_lag_ms") or {}).get("max_ms"), 1), r.get("note", "")))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    lines = ["  ".join(str(c).rjust(w) if i not in (0, len(head) - 1) else str(c).ljust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
