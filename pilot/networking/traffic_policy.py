"""DestinationRule traffic policies applied to outbound clusters (load balancing, connection
pools, outlier detection, upstream TLS), with istiod's merge rules: a subset's policy overrides
the top-level one field by field, and port-level settings override both for their port."""

from __future__ import annotations

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import base_pb2, protocol_pb2, proxy_protocol_pb2
from envoy.extensions.transport_sockets.proxy_protocol.v3 import upstream_proxy_protocol_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.matcher.v3 import string_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import wrappers_pb2

from pilot.durations import parse_duration
from pilot.model.credentials import CA_SUFFIX, SDS_PREFIX
from pilot.model.gateway_api.backend_tls import BackendTLS
from pilot.model.traffic import effective_policy  # noqa: F401 - the builders' import path
from pilot.networking.backend_tls import apply_backend_tls
from pilot.networking.protos import ads_config_source, duration, pack

HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
# istiod's defaultLBAlgorithm: outbound clusters without a `simple` balancer use least request.
DEFAULT_LB_POLICY = cluster_pb2.Cluster.LEAST_REQUEST
def _uint(v: int | None) -> wrappers_pb2.UInt32Value | None:
    return wrappers_pb2.UInt32Value(value=v) if v is not None else None


def _slow_start(lb) -> cluster_pb2.Cluster.SlowStartConfig | None:
    """istiod's warmup: `warmup` (with Envoy's defaults made explicit: aggression 1, 10% minimum
    weight) or the deprecated `warmupDurationSecs` (the window only)."""
    if lb.warmup is not None:
        w = lb.warmup
        return cluster_pb2.Cluster.SlowStartConfig(
            slow_start_window=duration(parse_duration(w.duration)),
            # istiod's runtime key "(" is not a valid runtime name, so it is never overridden.
            aggression=base_pb2.RuntimeDouble(default_value=w.aggression if w.aggression is not None else 1.0,
                                              runtime_key="("),
            min_weight_percent=percent_pb2.Percent(value=w.minimum_percent if w.minimum_percent is not None
                                                   else 10.0))
    if lb.warmup_duration_secs:
        window = duration(parse_duration(lb.warmup_duration_secs))
        return cluster_pb2.Cluster.SlowStartConfig(slow_start_window=window)
    return None


def apply_load_balancer(c: cluster_pb2.Cluster, lb) -> None:
    if c.type == cluster_pb2.Cluster.ORIGINAL_DST:
        return  # the original destination is the only host: istiod leaves CLUSTER_PROVIDED alone
    if lb.consistent_hash is not None:
        ch = lb.consistent_hash
        if ch.maglev is not None:
            c.lb_policy = cluster_pb2.Cluster.MAGLEV
            if ch.maglev.table_size:
                c.maglev_lb_config.table_size.value = ch.maglev.table_size
            return
        c.lb_policy = cluster_pb2.Cluster.RING_HASH
        ring = ch.ring_hash.minimum_ring_size if ch.ring_hash is not None else None
        if ring or ch.minimum_ring_size:
            c.ring_hash_lb_config.minimum_ring_size.value = ring or ch.minimum_ring_size
        return
    if lb.simple == "PASSTHROUGH":
        # Straight to the address the client dialled: no endpoints, whatever the service's type.
        c.type = cluster_pb2.Cluster.ORIGINAL_DST
        c.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
        c.ClearField("eds_cluster_config")
        c.ClearField("load_assignment")
        return
    c.lb_policy = {"LEAST_CONN": cluster_pb2.Cluster.LEAST_REQUEST,
                   "LEAST_REQUEST": cluster_pb2.Cluster.LEAST_REQUEST,
                   "RANDOM": cluster_pb2.Cluster.RANDOM,
                   "ROUND_ROBIN": cluster_pb2.Cluster.ROUND_ROBIN}.get(lb.simple or "", DEFAULT_LB_POLICY)
    slow_start = _slow_start(lb)
    if slow_start is not None:  # istiod: only the round-robin and least-request balancers warm up
        if c.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN:
            c.round_robin_lb_config.slow_start_config.CopyFrom(slow_start)
        elif c.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST:
            c.least_request_lb_config.slow_start_config.CopyFrom(slow_start)


