"""The file source: every YAML document under `--configDir`, recursively, kept in the Store.

A reload re-parses only files whose content changed, then syncs the whole directory's state
into the Store, so creates, edits, deletes and renames all reduce to "the directory now holds
this". A bad document is rejected with its file, index, kind/namespace/name and reason, and
never affects any other document. Nothing is lost to a bad edit either: an object whose new
version is rejected keeps its last good version (a file that stops being YAML keeps all its
objects) until the file is fixed or deleted.

Hostile input costs only itself: files are parsed in a worker process (parse_worker), driven from
a worker thread, never on the event loop;
yaml_docs bounds size, nesting and alias expansion; any exception while reading one file is that
file's rejection. dir_watch decides which files the directory holds (kubelet's ConfigMap layout
included) and keeps the watch alive.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from pilot import logging as plog
from pilot.config.base import K8sObject
from pilot.config.validation import InvalidObject, Rejection, parse_object
from pilot.model.store import ConfigKey, Store
from pilot.sources import parse_worker
from pilot.sources.dir_watch import SUFFIXES, DirectoryWatcher, is_kubelet_path, scan
from pilot.sources.yaml_docs import MAX_FILE_BYTES, LimitError, StreamError, load_documents

log = plog.get("files")

IN_THREAD_FILES_PER_RELOAD = 20
COMMIT_SLICE = 100  # objects written to the Store per event-loop turn (~5-20 ms)


@dataclass(frozen=True)
class ParsedFile:
    digest: bytes
    objects: tuple[tuple[K8sObject, str], ...]
    rejections: tuple[Rejection, ...]


def _keep_last_good(previous: ParsedFile | None, objs: list[tuple[K8sObject, str]],
                    rejs: list[Rejection]) -> tuple[list[tuple[K8sObject, str]], list[Rejection]]:
    """Carry over the previous good version of every object this parse rejected."""
    if previous is None or not rejs:
        return objs, rejs
    have = {ConfigKey.of(o) for o, _ in objs}
    whole_file = any(not r.kind for r in rejs)  # the file itself failed (YAML, encoding)
    rejected = {(r.kind, r.namespace, r.name) for r in rejs}
    kept: list[tuple[K8sObject, str]] = []
    for obj, src in previous.objects:
        key = ConfigKey.of(obj)
        if key not in have and (whole_file or (key.kind, key.namespace, key.name) in rejected):
            kept.append((obj, src))
    if not kept:
        return objs, rejs
    note = f"; still serving the last good version of {len(kept)} object(s) from this file"
    return objs + kept, [Rejection(r.source, r.kind, r.namespace, r.name, r.reason + note) for r in rejs]


Parsed = tuple[list[tuple[K8sObject, str]], list[Rejection]]


def parse_file(path: Path, default_namespace: str = "default") -> Parsed:
    """Every object of one file, and a rejection for everything that is not one. Never raises."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # never more, even if the file grows meanwhile
    except OSError as e:
        return [], [Rejection(str(path), "", "", "", f"cannot read file: {_os_reason(e)}")]
    return parse_data(path, data, default_namespace)


def parse_data(path: Path, data: bytes, default_namespace: str = "default") -> Parsed:
    """Parse the bytes read from `path`. Never raises: whatever goes wrong with this file is this
    file's rejection and nobody else's."""
    try:
        return _parse_data(path, data, default_namespace)
    except Exception as e:  # noqa: BLE001 - a defect here must still cost only this file
        log.error("reading a config file failed unexpectedly", source=str(path), error=type(e).__name__)
        reason = f"cannot read file: internal error ({type(e).__name__})"
        return [], [Rejection(str(path), "", "", "", reason)]


