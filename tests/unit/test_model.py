"""Model-level behaviour: protocols, node ids, durations, env knobs, MeshConfig, push classification,
PushRequest merging and the debouncer."""

from __future__ import annotations

import asyncio
import time

import pytest
from envoy.config.core.v3 import base_pb2
from google.protobuf import struct_pb2

from pilot.config.mesh import MeshConfig, MeshConfigError, parse_mesh_config
from pilot.config.validation import parse_object
from pilot.durations import parse_duration
from pilot.features import KNOBS, Features
from pilot.model import push_request as reasons
from pilot.model.events import SERVICE_ENDPOINTS, push_request_for
from pilot.model.mesh import MeshHolder
from pilot.model.protocol import Protocol, select_protocol
from pilot.model.proxy import InvalidNode, parse_node_id, proxy_from_node
from pilot.model.push_request import PushRequest
from pilot.model.store import ConfigKey, Store
from pilot.xds.debounce import Debouncer
from tests.support.wait import wait_for

from .helpers import SYSTEM_NS, endpoint_slice, mesh_configmap, pod, service

# --- protocol selection -----------------------------------------------------------------------

@pytest.mark.parametrize("name, app_protocol, transport, expected", [
    ("http", None, "TCP", Protocol.HTTP),
    ("http-web", None, "TCP", Protocol.HTTP),
    ("HTTP-Web", None, "TCP", Protocol.HTTP),
    ("http2", None, "TCP", Protocol.HTTP2),
    ("http2-api", None, "TCP", Protocol.HTTP2),
    ("grpc", None, "TCP", Protocol.GRPC),
    ("grpc-api", None, "TCP", Protocol.GRPC),
    ("grpc-web", None, "TCP", Protocol.GRPC_WEB),
    ("grpc-web-api", None, "TCP", Protocol.GRPC_WEB),
    ("https-admin", None, "TCP", Protocol.HTTPS),
    ("tcp-db", None, "TCP", Protocol.TCP),
    ("mongo", None, "TCP", Protocol.MONGO),
    ("redis-cache", None, "TCP", Protocol.REDIS),
    # No protocol named: sniffed (istiod's Unsupported), not TCP
    ("", None, "TCP", Protocol.UNSUPPORTED),
    ("web", None, "TCP", Protocol.UNSUPPORTED),
    ("httpfoo", None, "TCP", Protocol.UNSUPPORTED),  # a prefix counts only up to a dash
    ("foo-http", None, "TCP", Protocol.UNSUPPORTED),
    ("web", "unknown-proto", "TCP", Protocol.UNSUPPORTED),
    # appProtocol wins over the port name
    ("tcp", "http", "TCP", Protocol.HTTP),
    ("http", "grpc", "TCP", Protocol.GRPC),
    ("http", "HTTP2", "TCP", Protocol.HTTP2),
    ("grpc", "grpc-web", "TCP", Protocol.GRPC_WEB),
    ("tcp", "kubernetes.io/h2c", "TCP", Protocol.HTTP2),
    ("tcp", "kubernetes.io/ws", "TCP", Protocol.HTTP),
    ("tcp", "kubernetes.io/wss", "TCP", Protocol.HTTPS),
    ("http", "tcp", "TCP", Protocol.TCP),
    # UDP ports are UDP whatever they are called
    ("http", "http", "UDP", Protocol.UDP),
])
def test_select_protocol(name: str, app_protocol: str | None, transport: str, expected: Protocol) -> None:
    assert select_protocol(name, app_protocol, transport) is expected


def test_protocol_families() -> None:
    assert Protocol.GRPC.is_http and Protocol.GRPC.is_http2
    assert Protocol.GRPC_WEB.is_http and not Protocol.GRPC_WEB.is_http2  # grpc-web is HTTP/1.1 friendly
    assert Protocol.HTTP2.is_http2 and not Protocol.HTTP.is_http2
    assert not Protocol.HTTPS.is_http and not Protocol.TCP.is_http  # TLS is passed through


# --- node ids ---------------------------------------------------------------------------------

def test_parse_node_id() -> None:
    assert parse_node_id("sidecar~10.0.0.1~app-1.default~default.svc.cluster.local") == (
        "sidecar", ("10.0.0.1",), "app-1", "default", "cluster.local")
    assert parse_node_id("router~10.0.0.1,fd00::1~gw-1.istio-system~istio-system.svc.corp.example") == (
        "router", ("10.0.0.1", "fd00::1"), "gw-1", "istio-system", "corp.example")


