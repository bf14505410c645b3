"""A benchmark-only probe, loaded into the server under test (and the floor) by the `memory`
scenario: this directory goes first on the process's PYTHONPATH; the server itself has no such
hook. On SIGUSR2 it runs a full garbage collection and writes the process's RSS and glibc's heap
figures to $BENCH_HEAP_PROBE.

RSS read right after a sync counts two things the added proxies do not keep: garbage of the
burst not yet collected (the server's collector runs gen 2 rarely, see bootstrap.run) and memory
the allocator freed but holds for reuse. Either moved the per-proxy figure by tens of KB between
runs, in both directions. `in_use_kb` counts neither: the bytes in use after the collection,
malloc's (glibc mallinfo2: gRPC core, protobuf arenas, large Python objects) plus Python's
small-object blocks (pymalloc)."""

from __future__ import annotations

import ctypes
import gc
import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import sys
import tempfile

_PATH = os.environ.get("BENCH_HEAP_PROBE")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _pymalloc_bytes() -> int:
    """Bytes in Python's small-object blocks (pymalloc's own arenas are mmapped, outside
    mallinfo), from sys._debugmallocstats, which writes to the C stderr."""
    fd, name = tempfile.mkstemp()
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    with open(name) as f:
        text = f.read()
    os.unlink(name)
    m = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    return int(m.group(1).replace(",", "")) if m else 0


def _write(_signum, _frame) -> None:
    gc.collect()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    mi = libc.mallinfo2()
    malloc_kb = (mi.uordblks + mi.hblkhd) // 1024
    python_kb = _pymalloc_bytes() // 1024
    out = {"rss_kb": _rss_kb(), "malloc_in_use_kb": malloc_kb, "malloc_free_kb": mi.fordblks // 1024,
           "pymalloc_kb": python_kb, "in_use_kb": malloc_kb + python_kb,
           "seq": _write.seq}  # type: ignore[attr-defined]
    _write.seq += 1  # type: ignore[attr-defined]
    tmp = f"{_PATH}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, _PATH)


def _chain() -> None:
    """Run the next sitecustomize on the path too (benchmarks/diagnose, given with --server-env
    PYTHONPATH=...): Python imports only the first it finds."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if _PATH:
    _write.seq = 0  # type: ignore[attr-defined]
    signal.signal(signal.SIGUSR2, _write)
_chain()