def _http_options(c: cluster_pb2.Cluster) -> http_protocol_options_pb2.HttpProtocolOptions:
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    if HTTP_OPTIONS_KEY in c.typed_extension_protocol_options:
        c.typed_extension_protocol_options[HTTP_OPTIONS_KEY].Unpack(opts)
    return opts


def _store_http_options(c: cluster_pb2.Cluster, opts: http_protocol_options_pb2.HttpProtocolOptions) -> None:
    # Envoy requires one upstream protocol: HTTP/1.1 unless something above chose otherwise.
    if not opts.HasField("explicit_http_config") and not opts.HasField("use_downstream_protocol_config") \
            and not opts.HasField("auto_config"):
        opts.explicit_http_config.http_protocol_options.SetInParent()
    c.typed_extension_protocol_options[HTTP_OPTIONS_KEY].CopyFrom(pack(opts))


def should_h2_upgrade(pool, mesh_upgrade: bool, port_is_http: bool) -> bool:
    """istiod's shouldH2Upgrade (outbound clusters only): useClientProtocol never upgrades; a
    DestinationRule's `h2UpgradePolicy` UPGRADE or DO_NOT_UPGRADE decides; otherwise the mesh's
    `h2UpgradePolicy` does, for ports declared HTTP (not for TCP or sniffed ones)."""
    http = pool.http if pool is not None else None
    if http is not None:
        if http.use_client_protocol:
            return False
        if http.h2_upgrade_policy == "UPGRADE":
            return True
        if http.h2_upgrade_policy == "DO_NOT_UPGRADE":
            return False
    return port_is_http and mesh_upgrade


def apply_h2_upgrade(c: cluster_pb2.Cluster) -> None:
    """Talk HTTP/2 to the upstream whatever the client spoke (a port already HTTP/2 keeps its options)."""
    opts = _http_options(c)
    if not opts.HasField("explicit_http_config") and not opts.HasField("use_downstream_protocol_config"):
        opts.explicit_http_config.http2_protocol_options.SetInParent()
        c.typed_extension_protocol_options[HTTP_OPTIONS_KEY].CopyFrom(pack(opts))


def _tcp_keepalive(c: cluster_pb2.Cluster, keepalive) -> None:
    # An empty tcp_keepalive sets SO_KEEPALIVE with the OS defaults; each given value overrides.
    ka = c.upstream_connection_options.tcp_keepalive
    ka.SetInParent()
    if keepalive.probes:
        ka.keepalive_probes.value = keepalive.probes
    if keepalive.time:
        ka.keepalive_time.value = int(parse_duration(keepalive.time))
    if keepalive.interval:
        ka.keepalive_interval.value = int(parse_duration(keepalive.interval))


MAX_UINT32 = 2**32 - 1


def default_thresholds() -> circuit_breaker_pb2.CircuitBreakers.Thresholds:
    """istiod's getDefaultCircuitBreakerThresholds: no limit of its own (Envoy's defaults, 1024
    connections and requests and 3 parallel retries, turn pod churn into 503s), remaining
    capacity tracked. Every outbound, inbound and passthrough cluster starts from these; a
    connection pool overrides the limits it sets."""
    return circuit_breaker_pb2.CircuitBreakers.Thresholds(
        priority=base_pb2.DEFAULT, max_connections=_uint(MAX_UINT32), max_pending_requests=_uint(MAX_UINT32),
        max_requests=_uint(MAX_UINT32), max_retries=_uint(MAX_UINT32), track_remaining=True)


def apply_default_circuit_breakers(c: cluster_pb2.Cluster) -> None:
    del c.circuit_breakers.thresholds[:]
    c.circuit_breakers.thresholds.append(default_thresholds())