def test_pod_names_may_contain_dots() -> None:
    """Pod names are DNS subdomains (dots allowed); namespaces are DNS labels (no dots)."""
    assert parse_node_id("sidecar~10.0.0.1~web.v2-abc.prod~prod.svc.cluster.local") == (
        "sidecar", ("10.0.0.1",), "web.v2-abc", "prod", "cluster.local")


@pytest.mark.parametrize("node_id, message", [
    ("", "must have 4 '~'-separated parts"),
    ("sidecar~10.0.0.1~app.default", "must have 4 '~'-separated parts"),
    ("gateway~10.0.0.1~app.default~default.svc.cluster.local", "unknown proxy type 'gateway'"),
    ("sidecar~10.0.0~app.default~default.svc.cluster.local", "'10.0.0' is not an IP address"),
    ("sidecar~10.0.0.1~app~default.svc.cluster.local", "third part must be POD.NAMESPACE"),
    ("sidecar~10.0.0.1~.default~default.svc.cluster.local", "third part must be POD.NAMESPACE"),
    ("sidecar~10.0.0.1~app.~default.svc.cluster.local", "third part must be POD.NAMESPACE"),
])
def test_parse_node_id_errors(node_id: str, message: str) -> None:
    with pytest.raises(InvalidNode) as e:
        parse_node_id(node_id)
    assert message in str(e.value)
    assert repr(node_id) in str(e.value)  # the message names the offending id


def _node(node_id: str, **metadata) -> base_pb2.Node:
    md = struct_pb2.Struct()
    md.update(metadata)
    return base_pb2.Node(id=node_id, cluster="app.default", metadata=md)


def test_proxy_from_node() -> None:
    p = proxy_from_node(_node("sidecar~10.0.0.1~app-1.default~default.svc.cluster.local",
                              NAMESPACE="default", INTERCEPTION_MODE="none", LABELS={"app": "web"},
                              ISTIO_VERSION="1.28.0"))
    assert (p.type, p.namespace, p.pod_name, p.dns_domain) == ("sidecar", "default", "app-1", "cluster.local")
    assert p.interception_mode == "NONE"
    assert p.labels == {"app": "web"}
    assert p.istio_version == "1.28.0"
    assert not p.is_grpc
    default = proxy_from_node(_node("sidecar~10.0.0.1~app-1.default~default.svc.cluster.local"))
    assert default.interception_mode == "REDIRECT"
    grpc = proxy_from_node(_node("sidecar~10.0.0.1~app-1.default~default.svc.cluster.local", GENERATOR="grpc"))
    assert grpc.is_grpc and grpc.traits != default.traits


def test_proxy_namespace_disagreement_is_an_error() -> None:
    with pytest.raises(InvalidNode, match="disagrees with metadata NAMESPACE 'other'"):
        proxy_from_node(_node("sidecar~10.0.0.1~app-1.default~default.svc.cluster.local", NAMESPACE="other"))


# --- durations --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("0", 0.0), ("10s", 10.0), ("100ms", 0.1), ("1h30m", 5400.0), ("1h30m15s", 5415.0), ("1.5h", 5400.0),
    (".5s", 0.5), ("1.s", 1.0), ("250us", 250e-6), ("250µs", 250e-6), ("250μs", 250e-6), ("10ns", 10e-9),
    ("-1.5s", -1.5), ("+2m", 120.0), ("2h45m0.5s", 9900.5), ("90d", 90 * 86400.0),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "s", "1m1", "10 s", "1h 30m", "ten seconds", "1x", "+", "-", ".s",
                                  "1..5s", "--1s"])
