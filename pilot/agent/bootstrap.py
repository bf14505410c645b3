"""The Envoy bootstrap pilot-agent writes: node identity and metadata, admin, ADS to the agent's
xDS proxy (which forwards to istiod over mTLS), and the `sds-grpc` cluster through which Envoy
gets its workload certificate.

Pure: configuration and file contents in, a JSON-ready dict out.

THE CONTRACT with generated config: clusters and listeners from the control plane reference the
SDS secrets `default` (workload key and chain) and `ROOTCA` (mesh root) through the static cluster
named exactly `sds-grpc`; this bootstrap always defines it, and the agent serves both names.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from pilot.agent.config import (
    SDS_SOCKET_PATH,
    XDS_SOCKET_PATH,
    AgentConfig,
    is_ip,
    split_host_port,
    workload_name,
)

SDS_CLUSTER = "sds-grpc"
XDS_CLUSTER = "xds-grpc"
WORKLOAD_SECRET = "default"
ROOT_SECRET = "ROOTCA"

META_PREFIX = "ISTIO_META_"
METAJSON_PREFIX = "ISTIO_METAJSON_"
POD_TEMPLATE_HASH = "pod-template-hash"  # per-ReplicaSet noise, dropped as istio-agent does

_HTTP2 = {
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}},
    }
}


def parse_downward_api(text: str) -> dict[str, str]:
    """The downward API's `key="value"` lines (values Go-quoted) as a map; malformed lines raise."""
    out = {}
    for line in text.splitlines():
        key, sep, quoted = line.partition("=")
        if not sep:
            continue
        quoted = quoted.strip()
        if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
            raise ValueError(f"{key}: value {quoted!r} is not a quoted string")
        try:
            # Go's %q escapes are a subset of Python's string literal escapes.
            out[key] = ast.literal_eval(quoted)
        except (ValueError, SyntaxError) as e:
            raise ValueError(f"{key}: cannot unquote {quoted!r}: {e}") from None
    return out


def service_cluster(cfg: AgentConfig, labels: Mapping[str, str], workload: str) -> str:
    """istio-agent's node.cluster: serviceCluster, else `app.NAMESPACE`, else `WORKLOAD.NAMESPACE`."""
    name = cfg.proxy.service_cluster
    if name and name != "istio-proxy":
        return name
    if labels.get("app"):
        return f"{labels['app']}.{cfg.pod_namespace}"
    if workload:
        return f"{workload}.{cfg.pod_namespace}"
    return f"istio-proxy.{cfg.pod_namespace}"


def node_metadata(cfg: AgentConfig, labels_text: str = "", annotations_text: str = "") -> tuple[dict, list[str]]:
    """Node metadata as istio-agent sends it. Sources, later winning: ProxyConfig.proxyMetadata and
    the environment's ISTIO_META_* (prefix stripped, string values), ISTIO_METAJSON_* (JSON values;
    ISTIO_METAJSON_LABELS gives LABELS), the pod labels/annotations files, then what the agent
    itself knows (NAMESPACE, NAME, SERVICE_ACCOUNT, INSTANCE_IPS, PROXY_CONFIG...).
    `labels_text`/`annotations_text` are the downward API files' contents ("" when absent)."""
    warnings: list[str] = []
    md: dict[str, Any] = {}
    for source in (cfg.proxy.proxy_metadata, cfg.env):
        for k, v in source.items():
            if k.startswith(META_PREFIX) and len(k) > len(META_PREFIX):
                md[k[len(META_PREFIX):]] = v
    labels: dict[str, str] = {}
    for k, v in sorted(cfg.env.items()):
        if not k.startswith(METAJSON_PREFIX) or len(k) == len(METAJSON_PREFIX):
            continue
        try:
            value = json.loads(v)
        except ValueError as e:
            warnings.append(f"{k}: not JSON, ignored: {e}")
            continue
        key = k[len(METAJSON_PREFIX):]
        if key == "LABELS":
            if isinstance(value, dict):
                labels = {str(a): str(b) for a, b in value.items()}
            else:
                warnings.append(f"{k}: must be a JSON object of labels, ignored")
            continue
        md[key] = value
    if labels_text:
        try:
            labels.update(parse_downward_api(labels_text))
        except ValueError as e:
            warnings.append(f"pod labels file: {e}")
    labels.pop(POD_TEMPLATE_HASH, None)
    if annotations_text:
        try:
            md["ANNOTATIONS"] = parse_downward_api(annotations_text)
        except ValueError as e:
            warnings.append(f"pod annotations file: {e}")

    md.setdefault("CLUSTER_ID", "Kubernetes")
    md.setdefault("INTERCEPTION_MODE", "REDIRECT")
    md.setdefault("WORKLOAD_NAME", workload_name(cfg.pod_name))
    md.update({
        "NAMESPACE": cfg.pod_namespace,
        "NAME": cfg.pod_name,
        "SERVICE_ACCOUNT": cfg.service_account,
        "LABELS": labels,
        "INSTANCE_IPS": ",".join(cfg.instance_ips),
        "PILOT_SAN": [cfg.istiod_san],
        "PROXY_CONFIG": {**cfg.proxy.raw, "discoveryAddress": cfg.discovery_address},
    })
    md.setdefault("ISTIO_VERSION", cfg.istio_version)
    return md, warnings


