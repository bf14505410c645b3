"""Access logs and HCM tracing from a listener class's telemetry (pilot/model/telemetry.py), as
istiod builds them (pilot/pkg/model/telemetry_logging.go, pilot/pkg/networking/core/tracing.go)."""

from __future__ import annotations

import json

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import (
    base_pb2,
    config_source_pb2,
    extension_pb2,
    grpc_service_pb2,
    http_service_pb2,
    http_uri_pb2,
)
from envoy.config.core.v3 import substitution_format_string_pb2 as sfs_pb2
from envoy.config.trace.v3 import datadog_pb2, http_tracer_pb2, opentelemetry_pb2, zipkin_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.access_loggers.grpc.v3 import als_pb2
from envoy.extensions.access_loggers.open_telemetry.v3 import logs_service_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.formatter.req_without_query.v3 import req_without_query_pb2
from envoy.extensions.request_id.uuid.v3 import uuid_pb2
from envoy.type.metadata.v3 import metadata_pb2
from envoy.type.tracing.v3 import custom_tag_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import struct_pb2, wrappers_pb2
from opentelemetry.proto.common.v1 import common_pb2

from pilot.durations import parse_duration
from pilot.model.telemetry import AccessLog, ModeTelemetry, TracingSpec
from pilot.networking.protos import duration, pack

FILE_LOGGER = "envoy.access_loggers.file"
OTEL_LOGGER = "envoy.access_loggers.open_telemetry"
CEL_FILTER = "envoy.access_loggers.extension_filters.cel"
OTEL_LOG_NAME = "otel_envoy_accesslog"
HTTP_ALS_LOGGER = "envoy.access_loggers.http_grpc"
TCP_ALS_LOGGER = "envoy.tcp_grpc_access_log"  # istiod's name; Envoy picks the logger by the config's type
HTTP_ALS_LOG_NAME = "http_envoy_accesslog"
TCP_ALS_LOG_NAME = "tcp_envoy_accesslog"

# istiod's EnvoyTextLogFormat (Istio 1.9 onwards).
TEXT_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
    '%RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% '
    '"%UPSTREAM_TRANSPORT_FAILURE_REASON%" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% '
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" %UPSTREAM_CLUSTER_RAW% '
    '%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% '
    '%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n')

# istiod's EnvoyJSONLogFormatIstio.
JSON_FORMAT = {
    "start_time": "%START_TIME%", "route_name": "%ROUTE_NAME%", "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%", "protocol": "%PROTOCOL%", "response_code": "%RESPONSE_CODE%",
    "response_flags": "%RESPONSE_FLAGS%", "response_code_details": "%RESPONSE_CODE_DETAILS%",
    "connection_termination_details": "%CONNECTION_TERMINATION_DETAILS%", "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%", "duration": "%DURATION%",
    "upstream_service_time": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "x_forwarded_for": "%REQ(X-FORWARDED-FOR)%", "user_agent": "%REQ(USER-AGENT)%",
    "request_id": "%REQ(X-REQUEST-ID)%", "authority": "%REQ(:AUTHORITY)%", "upstream_host": "%UPSTREAM_HOST%",
    "upstream_cluster": "%UPSTREAM_CLUSTER_RAW%", "upstream_local_address": "%UPSTREAM_LOCAL_ADDRESS%",
    "downstream_local_address": "%DOWNSTREAM_LOCAL_ADDRESS%",
    "downstream_remote_address": "%DOWNSTREAM_REMOTE_ADDRESS%",
    "requested_server_name": "%REQUESTED_SERVER_NAME%",
    "upstream_transport_failure_reason": "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
}
REQ_WITHOUT_QUERY = "%REQ_WITHOUT_QUERY"
# The filter state envoyHttpAls/envoyTcpAls log unless the provider names its own (istiod's envoyStateToLog).
ALS_STATE_TO_LOG = ("upstream_peer", "downstream_peer")
# What the metadata exchange would have put in filter state, logged over ALS (istiod's list).
WASM_STATE_TO_LOG = ("upstream_peer", "downstream_peer", "wasm.upstream_peer", "wasm.upstream_peer_id",
                     "wasm.downstream_peer", "wasm.downstream_peer_id")


def text_format(text: str) -> str:
    """istiod's fileAccessLogFormat: the default when empty; a newline is always appended."""
    if not text:
        return TEXT_FORMAT
    return text if text.endswith("\n") else text + "\n"


