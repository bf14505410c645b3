"""DestinationRule traffic policies applied to outbound clusters (load balancing, connection
pools, outlier detection, upstream TLS), with istiod's merge rules: a subset's policy overrides
the top-level one field by field, and port-level settings override both for their port."""

from __future__ import annotations

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import wrappers_pb2

from pilot.durations import parse_duration
from pilot.networking.protos import duration, pack

HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_FIELDS = ("load_balancer", "connection_pool", "outlier_detection", "tls")


def effective_policy(spec, subset: str, port: int) -> dict:
    """The four policy parts in force for (subset, port): {field: value or None}."""
    layers = [spec.traffic_policy]
    if subset:
        layers.append(next((s.traffic_policy for s in spec.subsets if s.name == subset), None))
    out: dict = {f: None for f in _FIELDS}
    for layer in layers:
        if layer is None:
            continue
        for f in _FIELDS:
            if getattr(layer, f) is not None:
                out[f] = getattr(layer, f)
        for pls in layer.port_level_settings:
            if pls.port is not None and pls.port.number == port:
                for f in _FIELDS:
                    if getattr(pls, f) is not None:
                        out[f] = getattr(pls, f)
    return out


def _uint(v: int | None) -> wrappers_pb2.UInt32Value | None:
    return wrappers_pb2.UInt32Value(value=v) if v is not None else None


def apply_load_balancer(c: cluster_pb2.Cluster, lb) -> None:
    if lb.consistent_hash is not None:
        c.lb_policy = cluster_pb2.Cluster.RING_HASH
        if lb.consistent_hash.minimum_ring_size:
            c.ring_hash_lb_config.minimum_ring_size.value = lb.consistent_hash.minimum_ring_size
        return
    c.lb_policy = {"LEAST_CONN": cluster_pb2.Cluster.LEAST_REQUEST,
                   "LEAST_REQUEST": cluster_pb2.Cluster.LEAST_REQUEST,
                   "RANDOM": cluster_pb2.Cluster.RANDOM}.get(lb.simple or "", cluster_pb2.Cluster.ROUND_ROBIN)


def apply_connection_pool(c: cluster_pb2.Cluster, pool, http2: bool) -> None:
    thresholds = circuit_breaker_pb2.CircuitBreakers.Thresholds(priority=base_pb2.DEFAULT)
    if pool.tcp is not None:
        if pool.tcp.max_connections is not None:
            thresholds.max_connections.value = pool.tcp.max_connections
        if pool.tcp.connect_timeout:
            c.connect_timeout.CopyFrom(duration(parse_duration(pool.tcp.connect_timeout)))
    if pool.http is not None:
        h = pool.http
        if h.http1_max_pending_requests is not None:
            thresholds.max_pending_requests.value = h.http1_max_pending_requests
        if h.http2_max_requests is not None:
            thresholds.max_requests.value = h.http2_max_requests
        if h.max_retries is not None:
            thresholds.max_retries.value = h.max_retries
        if h.max_requests_per_connection or h.idle_timeout:
            opts = http_protocol_options_pb2.HttpProtocolOptions()
            if HTTP_OPTIONS_KEY in c.typed_extension_protocol_options:
                c.typed_extension_protocol_options[HTTP_OPTIONS_KEY].Unpack(opts)
            if h.max_requests_per_connection:
                opts.common_http_protocol_options.max_requests_per_connection.value = h.max_requests_per_connection
            if h.idle_timeout:
                opts.common_http_protocol_options.idle_timeout.CopyFrom(duration(parse_duration(h.idle_timeout)))
            if not opts.HasField("explicit_http_config") and not opts.HasField("use_downstream_protocol_config"):
                if http2:
                    opts.explicit_http_config.http2_protocol_options.SetInParent()
                else:
                    opts.explicit_http_config.http_protocol_options.SetInParent()
            c.typed_extension_protocol_options[HTTP_OPTIONS_KEY].CopyFrom(pack(opts))
    c.circuit_breakers.thresholds.append(thresholds)


def apply_outlier_detection(c: cluster_pb2.Cluster, od) -> None:
    out = outlier_detection_pb2.OutlierDetection()
    errors = od.consecutive_5xx_errors if od.consecutive_5xx_errors is not None else od.consecutive_errors
    if errors is not None:
        out.consecutive_5xx.value = errors
        out.enforcing_consecutive_5xx.value = 100 if errors > 0 else 0
    else:
        out.enforcing_consecutive_5xx.value = 0
    if od.consecutive_gateway_errors is not None:
        out.consecutive_gateway_failure.value = od.consecutive_gateway_errors
        out.enforcing_consecutive_gateway_failure.value = 100 if od.consecutive_gateway_errors > 0 else 0
    if od.interval:
        out.interval.CopyFrom(duration(parse_duration(od.interval)))
    if od.base_ejection_time:
        out.base_ejection_time.CopyFrom(duration(parse_duration(od.base_ejection_time)))
    if od.max_ejection_percent is not None:
        out.max_ejection_percent.value = od.max_ejection_percent
    if od.split_external_local_origin_errors:
        out.split_external_local_origin_errors = True
        if od.consecutive_local_origin_failures is not None:
            out.consecutive_local_origin_failure.value = od.consecutive_local_origin_failures
    c.outlier_detection.CopyFrom(out)
    # istiod: minHealthPercent is Envoy's panic threshold (default 0 there: never panic).
    c.common_lb_config.healthy_panic_threshold.value = float(od.min_health_percent or 0)


def apply_tls(c: cluster_pb2.Cluster, tls, hostname: str) -> str | None:
    """SIMPLE and MUTUAL with certificate files. Returns why a mode was not applied, if so.
    ISTIO_MUTUAL is not applied here: pilot.model.mtls decides it (it needs the client's identity)."""
    if tls.mode == "DISABLE":
        return None
    if tls.mode == "ISTIO_MUTUAL":
        return "ISTIO_MUTUAL applies only to proxies with a mesh identity (connected on 15012)"
    if tls.credential_name:
        return "credentialName for client TLS is not supported yet; the cluster stays plaintext"
    ctx = tls_pb2.UpstreamTlsContext(sni=tls.sni or hostname)
    common = ctx.common_tls_context
    if tls.mode == "MUTUAL" and tls.client_certificate and tls.private_key:
        common.tls_certificates.add(certificate_chain=base_pb2.DataSource(filename=tls.client_certificate),
                                    private_key=base_pb2.DataSource(filename=tls.private_key))
    if tls.ca_certificates and not tls.insecure_skip_verify:
        validation = common_pb2.CertificateValidationContext(
            trusted_ca=base_pb2.DataSource(filename=tls.ca_certificates))
        for san in tls.subject_alt_names:
            validation.match_typed_subject_alt_names.add(
                san_type=common_pb2.SubjectAltNameMatcher.DNS, matcher=string_pb2.StringMatcher(exact=san))
        common.validation_context.CopyFrom(validation)
    c.transport_socket.name = "envoy.transport_sockets.tls"
    c.transport_socket.typed_config.CopyFrom(pack(ctx))
    return None


def apply_policy(c: cluster_pb2.Cluster, policy: dict, hostname: str, http2: bool) -> None:
    if policy["load_balancer"] is not None:
        apply_load_balancer(c, policy["load_balancer"])
    if policy["connection_pool"] is not None:
        apply_connection_pool(c, policy["connection_pool"], http2)
    if policy["outlier_detection"] is not None:
        apply_outlier_detection(c, policy["outlier_detection"])
    if policy["tls"] is not None:
        apply_tls(c, policy["tls"], hostname)