def _parse_data(path: Path, data: bytes, default_namespace: str) -> Parsed:
    objects: list[tuple[K8sObject, str]] = []
    rejections: list[Rejection] = []
    if len(data) > MAX_FILE_BYTES:
        reason = (f"file is larger than the limit of {MAX_FILE_BYTES} bytes ({MAX_FILE_BYTES >> 20} MiB); "
                  "split it into several files")
        return [], [Rejection(str(path), "", "", "", reason)]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return [], [Rejection(str(path), "", "", "", f"cannot read file: {_os_reason(e)}")]
    try:
        docs = load_documents(text)
    except LimitError as e:  # a bound crossed in document N: not read from there on
        return [], [Rejection(f"{path}#{e.documents_before}", "", "", "", e.message)]
    except StreamError as e:
        # The stream is broken from some point on: report the file rather than guess at the rest.
        return [], [Rejection(str(path), "", "", "", f"invalid YAML: {e.message}")]
    for doc in docs:
        source = f"{path}#{doc.index}"
        if doc.refused:
            rejections.append(Rejection(source, "", "", "", doc.refused))
            continue
        if doc.value is None:
            continue
        value = doc.value
        if isinstance(value, dict) and value.get("kind") == "List" and isinstance(value.get("items"), list):
            items = list(enumerate(value["items"]))
        else:
            items = [(None, value)]
        for item_index, item in items:
            src = source if item_index is None else f"{source}.items[{item_index}]"
            try:
                objects.append((parse_object(item, default_namespace), src))
            except InvalidObject as e:
                rejections.append(Rejection(src, e.kind, e.namespace, e.name, e.reason))
            except Exception as e:  # noqa: BLE001 - a validator defect costs this document only
                log.error("validating a document failed unexpectedly", source=src, error=type(e).__name__)
                reason = f"cannot validate: internal error ({type(e).__name__})"
                rejections.append(Rejection(src, "", "", "", reason))
    return objects, rejections


def _os_reason(e: BaseException) -> str:
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 (byte {e.start})"
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    return type(e).__name__


@dataclass
class _Plan:
    """A reload computed off the event loop: the source's next state and the Store writes that
    take the Store there. A full plan replaces `files`; an incremental one updates some of them."""

    full: bool
    files: dict[Path, ParsedFile | None]  # None: the file is gone
    owners: dict[ConfigKey, Path]
    served: dict[ConfigKey, tuple[K8sObject, str]]
    upserts: list[tuple[K8sObject, str]]
    deletes: list[ConfigKey]
    duplicates: list[Rejection] | None = None  # None: unchanged
    changed_paths: int = 0


def _resolve_duplicates(files: dict[Path, ParsedFile]) -> tuple[dict, dict, list[Rejection]]:
    """The first definition of a key (in path order) wins; every other one is a rejection."""
    desired: dict[ConfigKey, tuple[K8sObject, str]] = {}
    owners: dict[ConfigKey, Path] = {}
    duplicates: list[Rejection] = []
    for path, parsed in sorted(files.items()):
        for obj, src in parsed.objects:
            key = ConfigKey.of(obj)
            if key in desired:
                reason = f"duplicate of the object in {desired[key][1]}; the first one is used"
                duplicates.append(Rejection(src, key.kind, key.namespace, key.name, reason))
                continue
            desired[key] = (obj, src)
            owners[key] = path
    return desired, owners, duplicates


