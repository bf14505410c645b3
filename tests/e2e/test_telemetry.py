"""Access logs and traces through a real Envoy (a plain local sidecar, no iptables), configured
by MeshConfig and the Telemetry API as istiod configures them."""

from __future__ import annotations

import json
import re
import textwrap
import uuid
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.support.backends import HttpBackend, http_get
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)
NODE = sidecar_node_id("client-1")
METADATA = {"NAMESPACE": "default", "INTERCEPTION_MODE": "NONE", "LABELS": {"app": "client"}}

# istiod's default text format: [time] "METHOD PATH PROTOCOL" CODE FLAGS DETAILS TERMINATION
# "FAILURE" RECEIVED SENT DURATION UPSTREAM_TIME "XFF" "UA" "REQUEST_ID" "AUTHORITY" "UPSTREAM_HOST"
# CLUSTER UPSTREAM_LOCAL DOWNSTREAM_LOCAL DOWNSTREAM_REMOTE SNI ROUTE
TEXT_LINE = re.compile(
    r'^\[(?P<time>\S+)\] "(?P<method>\S+) (?P<path>\S+) (?P<protocol>\S+)" (?P<code>\d+) (?P<flags>\S+) '
    r'(?P<details>\S+) (?P<termination>\S+) "(?P<failure>[^"]*)" (?P<received>\d+) (?P<sent>\d+) '
    r'(?P<duration>\d+) (?P<upstream_time>\S+) "(?P<xff>[^"]*)" "(?P<ua>[^"]*)" "(?P<request_id>[^"]*)" '
    r'"(?P<authority>[^"]*)" "(?P<upstream_host>[^"]*)" (?P<cluster>\S+) (?P<upstream_local>\S+) '
    r'(?P<downstream_local>\S+) (?P<downstream_remote>\S+) (?P<sni>\S+) (?P<route>\S+)$')


def mesh_configmap(body: str) -> str:
    return textwrap.dedent("""\
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: istio, namespace: istio-system}
        data:
          mesh: |
        """) + textwrap.indent(textwrap.dedent(body), "    ")


def versions(dump: dict) -> list[tuple[str, str]]:
    """(name, version) of each listener Envoy holds: an unchanged listener keeps its version."""
    return [(x.get("name"), x.get("active_state", {}).get("version_info")) for x in dump.get("configs", [])]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def call(port: int, host: str, request_id: str, path: str = "/") -> int:
    status, _ = await http_get(f"http://127.0.0.1:{port}{path}",
                               {"Host": host, "User-Agent": "telemetry-test", "x-request-id": request_id})
    return status


async def routed(port: int, host: str) -> bool:
    try:
        return await call(port, host, "probe") == 200
    except aiohttp.ClientError:
        return False