def _formatters(*texts: str) -> list[extension_pb2.TypedExtensionConfig]:
    """istiod's accessLogTextFormatters / accessLogJSONFormatters: %REQ_WITHOUT_QUERY% is a
    formatter extension Envoy loads only when it is listed."""
    if any(REQ_WITHOUT_QUERY in t for t in texts):
        return [extension_pb2.TypedExtensionConfig(name="envoy.formatter.req_without_query",
                                                   typed_config=pack(req_without_query_pb2.ReqWithoutQuery()))]
    return []


def _text(text: str, omit_empty: bool = False) -> sfs_pb2.SubstitutionFormatString:
    text = text_format(text)
    return sfs_pb2.SubstitutionFormatString(
        text_format_source=base_pb2.DataSource(inline_string=text), omit_empty_values=omit_empty,
        formatters=_formatters(text))


def _json(labels: dict, omit_empty: bool = False) -> sfs_pb2.SubstitutionFormatString:
    s = struct_pb2.Struct()
    s.update(labels or JSON_FORMAT)
    return sfs_pb2.SubstitutionFormatString(json_format=s, json_format_options=sfs_pb2.JsonFormatOptions(
        sort_properties=False), omit_empty_values=omit_empty,
        formatters=_formatters(*(str(v) for v in (labels or JSON_FORMAT).values())))


def _mesh_file(cfg: dict) -> file_pb2.FileAccessLog:
    """istiod's FileAccessLogFromMeshConfig (accessLogFormat, accessLogEncoding)."""
    fl = file_pb2.FileAccessLog(path=cfg["path"])
    if cfg["encoding"] == "JSON":
        labels = None
        if cfg["format"]:
            try:
                parsed = json.loads(cfg["format"])
                labels = parsed if isinstance(parsed, dict) else None
            except ValueError:
                labels = None  # istiod logs the error and uses its default JSON format
        fl.log_format.CopyFrom(_json(labels or JSON_FORMAT))
    else:
        fl.log_format.CopyFrom(_text(cfg["format"]))
    return fl


def _file(cfg: dict) -> file_pb2.FileAccessLog:
    """istiod's fileAccessLogFromTelemetry (an envoyFileAccessLog provider)."""
    fl = file_pb2.FileAccessLog(path=cfg.get("path") or "/dev/stdout")
    fmt = cfg.get("logFormat") or {}
    omit = bool(cfg.get("omitEmptyValues"))
    if fmt.get("labels") is not None:
        fl.log_format.CopyFrom(_json(fmt["labels"], omit))
    else:
        fl.log_format.CopyFrom(_text(fmt.get("text") or "", omit))
    return fl


def _otel(log: AccessLog, cfg: dict) -> logs_service_pb2.OpenTelemetryAccessLogConfig:
    fmt = cfg.get("logFormat") or {}
    body = fmt.get("text") or TEXT_FORMAT
    out = logs_service_pb2.OpenTelemetryAccessLogConfig(
        common_config=als_pb2.CommonGrpcAccessLogConfig(
            log_name=cfg.get("logName") or OTEL_LOG_NAME,
            grpc_service=grpc_service_pb2.GrpcService(envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(
                cluster_name=log.cluster, authority=log.authority)),
            transport_api_version=config_source_pb2.ApiVersion.V3,
            filter_state_objects_to_log=list(WASM_STATE_TO_LOG)),
        disable_builtin_labels=True,
        body=common_pb2.AnyValue(string_value=body))
    out.formatters.extend(_formatters(body, *(str(v) for v in (fmt.get("labels") or {}).values())))
    labels = fmt.get("labels") or {}
    if labels:
        out.attributes.CopyFrom(common_pb2.KeyValueList(values=[
            common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=str(labels[k]))) for k in sorted(labels)]))
    return out


def _grpc_common(log: AccessLog, cfg: dict, default_name: str) -> als_pb2.CommonGrpcAccessLogConfig:
    """istiod's http/tcpGrpcAccessLogFromTelemetry: the collector as an Envoy gRPC service."""
    return als_pb2.CommonGrpcAccessLogConfig(
        log_name=cfg.get("logName") or default_name,
        grpc_service=grpc_service_pb2.GrpcService(envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(
            cluster_name=log.cluster, authority=log.authority)),
        transport_api_version=config_source_pb2.ApiVersion.V3,
        filter_state_objects_to_log=cfg.get("filterStateObjectsToLog") or list(ALS_STATE_TO_LOG))