class FileSource:
    """Keeps the Store in line with a directory. `plan_*` read and parse (never touching the
    Store; `reload` runs them in a worker thread), `_commit*` write the Store (on the loop)."""

    OWNER = "files"

    def __init__(self, root: str | os.PathLike, store: Store, default_namespace: str = "default",
                 rescan_interval: float = 60.0) -> None:
        self.root = Path(root).resolve()
        self.store = store
        self.default_namespace = default_namespace
        self._files: dict[Path, ParsedFile] = {}
        self._owners: dict[ConfigKey, Path] = {}  # which file an object in the Store came from
        self._served: dict[ConfigKey, tuple[K8sObject, str]] = {}  # what this source last wrote
        self._duplicates: list[Rejection] = []
        self.loads = 0
        self._parses_this_plan = 0
        self.incremental_loads = 0
        self.watcher = DirectoryWatcher(self.root, self.reload, rescan_interval=rescan_interval)

    def _is_config_file(self, path: Path) -> bool:
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            return False
        return path.suffix in SUFFIXES and not any(part.startswith(".") for part in rel.parts)

    def _parse(self, path: Path, previous: ParsedFile | None) -> ParsedFile | None:
        """Parse `path` unless its content is unchanged; None when it cannot be read (gone)."""
        try:
            with path.open("rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as e:  # there but unreadable (permissions): say so, keep what it served
            objs, rejs = _keep_last_good(previous, [], [Rejection(str(path), "", "", "",
                                                                  f"cannot read file: {_os_reason(e)}")])
            return ParsedFile(b"", tuple(objs), tuple(rejs))
        # Hash the content rather than trust mtime: two same-size edits within the filesystem's
        # timestamp granularity would otherwise look unchanged.
        digest = hashlib.blake2b(data, digest_size=16).digest()
        if previous is not None and previous.digest == digest:
            return previous
        # A few files (an edit) are parsed right here if small; a flood of them goes to the worker
        # process, whose garbage and CPU then stay out of this process.
        self._parses_this_plan += 1
        if not self.loads:
            where = "thread"  # the first load: nothing is served yet, and no process to wait for
        elif self._parses_this_plan <= IN_THREAD_FILES_PER_RELOAD:
            where = "auto"
        else:
            where = "process"
        parsed = parse_worker.parse(path, data, self.default_namespace, where)
        objs, rejs = _keep_last_good(previous, *parsed)
        for r in rejs:
            log.warning("config rejected", source=r.source, kind=r.kind, namespace=r.namespace,
                        name=r.name, reason=r.reason)
        return ParsedFile(digest, tuple(objs), tuple(rejs))

    # --- planning: reads files and the source's own state, never the Store ----------------------
    def plan_full(self) -> _Plan:
        self._parses_this_plan = 0
        current: dict[Path, ParsedFile] = {}
        previous = dict(self._files)
        for path in scan(self.root):
            parsed = self._parse(path, previous.get(path))
            if parsed is not None:
                current[path] = parsed
        desired, owners, duplicates = _resolve_duplicates(current)
        # Only what differs from what this source last wrote reaches the Store: a rescan of an
        # unchanged directory writes nothing (objects of unchanged files are the same objects).
        served = self._served
        upserts = [item for key, item in desired.items()
                   if (old := served.get(key)) is None or old[0] is not item[0] or old[1] != item[1]]
        deletes = [key for key in served if key not in desired]
        return _Plan(True, dict(current), owners, desired, upserts, deletes, duplicates)

    def plan_paths(self, paths: set[Path]) -> _Plan:
        """Re-read only the files that changed. Anything a file-by-file update cannot decide
        alone (a directory moved, kubelet swapped `..data`, an object defined in two files)
        becomes a full reload."""
        self._parses_this_plan = 0
        files: dict[Path, ParsedFile | None] = {}
        owners = dict(self._owners)
        served = dict(self._served)
        contested = {(r.kind, r.namespace, r.name) for r in self._duplicates}
        known = self._files
        upserts: list[tuple[K8sObject, str]] = []
        deletes: list[ConfigKey] = []
        for path in sorted(paths):
            if is_kubelet_path(self.root, path):
                return self.plan_full()  # a ConfigMap update: the top-level symlinks now point elsewhere
            if path.name.startswith("."):
                continue  # hidden, and so is all below it (editors' and atomic writers' temp files)
            if path.is_dir() or (not path.exists() and path.suffix not in SUFFIXES and
                                 any(p.is_relative_to(path) for p in known)):
                return self.plan_full()  # a directory appeared, went or moved
            if not self._is_config_file(path):
                continue
            old = files[path] if path in files else known.get(path)
            new = self._parse(path, old) if path.exists() else None
            if new is old and new is not None:
                continue
            old_objs = {ConfigKey.of(o): (o, src) for o, src in (old.objects if old else ())}
            new_objs = {ConfigKey.of(o): (o, src) for o, src in (new.objects if new else ())}
            if new is not None and len(new_objs) != len(new.objects):
                return self.plan_full()  # the same object twice in one file
            if any(owners.get(k, path) != path for k in new_objs):
                return self.plan_full()  # claimed by another file: duplicates are decided in one place
            if any((k.kind, k.namespace, k.name) in contested for k in old_objs.keys() | new_objs.keys()):
                return self.plan_full()  # a duplicate may take over (or lose) its object
            for key in old_objs.keys() - new_objs.keys():
                deletes.append(key)
                owners.pop(key, None)
                served.pop(key, None)
            for key, item in new_objs.items():
                upserts.append(item)
                owners[key] = path
                served[key] = item
            files[path] = new
        moved = {ConfigKey.of(o) for o, _ in upserts}  # a rename deletes from one file, adds in another
        return _Plan(False, files, owners, served, upserts, [k for k in deletes if k not in moved],
                     changed_paths=len(paths))

    # --- committing: on the event loop ----------------------------------------------------------
    def _adopt(self, plan: _Plan) -> None:
        """Take the plan's state as the source's own, and publish its rejections."""
        if plan.full:
            self._files = {p: f for p, f in plan.files.items() if f is not None}
        else:
            for path, parsed in plan.files.items():
                if parsed is None:
                    self._files.pop(path, None)
                else:
                    self._files[path] = parsed
        self._owners, self._served = plan.owners, plan.served
        if plan.duplicates is not None:
            self._set_duplicates(plan.duplicates)
        self._publish_rejections()

    def _log_commit(self, plan: _Plan, changes: int) -> None:
        if plan.full:
            self.loads += 1
            if changes:
                log.info("config loaded", changes=changes, objects=len(plan.served),
                         rejected=len(self.store.rejections()))
        else:
            self.incremental_loads += 1
            if changes:
                log.info("config changed", changes=changes, files=plan.changed_paths)

    def _commit(self, plan: _Plan) -> None:
        self._adopt(plan)
        events = self.store.write(plan.upserts, plan.deletes)
        self._log_commit(plan, len(events))

    async def _commit_async(self, plan: _Plan) -> None:
        """As _commit, in slices: writing 20,000 objects at once would hold the loop for seconds
        (each slice is a batch of events, as informers deliver them). Upserts go first, so an
        object that moved between files is never missing in between."""
        self._adopt(plan)
        changes = 0
        for i in range(0, len(plan.upserts), COMMIT_SLICE):
            changes += len(self.store.write(plan.upserts[i:i + COMMIT_SLICE], ()))
            if len(plan.upserts) > COMMIT_SLICE:
                await asyncio.sleep(0)
        for i in range(0, len(plan.deletes), COMMIT_SLICE):
            changes += len(self.store.write((), plan.deletes[i:i + COMMIT_SLICE]))
            if len(plan.deletes) > COMMIT_SLICE:
                await asyncio.sleep(0)
        self._log_commit(plan, changes)

    def _set_duplicates(self, duplicates: list[Rejection]) -> None:
        before = {(r.source, r.reason) for r in self._duplicates}
        for r in duplicates:
            if (r.source, r.reason) not in before:
                log.warning("config rejected", source=r.source, kind=r.kind, namespace=r.namespace,
                            name=r.name, reason=r.reason)
        self._duplicates = duplicates

    def _publish_rejections(self) -> None:
        rejections = [r for parsed in self._files.values() for r in parsed.rejections]
        self.store.set_rejections(self.OWNER, rejections + self._duplicates)

    # --- entry points ---------------------------------------------------------------------------
    def load(self) -> None:
        """Bring the Store in line with the directory, on the calling thread."""
        self._commit(self.plan_full())

    def load_paths(self, paths: set[Path]) -> None:
        """Apply changes to `paths`, on the calling thread."""
        self._commit(self.plan_paths(paths))

    async def reload(self, paths: set[Path] | None = None) -> None:
        """Plan in a worker thread (files are parsed in the worker process), then write the Store
        on the loop, in slices. A failure keeps the last good state and is logged."""
        try:
            if paths:
                plan = await asyncio.to_thread(self.plan_paths, paths)
            else:
                plan = await asyncio.to_thread(self.plan_full)
            await self._commit_async(plan)
        except Exception:
            log.exception("reloading config directory failed; keeping the last good state")

    def watch_status(self) -> tuple[bool, str]:
        return self.watcher.status()

    async def watch(self, stop: asyncio.Event | None = None) -> None:
        """Follow the directory until `stop` (see DirectoryWatcher for restarts and rescans)."""
        await self.watcher.run(stop or asyncio.Event())
