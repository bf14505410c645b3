"""/metrics against dashboards: every metric istio's own control-plane Grafana dashboard
(manifests/addons/dashboards/pilot-dashboard, "Istio Control Plane Dashboard") and the control-plane
rules of Istio's alerting examples query is exported by a running server, except those listed with
the reason; every query of this repo's
deploy/dashboards/pilot.json names metrics the server exports; and the istiod gauges describing
state follow the state (a config change moves them)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import textwrap
from pathlib import Path

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from pilot import version
from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.support.control_plane import REPO_ROOT, ControlPlane
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)

SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"

# The PromQL of istio's control-plane dashboard (pilot-dashboard.gen.json, istio master), one
# entry per panel target.
ISTIOD_DASHBOARD_QUERIES = [
    'sum by (tag) (istio_build{component="pilot"})',
    'sum by (pod) (container_memory_working_set_bytes{container="discovery",pod=~"istiod-.*"})',
    'sum by (pod) (go_memstats_stack_inuse_bytes{app="istiod"})',
    'sum by (pod) (go_memstats_heap_inuse_bytes{app="istiod"})',
    'sum by (pod) (go_memstats_heap_alloc_bytes{app="istiod"})',
    'sum by (pod) (rate(go_memstats_alloc_bytes_total{app="istiod"}[$__rate_interval]))',
    'sum by (pod) (rate(go_memstats_mallocs_total{app="istiod"}[$__rate_interval]))',
    ('sum by (pod) (irate(container_cpu_usage_seconds_total{container="discovery",pod=~"istiod-.*"}'
    "[$__rate_interval]))"),
    'sum by (pod) (go_goroutines{app="istiod"})',
    "sum by (type) (irate(pilot_xds_pushes[$__rate_interval]))",
    "sum by (type,event) (rate(pilot_k8s_reg_events[$__rate_interval]))",
    "sum by (type,event) (rate(pilot_k8s_cfg_events[$__rate_interval]))",
    "sum by (type) (rate(pilot_push_triggers[$__rate_interval]))",
    'sum(envoy_cluster_upstream_cx_active{cluster_name="xds-grpc"})',
    "sum (pilot_xds)",
    "sum by (type) (pilot_total_xds_rejects)",
    "pilot_total_xds_internal_errors",
    "sum(rate(pilot_xds_push_time_bucket{}[$__rate_interval])) by (le)",
    "sum(rate(pilot_xds_config_size_bytes_bucket{}[$__rate_interval])) by (le)",
    "sum (rate(galley_validation_passed[$__rate_interval]))",
    "sum (rate(galley_validation_failed[$__rate_interval]))",
    "sum (rate(sidecar_injection_success_total[$__rate_interval]))",
    "sum (rate(sidecar_injection_failure_total[$__rate_interval]))",
]

# The control-plane rules of Istio's alerting examples (istio/tools perf/stability alertmanager
# PrometheusRule: istio.controlplane and the istiod rules of istio.infra), one entry per alert.
ISTIO_ALERT_QUERIES = [
    'sum(irate(pilot_xds_push_errors{app="istiod"}[5m])) / sum(irate(pilot_xds_pushes{app="istiod"}[5m])) > 0.05',
    'sum(irate(pilot_total_xds_rejects{app="istiod"}[5m])) / sum(irate(pilot_xds_pushes{app="istiod"}[5m])) > 0.05',
    'kube_pod_container_status_running{namespace="istio-system", container="discovery", component=""} == 0',
    'kube_deployment_status_replicas_unavailable{deployment="istiod", component=""} > 0',
    ('(sum(rate(container_cpu_usage_seconds_total{namespace="istio-system", container="discovery"}[5m])) '
     "BY (pod) * 100) > 80"),
    ('(sum(container_memory_working_set_bytes{namespace="istio-system", container="discovery"}) BY (pod) / '
     '(sum(container_spec_memory_limit_bytes{namespace="istio-system", container="discovery"}) BY (pod) > 0)'
     "* 100) > 80"),
    'sum(deriv(container_memory_working_set_bytes{namespace="istio-system",pod=~"istiod-.*"}[60m])) > 1000',
]

NOT_EXPORTED = {
    "pilot_xds_push_errors": ("istiod itself no longer exports it (send errors became pilot_xds_pushes "
                              "types); the alert fires on neither"),
    "kube_pod_container_status_running": "kube-state-metrics exports it, not istiod",
    "kube_deployment_status_replicas_unavailable": "kube-state-metrics exports it, not istiod",
    "container_spec_memory_limit_bytes": "cAdvisor (the kubelet) exports it, not istiod",
    "container_memory_working_set_bytes": "cAdvisor (the kubelet) exports it, not istiod",
    "container_cpu_usage_seconds_total": "cAdvisor (the kubelet) exports it, not istiod",
    "go_memstats_stack_inuse_bytes": "Go runtime; this server exports process_* and python_* instead",
    "go_memstats_heap_inuse_bytes": "Go runtime; see process_resident_memory_bytes",
    "go_memstats_heap_alloc_bytes": "Go runtime; see process_resident_memory_bytes",
    "go_memstats_alloc_bytes_total": "Go runtime; see python_gc_*",
    "go_memstats_mallocs_total": "Go runtime; see python_gc_*",
    "go_goroutines": "Go runtime; there are no goroutines in an asyncio server",
    "envoy_cluster_upstream_cx_active": "Envoy's own stat, scraped from the proxies",
}

_PROMQL_WORDS = {
    "sum",
    "by",
    "without",
    "rate",
    "irate",
    "increase",
    "histogram_quantile",
    "max",
    "min",
    "avg",
    "count",
    "topk",
    "bottomk",
    "time",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "clamp_min",
    "clamp_max",
    "abs",
    "and",
    "or",
    "unless",
    "bool",
    "delta",
    "deriv",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (selectors, ranges, groupings and strings removed)."""
    e = re.sub(r'"[^"]*"', "", expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", e, flags=re.IGNORECASE)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        rest = e[m.end() :].lstrip()
        if m.group().lower() not in _PROMQL_WORDS and not rest.startswith("("):
            names.add(m.group())
    return names


def exported(metrics_text: str) -> set[str]:
    """Every name a query may use: each family, and a histogram's _bucket/_sum/_count series."""
    names = set()
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", metrics_text, re.MULTILINE):
        names.add(m.group(1))
        if m.group(2) == "histogram":
            names.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))
    return names