def test_parse_duration_invalid(text: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_duration(text)
    assert "duration" in str(e.value)


# --- features ---------------------------------------------------------------------------------

def test_features_defaults() -> None:
    f = Features.from_env({})
    assert (f.debounce_after, f.debounce_max, f.enable_eds_debounce) == (0.1, 10.0, True)
    assert (f.push_throttle, f.xds_cache_size, f.pod_namespace) == (100, 60000, "istio-system")
    assert all(k.help for k in KNOBS.values())


def test_features_from_env() -> None:
    f = Features.from_env({"PILOT_DEBOUNCE_AFTER": "20ms", "PILOT_DEBOUNCE_MAX": "1m30s",
                           "PILOT_ENABLE_EDS_DEBOUNCE": "F", "PILOT_PUSH_THROTTLE": "0",
                           "POD_NAMESPACE": "mesh"})
    assert (f.debounce_after, f.debounce_max, f.enable_eds_debounce) == (0.02, 90.0, False)
    assert f.push_throttle == 1  # at least one push can run
    assert f.pod_namespace == "mesh"


@pytest.mark.parametrize("name, value", [
    ("PILOT_DEBOUNCE_AFTER", "100"), ("PILOT_DEBOUNCE_MAX", "soon"), ("PILOT_ENABLE_EDS_DEBOUNCE", "yes"),
    ("PILOT_PUSH_THROTTLE", "-1"), ("PILOT_PUSH_THROTTLE", "ten"), ("PILOT_XDS_CACHE_SIZE", "1.5"),
    ("PILOT_MAX_REQUESTS_PER_SECOND", "fast"),
])
def test_features_bad_value_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError) as e:
        Features.from_env({name: value})
    assert f"{name}={value!r}" in str(e.value)


# --- MeshConfig -------------------------------------------------------------------------------

def test_mesh_config_defaults() -> None:
    for text in ("", "   \n", "# only a comment\n", "{}"):
        m = parse_mesh_config(text)
        assert m == MeshConfig()
    m = MeshConfig()
    assert (m.trust_domain, m.root_namespace, m.connect_timeout_seconds) == ("cluster.local", "istio-system", 10.0)
    assert m.outbound_traffic_policy.mode == "ALLOW_ANY"
    assert m.default_http_retry_policy.attempts == 2
    assert m.access_log_file == ""


def test_mesh_config_parses_camel_case_and_ignores_unknown_fields() -> None:
    m = parse_mesh_config("trustDomain: example.org\nconnectTimeout: 1h30m\naccessLogFile: /dev/stdout\n"
                          "outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n"
                          "defaultHttpRetryPolicy: {attempts: 4, perTryTimeout: 2s}\n"
                          "enableTracing: true\n")
    assert m.trust_domain == "example.org"
    assert m.connect_timeout_seconds == 5400.0
    assert m.access_log_file == "/dev/stdout"
    assert m.outbound_traffic_policy.mode == "REGISTRY_ONLY"
    assert (m.default_http_retry_policy.attempts, m.default_http_retry_policy.per_try_timeout) == (4, "2s")


@pytest.mark.parametrize("text, message", [
    ("connectTimeout: 0s", "connectTimeout must be positive"),
    ("connectTimeout: ten", "connectTimeout"),
    ("outboundTrafficPolicy: {mode: DENY}", "outboundTrafficPolicy.mode"),
    ("defaultHttpRetryPolicy: {attempts: -1}", "defaultHttpRetryPolicy.attempts"),
    ("defaultHttpRetryPolicy: {perTryTimeout: 5}", "defaultHttpRetryPolicy.perTryTimeout"),
    ("- a\n- b", "must be a YAML mapping"),
    ("a: [1,", "not valid YAML"),
])
def test_mesh_config_invalid(text: str, message: str) -> None:
    with pytest.raises(MeshConfigError) as e:
        parse_mesh_config(text)
    assert message in str(e.value)


def _apply(store: Store, doc: dict, source: str = "test"):
    return store.apply(parse_object(doc), source=source)


def test_mesh_holder_follows_the_configmap_and_keeps_the_last_good_one() -> None:
    store = Store()
    holder = MeshHolder(parse_mesh_config("connectTimeout: 7s"), SYSTEM_NS)
    assert holder.refresh(store) is False
    assert holder.current.connect_timeout == "7s" and holder.source == "file"
    file_version = holder.version

    _apply(store, mesh_configmap({"connectTimeout": "3s"}), source="cm.yaml#0")
    assert holder.refresh(store) is True
    assert holder.current.connect_timeout == "3s"
    assert holder.source == f"configmap {SYSTEM_NS}/istio"
    good_version = holder.version
    assert good_version != file_version

    # A bad ConfigMap: rejected with its reason, and the last good MeshConfig stays in force.
    _apply(store, mesh_configmap({"connectTimeout": "-1s"}), source="cm.yaml#0")
    assert holder.refresh(store) is False
    assert (holder.current.connect_timeout, holder.version) == ("3s", good_version)
    [r] = store.rejections()
    assert (r.source, r.kind, r.namespace, r.name) == ("cm.yaml#0", "ConfigMap", SYSTEM_NS, "istio")
    assert "connectTimeout must be positive" in r.reason

    # Fixed: the rejection goes away.
    _apply(store, mesh_configmap({"connectTimeout": "4s"}))
    assert holder.refresh(store) is True
    assert holder.current.connect_timeout == "4s" and store.rejections() == []

    # Refreshing without a change reports no change.
    assert holder.refresh(store) is False

    # ConfigMap deleted: back to the file.
    store.delete(holder.configmap_key)
    assert holder.refresh(store) is True
    assert holder.current.connect_timeout == "7s" and holder.version == file_version


