"""The fake apiserver (tests/fakes/apiserver.py), driven through the real kubernetes-asyncio client.

These tests double as documentation of how kubernetes-asyncio surfaces each
watch outcome:

* BOOKMARK: yielded as ``{"type": "BOOKMARK", "object": dict, "raw_object": dict}``;
  ``object`` is *not* deserialized (a raw dict with kind/apiVersion/metadata.resourceVersion);
  ``Watch.resource_version`` advances to the bookmark's RV.
* ERROR 410 (Expired): ``unmarshal_event`` raises ``ApiException(status=410,
  reason="Expired: too old resource version: N (M)")`` (``body`` is None). With
  ``timeout_seconds`` it raises on the first stream; without it (watch-forever mode)
  Watch silently reconnects once from the *same* RV and raises on the second 410.
* Clean end of stream (``timeoutSeconds`` elapsed, ``drop_watches(abort=False)``, a
  500 with an empty body): with ``timeout_seconds`` the iterator ends
  (StopAsyncIteration); without it Watch reconnects by itself from the RV of the last
  event it yielded, with no backoff.
* Cut connection (``drop_watches()`` default, ``go_away()``): aiohttp
  ``ClientPayloadError`` escapes the iterator in both modes; a request while the
  server is away raises ``aiohttp.ClientConnectorError`` (not ApiException).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.fakes.apiserver import FakeApiServer
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(30)

ISTIO = "networking.istio.io"


@pytest.fixture
async def fake():
    server = FakeApiServer(bookmark_interval=None)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def api(fake):
    async with fake.api_client() as api_client:
        yield api_client


def pod(name: str, namespace: str = "default", labels: dict | None = None, **status) -> dict:
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
           "spec": {"containers": [{"name": "c", "image": "img"}]}}
    if status:
        obj["status"] = status
    return obj


class Collector:
    """Runs a kubernetes-asyncio watch in a task and queues what it yields (and how it ends)."""

    def __init__(self, func, *args, **kwargs):
        self.watch = watch.Watch()
        self.events: asyncio.Queue = asyncio.Queue()
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._run(func, args, kwargs))

    async def _run(self, func, args, kwargs):
        try:
            async with self.watch:
                async for event in self.watch.stream(func, *args, **kwargs):
                    await self.events.put(event)
            self.ended.set_result(None)
        except Exception as exc:  # noqa: BLE001 - surfaced through .ended
            self.ended.set_exception(exc)

    async def next(self, timeout: float = 5.0) -> dict:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def take(self, n: int, timeout: float = 5.0) -> list[dict]:
        return [await self.next(timeout) for _ in range(n)]

    async def end(self, timeout: float = 5.0):
        """Wait for the stream to end; return None or raise what ended it."""
        return await asyncio.wait_for(asyncio.shield(self.ended), timeout)

    async def close(self):
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task


@contextlib.asynccontextmanager
async def collecting(func, *args, **kwargs):
    c = Collector(func, *args, **kwargs)
    try:
        yield c
    finally:
        await c.close()


# ----------------------------------------------------------------- discovery


async def test_discovery_and_kubeconfig(fake, tmp_path):
    fake.register_crd(ISTIO, "v1", "virtualservices", "VirtualService")
    path = fake.write_kubeconfig(tmp_path / "kubeconfig")
    cfg = client.Configuration()
    await config.load_kube_config(config_file=path, client_configuration=cfg)
    assert cfg.host == fake.url
    async with client.ApiClient(cfg) as api:
        assert (await client.CoreApi(api).get_api_versions()).versions == ["v1"]
        groups = {g.name: g for g in (await client.ApisApi(api).get_api_versions()).groups}
        assert {"discovery.k8s.io", "coordination.k8s.io", ISTIO} <= set(groups)
        assert groups[ISTIO].preferred_version.group_version == f"{ISTIO}/v1"
        core = await client.CoreV1Api(api).get_api_resources()
        names = {r.name: r for r in core.resources}
        assert names["pods"].namespaced and not names["namespaces"].namespaced
        assert "pods/status" in names and "watch" in names["pods"].verbs
        leases = await client.CoordinationV1Api(api).get_api_resources()
        assert [r.name for r in leases.resources] == ["leases"]
        assert (await client.VersionApi(api).get_code()).major == "1"
        crds = await client.ApiextensionsV1Api(api).list_custom_resource_definition()
        assert [c.metadata.name for c in crds.items] == [f"virtualservices.{ISTIO}"]
        assert {c.type for c in crds.items[0].status.conditions} >= {"Established"}


# ---------------------------------------------------------------------- list


async def test_list_has_resource_versions_and_selectors(fake, api):
    fake.create(pod("a", labels={"app": "x"}, podIP="10.0.0.1"))
    fake.create(pod("b", labels={"app": "y"}))
    fake.create(pod("c", namespace="other", labels={"app": "x"}))
    core = client.CoreV1Api(api)

    result = await core.list_namespaced_pod("default")
    assert result.metadata.resource_version == fake.resource_version
    assert [p.metadata.name for p in result.items] == ["a", "b"]
    first = result.items[0]
    assert first.metadata.uid and first.metadata.creation_timestamp and first.metadata.resource_version
    assert first.status.pod_ip == "10.0.0.1"
    assert int(first.metadata.resource_version) < int(result.items[1].metadata.resource_version)

    everywhere = await core.list_pod_for_all_namespaces(label_selector="app=x")
    assert sorted((p.metadata.namespace, p.metadata.name) for p in everywhere.items) == [
        ("default", "a"), ("other", "c")]
    by_name = await core.list_pod_for_all_namespaces(field_selector="metadata.name=b")
    assert [p.metadata.name for p in by_name.items] == ["b"]
    by_ns = await core.list_pod_for_all_namespaces(field_selector="metadata.namespace=other")
    assert [p.metadata.name for p in by_ns.items] == ["c"]

    page = await core.list_namespaced_pod("default", limit=1)
    assert [p.metadata.name for p in page.items] == ["a"] and page.metadata._continue
    rest = await core.list_namespaced_pod("default", limit=1, _continue=page.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["b"] and not rest.metadata._continue

    # Raw wire format: built-in list items carry no kind/apiVersion; the list does.
    async with aiohttp.ClientSession() as http, http.get(f"{fake.url}/api/v1/namespaces/default/pods") as resp:
        body = await resp.json()
    assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
    assert body["metadata"]["resourceVersion"] == fake.resource_version
    assert "kind" not in body["items"][0]


# --------------------------------------------------------------------- watch


async def test_watch_from_rv0_sends_added_for_existing(fake, api):
    fake.create(pod("a"))
    fake.create(pod("b"))
    core = client.CoreV1Api(api)
    async with collecting(core.list_namespaced_pod, "default", resource_version="0", timeout_seconds=10) as c:
        events = await c.take(2)
        assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "a"), ("ADDED", "b")]
        assert isinstance(events[0]["object"], client.V1Pod)
        assert isinstance(events[0]["raw_object"], dict)


async def test_watch_from_list_rv_gets_subsequent_events_in_order(fake, api):
    core = client.CoreV1Api(api)
    fake.create(pod("existing"))
    listed = await core.list_namespaced_pod("default")
    rv = listed.metadata.resource_version
    fake.create(pod("before-watch"))  # after the list, before the watch: replayed from history

    async with collecting(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=10) as c:
        await fake.wait_for_watches(1, "pods")
        await core.create_namespaced_pod("default", pod("p"))
        current = await core.read_namespaced_pod("p", "default")
        current.metadata.labels = {"changed": "yes"}
        await core.replace_namespaced_pod("p", "default", current)
        await core.delete_namespaced_pod("p", "default")

        events = await c.take(4)
        assert [(e["type"], e["object"].metadata.name) for e in events] == [
            ("ADDED", "before-watch"), ("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]
        rvs = [int(e["object"].metadata.resource_version) for e in events]
        assert rvs == sorted(rvs) and rvs[0] > int(rv)
        assert events[2]["object"].metadata.labels == {"changed": "yes"}
        assert c.watch.resource_version == str(rvs[-1])


async def test_watch_with_selector_sees_objects_leave_and_enter(fake, api):
    core = client.CoreV1Api(api)
    fake.create(pod("p", labels={"app": "x"}))
    rv = (await core.list_namespaced_pod("default", label_selector="app=x")).metadata.resource_version
    async with collecting(core.list_namespaced_pod, "default", label_selector="app=x",
                          resource_version=rv, timeout_seconds=10) as c:
        await fake.wait_for_watches(1, "pods")
        fake.patch("pods", "p", {"metadata": {"labels": {"app": "y"}}})
        fake.patch("pods", "p", {"metadata": {"labels": {"app": "x"}}})
        events = await c.take(2)
        assert [e["type"] for e in events] == ["DELETED", "ADDED"]


async def test_bookmarks_on_demand_and_periodic(fake, api):
    core = client.CoreV1Api(api)
    rv = (await core.list_namespaced_pod("default")).metadata.resource_version
    async with collecting(core.list_namespaced_pod, "default", resource_version=rv,
                          allow_watch_bookmarks=True, timeout_seconds=10) as c:
        await fake.wait_for_watches(1, "pods")
        fake.create(pod("unrelated", namespace="elsewhere"))  # bumps the global RV, not seen here
        assert fake.send_bookmarks() == 1
        event = await c.next()
        assert event["type"] == "BOOKMARK"
        # kubernetes-asyncio does not deserialize bookmarks: both fields are the raw dict.
        assert isinstance(event["object"], dict) and event["object"] is event["raw_object"]
        assert event["object"] == {"kind": "Pod", "apiVersion": "v1",
                                   "metadata": {"resourceVersion": fake.resource_version}}
        assert c.watch.resource_version == fake.resource_version

    fake.bookmark_interval = 0.05
    async with collecting(core.list_namespaced_pod, "default", resource_version=rv,
                          allow_watch_bookmarks=True, timeout_seconds=10) as c:
        assert [e["type"] for e in await c.take(2)] == ["BOOKMARK", "BOOKMARK"]
    # Without allowWatchBookmarks nothing is sent.
    async with collecting(core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=10) as c:
        await fake.wait_for_watches(1, "pods")
        fake.send_bookmarks()
        fake.create(pod("after"))
        assert (await c.next())["type"] == "ADDED"


async def test_timeout_seconds_ends_stream(fake, api):
    core = client.CoreV1Api(api)
    started = time.monotonic()
    async with collecting(core.list_namespaced_pod, "default", resource_version="0", timeout_seconds=1) as c:
        assert await c.end() is None  # StopAsyncIteration, no exception
    assert 0.9 <= time.monotonic() - started < 5
    assert fake.count("watch", "pods") == 1
    assert fake.open_watches() == 0


async def test_expired_resource_version_gives_410(fake, api):
    core = client.CoreV1Api(api)
    fake.create(pod("a"))
    old_rv = (await core.list_namespaced_pod("default")).metadata.resource_version
    fake.create(pod("b"))
    fake.expire_history()

    # Wire format: 200, one ERROR event carrying an Expired Status, then the stream ends.
    async with aiohttp.ClientSession() as http, http.get(f"{fake.url}/api/v1/namespaces/default/pods",
                        params={"watch": "true", "resourceVersion": old_rv}) as resp:
        assert resp.status == 200
        lines = (await resp.read()).decode().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["type"] == "ERROR"
    assert event["object"] == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Expired",
        "code": 410, "message": f"too old resource version: {old_rv} ({fake.resource_version})"}

    # With timeout_seconds the client raises ApiException(410) on the first stream.
    mark = fake.mark()
    async with collecting(core.list_namespaced_pod, "default", resource_version=old_rv, timeout_seconds=5) as c:
        with pytest.raises(ApiException) as info:
            await c.end()
    assert info.value.status == 410 and info.value.reason.startswith("Expired: too old resource version")
    assert fake.count("watch", since=mark) == 1

    # Watch-forever mode retries once from the same RV, then raises.
    mark = fake.mark()
    async with collecting(core.list_namespaced_pod, "default", resource_version=old_rv) as c:
        with pytest.raises(ApiException) as info:
            await c.end()
    assert info.value.status == 410
    assert fake.count("watch", since=mark) == 2

    # The recovery path works: re-LIST, then watch from the fresh RV.
    fresh = await core.list_namespaced_pod("default")
    async with collecting(core.list_namespaced_pod, "default", resource_version=fresh.metadata.resource_version,
                          timeout_seconds=10) as c:
        await fake.wait_for_watches(1, "pods")
        fake.create(pod("c"))
        assert (await c.next())["object"].metadata.name == "c"
    assert fake.count("list", "pods") == 2


async def test_history_window_limit(fake, api):
    fake.history_limit = 2
    base = fake.resource_version
    for name in "abc":
        fake.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
    core = client.CoreV1Api(api)
    async with collecting(core.list_namespaced_config_map, "default", resource_version=base,
                          timeout_seconds=5) as c:
        with pytest.raises(ApiException) as info:
            await c.end()
    assert info.value.status == 410


# --------------------------------------------------------------------- writes


async def test_create_conflict_is_409_already_exists(fake, api):
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    with pytest.raises(ApiException) as info:
        await core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    assert info.value.status == 409
    status = json.loads(info.value.body)
    assert status["kind"] == "Status" and status["reason"] == "AlreadyExists"
    assert status["message"] == 'configmaps "cm" already exists'
    with pytest.raises(ApiException) as info:
        await core.read_namespaced_config_map("missing", "default")
    assert info.value.status == 404 and json.loads(info.value.body)["reason"] == "NotFound"


async def test_lease_update_with_stale_resource_version_is_409(fake, api):
    coord = client.CoordinationV1Api(api)
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="leader", namespace="istio-system"),
                           spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15))
    created = await coord.create_namespaced_lease("istio-system", lease)
    stale_rv = created.metadata.resource_version

    created.spec.holder_identity = "b"
    updated = await coord.replace_namespaced_lease("leader", "istio-system", created)
    assert updated.spec.holder_identity == "b"
    assert int(updated.metadata.resource_version) > int(stale_rv)

    created.metadata.resource_version = stale_rv
    created.spec.holder_identity = "c"
    with pytest.raises(ApiException) as info:
        await coord.replace_namespaced_lease("leader", "istio-system", created)
    assert info.value.status == 409
    status = json.loads(info.value.body)
    assert status["reason"] == "Conflict"
    assert 'leases.coordination.k8s.io "leader"' in status["message"]
    assert (await coord.read_namespaced_lease("leader", "istio-system")).spec.holder_identity == "b"

    # A no-op update neither bumps the RV nor emits an event.
    current = await coord.read_namespaced_lease("leader", "istio-system")
    same = await coord.replace_namespaced_lease("leader", "istio-system", current)
    assert same.metadata.resource_version == current.metadata.resource_version


async def test_status_subresource(fake, api):
    core = client.CoreV1Api(api)
    created = await core.create_namespaced_pod("default", pod("p", podIP="1.1.1.1"))
    assert created.status.phase == "Pending" and created.status.pod_ip is None  # POST drops status

    created.status.pod_ip = "2.2.2.2"
    created.metadata.labels = {"a": "b"}
    replaced = await core.replace_namespaced_pod("p", "default", created)  # main resource: status ignored
    assert replaced.status.pod_ip is None and replaced.metadata.labels == {"a": "b"}

    replaced.status.pod_ip = "3.3.3.3"
    replaced.metadata.labels = {"ignored": "yes"}
    with_status = await core.replace_namespaced_pod_status("p", "default", replaced)
    assert with_status.status.pod_ip == "3.3.3.3" and with_status.metadata.labels == {"a": "b"}

    patched = await core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"},
                                                                       "spec": {"nodeName": "ignored"}})
    assert patched.status.phase == "Running" and patched.status.pod_ip == "3.3.3.3"
    assert patched.spec.node_name is None

    with pytest.raises(ApiException) as info:  # configmaps have no status subresource
        await api.call_api("/api/v1/namespaces/default/configmaps/x/status", "GET",
                           response_types_map={}, _return_http_data_only=True)
    assert info.value.status == 404


async def test_patch_flavours_and_finalizers(fake, api):
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}, "data": {"a": "1", "b": "2"}})
    merged = await core.patch_namespaced_config_map("cm", "default", {"data": {"a": None, "c": "3"}})
    assert merged.data == {"b": "2", "c": "3"}
    jsonp = await core.patch_namespaced_config_map("cm", "default", [{"op": "replace", "path": "/data/b",
                                                                      "value": "9"}])
    assert jsonp.data == {"b": "9", "c": "3"}
    with pytest.raises(ApiException) as info:
        await core.patch_namespaced_config_map("cm", "default", {"metadata": {"resourceVersion": "1"}})
    assert info.value.status == 409

    fake.create({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "fin", "finalizers": ["example.com/hold"]}})
    deleting = await core.delete_namespaced_config_map("fin", "default")
    assert deleting.kind == "ConfigMap"
    assert fake.get("configmaps", "fin")["metadata"]["deletionTimestamp"]
    await core.patch_namespaced_config_map("fin", "default", {"metadata": {"finalizers": None}})
    assert fake.get("configmaps", "fin") is None


# --------------------------------------------------------------- custom objects


async def test_custom_objects_404_until_registered_then_list_and_watch(fake, api):
    co = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as info:
        await co.list_namespaced_custom_object(ISTIO, "v1", "default", "virtualservices")
    assert info.value.status == 404
    status = json.loads(info.value.body)
    assert status["kind"] == "Status" and status["reason"] == "NotFound"

    fake.register_crd(ISTIO, "v1", "virtualservices", "VirtualService")
    fake.register_crd(ISTIO, "v1beta1", "virtualservices", "VirtualService")
    vs = {"apiVersion": f"{ISTIO}/v1", "kind": "VirtualService", "metadata": {"name": "vs1"},
          "spec": {"hosts": ["a"]}}
    await co.create_namespaced_custom_object(ISTIO, "v1", "default", "virtualservices", vs)
    listed = await co.list_namespaced_custom_object(ISTIO, "v1", "default", "virtualservices")
    assert listed["kind"] == "VirtualServiceList"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["vs1"]
    assert listed["items"][0]["kind"] == "VirtualService"  # custom list items carry kind/apiVersion
    # The same object is served through every registered version.
    other = await co.list_namespaced_custom_object(ISTIO, "v1beta1", "default", "virtualservices")
    assert other["items"][0]["apiVersion"] == f"{ISTIO}/v1beta1"

    rv = listed["metadata"]["resourceVersion"]
    async with collecting(co.list_cluster_custom_object, ISTIO, "v1", "virtualservices",
                          resource_version=rv, timeout_seconds=10) as c:
        await fake.wait_for_watches(1, f"virtualservices.{ISTIO}")
        await co.patch_namespaced_custom_object(ISTIO, "v1", "default", "virtualservices", "vs1",
                                                {"spec": {"hosts": ["b"]}},
                                                _content_type="application/merge-patch+json")
        await co.patch_namespaced_custom_object_status(ISTIO, "v1", "default", "virtualservices", "vs1",
                                                       {"status": {"ok": True}},
                                                       _content_type="application/merge-patch+json")
        events = await c.take(2)
        assert [e["type"] for e in events] == ["MODIFIED", "MODIFIED"]
        assert isinstance(events[0]["object"], dict)  # no model for custom objects
        assert events[0]["object"]["spec"] == {"hosts": ["b"]}
        assert events[0]["object"]["metadata"]["generation"] == 2
        assert events[1]["object"]["status"] == {"ok": True}
        assert events[1]["object"]["metadata"]["generation"] == 2

        fake.unregister_crd(ISTIO, "virtualservices")  # objects deleted, then the watch ends
        assert (await c.next())["type"] == "DELETED"
        assert await c.end() is None
    with pytest.raises(ApiException) as info:
        await co.list_namespaced_custom_object(ISTIO, "v1", "default", "virtualservices")
    assert info.value.status == 404


# --------------------------------------------------------------- fault injection


async def test_drop_watches_ends_streams(fake, api):
    core = client.CoreV1Api(api)
    # abort=True (default): the connection is cut mid-body.
    async with collecting(core.list_namespace, resource_version="0", timeout_seconds=30) as c:
        await c.take(4)  # the seeded namespaces
        assert fake.drop_watches() == 1
        with pytest.raises(aiohttp.ClientPayloadError):
            await c.end()
    # abort=False: a clean end of the response.
    async with collecting(core.list_namespace, resource_version="0", timeout_seconds=30) as c:
        await fake.wait_for_watches(1)
        fake.drop_watches(abort=False)
        assert await c.end() is None
    # Watch-forever mode reconnects by itself after a clean end, from the RV of the *last event
    # it yielded*. Initial ADDED events come in key order, not RV order, so that RV can be older
    # than others already seen: the reconnected stream replays them (duplicate ADDED).
    async with collecting(core.list_namespace) as c:
        initial = await c.take(4)
        last_rv = initial[-1]["object"].metadata.resource_version
        mark = fake.mark()
        fake.drop_watches(abort=False)
        await wait_for(lambda: fake.count("watch", "namespaces", since=mark) == 1 and fake.open_watches() == 1)
        assert fake.requests_since(mark)[0].query["resourceVersion"] == last_rv
        newer = sorted(e["object"].metadata.name for e in initial
                       if int(e["object"].metadata.resource_version) > int(last_rv))
        replayed = await c.take(len(newer))
        assert sorted(e["object"].metadata.name for e in replayed) == newer
        assert {e["type"] for e in replayed} == {"ADDED"}


async def test_go_away_and_come_back_on_the_same_port(fake, api):
    core = client.CoreV1Api(api)
    port = fake.port
    async with collecting(core.list_namespace, resource_version="0", timeout_seconds=30) as c:
        await fake.wait_for_watches(1)
        await fake.go_away()
        with pytest.raises(aiohttp.ClientPayloadError):
            await c.end()
    with pytest.raises(aiohttp.ClientConnectorError):
        await core.list_namespace()
    await fake.come_back()
    assert fake.port == port
    assert len((await core.list_namespace()).items) == 4


async def test_fail_next_and_fail_when(fake, api):
    core = client.CoreV1Api(api)
    fake.fail_next(1)
    with pytest.raises(ApiException) as info:
        await core.list_namespace()
    assert info.value.status == 500 and info.value.body == ""
    assert len((await core.list_namespace()).items) == 4

    # A 500 with an empty body on a watch looks like a clean end of stream to the client.
    fault = fake.fail_when(lambda r: r.verb == "watch")
    async with collecting(core.list_namespace, resource_version="0", timeout_seconds=5) as c:
        assert await c.end() is None
    # ... and in watch-forever mode the client spins reconnecting without backoff.
    mark = fake.mark()
    async with collecting(core.list_namespace):
        await wait_for(lambda: fake.count("watch", since=mark) >= 50, timeout=5)
    assert fake.request_rate("watch", window=1.0) > 20
    fault.remove()

    # A Status body on a failed watch request surfaces as ApiException with that code.
    fake.fail_next(1, status=503, body={"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "reason": "ServiceUnavailable", "message": "later", "code": 503},
                   # (the cancelled spinning watch above may still have a request in flight)
                   match=lambda r: r.verb == "watch" and "timeoutSeconds" in r.query)
    async with collecting(core.list_namespace, timeout_seconds=5) as c:
        with pytest.raises(ApiException) as info:
            await c.end()
    assert info.value.status == 503


async def test_hang_when_and_request_timeout(fake, api):
    core = client.CoreV1Api(api)
    fault = fake.hang_when(lambda r: r.verb == "list")
    with pytest.raises(asyncio.TimeoutError):
        await core.list_namespace(_request_timeout=0.3)
    fault.release()
    assert len((await core.list_namespace(_request_timeout=5)).items) == 4


async def test_token_review_hook(fake, api):
    auth = client.AuthenticationV1Api(api)
    review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token="t0k"))
    assert (await auth.create_token_review(review)).status.authenticated is False

    def reviewer(token, audiences):
        return {"authenticated": token == "t0k", "user": {"username": "system:serviceaccount:ns:sa"}}

    fake.token_reviewer = reviewer
    result = await auth.create_token_review(review)
    assert result.status.authenticated is True
    assert result.status.user.username == "system:serviceaccount:ns:sa"


async def test_deleting_an_owner_collects_the_objects_it_owns_alone(fake, api):
    owner = fake.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner", "namespace": "a"}})
    other = fake.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other", "namespace": "a"}})

    def ref(o):
        return {"apiVersion": "v1", "kind": "ConfigMap", "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]}

    fake.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "owned", "namespace": "a",
                                                                      "ownerReferences": [ref(owner)]}})
    fake.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "shared", "namespace": "a",
                                                                      "ownerReferences": [ref(owner), ref(other)]}})
    await client.CoreV1Api(api).delete_namespaced_config_map("owner", "a")
    assert fake.get("services", "owned", namespace="a") is None
    assert fake.get("services", "shared", namespace="a") is not None  # another owner remains
    fake.delete("configmaps", "other", namespace="a")
    assert fake.get("services", "shared", namespace="a") is None
