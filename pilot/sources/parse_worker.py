"""Parse config files in a separate process, so hostile or merely large files cost the event loop
nothing: not the CPU (a worker thread would share the GIL with the loop and get half of it at
best), not the garbage collector's pauses for the parse's temporary objects, and not the process
itself (a crash in the parser ends the worker, which is replaced; the file is rejected).

Small plain files (what kubectl and Helm write, up to IN_THREAD_MAX_BYTES), a few per reload
(an edit; see files.IN_THREAD_FILES_PER_RELOAD), are parsed in the calling thread: a few
milliseconds each, and most config directories then never need the worker.
The worker is started on first need with "spawn" (forking a process that runs gRPC threads is
unsafe; starting takes ~1 s of a core, ~45 MB), shared by every FileSource in the process, and
kept. Results come back pickled, one file at a time. Where no process can be started the parse
runs in the calling thread instead.
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from pilot import logging as plog
from pilot.config.base import K8sObject
from pilot.config.validation import Rejection
from pilot.sources.yaml_docs import MAX_FILE_BYTES, is_plain

log = plog.get("files")

IN_THREAD_MAX_BYTES = 32 << 10

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_unavailable = False


def _executor() -> ProcessPoolExecutor | None:
    global _pool, _unavailable
    with _lock:
        if _pool is None and not _unavailable:
            try:
                _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            except (OSError, ValueError) as e:  # no processes here (sandbox): parse in-thread
                log.warning("cannot start a config parser process; parsing in a thread", error=str(e))
                _unavailable = True
        return _pool


def _discard(pool: ProcessPoolExecutor) -> None:
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
    pool.shutdown(wait=False, cancel_futures=True)


def parse(
    path: Path, data: bytes, default_namespace: str, where: str = "auto"
) -> tuple[list[tuple[K8sObject, str]], list[Rejection]]:
    """parse_data(path, data) in the worker process (`where="process"`), in the calling thread
    ("thread"), or in the thread when the file is small and plain ("auto"). Blocks the calling
    (planning) thread only."""
    from pilot.sources.files import parse_data

    small = len(data) <= IN_THREAD_MAX_BYTES and is_plain(data.decode("utf-8", "replace"))
    if where == "thread" or (where == "auto" and small) or len(data) > MAX_FILE_BYTES:  # refused unread
        return parse_data(path, data, default_namespace)
    pool = _executor()
    if pool is None:
        return parse_data(path, data, default_namespace)
    try:
        return pool.submit(parse_data, path, data, default_namespace).result()
    except BrokenProcessPool:
        _discard(pool)
        log.error("the config parser process died while reading a file; it is restarted", source=str(path))
        return [], [Rejection(str(path), "", "", "", "cannot read file: the parser process died reading it")]
    except RuntimeError:  # the pool was shut down under us (interpreter exit): finish in-thread
        return parse_data(path, data, default_namespace)