def test_mesh_holder_ignores_configmaps_elsewhere() -> None:
    store = Store()
    holder = MeshHolder(MeshConfig(), SYSTEM_NS)
    other = mesh_configmap({"connectTimeout": "3s"})
    other["metadata"]["namespace"] = "default"
    _apply(store, other)
    assert holder.refresh(store) is False and holder.current == MeshConfig()


# --- push classification ----------------------------------------------------------------------

MESH_KEY = ConfigKey("ConfigMap", SYSTEM_NS, "istio")


def test_endpoint_slice_change_is_an_eds_push_for_its_service() -> None:
    store = Store()
    ev = _apply(store, endpoint_slice("reviews-1", "reviews"))
    req = push_request_for([ev], MESH_KEY)
    assert req is not None and not req.full
    assert ConfigKey(SERVICE_ENDPOINTS, "default", "reviews") in req.config_keys
    assert ConfigKey("EndpointSlice", "default", "reviews-1") in req.config_keys
    assert req.reasons == {reasons.ENDPOINT_UPDATE: 1}
    # Relabelled to another service: both services' endpoints changed.
    moved = endpoint_slice("reviews-1", "ratings")
    req = push_request_for([_apply(store, moved)], MESH_KEY)
    assert {k for k in req.config_keys if k.kind == SERVICE_ENDPOINTS} == {
        ConfigKey(SERVICE_ENDPOINTS, "default", "reviews"), ConfigKey(SERVICE_ENDPOINTS, "default", "ratings")}
    # Deleted: still names the service.
    req = push_request_for([store.delete(ConfigKey("EndpointSlice", "default", "reviews-1"))], MESH_KEY)
    assert ConfigKey(SERVICE_ENDPOINTS, "default", "ratings") in req.config_keys and not req.full


def test_service_and_mesh_changes_are_full_pushes() -> None:
    store = Store()
    req = push_request_for([_apply(store, service("reviews"))], MESH_KEY)
    assert req.full and req.config_keys == {ConfigKey("Service", "default", "reviews")}
    assert req.reasons == {reasons.SERVICE_UPDATE: 1}
    req = push_request_for([_apply(store, mesh_configmap({"connectTimeout": "3s"}))], MESH_KEY)
    assert req.full and req.reasons == {reasons.MESH_UPDATE: 1}


def test_objects_no_index_reads_cause_no_push() -> None:
    store = Store()
    other_cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": SYSTEM_NS},
                "data": {"x": "y"}}
    assert push_request_for([_apply(store, other_cm)], MESH_KEY) is None
    # Pods are read (subset members, tlsMode, SANs): an endpoint-class push, matched per proxy.
    req = push_request_for([_apply(store, pod("reviews-abc"))], MESH_KEY)
    assert req is not None and not req.full and req.config_keys == {ConfigKey("Pod", "default", "reviews-abc")}


def test_batch_of_events_merges_into_one_request() -> None:
    store = Store()
    events = [_apply(store, endpoint_slice("a-1", "a")), _apply(store, pod("p")), _apply(store, service("b"))]
    req = push_request_for(events, MESH_KEY)
    assert req.full
    assert req.reasons == {reasons.ENDPOINT_UPDATE: 2, reasons.SERVICE_UPDATE: 1}  # the slice and the Pod
    assert ConfigKey(SERVICE_ENDPOINTS, "default", "a") in req.config_keys


def test_no_op_write_produces_no_event() -> None:
    store = Store()
    doc = service("reviews")
    assert _apply(store, doc) is not None
    again = dict(doc, metadata={**doc["metadata"], "resourceVersion": "42", "uid": "u-1"})
    assert _apply(store, again) is None


