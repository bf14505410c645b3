"""The file source against hostile and surprising input: YAML read as kubectl reads it (1.2 core
schema), bounded size, nesting and alias expansion, error messages that never quote the document,
one file's failure costing only that file, and duplicates handing over when the winner goes."""

from __future__ import annotations

import asyncio
import gc
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import pytest

from pilot.model.store import ConfigKey, Store
from pilot.sources import yaml_docs
from pilot.sources.files import FileSource
from pilot.sources.yaml_docs import MAX_DEPTH, MAX_FILE_BYTES, StreamError, load_documents
from tests.support.wait import wait_for
from tests.unit.test_file_source import keys, svc, write

# 521 bytes: nine levels of nine aliases, 9**9 = 387 million strings once expanded.
ALIAS_BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    "i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
)
# The same, as a manifest: the expansion would only happen when the object is validated or dumped.
BOMB_OBJECT = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol, namespace: default}\ndata:\n" + "".join(
    f"  {line}\n" for line in ALIAS_BOMB.splitlines()
)
DEEP_FLOW = (
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: deep}\ndata: " + "[" * 10_000 + "]" * 10_000 + "\n"
)


@pytest.fixture
def store() -> Store:
    return Store()


def _only_rejection(store: Store, path: Path):
    found = [r for r in store.rejections() if r.source.startswith(str(path))]
    assert len(found) == 1, store.rejections()
    return found[0]


# --- YAML 1.2, as kubectl and the apiserver read it -------------------------------------------


@pytest.mark.parametrize(
    "text,value",
    [
        ("[1.2.3.4, 001:db8::]", ["1.2.3.4", "001:db8::"]),
        ("1:20", "1:20"),  # no sexagesimal numbers
        ("[on, off, yes, no, y, n]", ["on", "off", "yes", "no", "y", "n"]),
        ("[true, False, TRUE]", [True, False, True]),
        ("0o17", 15),
        ("017", 17),
        ("0x1F", 31),
        ("+12", 12),
        ("-3", -3),
        ("1_000", "1_000"),
        ("2026-12-01", "2026-12-01"),  # no YAML 1.1 underscores or timestamps
        ("1.5", 1.5),
        ("1e3", 1000.0),
        (".5", 0.5),
        (".inf", float("inf")),
        ("[~, null, '', !!str 12, '12', ! 12]", [None, None, "", "12", "12", "12"]),
        ("!!float 1", 1.0),
    ],
)
def test_scalars_follow_the_yaml_1_2_core_schema(text: str, value: object) -> None:
    for pure in (True, None):  # the pure 1.2 parser, and the default (libyaml first)
        (doc,) = load_documents(f"v: {text}\n", pure=pure)
        assert doc.value == {"v": value}, pure


def test_1_2_syntax_libyaml_refuses_is_read_by_the_pure_parser(tmp_path: Path, store: Store) -> None:
    """`[2001:db8::1, 001:db8::]` unquoted in a flow sequence is YAML 1.2 (libyaml refuses it)."""
    write(
        tmp_path / "a.yaml",
        svc("first")
        + "---\n"
        + """\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: v6, namespace: default, labels: {kubernetes.io/service-name: first}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [2001:db8::1, 001:db8::]
"""
        + "---\n"
        + svc("last", ip="10.96.0.7"),
    )
    FileSource(tmp_path, store).load()
    assert store.rejections() == []
    assert keys(store, "Service") == {"default/first", "default/last"}
    ep = store.get(ConfigKey("EndpointSlice", "default", "v6")).obj
    assert ep.endpoints[0].addresses == ["2001:db8::1", "001:db8::"]
    assert store.get(ConfigKey("Service", "default", "last")).source == f"{tmp_path / 'a.yaml'}#2"


def test_configmap_values_that_yaml_1_1_would_turn_into_booleans_and_numbers(
    tmp_path: Path, store: Store
) -> None:
    write(
        tmp_path / "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: flags}\n"
        "data: {enabled: on, debug: no, window: 1:20, since: 2026-12-01}\n",
    )
    FileSource(tmp_path, store).load()
    assert store.rejections() == []
    data = store.get(ConfigKey("ConfigMap", "default", "flags")).obj.data
    assert data == {"enabled": "on", "debug": "no", "window": "1:20", "since": "2026-12-01"}