def apply_connection_pool(c: cluster_pb2.Cluster, pool, http2: bool) -> None:
    """istiod's applyConnectionPool. An HTTP/2 port's explicit HTTP/2 options (or those of
    h2UpgradePolicy) are already on the cluster: maxConcurrentStreams applies to them only.
    `http2` is kept for callers; the cluster itself says which protocol it speaks."""
    thresholds = default_thresholds()
    idle_timeout = None
    max_connection_duration = None
    h = pool.http
    if h is not None:
        # istiod: a zero (or absent) limit keeps the default (it cannot tell unset from zero).
        if h.http1_max_pending_requests:
            thresholds.max_pending_requests.value = h.http1_max_pending_requests
        if h.http2_max_requests:
            thresholds.max_requests.value = h.http2_max_requests
        if h.max_retries:
            thresholds.max_retries.value = h.max_retries
        idle_timeout = h.idle_timeout
    if pool.tcp is not None:
        t = pool.tcp
        if t.max_connections:
            thresholds.max_connections.value = t.max_connections
        if t.connect_timeout:
            c.connect_timeout.CopyFrom(duration(parse_duration(t.connect_timeout)))
        max_connection_duration = t.max_connection_duration
        if idle_timeout is None:  # the HTTP idle timeout wins; the TCP one applies to HTTP pools too
            idle_timeout = t.idle_timeout
        if t.tcp_keepalive is not None:
            _tcp_keepalive(c, t.tcp_keepalive)
    max_requests = h.max_requests_per_connection if h is not None else None
    streams = h.max_concurrent_streams if h is not None else None
    if idle_timeout is not None or max_connection_duration or max_requests or streams:
        opts = _http_options(c)
        common = opts.common_http_protocol_options
        if idle_timeout is not None:
            common.idle_timeout.CopyFrom(duration(parse_duration(idle_timeout)))
        if max_requests:
            common.max_requests_per_connection.value = max_requests
        if max_connection_duration:
            common.max_connection_duration.CopyFrom(duration(parse_duration(max_connection_duration)))
        if streams and opts.explicit_http_config.HasField("http2_protocol_options"):
            # istiod: only an HTTP/2 upstream (the port's, or h2UpgradePolicy's) has streams to limit.
            opts.explicit_http_config.http2_protocol_options.max_concurrent_streams.value = streams
        _store_http_options(c, opts)
    if h is not None and h.use_client_protocol:
        # Speak to the upstream whatever the client spoke (HTTP/1.1 options kept from before).
        opts = _http_options(c)
        http1 = protocol_pb2.Http1ProtocolOptions()
        if opts.explicit_http_config.HasField("http_protocol_options"):
            http1.CopyFrom(opts.explicit_http_config.http_protocol_options)
        opts.use_downstream_protocol_config.http_protocol_options.CopyFrom(http1)
        opts.use_downstream_protocol_config.http2_protocol_options.SetInParent()
        _store_http_options(c, opts)
    del c.circuit_breakers.thresholds[:]
    c.circuit_breakers.thresholds.append(thresholds)


def apply_retry_budget(c: cluster_pb2.Cluster, budget) -> None:
    """istiod's applyRetryBudget, with its defaults (20% of active requests, at least 3 retries),
    on the cluster's default-priority thresholds (the connection pool's, when it set some)."""
    if not c.circuit_breakers.thresholds:
        c.circuit_breakers.thresholds.add(priority=base_pb2.DEFAULT)
    rb = c.circuit_breakers.thresholds[0].retry_budget
    rb.budget_percent.value = budget.percent if budget.percent is not None else 20.0
    rb.min_retry_concurrency.value = budget.min_retry_concurrency or 3


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