def test_pod_ip_change_reaches_the_store_as_an_endpoint_push() -> None:
    store = Store()
    _apply(store, pod("web-1", ip="10.1.0.1"))
    ev = _apply(store, pod("web-1", ip="10.1.0.2"))
    assert ev is not None and ev.op == "update"
    assert store.get(ConfigKey("Pod", "default", "web-1")).obj.status.pod_ip == "10.1.0.2"
    req = push_request_for([ev], MESH_KEY)  # an endpoint-class push (ztunnel reads Pod IPs)
    assert req is not None and not req.full
    # Status fields the model does not keep (start time, probe times...) are not changes.
    ready = pod("web-1", ip="10.1.0.2")
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastProbeTime": "2024-01-01T00:00:00Z"}]
    assert _apply(store, ready) is not None  # readiness is kept (ambient Workload status)
    noisy = pod("web-1", ip="10.1.0.2")
    noisy["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastProbeTime": "2024-01-01T00:00:09Z"}]
    noisy["status"]["startTime"] = "2024-01-01T00:00:00Z"
    assert _apply(store, noisy) is None


def test_push_request_merge() -> None:
    a = PushRequest(full=False, config_keys={ConfigKey("EndpointSlice", "default", "a-1")}, start=10.0)
    a.reasons[reasons.ENDPOINT_UPDATE] += 2
    b = PushRequest(full=True, config_keys={ConfigKey("Service", "default", "b")}, start=5.0, version="v2")
    b.reasons[reasons.SERVICE_UPDATE] += 1
    b.reasons[reasons.ENDPOINT_UPDATE] += 1
    m = a.merge(b)
    assert m.full
    assert m.config_keys == a.config_keys | b.config_keys
    assert m.reasons == {reasons.ENDPOINT_UPDATE: 3, reasons.SERVICE_UPDATE: 1}
    assert m.start == 5.0  # convergence time counts from the first change
    assert m.version == "v2"
    assert m.kinds() == {"EndpointSlice", "Service"}
    assert m.reason_text() == "endpoint,service"
    # Merging does not mutate either side, and None is the identity.
    assert not a.full and len(a.config_keys) == 1 and a.reasons == {reasons.ENDPOINT_UPDATE: 2}
    assert a.merge(None) is a
    eds = PushRequest(full=False).merge(PushRequest(full=False))
    assert not eds.full


# --- debounce ---------------------------------------------------------------------------------

class Pushes:
    """Records on_push calls; `next()` awaits the next one with a timeout."""

    def __init__(self) -> None:
        self.received: list[tuple[PushRequest, float, float]] = []  # (request, debounce_s, at)
        self._event = asyncio.Event()
        self._taken = 0

    async def __call__(self, req: PushRequest, debounce_s: float) -> None:
        self.received.append((req, debounce_s, time.monotonic()))
        self._event.set()

    async def next(self, timeout: float = 5.0) -> tuple[PushRequest, float, float]:
        while self._taken >= len(self.received):
            self._event.clear()
            await asyncio.wait_for(self._event.wait(), timeout)
        self._taken += 1
        return self.received[self._taken - 1]


def _eds(name: str) -> PushRequest:
    r = PushRequest(full=False, config_keys={ConfigKey(SERVICE_ENDPOINTS, "default", name)})
    r.reasons[reasons.ENDPOINT_UPDATE] += 1
    return r


def _full(name: str) -> PushRequest:
    r = PushRequest(full=True, config_keys={ConfigKey("Service", "default", name)})
    r.reasons[reasons.SERVICE_UPDATE] += 1
    return r


@pytest.fixture
async def running():
    tasks: list[asyncio.Task] = []

    def start(d: Debouncer) -> Debouncer:
        tasks.append(asyncio.create_task(d.run()))
        return d

    yield start
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_debounce_merges_a_burst(running) -> None:
    pushes = Pushes()
    d = running(Debouncer(0.05, 2.0, True, pushes))
    for i in range(5):
        d.enqueue(_eds(f"s{i}"))
    d.enqueue(_full("svc"))
    req, debounce_s, _ = await pushes.next()
    assert req.full
    assert {k.name for k in req.config_keys} == {"s0", "s1", "s2", "s3", "s4", "svc"}
    assert req.reasons == {reasons.ENDPOINT_UPDATE: 5, reasons.SERVICE_UPDATE: 1}
    assert debounce_s >= 0.05  # waited for the quiet period
    assert d.merged_events == 5
    # The next request is a push of its own.
    d.enqueue(_eds("later"))
    req, _, _ = await pushes.next()
    assert {k.name for k in req.config_keys} == {"later"}
    assert len(pushes.received) == 2


