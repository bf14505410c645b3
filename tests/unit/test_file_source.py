"""The file source: a directory of YAML/JSON manifests kept in the Store, bad documents rejected
precisely while everything else loads."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from pilot.model.store import ConfigKey, Event, Store
from pilot.sources.files import FileSource
from tests.support.wait import wait_for

SVC = """\
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  clusterIP: {ip}
  ports: [{{name: http, port: {port}}}]
"""


def svc(name: str, ns: str = "default", port: int = 80, ip: str = "10.96.0.1") -> str:
    return SVC.format(name=name, ns=ns, port=port, ip=ip)


def eps(name: str, service: str, ns: str = "default", address: str = "10.1.0.1") -> str:
    return f"""\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: {ns}
  labels: {{kubernetes.io/service-name: {service}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
- addresses: ["{address}"]
"""


class Recorder:
    def __init__(self, store: Store) -> None:
        self.events: list[Event] = []
        store.subscribe(self.events.extend)


def keys(store: Store, kind: str) -> set[str]:
    return {f"{e.key.namespace}/{e.key.name}" for e in store.list(kind)}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def store() -> Store:
    return Store()


def test_multi_document_nested_list_and_json(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", svc("a") + "---\n" + eps("a-1", "a") + "---\n# only a comment\n---\n")
    write(tmp_path / "deep" / "er" / "b.yml", svc("b", ns="prod"))
    write(tmp_path / "list.yaml", json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "c"}, "spec": {"ports": [{"port": 81}]}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}},
    ]}))
    write(tmp_path / "d.json", json.dumps({"apiVersion": "v1", "kind": "Service",
                                           "metadata": {"name": "d", "namespace": "default"},
                                           "spec": {"ports": [{"name": "grpc", "port": 9090}]}}))
    write(tmp_path / "notes.txt", svc("ignored"))
    write(tmp_path / ".hidden" / "x.yaml", svc("hidden"))
    FileSource(tmp_path, store).load()
    assert keys(store, "Service") == {"default/a", "prod/b", "default/c", "default/d"}
    assert keys(store, "EndpointSlice") == {"default/a-1"}
    assert keys(store, "Namespace") == {"/prod"}
    assert store.rejections() == []
    # Each object remembers where it came from.
    src = store.get(ConfigKey("Service", "default", "c")).source
    assert src == f"{tmp_path / 'list.yaml'}#0.items[0]"
    assert store.get(ConfigKey("EndpointSlice", "default", "a-1")).source == f"{tmp_path / 'a.yaml'}#1"


def test_namespace_defaulting(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: nons}\nspec: {ports: [{port: 80}]}\n"
          "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: team, namespace: ignored}\n")
    FileSource(tmp_path, store).load()
    assert store.get(ConfigKey("Service", "default", "nons")).obj.metadata.namespace == "default"
    assert store.get(ConfigKey("Namespace", "", "team")) is not None  # cluster-scoped: no namespace
    other = Store()
    FileSource(tmp_path, other, default_namespace="apps").load()
    assert keys(other, "Service") == {"apps/nons"}


def test_create_modify_delete_rename(tmp_path: Path, store: Store) -> None:
    rec = Recorder(store)
    src = FileSource(tmp_path, store)
    src.load()
    assert store.list("Service") == []

    write(tmp_path / "a.yaml", svc("a", port=80))
    src.load()
    assert [(e.op, str(e.key)) for e in rec.events] == [("add", "Service/default/a")]

    rec.events.clear()
    write(tmp_path / "a.yaml", svc("a", port=81))
    src.load()
    assert [(e.op, str(e.key)) for e in rec.events] == [("update", "Service/default/a")]
    assert store.get(ConfigKey("Service", "default", "a")).obj.spec.ports[0].port == 81

    # Rename: same object, new file -> no event, but the source follows the file.
    rec.events.clear()
    (tmp_path / "a.yaml").rename(tmp_path / "renamed.yaml")
    src.load()
    assert rec.events == []
    assert store.get(ConfigKey("Service", "default", "a")).source == f"{tmp_path / 'renamed.yaml'}#0"

    # Rename that also moves to a subdirectory and changes the content.
    rec.events.clear()
    write(tmp_path / "sub" / "moved.yaml", svc("a", port=82))
    (tmp_path / "renamed.yaml").unlink()
    src.load()
    assert [(e.op, str(e.key)) for e in rec.events] == [("update", "Service/default/a")]

    rec.events.clear()
    (tmp_path / "sub" / "moved.yaml").unlink()
    src.load()
    assert [(e.op, str(e.key)) for e in rec.events] == [("delete", "Service/default/a")]
    assert store.list("Service") == []


def test_removing_a_document_from_a_file_deletes_only_it(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", svc("a") + "---\n" + svc("b", ip="10.96.0.2"))
    src = FileSource(tmp_path, store)
    src.load()
    rec = Recorder(store)
    write(tmp_path / "a.yaml", svc("b", ip="10.96.0.2"))
    src.load()
    assert [(e.op, str(e.key)) for e in rec.events] == [("delete", "Service/default/a")]
    assert keys(store, "Service") == {"default/b"}


def test_rewriting_identical_content_produces_no_events(tmp_path: Path, store: Store) -> None:
    text = svc("a") + "---\n" + eps("a-1", "a")
    write(tmp_path / "a.yaml", text)
    src = FileSource(tmp_path, store)
    src.load()
    rec = Recorder(store)
    revision = store.revision
    write(tmp_path / "a.yaml", text)
    src.load()
    # Also: the same content reformatted (key order, flow style) is the same object.
    write(tmp_path / "a.yaml", "kind: Service\napiVersion: v1\nspec:\n  ports:\n  - port: 80\n    name: http\n"
          "  clusterIP: 10.96.0.1\nmetadata:\n  namespace: default\n  name: a\n---\n" + eps("a-1", "a"))
    src.load()
    assert rec.events == []
    assert store.revision == revision


def _rejection(store: Store, name: str):
    found = [r for r in store.rejections() if r.name == name]
    assert len(found) == 1, store.rejections()
    return found[0]


def test_bad_documents_are_rejected_precisely_and_the_rest_loads(tmp_path: Path, store: Store) -> None:
    bad_port = svc("bad-port", port=70000)
    no_addresses = eps("no-addr", "a").replace('- addresses: ["10.1.0.1"]', "- addresses: []")
    unknown = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: default}\n"
    wrong_version = "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: old, namespace: default}\n"
    write(tmp_path / "mixed.yaml", "---\n".join([svc("good"), bad_port, no_addresses, unknown, wrong_version,
                                                  "just a string\n"]))
    write(tmp_path / "broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: x\n  bad: [\n")
    write(tmp_path / "other.yaml", svc("also-good", ip="10.96.0.9"))
    FileSource(tmp_path, store).load()

    assert keys(store, "Service") == {"default/good", "default/also-good"}
    mixed = tmp_path / "mixed.yaml"

    r = _rejection(store, "bad-port")
    assert (r.source, r.kind, r.namespace) == (f"{mixed}#1", "Service", "default")
    assert "spec.ports[0].port" in r.reason and "65535" in r.reason

    r = _rejection(store, "no-addr")
    assert (r.source, r.kind, r.namespace) == (f"{mixed}#2", "EndpointSlice", "default")
    assert "endpoints[0].addresses" in r.reason and "at least 1" in r.reason

    r = _rejection(store, "w")
    assert (r.source, r.kind) == (f"{mixed}#3", "Widget")
    assert "unknown kind 'Widget'" in r.reason

    r = _rejection(store, "old")
    assert (r.source, r.kind) == (f"{mixed}#4", "EndpointSlice")
    assert "discovery.k8s.io/v1beta1" in r.reason and "want discovery.k8s.io/v1" in r.reason

    r = next(r for r in store.rejections() if r.source == f"{mixed}#5")
    assert "not a mapping" in r.reason

    r = next(r for r in store.rejections() if r.source.startswith(str(tmp_path / "broken.yaml")))
    assert "invalid YAML" in r.reason and "line" in r.reason
    assert len(store.rejections()) == 6

    # as_dict is what /debug/configz shows.
    assert set(_rejection(store, "bad-port").as_dict()) == {"source", "kind", "namespace", "name", "reason"}


def test_missing_addresses_field_is_rejected(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", eps("no-addr", "a").replace('- addresses: ["10.1.0.1"]', "- conditions: {ready: true}"))
    FileSource(tmp_path, store).load()
    r = _rejection(store, "no-addr")
    assert "endpoints[0].addresses" in r.reason and "required" in r.reason.lower()


def test_service_validation_reasons(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: two, namespace: default}\n"
          "spec: {ports: [{port: 80}, {port: 81}]}\n---\n"
          "apiVersion: v1\nkind: Service\nmetadata: {name: dup, namespace: default}\n"
          "spec: {ports: [{name: a, port: 80}, {name: b, port: 80}]}\n---\n"
          "apiVersion: v1\nkind: Service\nmetadata: {namespace: default}\nspec: {ports: [{port: 80}]}\n")
    FileSource(tmp_path, store).load()
    assert "every port must have a name" in _rejection(store, "two").reason
    assert "duplicate port 80/TCP" in _rejection(store, "dup").reason
    assert "metadata.name" in _rejection(store, "").reason


def test_duplicates_keep_the_first_and_reject_the_rest(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", svc("a", port=80))
    write(tmp_path / "b.yaml", svc("a", port=81))
    write(tmp_path / "c.yaml", svc("a", port=82) + "---\n" + svc("a", port=83))
    FileSource(tmp_path, store).load()
    assert store.get(ConfigKey("Service", "default", "a")).obj.spec.ports[0].port == 80
    rs = store.rejections()
    assert sorted(r.source for r in rs) == [f"{tmp_path / 'b.yaml'}#0", f"{tmp_path / 'c.yaml'}#0",
                                            f"{tmp_path / 'c.yaml'}#1"]
    for r in rs:
        assert (r.kind, r.namespace, r.name) == ("Service", "default", "a")
        assert "duplicate" in r.reason and str(tmp_path / "a.yaml") in r.reason


def test_fixing_a_bad_file_clears_its_rejection(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", svc("a", port=70000))
    src = FileSource(tmp_path, store)
    src.load()
    assert len(store.rejections()) == 1 and store.list("Service") == []
    write(tmp_path / "a.yaml", svc("a", port=80))
    src.load()
    assert store.rejections() == []
    assert keys(store, "Service") == {"default/a"}


def test_breaking_an_object_keeps_its_last_good_version_and_reports_why(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", svc("a"))
    write(tmp_path / "b.yaml", svc("b", ip="10.96.0.2"))
    src = FileSource(tmp_path, store)
    src.load()
    good = store.get(ConfigKey("Service", "default", "a"))
    write(tmp_path / "a.yaml", svc("a", port=0))
    src.load()
    assert keys(store, "Service") == {"default/a", "default/b"}
    assert store.get(ConfigKey("Service", "default", "a")).revision == good.revision  # untouched
    rej = _rejection(store, "a")
    assert rej.source == f"{tmp_path / 'a.yaml'}#0"
    assert "last good version" in rej.reason
    # Fixing it applies the fix and clears the rejection; deleting the file deletes the object.
    write(tmp_path / "a.yaml", svc("a", port=81))
    src.load()
    assert store.rejections() == []
    assert store.get(ConfigKey("Service", "default", "a")).obj.spec.ports[0].port == 81
    (tmp_path / "a.yaml").unlink()
    src.load()
    assert keys(store, "Service") == {"default/b"}


def test_a_file_that_stops_being_yaml_keeps_all_its_objects(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "ab.yaml", svc("a") + "\n---\n" + svc("b", ip="10.96.0.2"))
    src = FileSource(tmp_path, store)
    src.load()
    write(tmp_path / "ab.yaml", "kind: Service\n  bad: [indent\n")
    src.load()
    assert keys(store, "Service") == {"default/a", "default/b"}
    (rej,) = store.rejections()
    assert "invalid YAML" in rej.reason and "2 object(s)" in rej.reason


def test_same_size_edit_is_noticed(tmp_path: Path, store: Store) -> None:
    write(tmp_path / "a.yaml", svc("a", port=81))
    src = FileSource(tmp_path, store)
    src.load()
    stat = (tmp_path / "a.yaml").stat()
    write(tmp_path / "a.yaml", svc("a", port=82))
    os.utime(tmp_path / "a.yaml", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    src.load()
    assert store.get(ConfigKey("Service", "default", "a")).obj.spec.ports[0].port == 82


def test_objects_from_other_owners_are_left_alone(tmp_path: Path, store: Store) -> None:
    from pilot.config.validation import parse_object
    store.apply(parse_object({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube", "namespace": "default"},
                              "spec": {"ports": [{"port": 80}]}}), source="kube")
    write(tmp_path / "a.yaml", svc("a"))
    src = FileSource(tmp_path, store)
    src.load()
    (tmp_path / "a.yaml").unlink()
    src.load()
    assert keys(store, "Service") == {"default/kube"}


async def test_watch_follows_file_writes(tmp_path: Path, store: Store) -> None:
    src = FileSource(tmp_path, store)
    src.load()
    stop = asyncio.Event()
    task = asyncio.create_task(src.watch(stop))
    try:
        # The watcher starts asynchronously: keep writing new content until a load has seen it.
        attempt = 0

        def written_and_seen() -> bool:
            nonlocal attempt
            if store.get(ConfigKey("Service", "default", "a")) is not None:
                return True
            attempt += 1
            write(tmp_path / "a.yaml", svc("a", port=80 + attempt))
            return False

        await wait_for(written_and_seen, timeout=10, interval=0.1, message="file write not loaded")
        write(tmp_path / "nested" / "b.yaml", svc("b", ip="10.96.0.2"))
        await wait_for(lambda: store.get(ConfigKey("Service", "default", "b")), timeout=10,
                       message="nested file not loaded")
        (tmp_path / "nested" / "b.yaml").unlink()
        await wait_for(lambda: store.get(ConfigKey("Service", "default", "b")) is None, timeout=10,
                       message="delete not noticed")
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_watch_picks_up_a_config_dir_created_later(tmp_path: Path, store: Store) -> None:
    root = tmp_path / "later"
    src = FileSource(root, store)
    src.load()
    assert store.list("Service") == []
    stop = asyncio.Event()
    task = asyncio.create_task(src.watch(stop))
    try:
        attempt = 0

        def created_and_seen() -> bool:
            nonlocal attempt
            if store.get(ConfigKey("Service", "default", "a")) is not None:
                return True
            attempt += 1
            write(root / "a.yaml", svc("a", port=80 + attempt))
            return False

        await wait_for(created_and_seen, timeout=10, interval=0.1, message="late config dir not loaded")
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


def _state(store: Store) -> dict:
    return {str(e.key): (e.obj.model_dump(), e.source) for k in store.kinds() for e in store.list(k)}


def test_incremental_reload_matches_a_full_reload(tmp_path: Path) -> None:
    """The watcher re-reads only the files that changed; after every step the Store must hold
    exactly what a full reload after the same history gives, rejections included."""
    incremental, full = Store(), Store()
    inc, whole = FileSource(tmp_path, incremental), FileSource(tmp_path, full)
    inc.load()
    whole.load()
    steps = [
        ("write", "a.yaml", svc("a", port=81)),
        ("write", "b.yaml", svc("b", ip="10.96.0.2")),
        ("write", "a.yaml", svc("a", port=82)),                  # edit
        ("write", "dup.yaml", svc("a", port=99)),                # duplicate of a: first one wins
        ("delete", "dup.yaml", None),
        ("write", "a.yaml", "kind: [broken"),                    # keeps the last good a
        ("write", "a.yaml", svc("a", port=83)),                  # fixed
        ("rename", "b.yaml", "nested/c.yaml"),
        ("write", "ab.yaml", svc("x", ip="10.96.0.9") + "\n---\n" + svc("y", ip="10.96.0.8")),
        ("write", "ab.yaml", svc("x", ip="10.96.0.9")),          # one document removed
        ("delete", "a.yaml", None),
    ]
    for op, name, arg in steps:
        changed = {tmp_path / name}
        if op == "write":
            write(tmp_path / name, arg)
        elif op == "delete":
            (tmp_path / name).unlink()
        else:
            (tmp_path / arg).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp_path / name, tmp_path / arg)
            changed.add(tmp_path / arg)
        inc.load_paths(changed)
        whole.load()
        assert _state(incremental) == _state(full), (op, name)
        assert sorted((r.source, r.name, r.reason) for r in incremental.rejections()) == \
            sorted((r.source, r.name, r.reason) for r in full.rejections()), (op, name)
    assert inc.incremental_loads > 0