async def test_access_logs_in_istiods_text_and_json_formats_and_telemetry_filters(tmp_path):
    port, = free_ports(1)
    alpha, beta = HttpBackend("alpha"), HttpBackend("beta", status=503)
    for b in (alpha, beta):
        await b.start()
    log = tmp_path / "access.log"
    cp = ControlPlane(tmp_path)
    for name, backend in (("alpha", alpha), ("beta", beta)):
        cp.write(f"{name}.yaml", service_yaml(name, port) + "---\n" + endpoint_slice_yaml(name, backend.port))
    cp.write("mesh.yaml", mesh_configmap(f"accessLogFile: {log}\n"))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata=METADATA), tmp_path)
        await wait_for(lambda: routed(port, fqdn("alpha")), timeout=30, message=f"routed\n{cp.log_tail()}")

        # 1. MeshConfig accessLogFile, TEXT: istiod's EnvoyTextLogFormat, field by field.
        assert await call(port, fqdn("alpha"), "req-text", "/hello?x=1") == 200

        def text_line():
            return next((m for m in map(TEXT_LINE.match, lines(log)) if m and m["request_id"] == "req-text"), None)

        m = await wait_for(text_line, timeout=20, message=f"a text access log line in {log}: {lines(log)}")
        assert (m["method"], m["path"], m["protocol"], m["code"]) == ("GET", "/hello?x=1", "HTTP/1.1", "200")
        assert (m["flags"], m["details"], m["ua"]) == ("-", "via_upstream", "telemetry-test")
        assert m["authority"] == fqdn("alpha") and m["upstream_host"] == f"127.0.0.1:{alpha.port}"
        assert m["cluster"] == f"outbound|{port}||{fqdn('alpha')}"
        assert m["downstream_local"] == f"127.0.0.1:{port}" and m["route"] == "default"

        # 2. JSON encoding: istiod's JSON fields.
        cp.write("mesh.yaml", mesh_configmap(f"accessLogFile: {log}\naccessLogEncoding: JSON\n"))

        async def json_line():
            await call(port, fqdn("alpha"), "req-json")
            for line in lines(log):
                if line.startswith("{"):
                    entry = json.loads(line)
                    if entry.get("request_id") == "req-json":
                        return entry
            return None

        entry = await wait_for(json_line, timeout=30, message=f"a JSON access log line: {lines(log)[-3:]}")
        assert entry["method"] == "GET" and entry["response_code"] == 200
        assert entry["upstream_cluster"] == f"outbound|{port}||{fqdn('alpha')}"
        assert entry["user_agent"] == "telemetry-test" and entry["authority"] == fqdn("alpha")
        assert {"start_time", "duration", "bytes_sent", "downstream_remote_address", "route_name"} <= set(entry)

        # 3. The Telemetry API: a file provider with a CEL filter (only 5xx), mesh-wide.
        errors = tmp_path / "errors.log"
        cp.write("mesh.yaml", mesh_configmap(f"""\
            accessLogFile: {log}
            extensionProviders:
            - name: errors
              envoyFileAccessLog:
                path: {errors}
                logFormat: {{text: "%REQ(X-REQUEST-ID)% %RESPONSE_CODE% %UPSTREAM_CLUSTER_RAW%"}}
            """))
        cp.write("telemetry.yaml", textwrap.dedent("""\
            apiVersion: telemetry.istio.io/v1
            kind: Telemetry
            metadata: {name: mesh-default, namespace: istio-system}
            spec:
              accessLogging:
              - providers: [{name: errors}]
                filter: {expression: "response.code >= 500"}
            """))

        async def filtered():
            await call(port, fqdn("beta"), "req-beta")
            return any(line.startswith("req-beta 503 ") for line in lines(errors))

        await wait_for(filtered, timeout=30, message=f"the Telemetry's log\n{cp.log_tail()}")
        assert await call(port, fqdn("alpha"), "req-ok") == 200
        await wait_for(lambda: call(port, fqdn("beta"), "req-after"), timeout=10)

        def logged_after():
            return any(line.startswith("req-after ") for line in lines(errors))

        await wait_for(logged_after, timeout=20, message="the later 5xx logged")
        # The 200 between them was filtered out; the MeshConfig file no longer gets lines
        # (the Telemetry replaces the legacy accessLogFile, as in istiod).
        assert not any(line.startswith("req-ok") for line in lines(errors))
        assert lines(errors)[-1] == f"req-after 503 outbound|{port}||{fqdn('beta')}"
        assert not any("req-ok" in line or "req-after" in line for line in lines(log))
    finally:
        await envoy.stop()
        await cp.stop()
        for b in (alpha, beta):
            await b.stop()