async def test_debounce_waits_for_quiet_after_the_last_event(running) -> None:
    pushes = Pushes()
    d = running(Debouncer(0.25, 5.0, True, pushes))
    start = time.monotonic()
    d.enqueue(_full("a"))
    # Keep the burst going for a while, each event within the quiet period of the previous.
    for name in ("b", "c", "d"):
        await asyncio.sleep(0.05)  # pacing the producer, not synchronising with the debouncer
        d.enqueue(_full(name))
    last = time.monotonic()
    req, debounce_s, at = await pushes.next()
    assert {k.name for k in req.config_keys} == {"a", "b", "c", "d"}
    assert at - last >= 0.24  # quiet period measured from the last event
    assert debounce_s >= last - start


async def test_debounce_honours_max_delay(running) -> None:
    pushes = Pushes()
    d = running(Debouncer(0.15, 0.3, True, pushes))
    stop = asyncio.Event()

    async def keep_changing() -> None:
        i = 0
        while not stop.is_set():
            d.enqueue(_full(f"s{i}"))
            i += 1
            await asyncio.sleep(0.01)  # pacing: one event every 10 ms, never 150 ms of quiet

    producer = asyncio.create_task(keep_changing())
    try:
        req, debounce_s, _ = await pushes.next(timeout=3)
    finally:
        stop.set()
        await producer
    assert 0.3 <= debounce_s < 0.3 + 0.5, debounce_s
    assert len(req.config_keys) > 3


async def test_eds_push_is_immediate_when_eds_debounce_is_disabled(running) -> None:
    pushes = Pushes()
    d = running(Debouncer(0.2, 5.0, False, pushes))
    d.enqueue(_eds("a"))
    req, debounce_s, _ = await pushes.next()
    assert not req.full and {k.name for k in req.config_keys} == {"a"}
    assert debounce_s < 0.2


async def test_eds_is_not_held_back_by_a_debouncing_full_push(running) -> None:
    """With EDS debounce off, an endpoint change goes out at once even while a config change
    waits for its quiet period (istiod pushes such EDS requests without entering debounce)."""
    pushes = Pushes()
    d = running(Debouncer(0.3, 5.0, False, pushes))
    d.enqueue(_full("svc"))
    d.enqueue(_eds("ep"))
    first, _, _ = await pushes.next()
    assert not first.full and {k.name for k in first.config_keys} == {"ep"}
    second, debounce_s, _ = await pushes.next()
    assert second.full and {k.name for k in second.config_keys} == {"svc"}
    assert debounce_s >= 0.3


async def test_endpoint_churn_is_not_starved_by_a_rolling_quiet_period(running) -> None:
    """Endpoint changes every 50 ms against a 200 ms debounce: batches still go out about every
    200 ms, not once at PILOT_DEBOUNCE_MAX as a rolling quiet period would do."""
    pushes = Pushes()
    d = running(Debouncer(0.2, 5.0, True, pushes))
    stop = asyncio.Event()

    async def churn() -> None:
        i = 0
        while not stop.is_set():
            d.enqueue(_eds(f"e{i}"))
            i += 1
            await asyncio.sleep(0.05)  # pacing of the load, not synchronisation

    task = asyncio.create_task(churn())
    try:
        start = time.monotonic()
        await pushes.next()
        await pushes.next()
        assert time.monotonic() - start < 1.5
    finally:
        stop.set()
        await task


async def test_eds_is_debounced_when_enabled(running) -> None:
    pushes = Pushes()
    d = running(Debouncer(0.05, 5.0, True, pushes))
    d.enqueue(_eds("a"))
    d.enqueue(_eds("b"))
    req, debounce_s, _ = await pushes.next()
    assert not req.full and {k.name for k in req.config_keys} == {"a", "b"}
    assert debounce_s >= 0.05


async def test_a_failing_push_does_not_stop_later_pushes(running) -> None:
    pushes = Pushes()
    calls = 0

    async def flaky(req: PushRequest, debounce_s: float) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("push context build failed")
        await pushes(req, debounce_s)

    d = running(Debouncer(0.02, 1.0, True, flaky))
    d.enqueue(_full("a"))
    await wait_for(lambda: calls == 1, timeout=2, interval=0.005)
    d.enqueue(_full("b"))
    req, _, _ = await pushes.next(timeout=2)
    assert {k.name for k in req.config_keys} == {"b"}