def test_merge_keys_are_applied_as_kubectl_does() -> None:
    (doc,) = load_documents("base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  y: 3\n")
    assert doc.value == {"base": {"x": 1, "y": 2}, "m": {"x": 1, "y": 3}}


SECRET = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"


@pytest.mark.parametrize(
    "text",
    [
        f"apiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\ndata:\n  tls.key: '{SECRET}\n",  # unterminated
        (f"apiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\n"
        f"data: {{tls.key: {SECRET}, tls.key: {SECRET}}}\n"),
        f"apiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\ndata:\n  tls.key: {SECRET}\n bad: [\n",
        f"apiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\ndata:\n  tls.key: *{SECRET}\n",
        f"apiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\ndata:\n  tls.key: !{SECRET} x\n",
        f"apiVersion: v1\nkind: Secret\nmetadata: {{name: s}}\ndata:\n  {SECRET}: [\n",
    ],
)
def test_yaml_errors_give_line_and_column_but_never_document_content(
    tmp_path: Path, store: Store, text: str
) -> None:
    write(tmp_path / "s.yaml", text)
    FileSource(tmp_path, store).load()
    r = _only_rejection(store, tmp_path / "s.yaml")
    assert "line" in r.reason and "column" in r.reason, r.reason
    assert SECRET not in r.reason and SECRET[:12] not in r.reason, r.reason


# --- size, nesting and alias bounds ------------------------------------------------------------


def test_alias_bomb_is_refused_at_once_and_the_rest_loads(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "bomb.yaml", BOMB_OBJECT + "---\n" + svc("same-file", ip="10.96.0.3"))
    write(tmp_path / "good.yaml", svc("good"))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    FileSource(tmp_path, store).load()
    elapsed = time.perf_counter() - started
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert keys(store, "Service") == {"default/good", "default/same-file"}
    r = _only_rejection(store, tmp_path / "bomb.yaml")
    assert r.source == f"{tmp_path / 'bomb.yaml'}#0"
    assert "aliases expand the document past" in r.reason and "line" in r.reason
    assert elapsed < 1.0, elapsed  # the unbounded parse froze the server for 13.7-17 s
    assert grown_mb < 50, grown_mb  # ... and added 290 MB


def test_aliases_within_bounds_are_shared_not_copied() -> None:
    text = "a: &a {k: v}\nlist: [" + ", ".join(["*a"] * 1000) + "]\n"
    (doc,) = load_documents(text)
    assert len(doc.value["list"]) == 1000 and all(x is doc.value["a"] for x in doc.value["list"])


def test_a_file_over_the_size_limit_is_refused_unparsed(tmp_path: Path, store: Store) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(svc("big") + "# " + "x" * MAX_FILE_BYTES + "\n")
    write(tmp_path / "good.yaml", svc("good"))
    started = time.perf_counter()
    FileSource(tmp_path, store).load()
    assert time.perf_counter() - started < 1.0
    assert keys(store, "Service") == {"default/good"}
    r = _only_rejection(store, big)
    assert r.source == str(big) and f"limit of {MAX_FILE_BYTES} bytes" in r.reason


@pytest.mark.parametrize(
    "deep",
    [
        DEEP_FLOW,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: deep}\ndata:\n"
        + "".join("  " * (i + 1) + "k:\n" for i in range(1_000)),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: deep}\ndata: "
        + "{a: " * 10_000
        + "1"
        + "}" * 10_000
        + "\n",
    ],
)
def test_nesting_past_the_bound_is_this_files_rejection(tmp_path: Path, store: Store, deep: str) -> None:
    """A 20 kB file nested 10,000 levels raised RecursionError past the parser: the server exited
    at startup and, while running, dropped the whole watch batch and every later full reload.
    Reading stops at the level past the bound (each further level makes libyaml's scanner, and the
    pure one, slower: the rest is not read), and the file keeps serving its last good version."""
    write(tmp_path / "deep.yaml", svc("kept", ip="10.96.0.4"))
    src = FileSource(tmp_path, store)
    src.load()
    write(tmp_path / "deep.yaml", deep + "---\n" + svc("kept", ip="10.96.0.4"))
    write(tmp_path / "good.yaml", svc("good"))
    src.load_paths({tmp_path / "deep.yaml", tmp_path / "good.yaml"})  # one watch batch
    assert keys(store, "Service") == {"default/good", "default/kept"}
    r = _only_rejection(store, tmp_path / "deep.yaml")
    assert r.source == f"{tmp_path / 'deep.yaml'}#0"
    assert f"nested deeper than {MAX_DEPTH} levels" in r.reason and "line" in r.reason
    assert "the rest of the file is not read" in r.reason and "last good version" in r.reason
    # Later full reloads keep working, and the same input at startup is no different.
    write(tmp_path / "later.yaml", svc("later", ip="10.96.0.5"))
    src.load()
    assert keys(store, "Service") == {"default/good", "default/kept", "default/later"}
    fresh = Store()
    FileSource(tmp_path, fresh).load()
    assert keys(fresh, "Service") == {"default/good", "default/later"}
    assert [r.source for r in fresh.rejections()] == [f"{tmp_path / 'deep.yaml'}#0"]


