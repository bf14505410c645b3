"""A benchmark-only probe, loaded into the server under test by the `memory` scenario (this
directory goes first on the server's PYTHONPATH; the server itself has no such hook): on SIGUSR2
it writes the process's RSS and glibc's heap figures to $BENCH_HEAP_PROBE. RSS alone keeps what
the allocator freed but holds for reuse (a burst of 1,000 initial syncs leaves tens of MB of it),
which made per-proxy figures move by +-20 KB between runs; `in_use_kb` (RSS less the free bytes
glibc holds) does not."""

from __future__ import annotations

import ctypes
import json
import os
import signal

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


def _write(_signum, _frame) -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    mi = libc.mallinfo2()
    rss = _rss_kb()
    out = {"rss_kb": rss, "malloc_in_use_kb": (mi.uordblks + mi.hblkhd) // 1024,
           "malloc_free_kb": mi.fordblks // 1024, "in_use_kb": rss - mi.fordblks // 1024,
           "seq": _write.seq}  # type: ignore[attr-defined]
    _write.seq += 1  # type: ignore[attr-defined]
    tmp = f"{_PATH}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, _PATH)


if _PATH:
    _write.seq = 0  # type: ignore[attr-defined]
    signal.signal(signal.SIGUSR2, _write)
