"""Property-based fuzzing of the file source: random and mutated YAML documents of every supported
kind, seeded from examples/ and the tests. Whatever the input: no exception escapes, every
document of the fuzzed file is either served or a rejection naming its source, and a good file
next to it is still loaded. Also: the libyaml fast path reads exactly what the pure YAML 1.2
parser reads. Seeded and bounded (a few seconds); inputs per second are printed."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.config.kinds import KINDS
from pilot.model.store import ConfigKey, Store
from pilot.sources.files import FileSource
from pilot.sources.yaml_docs import StreamError, load_documents
from tests.unit.networking_examples import EXAMPLES
from tests.unit.test_file_source import svc
from tests.unit.test_gateway_api import CLASS, gateway

REPO = Path(__file__).resolve().parents[2]
GOOD = svc("fuzz-good-neighbour", ip="10.96.0.250")
GOOD_KEY = ConfigKey("Service", "default", "fuzz-good-neighbour")


def _seed_documents() -> list[dict]:
    docs: list[dict] = []
    for path in sorted((REPO / "examples" / "mesh").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    docs += [d for d in EXAMPLES.values() if isinstance(d, dict)]
    docs += [yaml.safe_load(CLASS), yaml.safe_load(gateway("- {name: http, port: 80, protocol: HTTP}\n"))]
    have = {d.get("kind") for d in docs}
    for k in KINDS:  # every supported kind at least as a skeleton
        if k.kind not in have:
            meta = {"name": f"seed-{k.plural}"} | ({"namespace": "default"} if k.namespaced else {})
            docs.append({"apiVersion": k.api_version, "kind": k.kind, "metadata": meta, "spec": {}})
    return docs


SEEDS = _seed_documents()
API_VERSIONS = sorted({k.api_version for k in KINDS} | {"v2", "networking.istio.io/v9", ""})
WIRE_KINDS = sorted({k.kind for k in KINDS} | {"List", "Widget", ""})

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(
        [
            "on",
            "no",
            "1:20",
            "0o17",
            "001:db8::",
            "~",
            "*",
            "&a",
            "!!binary",
            "- x",
            "{",
            "]",
            "<<",
            "0x1F",
            "2026-12-01",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _set(doc, path, value):
    if not path:
        return value
    node = doc
    for p in path[:-1]:
        node = node[p]
    if isinstance(node, dict | list):
        node[path[-1]] = value
    return doc


@st.composite
def mutated_documents(draw) -> object:
    doc = json.loads(json.dumps(draw(st.sampled_from(SEEDS))))  # a deep copy
    for _ in range(draw(st.integers(0, 4))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "kind", "apiVersion", "delete", "insert"]))
        if op == "replace":
            doc = _set(doc, path, draw(values))
        elif op == "kind" and isinstance(doc, dict):
            doc["kind"] = draw(st.sampled_from(WIRE_KINDS))
        elif op == "apiVersion" and isinstance(doc, dict):
            doc["apiVersion"] = draw(st.sampled_from(API_VERSIONS))
        elif op == "delete" and path:
            parent = doc
            for p in path[:-1]:
                parent = parent[p]
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif isinstance(parent, list) and parent:
                parent.pop(path[-1] if isinstance(path[-1], int) and path[-1] < len(parent) else 0)
        elif op == "insert":
            target = doc
            for p in path:
                target = target[p]
            if isinstance(target, dict):
                target[draw(st.text(max_size=10))] = draw(values)
            elif isinstance(target, list):
                target.append(draw(values))
    return doc


# Characters and fragments that make YAML interesting.
YAML_CHARS = st.sampled_from(
    list(":-[]{}&*!|>'\"%@`#,? \n\t\\")
    + ["\n  ", "---\n", "...\n", "<<: ", "\x00", "é", "\x85", "\u2028", "\ufeff"]
)


@st.composite
def mutated_texts(draw) -> str:
    docs = draw(st.lists(st.sampled_from(SEEDS), min_size=1, max_size=3))
    text = "---\n".join(
        yaml.safe_dump(d, sort_keys=False, default_flow_style=draw(st.booleans())) for d in docs
    )
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "duplicate"]))
        if op == "insert":
            text = text[:i] + draw(YAML_CHARS) + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 20)) :]
        else:
            j = draw(st.integers(i, min(len(text), i + 80)))
            text = text[:j] + text[i:j] + text[j:]
    return text


class Counter:
    inputs = 0
    started = 0.0


@pytest.fixture(scope="module")
def rate():
    Counter.inputs, Counter.started = 0, time.perf_counter()
    yield Counter
    elapsed = time.perf_counter() - Counter.started
    print(
        f"\nfile source fuzz: {Counter.inputs} inputs in {elapsed:.1f} s ({Counter.inputs / elapsed:.0f}/s)"
    )


def _check_directory(root: Path, text: str) -> None:
    (root / "fuzz.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
    (root / "good.yaml").write_text(GOOD)
    store = Store()
    FileSource(root, store).load()  # must not raise
    assert store.get(GOOD_KEY) is not None, store.rejections()
    fuzz = str(root / "fuzz.yaml")
    rejections = store.rejections()
    for r in rejections:
        assert r.source and r.reason, r
        assert r.source == str(root / "fuzz.yaml") or r.source.startswith(fuzz + "#"), r
    served = {e.source for k in store.kinds() for e in store.list(k) if e.source.startswith(fuzz)}
    rejected = {r.source for r in rejections}
    if fuzz in rejected:  # the whole file was refused (not YAML from some point on)
        assert not served
        return
    for doc in load_documents(text):
        if doc.value is None and not doc.refused:
            continue
        where = f"{fuzz}#{doc.index}"
        assert any(s == where or s.startswith(where + ".") for s in served | rejected), (where, rejections)


def _same(a: list, b: list) -> bool:
    def norm(docs):
        return [
            (
                d.index,
                bool(d.refused),
                None if d.refused else json.dumps(d.value, sort_keys=True, default=str),
            )
            for d in docs
        ]

    return norm(a) == norm(b)


def _differential(text: str) -> None:
    """The default reader (libyaml first, the 1.2 parser where libyaml fails) and the pure 1.2
    parser agree: same documents, or both refuse the stream."""
    try:
        fast = load_documents(text)
    except StreamError:
        fast = None
    try:
        pure = load_documents(text, pure=True)
    except StreamError:
        pure = None
    if fast is None or pure is None:
        assert fast is None and pure is None, (text, fast, pure)
    else:
        assert _same(fast, pure), text


FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(docs=st.lists(mutated_documents(), min_size=1, max_size=3))
def test_mutated_documents_of_every_kind(tmp_path: Path, rate, docs: list) -> None:
    text = "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)
    rate.inputs += 1
    _check_directory(tmp_path, text)
    _differential(text)


@FUZZ
@given(text=mutated_texts())
def test_mutated_yaml_text(tmp_path: Path, rate, text: str) -> None:
    rate.inputs += 1
    _check_directory(tmp_path, text)
    _differential(text)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(text=st.lists(YAML_CHARS | st.sampled_from(list("abc01 .")), max_size=40).map("".join))
def test_random_text_reads_the_same_with_both_parsers(rate, text: str) -> None:
    rate.inputs += 1
    _differential(text)


def test_the_seeds_cover_every_kind() -> None:
    assert {d["kind"] for d in SEEDS} >= {k.kind for k in KINDS}
    assert not any(isinstance(v, float) and math.isnan(v) for v in SEEDS)