def _http_als(log: AccessLog, cfg: dict) -> als_pb2.HttpGrpcAccessLogConfig:
    return als_pb2.HttpGrpcAccessLogConfig(
        common_config=_grpc_common(log, cfg, HTTP_ALS_LOG_NAME),
        additional_request_headers_to_log=cfg.get("additionalRequestHeadersToLog") or [],
        additional_response_headers_to_log=cfg.get("additionalResponseHeadersToLog") or [],
        additional_response_trailers_to_log=cfg.get("additionalResponseTrailersToLog") or [])


def access_log(log: AccessLog) -> accesslog_pb2.AccessLog:
    cfg = json.loads(log.config)
    if log.kind == "otel":
        al = accesslog_pb2.AccessLog(name=OTEL_LOGGER, typed_config=pack(_otel(log, cfg)))
    elif log.kind == "http-als":
        al = accesslog_pb2.AccessLog(name=HTTP_ALS_LOGGER, typed_config=pack(_http_als(log, cfg)))
    elif log.kind == "tcp-als":
        al = accesslog_pb2.AccessLog(name=TCP_ALS_LOGGER, typed_config=pack(als_pb2.TcpGrpcAccessLogConfig(
            common_config=_grpc_common(log, cfg, TCP_ALS_LOG_NAME))))
    else:
        fl = _mesh_file(cfg) if log.kind == "mesh-file" else _file(cfg)
        al = accesslog_pb2.AccessLog(name=FILE_LOGGER, typed_config=pack(fl))
    if log.filter is not None:
        al.filter.CopyFrom(accesslog_pb2.AccessLogFilter(extension_filter=accesslog_pb2.ExtensionFilter(
            name=CEL_FILTER, typed_config=pack(cel_pb2.ExpressionFilter(expression=log.filter)))))
    return al


def access_logs(telemetry: ModeTelemetry) -> list[accesslog_pb2.AccessLog]:
    return [access_log(a) for a in telemetry.access_logs]


# --- tracing -------------------------------------------------------------------------------------

def _headers(headers: list[dict]) -> list[base_pb2.HeaderValueOption]:
    return [base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=h["name"], value=h.get("value", "")))
            for h in headers]


def _provider(spec: TracingSpec) -> http_tracer_pb2.Tracing.Http:
    cfg = json.loads(spec.config)
    if spec.kind == "zipkin":
        zc = zipkin_pb2.ZipkinConfig(
            collector_endpoint_version=zipkin_pb2.ZipkinConfig.HTTP_JSON,
            trace_id_128bit=not cfg.get("enable64bitTraceId", False),
            shared_span_context=wrappers_pb2.BoolValue(value=False),
            trace_context_option=(zipkin_pb2.ZipkinConfig.USE_B3_WITH_W3C_PROPAGATION
                                  if cfg.get("traceContextOption") == "USE_B3_WITH_W3C_PROPAGATION"
                                  else zipkin_pb2.ZipkinConfig.USE_B3))
        # istiod for proxies of 1.29 and later: the collector as an HttpService (timeout 5s default).
        timeout = parse_duration(cfg["timeout"]) if cfg.get("timeout") else 5.0
        zc.collector_service.CopyFrom(http_service_pb2.HttpService(
            http_uri=http_uri_pb2.HttpUri(uri=f"http://{spec.authority}{cfg.get('path') or '/api/v2/spans'}",
                                          cluster=spec.cluster, timeout=duration(timeout)),
            request_headers_to_add=_headers(cfg.get("headers") or [])))
        return http_tracer_pb2.Tracing.Http(name="envoy.tracers.zipkin", typed_config=pack(zc))
    if spec.kind == "datadog":
        dc = datadog_pb2.DatadogConfig(collector_cluster=spec.cluster, service_name=spec.service_name,
                                       collector_hostname=spec.authority)
        return http_tracer_pb2.Tracing.Http(name="envoy.tracers.datadog", typed_config=pack(dc))
    oc = opentelemetry_pb2.OpenTelemetryConfig(service_name=spec.service_name)
    http = cfg.get("http")
    if http is not None:
        path = (http.get("path") or "").lstrip("/")
        oc.http_service.CopyFrom(http_service_pb2.HttpService(
            http_uri=http_uri_pb2.HttpUri(uri=f"{spec.authority}/{path}" if path else spec.authority,
                                          cluster=spec.cluster,
                                          timeout=duration(parse_duration(http["timeout"]) if http.get("timeout") else 0)),
            request_headers_to_add=_headers(http.get("headers") or [])))
    else:
        grpc = cfg.get("grpc") or {}
        gs = grpc_service_pb2.GrpcService(envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(
            cluster_name=spec.cluster, authority=spec.authority),
            initial_metadata=[base_pb2.HeaderValue(key=h["name"], value=h.get("value", ""))
                              for h in grpc.get("initialMetadata") or []])
        if grpc.get("timeout"):
            gs.timeout.CopyFrom(duration(parse_duration(grpc["timeout"])))
        oc.grpc_service.CopyFrom(gs)
    return http_tracer_pb2.Tracing.Http(name="envoy.tracers.opentelemetry", typed_config=pack(oc))