def sample(metrics_text: str, series: str) -> float | None:
    m = re.search(rf"^{re.escape(series)} (\S+)$", metrics_text, re.MULTILINE)
    return float(m.group(1)) if m else None


def dashboard_queries(path: Path) -> list[str]:
    out = []

    def walk(o):
        if isinstance(o, dict):
            if isinstance(o.get("expr"), str):
                out.append(o["expr"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(json.loads(path.read_text()))
    return out


def test_promql_name_extraction():
    assert metric_names("sum(rate(pilot_xds_push_time_bucket{}[$__rate_interval])) by (le)") == {
        "pilot_xds_push_time_bucket"
    }
    assert metric_names("citadel_server_root_cert_expiry_timestamp - time()") == {
        "citadel_server_root_cert_expiry_timestamp"
    }
    assert metric_names("sum by (type, config) (pilot_xds_rejected_config) > 0") == {
        "pilot_xds_rejected_config"
    }
    assert metric_names('(sum(rate(a_total{x="y"}[5m])) BY (pod) * 100) > 80') == {"a_total"}


class Client:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        md = struct_pb2.Struct()
        md.update({"NAMESPACE": "default"})
        self.node = base_pb2.Node(id="sidecar~10.0.0.5~app-1.default~default.svc.cluster.local", metadata=md)
        self.call = channel.stream_stream(
            SOTW,
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
        )()

    async def request(self, **kw) -> None:
        await self.call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, **kw))


