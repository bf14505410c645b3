"""Telemetry to gRPC collectors through a real Envoy: traces to an OpenTelemetry OTLP/gRPC
collector, access logs to Envoy's access log service (envoyHttpAls, envoyTcpAls), and istiod's
legacy tracing (MeshConfig defaultConfig.tracing, no Telemetry) through the Zipkin tracer the real
pilot-agent writes into its Envoy's bootstrap."""

from __future__ import annotations

import json
import textwrap
import uuid

import grpc
import pytest
from envoy.service.accesslog.v3 import als_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.e2e.test_telemetry import METADATA, NODE, Collector, _field2, call, mesh_configmap, routed
from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend, http_get
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.ports import free_ports
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)


class GrpcCollector:
    """A grpc.aio server on loopback with generic handlers (no generated service stubs needed)."""

    def __init__(self) -> None:
        self.server: grpc.aio.Server | None = None
        self.port = 0

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        raise NotImplementedError

    async def start(self) -> None:
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers(tuple(self.handlers()))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)


class OtlpTraceCollector(GrpcCollector):
    """opentelemetry.proto.collector.trace.v1.TraceService/Export, what Envoy's OpenTelemetry
    tracer sends over gRPC."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list = []

    async def _export(self, request, _context):
        for resource_spans in request.resource_spans:
            # As the logs collector in test_telemetry: the OTLP protos in xds-protos are older
            # (instrumentation_library_spans); today's scope_spans is the same field 2.
            for scope_spans in _field2(resource_spans):
                self.spans.extend(_field2(scope_spans))
        return trace_service_pb2.ExportTraceServiceResponse()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        return [grpc.method_handlers_generic_handler("opentelemetry.proto.collector.trace.v1.TraceService", {
            "Export": grpc.unary_unary_rpc_method_handler(
                self._export, request_deserializer=trace_service_pb2.ExportTraceServiceRequest.FromString,
                response_serializer=trace_service_pb2.ExportTraceServiceResponse.SerializeToString)})]

    def attributes(self, span) -> dict[str, str]:
        return {a.key: a.value.string_value for a in span.attributes}


class AlsServer(GrpcCollector):
    """envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs: Envoy's gRPC access log
    service, streaming HTTP and TCP entries under the log name of each logger."""

    def __init__(self) -> None:
        super().__init__()
        self.http: list[tuple[str, object]] = []  # (log name, HTTPAccessLogEntry)
        self.tcp: list[tuple[str, object]] = []

    async def _stream(self, requests, _context):
        log_name = ""
        async for message in requests:
            if message.HasField("identifier"):
                log_name = message.identifier.log_name
            self.http += [(log_name, e) for e in message.http_logs.log_entry]
            self.tcp += [(log_name, e) for e in message.tcp_logs.log_entry]
        return als_pb2.StreamAccessLogsResponse()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        return [grpc.method_handlers_generic_handler("envoy.service.accesslog.v3.AccessLogService", {
            "StreamAccessLogs": grpc.stream_unary_rpc_method_handler(
                self._stream, request_deserializer=als_pb2.StreamAccessLogsMessage.FromString,
                response_serializer=als_pb2.StreamAccessLogsResponse.SerializeToString)})]


def collector_service(name: str, service_port: int, backend_port: int) -> str:
    return (service_yaml(name, service_port, port_name="grpc", namespace="istio-system") + "---\n"
            + endpoint_slice_yaml(name, backend_port, port_name="grpc", namespace="istio-system"))


async def test_traces_reach_an_opentelemetry_grpc_collector(tmp_path):
    port, otel_port = free_ports(2)
    alpha = HttpBackend("alpha")
    await alpha.start()
    collector = OtlpTraceCollector()
    await collector.start()
    cp = ControlPlane(tmp_path)
    cp.write("alpha.yaml", service_yaml("alpha", port) + "---\n" + endpoint_slice_yaml("alpha", alpha.port))
    cp.write("otel.yaml", collector_service("otel", otel_port, collector.port))
    cp.write("mesh.yaml", mesh_configmap(f"""\
        extensionProviders:
        - name: otel-tracing
          opentelemetry: {{service: {fqdn('otel', 'istio-system')}, port: {otel_port}}}
        """))
    cp.write("telemetry.yaml", textwrap.dedent("""\
        apiVersion: telemetry.istio.io/v1
        kind: Telemetry
        metadata: {name: mesh-default, namespace: istio-system}
        spec:
          tracing:
          - providers: [{name: otel-tracing}]
            randomSamplingPercentage: 100
            customTags:
              team: {literal: {value: payments}}
        """))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata=METADATA), tmp_path)
        await wait_for(lambda: routed(port, fqdn("alpha")), timeout=30, message=f"routed\n{cp.log_tail()}")
        request_id = str(uuid.uuid4())
        assert await call(port, fqdn("alpha"), request_id) == 200

        def span_of_request():
            return [s for s in collector.spans
                    if collector.attributes(s).get("guid:x-request-id", "")[15:] == request_id[15:]]

        # Envoy's OpenTelemetry tracer flushes every 5 s: wait on the span itself.
        [span, *_] = await wait_for(span_of_request, timeout=30, message="a span at the OTLP collector")
        attrs = collector.attributes(span)
        assert attrs["team"] == "payments" and attrs["istio.namespace"] == "default"
        assert attrs["upstream_cluster"] == f"outbound|{port}||{fqdn('alpha')}"
        assert len(span.trace_id) == 16 and span.name
    finally:
        await envoy.stop()
        await cp.stop()
        await alpha.stop()
        await collector.stop()


async def test_http_and_tcp_access_logs_reach_an_access_log_service(tmp_path):
    http_port, tcp_port, als_port = free_ports(3)
    alpha, beta = HttpBackend("alpha"), HttpBackend("beta")
    for b in (alpha, beta):
        await b.start()
    als = AlsServer()
    await als.start()
    cp = ControlPlane(tmp_path)
    cp.write("alpha.yaml", service_yaml("alpha", http_port) + "---\n" + endpoint_slice_yaml("alpha", alpha.port))
    cp.write("beta.yaml", service_yaml("beta", tcp_port, port_name="tcp") + "---\n"
             + endpoint_slice_yaml("beta", beta.port, port_name="tcp"))
    cp.write("als.yaml", collector_service("als", als_port, als.port))
    service = f"istio-system/{fqdn('als', 'istio-system')}"
    cp.write("mesh.yaml", mesh_configmap(f"""\
        extensionProviders:
        - name: http-als
          envoyHttpAls:
            service: {service}
            port: {als_port}
            logName: http-log
            additionalRequestHeadersToLog: [x-caller]
        - name: tcp-als
          envoyTcpAls: {{service: {service}, port: {als_port}}}
        """))
    cp.write("telemetry.yaml", textwrap.dedent("""\
        apiVersion: telemetry.istio.io/v1
        kind: Telemetry
        metadata: {name: mesh-default, namespace: istio-system}
        spec:
          accessLogging:
          - providers: [{name: http-als}, {name: tcp-als}]
        """))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata=METADATA), tmp_path)
        await wait_for(lambda: routed(http_port, fqdn("alpha")), timeout=30, message=f"routed\n{cp.log_tail()}")

        async def http_entry():
            await http_get(f"http://127.0.0.1:{http_port}/als", {"Host": fqdn("alpha"), "x-request-id": "als-1",
                                                                 "x-caller": "checkout"})
            return [(n, e) for n, e in als.http if e.request.request_id == "als-1"]

        [(name, entry), *_] = await wait_for(http_entry, timeout=30, message="an HTTP entry at the ALS server")
        assert name == "http-log"
        assert entry.request.path == "/als" and entry.response.response_code.value == 200
        assert entry.request.request_headers["x-caller"] == "checkout"
        assert entry.common_properties.upstream_cluster == f"outbound|{http_port}||{fqdn('alpha')}"

        # The TCP port: a plain TCP proxy; its connections arrive as TCP entries (tcp_envoy_accesslog).
        async def tcp_entry():
            await http_get(f"http://127.0.0.1:{tcp_port}/", {"Host": "beta"})
            return [(n, e) for n, e in als.tcp
                    if e.common_properties.upstream_cluster == f"outbound|{tcp_port}||{fqdn('beta')}"]

        [(name, entry), *_] = await wait_for(tcp_entry, timeout=30, message="a TCP entry at the ALS server")
        assert name == "tcp_envoy_accesslog" and entry.connection_properties.received_bytes > 0

        # A change of the MeshConfig provider reaches the running Envoy: a new log name.
        cp.write("mesh.yaml", mesh_configmap(f"""\
            extensionProviders:
            - name: http-als
              envoyHttpAls: {{service: {service}, port: {als_port}, logName: http-log-2}}
            - name: tcp-als
              envoyTcpAls: {{service: {service}, port: {als_port}}}
            """))

        async def renamed():
            await http_get(f"http://127.0.0.1:{http_port}/als", {"Host": fqdn("alpha"), "x-request-id": "als-2",
                                                                 "x-caller": "checkout"})
            return [e for n, e in als.http if n == "http-log-2" and e.request.request_id == "als-2"]

        [entry, *_] = await wait_for(renamed, timeout=30, message=f"the provider's new logName\n{cp.log_tail()}")
        assert "x-caller" not in entry.request.request_headers  # no longer asked for
    finally:
        await envoy.stop()
        await cp.stop()
        for b in (alpha, beta):
            await b.stop()
        await als.stop()


async def test_default_config_tracing_without_telemetry_reaches_zipkin_through_the_agents_bootstrap(tmp_path):
    """istiod's legacy path: no Telemetry tracing, `enableTracing` (the default) and the proxy's
    ProxyConfig tracing. The control plane sets sampling and tags, pilot-agent the Zipkin tracer."""
    port, = free_ports(1)
    alpha = HttpBackend("alpha")
    await alpha.start()
    collector = Collector()
    await collector.start()
    issuer = Issuer("ES256")
    cp = ControlPlane(tmp_path / "cp", secure_grpc=True, env={"JWT_RULE": issuer.rule()})
    cp.write("alpha.yaml", service_yaml("alpha", port) + "---\n" + endpoint_slice_yaml("alpha", alpha.port))
    tracing = {"zipkin": {"address": f"127.0.0.1:{collector.port}"}, "sampling": 100,
               "custom_tags": {"team": {"literal": {"value": "payments"}},
                               "caller": {"header": {"name": "x-caller", "defaultValue": "nobody"}}},
               "max_path_tag_length": 8}
    agent = None
    try:
        await cp.start()
        env = {"POD_NAME": "client-1", "POD_NAMESPACE": "default", "SERVICE_ACCOUNT": "client",
               "INSTANCE_IP": "127.0.0.3", "ISTIO_META_INTERCEPTION_MODE": "NONE",
               "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}", "proxyAdminPort": 0,
                                           "statusPort": 0, "concurrency": 1, "tracing": tracing})}
        agent = PilotAgent(tmp_path / "client", env=env)
        agent.write_root_cert(cp.root_cert())
        agent.write_token(issuer.token(namespace="default", sa="client"))
        await agent.start()
        await agent.wait_ready()
        await wait_for(lambda: routed(port, fqdn("alpha")), timeout=30,
                       message=f"routed\n{cp.log_tail()}\n{agent.log_tail()}")
        request_id = str(uuid.uuid4())
        status, _ = await http_get(f"http://127.0.0.1:{port}/a/long/path", {
            "Host": fqdn("alpha"), "x-request-id": request_id, "x-caller": "checkout"})
        assert status == 200
        [span, *_] = await wait_for(lambda: collector.by_request_id(request_id), timeout=30,
                                    message=f"the span at the Zipkin collector\n{agent.log_tail()}")
        tags = span["tags"]
        assert tags["team"] == "payments" and tags["caller"] == "checkout"
        assert tags["istio.namespace"] == "default" and span["kind"] == "CLIENT"
        assert tags["http.url"] == f"http://{fqdn('alpha')}/a/long/"  # max_path_tag_length 8 cuts the path
        # No provider in the listener: the tracer is the bootstrap's, the sampling ProxyConfig's.
        dump = json.dumps(await agent.admin_json("/config_dump?resource=dynamic_listeners"))
        assert '"random_sampling": {"value": 100' in dump and "envoy.tracers" not in dump
    finally:
        if agent is not None:
            await agent.stop()
        await cp.stop()
        await alpha.stop()
        await collector.stop()