# istiod's optionalPolicyTags: the dry-run AuthorizationPolicy results, from RBAC's metadata.
_DRY_RUN_TAGS = (("istio.authorization.dry_run.allow_policy.name", "istio_dry_run_allow_shadow_effective_policy_id"),
                 ("istio.authorization.dry_run.allow_policy.result", "istio_dry_run_allow_shadow_engine_result"),
                 ("istio.authorization.dry_run.deny_policy.name", "istio_dry_run_deny_shadow_effective_policy_id"),
                 ("istio.authorization.dry_run.deny_policy.result", "istio_dry_run_deny_shadow_engine_result"))


def _custom_tags(spec: TracingSpec) -> list[custom_tag_pb2.CustomTag]:
    tags = []
    for name, value in spec.istio_tags:
        tags.append(custom_tag_pb2.CustomTag(tag=name, literal=custom_tag_pb2.CustomTag.Literal(value=value)))
    if spec.istio_tags:
        for name, key in _DRY_RUN_TAGS:
            tags.append(custom_tag_pb2.CustomTag(tag=name, metadata=custom_tag_pb2.CustomTag.Metadata(
                kind=metadata_pb2.MetadataKind(request=metadata_pb2.MetadataKind.Request()),
                metadata_key=metadata_pb2.MetadataKey(key="envoy.filters.http.rbac", path=[
                    metadata_pb2.MetadataKey.PathSegment(key=key)]))))
    for name, kind, value, default in spec.custom_tags:
        t = custom_tag_pb2.CustomTag(tag=name)
        if kind == "literal":
            t.literal.value = value
        elif kind == "environment":
            t.environment.CopyFrom(custom_tag_pb2.CustomTag.Environment(name=value, default_value=default))
        elif kind == "header":
            t.request_header.CopyFrom(custom_tag_pb2.CustomTag.Header(name=value, default_value=default))
        else:
            t.value = value
        tags.append(t)
    return sorted(tags, key=lambda t: t.tag)


def apply_tracing(hcm: hcm_pb2.HttpConnectionManager, telemetry: ModeTelemetry) -> None:
    """istiod's configureTracingFromTelemetry for a listener class with a tracing provider."""
    spec = telemetry.tracing
    if spec is None:
        return
    tracing = hcm.tracing
    if spec.kind != "bootstrap":  # the legacy path: no provider, Envoy uses the bootstrap's tracer
        tracing.provider.CopyFrom(_provider(spec))
    if spec.spawn_upstream_span:
        tracing.spawn_upstream_span.value = True
    if spec.max_path_tag_length:
        tracing.max_path_tag_length.value = spec.max_path_tag_length
    tracing.client_sampling.CopyFrom(percent_pb2.Percent(value=100.0))
    tracing.overall_sampling.CopyFrom(percent_pb2.Percent(value=100.0))
    tracing.random_sampling.CopyFrom(percent_pb2.Percent(value=spec.sampling))
    tracing.custom_tags.extend(_custom_tags(spec))
    if spec.no_context_propagation:
        tracing.no_context_propagation = True
    if not spec.use_request_id_for_sampling:
        hcm.request_id_extension.typed_config.Pack(uuid_pb2.UuidRequestIdConfig(
            use_request_id_for_trace_sampling=wrappers_pb2.BoolValue(value=False)))