def test_nesting_up_to_the_bound_is_accepted() -> None:
    (doc,) = load_documents("v: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n")
    depth, node = 0, doc.value["v"]
    while node:
        node, depth = node[0], depth + 1
    assert depth == MAX_DEPTH - 2


def test_a_pure_parser_fallback_past_its_bound_keeps_the_libyaml_error(monkeypatch) -> None:
    # The libyaml error stands when the document it cannot read is too large to re-read slowly.
    monkeypatch.setattr(yaml_docs, "PURE_FALLBACK_MAX_BYTES", 10)
    with pytest.raises(StreamError, match="line 1, column"):
        load_documents("a: [1.2.3.4, 001:db8::]\n")


def test_not_utf8_and_unreadable_files_are_rejections_that_keep_the_last_good(
    tmp_path: Path, store: Store
) -> None:
    write(tmp_path / "a.yaml", svc("a"))
    src = FileSource(tmp_path, store)
    src.load()
    (tmp_path / "a.yaml").write_bytes(svc("a").encode() + b"# \xff\xfe\n")
    src.load()
    assert keys(store, "Service") == {"default/a"}
    r = _only_rejection(store, tmp_path / "a.yaml")
    assert "not UTF-8" in r.reason and "last good version" in r.reason


# --- duplicates --------------------------------------------------------------------------------


@pytest.mark.parametrize("incremental", [True, False])
def test_deleting_the_winning_duplicate_hands_the_object_to_the_next(
    tmp_path: Path, store: Store, incremental: bool
) -> None:
    write(tmp_path / "a.yaml", svc("shared", port=80))
    write(tmp_path / "b.yaml", svc("shared", port=81))
    src = FileSource(tmp_path, store)
    src.load()
    assert store.get(ConfigKey("Service", "default", "shared")).obj.spec.ports[0].port == 80
    assert [r.source for r in store.rejections()] == [f"{tmp_path / 'b.yaml'}#0"]
    (tmp_path / "a.yaml").unlink()
    if incremental:
        src.load_paths({tmp_path / "a.yaml"})
    else:
        src.load()
    entry = store.get(ConfigKey("Service", "default", "shared"))
    assert entry is not None and entry.obj.spec.ports[0].port == 81
    assert entry.source == f"{tmp_path / 'b.yaml'}#0"
    assert store.rejections() == []


