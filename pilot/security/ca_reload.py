"""Reload a plugged-in CA when the files in ROOT_CA_DIR change, as istiod does.

Operators rotate an intermediate by updating the `cacerts` Secret; the kubelet swaps the mounted
files atomically (a `..data` symlink), which shows up as changes in the directory. A periodic
re-check backs the file events up: a missed event delays a rotation, it never loses one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import watchfiles

from pilot import logging as plog
from pilot.security.ca import CertificateAuthority

log = plog.get("ca")

RECHECK_MS = 60_000


async def watch_plugged_in_ca(ca: CertificateAuthority, directory: str | Path,
                              on_reload: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
    async for _ in watchfiles.awatch(directory, stop_event=stop, rust_timeout=RECHECK_MS, yield_on_timeout=True,
                                     debounce=200):
        try:
            reloaded = await asyncio.to_thread(ca.reload_if_changed)
        except Exception as e:  # noqa: BLE001 - a broken rotation keeps the CA that works
            log.error("cannot reload the plugged-in CA; keeping the current one", dir=str(directory), error=str(e))
            continue
        if reloaded:
            log.info("plugged-in CA reloaded", dir=str(directory),
                     root_expires=ca.root_expiry.isoformat(timespec="seconds"))
            await on_reload()