async def test_dashboards_read_only_exported_metrics_and_state_gauges_follow_state(tmp_path):
    cp = ControlPlane(tmp_path, secure_grpc=True, env={"CA_KEY_TYPE": "EC"})
    cp.write(
        "svc.yaml",
        service_yaml("reviews", 9080)
        + "---\n"
        + endpoint_slice_yaml("reviews", 19080)
        + "---\n"
        + service_yaml("db", 9300, port_name="tcp")
        + "---\n"
        + service_yaml("cache", 9300, port_name="tcp"),
    )
    async with cp, grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        client = Client(ch)
        await client.request(node=client.node)
        first = await asyncio.wait_for(client.call.read(), 10)
        await client.request(version_info=first.version_info, response_nonce="not-the-last-nonce")

        text = await wait_for(
            lambda: _when(cp, lambda t: (sample(t, 'pilot_xds_expired_nonce{type="cds"}') or 0) >= 1),
            10,
            message="expired nonce counted",
        )
        names = exported(text)

        # istio's dashboard and alerts: everything they read is here, but for the listed reasons.
        wanted = set().union(*(metric_names(q) for q in ISTIOD_DASHBOARD_QUERIES + ISTIO_ALERT_QUERIES))
        assert set(NOT_EXPORTED) <= wanted, "an exclusion for a metric the dashboard does not read"
        assert sorted(wanted - set(NOT_EXPORTED) - names) == []
        assert not (set(NOT_EXPORTED) & names), "exported now: remove it from NOT_EXPORTED"

        # This repo's dashboard reads only what the server exports.
        ours = dashboard_queries(REPO_ROOT / "deploy" / "dashboards" / "pilot.json")
        assert len(ours) >= 25
        missing = {q: sorted(metric_names(q) - names) for q in ours if metric_names(q) - names}
        assert missing == {}
        for needed in (
            "pilot_event_loop_lag_seconds_bucket",
            "pilot_xds_rejected_config",
            "pilot_proxy_convergence_time_bucket",
            "citadel_server_csr_count",
            "pilot_debounce_time_bucket",
            "pilot_xds_send_time_bucket",
        ):
            assert any(needed in metric_names(q) for q in ours), needed

        # Every istiod name the operators' issue listed as missing, by its exact name.
        for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "python_info", "istio_build",
                     "pilot_total_xds_internal_errors", "pilot_xds_expired_nonce", "pilot_xds_send_time",
                     "pilot_xds_write_timeout", "pilot_services", "pilot_virt_services", "pilot_k8s_reg_events",
                     "pilot_eds_no_instances", "pilot_conflict_inbound_listener",
                     "pilot_conflict_outbound_listener_tcp_over_current_tcp", "pilot_info",
                     "galley_validation_passed", "galley_validation_failed", "sidecar_injection_requests_total",
                     "sidecar_injection_success_total", "sidecar_injection_failure_total",
                     "sidecar_injection_skip_total", "citadel_server_csr_sign_err_count"):
            assert name in names, name

        # Values are the state's, not constants.
        build = version.build_info()
        assert sample(text, f'istio_build{{component="pilot",tag="{build["tag"]}"}}') == 1.0
        assert sample(text, f'pilot_info{{version="{version.info_string()}"}}') == 1.0
        assert sample(text, "pilot_services") == 3.0
        assert sample(text, "pilot_virt_services") == 0.0
        assert sample(text, "pilot_eds_no_instances") == 2.0  # db and cache have no endpoints
        assert (
            sample(text, "pilot_conflict_outbound_listener_tcp_over_current_tcp") == 1.0
        )  # db vs cache, no IPs
        assert sample(text, 'pilot_k8s_reg_events{type="Services",event="add"}') == 3.0
        assert sample(text, 'pilot_k8s_reg_events{type="EndpointSlice",event="add"}') == 1.0
        assert (sample(text, "pilot_xds_send_time_count") or 0) >= 1
        assert (sample(text, "process_resident_memory_bytes") or 0) > 10e6
        assert sample(text, "citadel_server_csr_sign_err_count") is None  # labelled by type: no error yet
        assert "# TYPE citadel_server_csr_sign_err_count counter" in text

        cp.write(
            "vs.yaml",
            textwrap.dedent("""\
            apiVersion: networking.istio.io/v1
            kind: VirtualService
            metadata: {name: reviews, namespace: default}
            spec:
              hosts: [reviews]
              http:
              - route:
                - destination: {host: reviews}
            """),
        )
        cp.write(
            "svc.yaml",
            service_yaml("reviews", 9080)
            + "---\n"
            + endpoint_slice_yaml("reviews", 19080)
            + "---\n"
            + service_yaml("db", 9300, port_name="tcp"),
        )
        text = await wait_for(
            lambda: _when(
                cp, lambda t: sample(t, "pilot_virt_services") == 1.0 and sample(t, "pilot_services") == 2.0
            ),
            10,
            message="gauges follow the config",
        )
        assert sample(text, "pilot_eds_no_instances") == 1.0
        assert sample(text, "pilot_conflict_outbound_listener_tcp_over_current_tcp") == 0.0
        assert sample(text, 'pilot_k8s_reg_events{type="Services",event="delete"}') == 1.0
        assert sample(text, 'pilot_k8s_cfg_events{type="VirtualService",event="add"}') == 1.0
        client.call.cancel()

        # Event-loop lag: a process stopped for a second wakes its timer at least 0.75 s late (a
        # sample is due every 0.25 s): one more sample above 0.5 s than before.
        def late(t: str) -> float:
            return sample(t, "pilot_event_loop_lag_seconds_count") - sample(
                t, 'pilot_event_loop_lag_seconds_bucket{le="0.5"}')

        before = late(await cp.metrics())
        os.kill(cp.proc.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(1.0)  # the stimulus (how long the loop cannot run), not a synchronisation
        finally:
            os.kill(cp.proc.pid, signal.SIGCONT)
        text = await wait_for(lambda: _when(cp, lambda t: late(t) >= before + 1), 10,
                              message="loop lag recorded")
        assert (sample(text, "pilot_event_loop_lag_max_seconds") or 0) >= 0.5


async def _when(cp: ControlPlane, ok) -> str | None:
    text = await cp.metrics()
    return text if ok(text) else None
