"""Which files a config directory holds, and a watcher over it that does not die silently.

Layout rules (scan):
- hidden entries (a leading '.') are skipped: editors' swap files, atomic writers' temp files,
  and kubelet's private `..data` / `..2026_12_01_...` directories of a mounted ConfigMap, whose
  files are read once, through the top-level symlinks kubelet makes (`name.yaml -> ..data/name.yaml`);
- symlinked directories are followed when they stay inside the root (kubelet links nested keys as
  `sub -> ..data/sub`), each real directory at most once, so a loop (`up -> ..`) ends the walk.

Watching (DirectoryWatcher): watchfiles reports changes; kubelet's atomic `..data` swap and
anything under a hidden `..` directory ask for a full rescan (the top-level symlinks do not change,
their targets do). The watcher restarts itself after any error with the reason logged, and after a
batch it cannot trust: inotify watches follow symlinks, so after a directory holding `up -> ..` is
moved in and removed, changes in the root are reported under the removed path and a new file is
never seen (observed with watchfiles 1.x). A periodic full rescan
(PILOT_CONFIG_RESCAN_INTERVAL) heals whatever events were missed. `status()` says whether the
watch is running, for /ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import watchfiles

from pilot import logging as plog

log = plog.get("files")

SUFFIXES = (".yaml", ".yml", ".json")


def is_kubelet_path(root: Path, path: Path) -> bool:
    """A path inside kubelet's atomic-writer machinery (`..data`, `..data_tmp`, `..TIMESTAMP`)."""
    try:
        rel = path.relative_to(root)
    except ValueError:
        return False
    return any(part.startswith("..") for part in rel.parts)


def scan(root: Path) -> list[Path]:
    """The config files below `root` (see the module doc for what is followed and skipped)."""
    try:
        real_root = root.resolve(strict=True)
    except OSError:
        return []
    out: list[Path] = []
    seen: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            st = directory.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    try:
                        if entry.is_dir():
                            if entry.is_symlink() and not Path(entry.path).resolve().is_relative_to(
                                real_root
                            ):
                                continue
                            stack.append(Path(entry.path))
                        elif entry.name.endswith(SUFFIXES) and entry.is_file():
                            out.append(Path(entry.path))
                    except OSError:  # a dangling or self-referencing symlink
                        continue
        except OSError:  # vanished or unreadable meanwhile: the next event or rescan tells
            continue
    return sorted(out)


class WatchUntrusted(Exception):
    """The watcher reported something it cannot have seen: its view of the tree is stale."""


class DirectoryWatcher:
    """Calls `reload(paths)` for changed paths and `reload(None)` for a full rescan, one at a time."""

    def __init__(
        self,
        root: Path,
        reload: Callable[[set[Path] | None], Awaitable[None]],
        rescan_interval: float = 60.0,
        debounce_ms: int = 50,
        step_ms: int = 5,
    ) -> None:
        self.root = root
        self._reload = reload
        self.rescan_interval = rescan_interval
        self.debounce_ms, self.step_ms = debounce_ms, step_ms
        self.restarts = 0
        self.rescans = 0
        self._running = False
        self._reason = "not started"
        self._lock = asyncio.Lock()

    def status(self) -> tuple[bool, str]:
        """(running, why not)."""
        return self._running, self._reason

    async def reload(self, paths: set[Path] | None = None) -> None:
        async with self._lock:
            await self._reload(paths)

    async def run(self, stop: asyncio.Event) -> None:
        self._running, self._reason = True, ""
        rescans = asyncio.create_task(self._rescan_loop(stop), name="config-rescan")
        backoff = 0.2
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await self._watch(stop)
                    if stop.is_set():
                        break
                    reason = "the watch ended by itself"
                except WatchUntrusted as e:
                    reason = str(e)
                except Exception as e:  # noqa: BLE001 - any failure restarts the watch, loudly
                    reason = f"{type(e).__name__}: {e}"
                if time.monotonic() - started > 30:
                    backoff = 0.2  # it ran well for a while: this is a new failure, not a loop
                self._running, self._reason = False, reason
                self.restarts += 1
                log.warning(
                    "config directory watcher stopped; restarting it",
                    reason=reason,
                    retry_in=f"{backoff:g}s",
                    path=str(self.root),
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, 10.0)
                if not stop.is_set():
                    await self.reload(None)  # whatever happened while it was down
        finally:
            rescans.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rescans
            self._running, self._reason = False, "stopped"

    async def _rescan_loop(self, stop: asyncio.Event) -> None:
        if self.rescan_interval <= 0:
            return
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rescan_interval)
            if stop.is_set():
                return
            try:
                await self.reload(None)
                self.rescans += 1
            except Exception as e:  # noqa: BLE001 - the next interval tries again
                log.warning("periodic config rescan failed", reason=f"{type(e).__name__}: {e}")

    def _examine(self, changes: set[tuple[watchfiles.Change, str]]) -> tuple[set[Path], Path | None]:
        """The changed paths, and one the watcher cannot have seen (its view is stale), if any."""
        if not self.root.is_dir():
            raise WatchUntrusted("the config directory itself was removed or replaced")
        paths = {Path(p) for _, p in changes}
        for change, p in changes:
            path = Path(p)
            if (
                change != watchfiles.Change.deleted
                and not is_kubelet_path(self.root, path)
                and not path.parent.exists()
            ):
                return paths, path
        return paths, None

    async def _watch(self, stop: asyncio.Event) -> None:
        """One watch session, until `stop`, an error, or a batch that cannot be trusted."""
        if not self.root.is_dir():
            # A root that does not exist yet is waited for by watching only its parent's entries,
            # never the parent's whole tree.
            log.warning("config directory does not exist yet; waiting for it", path=str(self.root))
            async for _ in watchfiles.awatch(
                self.root.parent,
                debounce=50,
                step=20,
                stop_event=stop,
                recursive=False,
                ignore_permission_denied=True,
            ):
                if self.root.is_dir():
                    break
            if stop.is_set():
                return
            await self.reload(None)
        if not self._running:
            log.info("config directory watcher running again", path=str(self.root))
        self._running, self._reason = True, ""
        # step: how long the watcher waits for more changes before reporting; every change waits
        # this long before the debounce even starts (5 ms idles at +0.2% of a core over 20 ms).
        async for changes in watchfiles.awatch(
            self.root,
            debounce=self.debounce_ms,
            step=self.step_ms,
            stop_event=stop,
            recursive=True,
            ignore_permission_denied=True,
        ):
            # Path handling and stat calls for a batch of thousands of changes: off the loop.
            paths, stale = await asyncio.to_thread(self._examine, changes)
            await self.reload(paths)
            if stale is not None:
                raise WatchUntrusted(
                    f"a change was reported under {stale.parent}, which does not exist "
                    "(the watch followed a symlink that is gone)"
                )