def test_editing_the_losing_duplicate_away_clears_its_rejection(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", svc("shared", port=80))
    write(tmp_path / "b.yaml", svc("shared", port=81))
    src = FileSource(tmp_path, store)
    src.load()
    write(tmp_path / "b.yaml", svc("other", port=81, ip="10.96.0.8"))
    src.load_paths({tmp_path / "b.yaml"})
    assert keys(store, "Service") == {"default/shared", "default/other"}
    assert store.rejections() == []


# --- the event loop during the attack ----------------------------------------------------------


class LoopLag:
    """Measures how late the event loop wakes a 10 ms sleeper."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            self.samples.append(time.perf_counter() - t - 0.01)

    def __enter__(self) -> Self:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        self._task.cancel()

    @property
    def worst_ms(self) -> float:
        return max(self.samples) * 1000

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) * 1000

    @property
    def p99_ms(self) -> float:
        return statistics.quantiles(self.samples, n=100)[98] * 1000


_CONTROL = """
import asyncio, sys, time
async def main():
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        print(time.perf_counter() - t - 0.01, flush=True)
asyncio.run(main())
"""


class ControlLag(LoopLag):
    """The same probe in an idle process running alongside: what the machine alone costs a loop
    (on a shared 2-core machine an idle loop is sometimes late by 50-500 ms). Assertions allow
    the control's lag on top of their bound, so they fail for our stalls, not the neighbours'."""

    def __enter__(self) -> Self:
        self._proc = subprocess.Popen([sys.executable, "-c", _CONTROL], stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=10)
        self.samples = [float(x) for x in out.split()[5:]] or [0.0]  # skip start-up


@pytest.fixture
def server_gc():
    """The collector tuned as pilot-discovery runs it (bootstrap.run, ControlPlane.start)."""
    before = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    gc.freeze()  # as after startup: the test process's own objects are not walked on every collection
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


async def test_the_event_loop_keeps_running_while_hostile_files_are_read(
    tmp_path: Path, store: Store, server_gc
) -> None:
    """Alias bomb, oversized file, deep nesting, a large valid file and 1,000 small files, all
    while a good edit must get through: the loop is not late by 100 ms (p99 of 10 ms sleeps)."""
    write(tmp_path / "good.yaml", svc("good", port=80))
    src = FileSource(tmp_path, store, rescan_interval=0)
    src.load()
    stop = asyncio.Event()
    watch = asyncio.create_task(src.watch(stop))
    try:
        with ControlLag() as control, LoopLag() as lag:
            # Let the watcher start; then the attack, all at once.
            await wait_for(lambda: len(lag.samples) > 20, timeout=10)

            def attack() -> None:  # written from a thread: the test must not be what blocks the loop
                write(tmp_path / "bomb.yaml", BOMB_OBJECT)
                write(tmp_path / "deep.yaml", DEEP_FLOW)
                (tmp_path / "huge.yaml").write_text("# " + "x" * (MAX_FILE_BYTES + 10) + "\n")
                big = "---\n".join(svc(f"big-{i}", ip="10.96.1.1") for i in range(3_000))  # ~400 kB, valid
                write(tmp_path / "big.yaml", big)
                for i in range(1_000):
                    write(tmp_path / "many" / f"s{i}.yaml", svc(f"many-{i}", ip="10.96.2.1"))
                write(tmp_path / "good.yaml", svc("good", port=81))

            await asyncio.to_thread(attack)
            edited = time.perf_counter()
            await wait_for(
                lambda: store.get(ConfigKey("Service", "default", "good")).obj.spec.ports[0].port == 81,
                timeout=60,
                message="good edit during the attack",
            )
            edit_latency = time.perf_counter() - edited
            last = (ConfigKey("Service", "default", "big-2999"), ConfigKey("Service", "default", "many-999"))
            await wait_for(  # cheap to ask: listing 4,000 objects every poll would itself hold the loop
                lambda: all(store.get(k) for k in last),
                timeout=120,
                message="all valid files loaded",
            )
            await wait_for(
                lambda: (
                    {r.source.split("#")[0] for r in store.rejections()}
                    >= {str(tmp_path / n) for n in ("bomb.yaml", "deep.yaml", "huge.yaml")}
                ),
                timeout=30,
            )
        print(
            f"\nloop lag during the attack: p99 {lag.p99_ms:.1f} ms, worst {lag.worst_ms:.1f} ms, median "
            f"{lag.median_ms:.2f} ms, {len(lag.samples)} samples (an idle process alongside: p99 "
            f"{control.p99_ms:.1f} ms, worst {control.worst_ms:.1f} ms); "
            f"good edit reached the Store in {edit_latency:.2f} s"
        )
        # p99 rather than the maximum, on top of what the machine alone costs an idle loop (see
        # ControlLag); the worst case guards against any real stall (the old code: 13-17 s).
        assert lag.p99_ms < 100 + control.p99_ms, (lag.p99_ms, control.p99_ms)
        assert lag.worst_ms < 1000 + 2 * control.worst_ms, (lag.worst_ms, control.worst_ms)
    finally:
        stop.set()
        await asyncio.wait_for(watch, 10)