class Collector:
    """A Zipkin-compatible collector: POST /api/v2/spans with a JSON list of spans."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _spans(self, request: web.Request) -> web.Response:
        self.spans.extend(await request.json())
        return web.Response(status=202)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/v2/spans", self._spans)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def by_request_id(self, request_id: str) -> list[dict]:
        """Spans of the request with this x-request-id (Envoy rewrites the UUID's version nibble,
        the 15th character, to mark the request as traced)."""
        def same(rid: str) -> bool:
            return rid[:14] == request_id[:14] and rid[15:] == request_id[15:]
        return [s for s in self.spans if same((s.get("tags") or {}).get("guid:x-request-id", ""))]


def tracing_telemetry(sampling: float) -> str:
    return textwrap.dedent(f"""\
        apiVersion: telemetry.istio.io/v1
        kind: Telemetry
        metadata: {{name: mesh-default, namespace: istio-system}}
        spec:
          tracing:
          - providers: [{{name: zipkin}}]
            randomSamplingPercentage: {sampling}
            customTags:
              team: {{literal: {{value: payments}}}}
              caller: {{header: {{name: x-caller, defaultValue: nobody}}}}
        """)


async def test_traces_reach_a_zipkin_collector_with_sampling_and_custom_tags(tmp_path):
    port, zipkin_port = free_ports(2)
    alpha = HttpBackend("alpha")
    await alpha.start()
    collector = Collector()
    await collector.start()
    cp = ControlPlane(tmp_path)
    cp.write("alpha.yaml", service_yaml("alpha", port) + "---\n" + endpoint_slice_yaml("alpha", alpha.port))
    cp.write("zipkin.yaml", service_yaml("zipkin", zipkin_port, namespace="istio-system") + "---\n"
             + endpoint_slice_yaml("zipkin", collector.port, namespace="istio-system"))
    cp.write("mesh.yaml", mesh_configmap(f"""\
        extensionProviders:
        - name: zipkin
          zipkin: {{service: {fqdn('zipkin', 'istio-system')}, port: {zipkin_port}}}
        """))
    cp.write("telemetry.yaml", tracing_telemetry(100))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata=METADATA), tmp_path)
        await wait_for(lambda: routed(port, fqdn("alpha")), timeout=30, message=f"routed\n{cp.log_tail()}")

        # Request ids are UUIDs: Envoy traces only requests whose x-request-id it can sample by.
        first, second = str(uuid.uuid4()), str(uuid.uuid4())
        unsampled = [str(uuid.uuid4()) for _ in range(10)]
        status, _ = await http_get(f"http://127.0.0.1:{port}/", {"Host": fqdn("alpha"), "x-request-id": first,
                                                                 "x-caller": "checkout"})
        assert status == 200
        # Envoy's Zipkin tracer flushes every 5 s (or every 5 spans): wait on the span itself.
        [span, *_] = await wait_for(lambda: collector.by_request_id(first), timeout=30,
                                    message="the first span at the collector")
        tags = span["tags"]
        assert tags["team"] == "payments" and tags["caller"] == "checkout"
        assert tags["istio.namespace"] == "default" and tags["istio.canonical_service"] == "unknown"
        assert span["kind"] == "CLIENT" and tags["http.status_code"] == "200" and span["traceId"]
        assert tags["upstream_cluster"] == f"outbound|{port}||{fqdn('alpha')}"

        # Sampling 0: requests are not traced. Proven by order: back at 100, a later request's
        # span arrives, and none of the unsampled ones did (spans are flushed in order).
        cp.write("telemetry.yaml", tracing_telemetry(0))

        async def sampling_is(value: float) -> bool:
            dump = json.dumps(await envoy.config_dump(resource="dynamic_listeners"))
            return f'"random_sampling": {{"value": {value}' in dump or (
                value == 0 and '"random_sampling": {}' in dump)

        await wait_for(lambda: sampling_is(0), timeout=30, message="sampling 0 in Envoy's listeners")
        for rid in unsampled:
            assert await call(port, fqdn("alpha"), rid) == 200
        cp.write("telemetry.yaml", tracing_telemetry(100))
        await wait_for(lambda: sampling_is(100), timeout=30, message="sampling 100 again")
        assert await call(port, fqdn("alpha"), second) == 200
        await wait_for(lambda: collector.by_request_id(second), timeout=30, message="the span of the second request")
        assert not any(collector.by_request_id(rid) for rid in unsampled)
    finally:
        await envoy.stop()
        await cp.stop()
        await alpha.stop()
        await collector.stop()


async def test_a_telemetry_naming_a_missing_provider_is_reported_and_changes_nothing(tmp_path):
    port, = free_ports(1)
    alpha = HttpBackend("alpha")
    await alpha.start()
    log = tmp_path / "access.log"
    cp = ControlPlane(tmp_path)
    cp.write("alpha.yaml", service_yaml("alpha", port) + "---\n" + endpoint_slice_yaml("alpha", alpha.port))
    cp.write("mesh.yaml", mesh_configmap(f"accessLogFile: {log}\n"))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata=METADATA), tmp_path)
        await wait_for(lambda: routed(port, fqdn("alpha")), timeout=30, message=f"routed\n{cp.log_tail()}")
        before = await envoy.config_dump(resource="dynamic_listeners")
        cp.write("telemetry.yaml", textwrap.dedent("""\
            apiVersion: telemetry.istio.io/v1
            kind: Telemetry
            metadata: {name: broken, namespace: default}
            spec:
              accessLogging:
              - providers: [{name: nowhere}]
            """))

        async def reported():
            configz = await cp.debug("/debug/configz")
            known = any(c["kind"] == "Telemetry" and c["name"] == "broken" for c in configz["configs"])
            problems = [u for u in configz["unsupported"] if u["kind"] == "Telemetry" and u["name"] == "broken"]
            return problems if known and problems else None

        [problem] = await wait_for(reported, timeout=30, message="the Telemetry reported in /debug/configz")
        assert "'nowhere' is not defined" in problem["reason"] and "not applied" in problem["reason"]
        assert [line for line in cp.log_tail(400).splitlines() if "telemetry not applied" in line and "nowhere" in line]
        # The access log still goes to the MeshConfig file, and the listeners did not change.
        assert await call(port, fqdn("alpha"), "still-logged") == 200
        await wait_for(lambda: any("still-logged" in line for line in lines(log)), timeout=20,
                       message="the MeshConfig access log still written")
        after = await envoy.config_dump(resource="dynamic_listeners")
        assert versions(after) == versions(before)
    finally:
        await envoy.stop()
        await cp.stop()
        await alpha.stop()


def _field2(message):
    return getattr(message, message.DESCRIPTOR.fields_by_number[2].name)


class OtlpLogsCollector:
    """An OTLP logs collector (opentelemetry.proto.collector.logs.v1.LogsService/Export) on
    loopback, a plain grpc.aio server: what Envoy's OpenTelemetry access logger streams to."""

    def __init__(self) -> None:
        self.records: list = []
        self.server = None
        self.port = 0

    async def _export(self, request, _context):
        for resource_logs in request.resource_logs:
            # The OTLP protos shipped in xds-protos are older than Envoy's: today's
            # ResourceLogs.scope_logs and ScopeLogs.log_records are field 2 of each, named
            # instrumentation_library_logs and logs there. Read field 2 by number.
            for scope_logs in _field2(resource_logs):
                self.records.extend(_field2(scope_logs))
        return logs_service_pb2.ExportLogsServiceResponse()

    async def start(self) -> None:
        import grpc
        handler = grpc.method_handlers_generic_handler("opentelemetry.proto.collector.logs.v1.LogsService", {
            "Export": grpc.unary_unary_rpc_method_handler(
                self._export, request_deserializer=logs_service_pb2.ExportLogsServiceRequest.FromString,
                response_serializer=logs_service_pb2.ExportLogsServiceResponse.SerializeToString)})
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)