def _sds_config() -> dict:
    return {
        "api_config_source": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "set_node_on_first_message_only": True,
            "grpc_services": [{"envoy_grpc": {"cluster_name": SDS_CLUSTER}}],
        },
        "initial_fetch_timeout": "0s",
        "resource_api_version": "V3",
    }


def _xds_cluster() -> dict:
    """ADS goes to the agent's xDS proxy (pilot/agent/xds_proxy.py), which holds the mTLS
    connection to istiod and fetches remote Wasm modules, as istio-agent's bootstrap does."""
    return {
        "name": XDS_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": _HTTP2,
        "load_assignment": {
            "cluster_name": XDS_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "pipe": {"path": XDS_SOCKET_PATH}}}}]}],
        },
    }


ZIPKIN_CLUSTER = "zipkin"


def bootstrap_dns_lookup_family(cfg: AgentConfig) -> str:
    """istio-agent's bootstrap DNSLookupFamily from INSTANCE_IPS: V6_ONLY when every address is
    IPv6, ALL for both families with ISTIO_DUAL_STACK in the agent's environment, else V4_ONLY."""
    v6 = [":" in a for a in cfg.instance_ips]
    if v6 and all(v6):
        return "V6_ONLY"
    if any(v6) and str(cfg.env.get("ISTIO_DUAL_STACK", "")).lower() in ("1", "t", "true"):
        return "ALL"  # (strconv.ParseBool's true spellings, as istio-agent reads the knob)
    return "V4_ONLY"


def _zipkin(cfg: AgentConfig) -> tuple[dict, dict] | None:
    """istio-agent's bootstrap tracer from ProxyConfig tracing.zipkin.address (its bootstrap
    template's `zipkin` cluster and `tracing.http`): the tracer of every HCM whose `tracing` names
    no provider (istiod's legacy path, when no Telemetry sets a tracing provider)."""
    tracing = cfg.proxy.tracing
    if tracing is None or tracing.zipkin is None:
        return None
    host, port = split_host_port(tracing.zipkin.address, "tracing.zipkin.address")
    cluster = {
        "name": ZIPKIN_CLUSTER,
        "type": "STATIC" if is_ip(host) else "STRICT_DNS",
        "respect_dns_ttl": True,
        "dns_lookup_family": bootstrap_dns_lookup_family(cfg),
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": ZIPKIN_CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": host, "port_value": port}}}}]}]},
    }
    tracer = {"http": {"name": "envoy.tracers.zipkin", "typed_config": {
        "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
        "collector_cluster": ZIPKIN_CLUSTER,
        "collector_endpoint": "/api/v2/spans",
        "collector_endpoint_version": "HTTP_JSON",
        "trace_id_128bit": True,
        "shared_span_context": False,
    }}}
    return cluster, tracer


def envoy_bootstrap(cfg: AgentConfig, metadata: Mapping[str, Any]) -> dict:
    boot = _envoy_bootstrap(cfg, metadata)
    zipkin = _zipkin(cfg)
    if zipkin is not None:
        boot["static_resources"]["clusters"].append(zipkin[0])
        boot["tracing"] = zipkin[1]
    return boot


def _envoy_bootstrap(cfg: AgentConfig, metadata: Mapping[str, Any]) -> dict:
    labels = metadata.get("LABELS") or {}
    xds = {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}
    return {
        "node": {
            "id": cfg.node_id,
            "cluster": service_cluster(cfg, labels, str(metadata.get("WORKLOAD_NAME") or "")),
            "metadata": dict(metadata),
        },
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": cfg.proxy.proxy_admin_port}}},
        # Envoy warns at start without a downstream connection limit; this one (istio's value) is
        # a formality, not a limit.
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {
                "@type": "type.googleapis.com/"
                         "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                "max_active_downstream_connections": 2147483647,
            },
        }]},
        "layered_runtime": {"layers": [{"name": "admin", "admin_layer": {}}]},
        # Internal listeners (a waypoint hands each HBONE tunnel to one), as istio-agent enables.
        "bootstrap_extensions": [{"name": "envoy.bootstrap.internal_listener", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"}}],
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if cfg.delta_xds else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
            },
            "cds_config": dict(xds),
            "lds_config": dict(xds),
        },
        "static_resources": {
            "clusters": [
                {
                    "name": SDS_CLUSTER,
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": _HTTP2,
                    "load_assignment": {
                        "cluster_name": SDS_CLUSTER,
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                            "pipe": {"path": SDS_SOCKET_PATH}}}}]}],
                    },
                },
                _xds_cluster(),
            ],
        },
    }