def apply_tls(c: cluster_pb2.Cluster, tls, hostname: str, http2: bool = False) -> str | None:
    """SIMPLE and MUTUAL with certificate files, or with a Secret (`credentialName`, served over
    SDS on the ADS stream, as istiod: MUTUAL's chain and key from `kubernetes://NAME`, the CA to
    verify the server with from `kubernetes://NAME-cacert`). Returns why a mode was not applied,
    if so. ISTIO_MUTUAL is not applied here: pilot.model.mtls decides it (it needs the client's
    identity)."""
    if tls.mode == "DISABLE":
        return None
    if isinstance(tls, BackendTLS):  # from a BackendTLSPolicy: its own validation rules
        apply_backend_tls(c, tls, http2)
        return None
    if tls.mode == "ISTIO_MUTUAL":
        return "ISTIO_MUTUAL applies only to proxies with a mesh identity (connected on 15012)"
    ctx = tls_pb2.UpstreamTlsContext(sni=tls.sni or hostname)
    common = ctx.common_tls_context
    if tls.credential_name:
        name = SDS_PREFIX + tls.credential_name
        if tls.mode == "MUTUAL":
            common.tls_certificate_sds_secret_configs.add(name=name, sds_config=ads_config_source())
        if not tls.insecure_skip_verify:
            combined = common.combined_validation_context
            for san in tls.subject_alt_names:
                combined.default_validation_context.match_typed_subject_alt_names.add(
                    san_type=common_pb2.SubjectAltNameMatcher.DNS, matcher=string_pb2.StringMatcher(exact=san))
            combined.validation_context_sds_secret_config.name = name + CA_SUFFIX
            combined.validation_context_sds_secret_config.sds_config.CopyFrom(ads_config_source())
    elif tls.mode == "MUTUAL" and tls.client_certificate and tls.private_key:
        common.tls_certificates.add(certificate_chain=base_pb2.DataSource(filename=tls.client_certificate),
                                    private_key=base_pb2.DataSource(filename=tls.private_key))
    if tls.ca_certificates and not tls.insecure_skip_verify:
        validation = common_pb2.CertificateValidationContext(
            trusted_ca=base_pb2.DataSource(filename=tls.ca_certificates))
        if tls.ca_crl:
            validation.crl.CopyFrom(base_pb2.DataSource(filename=tls.ca_crl))
        for san in tls.subject_alt_names:
            validation.match_typed_subject_alt_names.add(
                san_type=common_pb2.SubjectAltNameMatcher.DNS, matcher=string_pb2.StringMatcher(exact=san))
        common.validation_context.CopyFrom(validation)
    c.transport_socket.name = "envoy.transport_sockets.tls"
    c.transport_socket.typed_config.CopyFrom(pack(ctx))
    return None


PROXY_PROTOCOL_SOCKET = "envoy.transport_sockets.upstream_proxy_protocol"


def apply_proxy_protocol(c: cluster_pb2.Cluster, proxy_protocol) -> None:
    """istiod's applyUpstreamProxyProtocol: wrap the cluster's transport socket(s) (mTLS, TLS, or
    plain) so each upstream connection starts with a PROXY protocol header. Call after TLS."""
    version = (proxy_protocol_pb2.ProxyProtocolConfig.V2 if proxy_protocol.version == "V2"
               else proxy_protocol_pb2.ProxyProtocolConfig.V1)

    def wrap(inner: base_pb2.TransportSocket) -> base_pb2.TransportSocket:
        transport = upstream_proxy_protocol_pb2.ProxyProtocolUpstreamTransport(
            config=proxy_protocol_pb2.ProxyProtocolConfig(version=version), transport_socket=inner)
        return base_pb2.TransportSocket(name=PROXY_PROTOCOL_SOCKET, typed_config=pack(transport))

    if not c.HasField("transport_socket") and not c.transport_socket_matches:
        c.transport_socket.CopyFrom(wrap(base_pb2.TransportSocket(
            name="envoy.transport_sockets.raw_buffer", typed_config=pack(raw_buffer_pb2.RawBuffer()))))
        return
    if c.HasField("transport_socket"):
        c.transport_socket.CopyFrom(wrap(c.transport_socket))
    for match in c.transport_socket_matches:
        match.transport_socket.CopyFrom(wrap(match.transport_socket))


def apply_policy(c: cluster_pb2.Cluster, policy: dict, hostname: str, http2: bool) -> None:
    """`http2`: the cluster talks HTTP/2 upstream (its port's protocol, or the upgrade above)."""
    if policy["connection_pool"] is not None:
        apply_connection_pool(c, policy["connection_pool"], http2)
    if policy["load_balancer"] is not None:
        apply_load_balancer(c, policy["load_balancer"])
    if policy.get("retry_budget") is not None:
        apply_retry_budget(c, policy["retry_budget"])
    if policy["outlier_detection"] is not None:
        apply_outlier_detection(c, policy["outlier_detection"])
    if policy["tls"] is not None:
        apply_tls(c, policy["tls"], hostname, http2)
