"""The file source's watcher: a ConfigMap mounted by kubelet (atomic `..data` swaps), a watcher
whose view went stale (symlink loop), changes no event reports (periodic rescan), and a status
that says when the watch is not running."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Self

import pytest

from pilot.model.store import ConfigKey, Store
from pilot.sources.files import FileSource
from tests.support.wait import wait_for
from tests.unit.test_file_source import keys, svc, write


@pytest.fixture
def store() -> Store:
    return Store()


class Watching:
    def __init__(self, src: FileSource) -> None:
        self.src = src
        self.stop = asyncio.Event()

    async def __aenter__(self) -> Self:
        self.task = asyncio.create_task(self.src.watch(self.stop))
        await wait_for(lambda: self.src.watch_status()[0], timeout=10, message="watcher running")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


async def until_seen(root: Path, store: Store, name: str, text: str, key: ConfigKey) -> None:
    """The watch starts asynchronously: rewrite a file until a load has seen it."""
    attempt = 0

    def seen() -> bool:
        nonlocal attempt
        if store.get(key) is not None:
            return True
        attempt += 1
        write(root / name, text + f"# attempt {attempt}\n")
        return False

    await wait_for(seen, timeout=15, interval=0.2, message=f"{name} not loaded")


def _port(store: Store, name: str) -> int | None:
    entry = store.get(ConfigKey("Service", "default", name))
    return entry.obj.spec.ports[0].port if entry else None


# --- kubelet's ConfigMap volume ------------------------------------------------------------------


def _kubelet_write(root: Path, stamp: str, files: dict[str, str]) -> None:
    """What kubelet's AtomicWriter does: a new timestamped directory, `..data_tmp` pointing at it
    renamed over `..data`, user-visible symlinks for new keys, stale ones and the old directory
    removed."""
    new = root / f"..{stamp}"
    new.mkdir()
    for name, text in files.items():
        (new / name).write_text(text)
    old = os.readlink(root / "..data") if (root / "..data").is_symlink() else None
    os.symlink(new.name, root / "..data_tmp")
    os.rename(root / "..data_tmp", root / "..data")
    for name in files:
        if not (root / name).is_symlink():
            os.symlink(f"..data/{name}", root / name)
    for link in root.iterdir():
        if link.is_symlink() and not link.name.startswith("..") and link.name not in files:
            link.unlink()
    if old is not None:
        shutil.rmtree(root / old)


async def test_a_configmap_volume_is_read_once_and_its_updates_followed(tmp_path: Path, store: Store) -> None:
    root = tmp_path / "mounted"
    root.mkdir()
    _kubelet_write(
        root,
        "2026_12_01_22_00_00.123456789",
        {"reviews.yaml": svc("reviews", port=80), "ratings.yaml": svc("ratings", ip="10.96.0.2")},
    )
    src = FileSource(root, store, rescan_interval=0)  # the watch alone must see the update
    src.load()
    assert keys(store, "Service") == {"default/reviews", "default/ratings"}
    assert store.rejections() == []  # not also read through ..data or the timestamped directory
    assert store.get(ConfigKey("Service", "default", "reviews")).source == f"{root / 'reviews.yaml'}#0"

    async with Watching(src):
        _kubelet_write(
            root,
            "2026_12_01_22_05_00.987654321",
            {"reviews.yaml": svc("reviews", port=81), "details.yaml": svc("details", ip="10.96.0.3")},
        )
        await wait_for(
            lambda: (
                keys(store, "Service") == {"default/reviews", "default/details"}
                and _port(store, "reviews") == 81
            ),
            timeout=15,
            message="ConfigMap update not followed",
        )
        assert store.rejections() == []
        _kubelet_write(root, "2026_12_01_22_10_00.000000001", {"reviews.yaml": svc("reviews", port=82)})
        await wait_for(
            lambda: keys(store, "Service") == {"default/reviews"} and _port(store, "reviews") == 82,
            timeout=15,
            message="second ConfigMap update not followed",
        )
    assert src.watcher.restarts == 0


def test_a_kubelet_swap_reported_as_a_path_triggers_a_full_reload(tmp_path: Path, store: Store) -> None:
    root = tmp_path / "mounted"
    root.mkdir()
    _kubelet_write(root, "2026_12_01_22_00_00.1", {"a.yaml": svc("a", port=80)})
    src = FileSource(root, store)
    src.load()
    _kubelet_write(root, "2026_12_01_22_00_01.2", {"a.yaml": svc("a", port=81)})
    src.load_paths({root / "..data"})
    assert _port(store, "a") == 81


# --- a watcher that cannot be trusted any more restarts ---------------------------------------


async def test_the_watcher_recovers_from_a_symlink_loop_moved_in_and_removed(
    tmp_path: Path, store: Store
) -> None:
    """Found live: after this, no reload ever happened again, with no log line and /ready 200."""
    root = tmp_path / "config"
    root.mkdir()
    src = FileSource(root, store, rescan_interval=0)  # no rescan: the watcher itself must recover
    src.load()
    async with Watching(src):
        await until_seen(root, store, "a.yaml", svc("a"), ConfigKey("Service", "default", "a"))
        outside = tmp_path / "incoming"
        outside.mkdir()
        os.symlink("..", outside / "up")
        os.rename(outside, root / "loop")
        await wait_for(lambda: src.loads >= 2, timeout=15, message="directory move not seen")
        shutil.rmtree(root / "loop")
        await until_seen(
            root, store, "b.yaml", svc("b", ip="10.96.0.2"), ConfigKey("Service", "default", "b")
        )
        assert keys(store, "Service") == {"default/a", "default/b"}
        # And it keeps working afterwards.
        write(root / "c.yaml", svc("c", ip="10.96.0.3"))
        await wait_for(
            lambda: store.get(ConfigKey("Service", "default", "c")), timeout=15, message="c not loaded"
        )
        assert src.watch_status() == (True, "")


async def test_a_removed_config_directory_is_reported_until_it_is_back(tmp_path: Path, store: Store) -> None:
    root = tmp_path / "config"
    root.mkdir()
    write(root / "a.yaml", svc("a"))
    src = FileSource(root, store, rescan_interval=0)
    src.load()
    async with Watching(src):
        shutil.rmtree(root)
        status = await wait_for(
            lambda: (s := src.watch_status()) and not s[0] and s,
            timeout=15,
            message="watcher still reported as running",
        )
        assert "config directory" in status[1], status
        root.mkdir()
        await until_seen(
            root, store, "b.yaml", svc("b", ip="10.96.0.2"), ConfigKey("Service", "default", "b")
        )
        await wait_for(
            lambda: src.watch_status() == (True, ""), timeout=15, message="watcher not running again"
        )


async def test_a_periodic_rescan_sees_what_no_event_reports(tmp_path: Path, store: Store) -> None:
    """A file symlinked from elsewhere changes without any event in the watched directory."""
    root = tmp_path / "config"
    root.mkdir()
    elsewhere = tmp_path / "shared" / "a.yaml"
    write(elsewhere, svc("a", port=80))
    os.symlink(elsewhere, root / "a.yaml")
    src = FileSource(root, store, rescan_interval=0.3)
    src.load()
    async with Watching(src):
        write(elsewhere, svc("a", port=81))
        await wait_for(
            lambda: _port(store, "a") == 81, timeout=15, message="rescan did not pick up the change"
        )
        assert src.watcher.rescans >= 1


def test_symlinked_directories_inside_the_root_are_followed_and_loops_end(
    tmp_path: Path, store: Store
) -> None:
    root = tmp_path / "config"
    write(root / "real" / "a.yaml", svc("a"))
    os.symlink("real", root / "alias")  # the same directory twice: read once
    os.symlink("..", root / "real" / "up")  # a loop
    write(tmp_path / "outside" / "x.yaml", svc("x", ip="10.96.0.9"))
    os.symlink(tmp_path / "outside", root / "out")  # leaves the root: not followed
    FileSource(root, store).load()
    assert keys(store, "Service") == {"default/a"}
    assert store.rejections() == []