async def test_access_logs_reach_an_opentelemetry_collector(tmp_path):
    port, als_port = free_ports(2)
    alpha = HttpBackend("alpha")
    await alpha.start()
    collector = OtlpLogsCollector()
    await collector.start()
    cp = ControlPlane(tmp_path)
    cp.write("alpha.yaml", service_yaml("alpha", port) + "---\n" + endpoint_slice_yaml("alpha", alpha.port))
    cp.write("otel.yaml", service_yaml("otel", als_port, port_name="grpc", namespace="istio-system") + "---\n"
             + endpoint_slice_yaml("otel", collector.port, port_name="grpc", namespace="istio-system"))
    cp.write("mesh.yaml", mesh_configmap(f"""\
        extensionProviders:
        - name: otel
          envoyOtelAls:
            service: istio-system/{fqdn('otel', 'istio-system')}
            port: {als_port}
            logFormat: {{text: "%REQ(X-REQUEST-ID)% %RESPONSE_CODE%", labels: {{cluster: "%UPSTREAM_CLUSTER_RAW%"}}}}
        """))
    cp.write("telemetry.yaml", textwrap.dedent("""\
        apiVersion: telemetry.istio.io/v1
        kind: Telemetry
        metadata: {name: mesh-default, namespace: istio-system}
        spec:
          accessLogging:
          - providers: [{name: otel}]
        """))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata=METADATA), tmp_path)
        await wait_for(lambda: routed(port, fqdn("alpha")), timeout=30, message=f"routed\n{cp.log_tail()}")

        async def exported():
            await call(port, fqdn("alpha"), "otel-1")
            return [r for r in collector.records if r.body.string_value == "otel-1 200"]

        [record, *_] = await wait_for(exported, timeout=40, message="a log record at the OTLP collector")
        attributes = {a.key: a.value.string_value for a in record.attributes}
        assert attributes["cluster"] == f"outbound|{port}||{fqdn('alpha')}"
    finally:
        await envoy.stop()
        await cp.stop()
        await alpha.stop()
        await collector.stop()
