"""Prometheus metrics with istiod's names and labels, one registry per server instance (so tests
can run several servers in one process without clashing)."""

from __future__ import annotations

import math
from bisect import bisect_left

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from pilot import version

_PUSH_BUCKETS = (0.01, 0.1, 0.5, 1, 3, 5, 10, 20, 30)
_INF = float("inf")
_FOLD_AT = 1024  # observations a LoopHistogram holds before folding them in unasked


class LoopHistogram(Histogram):
    """A Histogram observed and collected on the event loop's thread only (the push path observes
    a few per stream and type: 4,000 or more per full push at 1,000 proxies). observe() appends
    the value to a list; the values are folded into prometheus-client's own, in the order they
    were observed, whenever the metric is collected (/metrics, on the loop too) or the list is
    long. So what is exported is what Histogram exports, sum included to the last bit, without
    its lock taken twice and its scan of the bounds per value."""

    _amounts: list[float] | None = None  # None: the parent of labelled children (observe raises)

    def _metric_init(self) -> None:
        super()._metric_init()
        self._amounts = []

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        amounts = self._amounts
        if amounts is None or exemplar:
            super().observe(amount, exemplar)  # what Histogram does (raising for a parent)
            return
        amounts.append(amount)
        if len(amounts) >= _FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        amounts = self._amounts
        if not amounts:
            return
        self._amounts = []
        bounds, counts = self._upper_bounds, [0] * len(self._upper_bounds)
        total = self._sum.get()
        for a in amounts:
            total += a  # one value at a time, as Histogram adds them: the same float
            if a <= _INF:  # NaN lands in no bucket, as in Histogram
                counts[bisect_left(bounds, a)] += 1  # the first bound >= a: Histogram's bucket
        self._sum.set(total)
        for bucket, n in zip(self._buckets, counts, strict=True):
            if n:
                bucket.inc(n)

    def _child_samples(self):
        self._fold()
        return super()._child_samples()


class LoopCounter(Counter):
    """A Counter incremented by one, on the event loop's thread only, as LoopHistogram: inc()
    adds to a plain int, folded into prometheus-client's value when the metric is collected
    (whole numbers: the same value as adding them one at a time)."""

    _ones: int | None = None  # None: the parent of labelled children (inc raises)

    def _metric_init(self) -> None:
        super()._metric_init()
        self._ones = 0

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if amount != 1 or exemplar or self._ones is None:
            self._fold()
            super().inc(amount, exemplar)
            return
        self._ones += 1

    def _fold(self) -> None:
        if self._ones:
            self._value.inc(self._ones)
            self._ones = 0

    def _child_samples(self):
        self._fold()
        return super()._child_samples()
_CONVERGENCE_BUCKETS = (0.1, 0.5, 1, 3, 5, 10, 20, 30)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # prometheus-client's defaults (process_*, python_*), as istiod exports Go's process_*/go_*.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        r.register(GC_COLLECTOR)
        build = version.build_info()
        Gauge("istio_build", "Istio component build info", ["component", "tag"], registry=r).labels(
            "pilot", build["tag"]).set(1)
        Gauge("pilot_info", "Pilot version and build information.", ["version"], registry=r).labels(
            version.info_string()).set(1)
        self.xds_internal_errors = Counter("pilot_total_xds_internal_errors",
                                           "Total number of internal XDS errors in pilot.", registry=r)
        self.xds_expired_nonce = Counter(
            "pilot_xds_expired_nonce", "Total number of XDS requests with an expired nonce.", ["type"], registry=r)
        self.xds_send_time = LoopHistogram("pilot_xds_send_time",
                                       "Total time in seconds Pilot takes to send generated configuration.",
                                       buckets=(.01, .1, 1, 3, 5, 10, 20, 30), registry=r)
        self.registry_events = Counter("pilot_k8s_reg_events", "Events from k8s registry.", ["type", "event"],
                                       registry=r)
        self.xds_pushes = LoopCounter("pilot_xds_pushes", "Pushes sent, by type (cds, eds, lds, rds).",
                                  ["type"], registry=r)
        self.xds_push_time = LoopHistogram("pilot_xds_push_time", "Seconds to generate and send one type to one proxy.",
                                       ["type"], buckets=_PUSH_BUCKETS, registry=r)
        self.proxy_convergence_time = LoopHistogram(
            "pilot_proxy_convergence_time", "Seconds from the first change of a push to the proxy's ACK.",
            buckets=_CONVERGENCE_BUCKETS, registry=r)
        self.debounce_time = Histogram("pilot_debounce_time", "Seconds a push request spent in debounce.",
                                       buckets=_CONVERGENCE_BUCKETS, registry=r)
        self.pushcontext_init_seconds = Histogram(
            "pilot_pushcontext_init_seconds", "Seconds to build a push context.", registry=r)
        self.proxy_queue_time = LoopHistogram("pilot_proxy_queue_time", "Seconds a proxy waited in the push queue.",
                                          buckets=_PUSH_BUCKETS, registry=r)
        self.total_xds_rejects = Counter("pilot_total_xds_rejects", "Responses NACKed by proxies.",
                                         ["type"], registry=r)
        self.type_rejects = {
            t: Gauge(f"pilot_xds_{t}_reject", f"Proxies whose last {t.upper()} response was rejected.",
                     ["node", "err"], registry=r)
            for t in ("cds", "eds", "lds", "rds")
        }
        self.rejected_config = Gauge(
            "pilot_xds_rejected_config", "Proxies currently rejecting a resource built from this config object.",
            ["type", "config"], registry=r)
        # istiod's gauge (pilot/pkg/networking/core/envoyfilter/monitoring.go), name NS/NAME:
        # 1 once a patch of that type met a generated resource, 0 when its output was NACKed.
        self.envoy_filter_status = Gauge(
            "pilot_envoy_filter_status", "Status of Envoy filters whether it was applied or errored.",
            ["name", "type"], registry=r)
        self.xds_write_timeouts = Counter(
            "pilot_xds_write_timeout", "Pilot XDS response write timeouts (PILOT_XDS_SEND_TIMEOUT).",
            registry=r)
        # Not an istiod metric: istiod refuses none of these; one count per stream refused, by why.
        self.xds_refused_streams = Counter(
            "pilot_xds_refused_streams",
            "xDS streams ended by the server for a hostile or broken client, by reason.",
            ["reason"], registry=r)
        self.xds_clients = Gauge("pilot_xds", "Connected xDS clients.", ["version"], registry=r)
        self.config_events = Counter("pilot_k8s_cfg_events", "Config events by kind and operation.",
                                     ["type", "event"], registry=r)
        self.xds_config_size = LoopHistogram("pilot_xds_config_size_bytes", "Bytes in one xDS response.",
                                         ["type"], buckets=(1e3, 1e4, 1e5, 1e6, 4e6, 1e7), registry=r)
        self.push_triggers = Counter("pilot_push_triggers", "Pushes by reason.", ["type"], registry=r)
        self.config_rejections = Gauge("pilot_config_rejected", "Config documents currently rejected.",
                                       registry=r)
        self.cache_events = Counter("pilot_xds_cache_reads", "xDS cache reads.", ["type"], registry=r)
        self.sds_certificate_errors = Counter(
            "pilot_sds_certificate_errors_total",
            "Credential (SDS) requests refused or unservable: the proxy proved no identity or may not "
            "read the Secret, or the Secret is not a usable certificate.", registry=r)
        # The CA (istiod's citadel_server_* names), served on 15012.
        self.csr_count = Counter("citadel_server_csr_count", "CSRs received.", registry=r)
        self.authentication_failure_count = Counter(
            "citadel_server_authentication_failure_count", "CSRs refused because the caller is not authenticated.",
            registry=r)
        self.success_cert_issuance_count = Counter(
            "citadel_server_success_cert_issuance_count", "Certificates issued.", registry=r)
        self.csr_sign_error_count = Counter(
            "citadel_server_csr_sign_err_count", "CSRs refused or failed while signing, by error type.",
            ["type"], registry=r)
        self.csr_sign_seconds = Histogram(  # not an istiod metric
            "citadel_server_csr_sign_seconds", "Seconds to sign one CSR (in a worker thread).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1), registry=r)
        self.root_cert_expiry = Gauge("citadel_server_root_cert_expiry_timestamp",
                                      "Unix time the CA's root certificate expires.", registry=r)
        self.cert_chain_expiry = Gauge("citadel_server_cert_chain_expiry_timestamp",
                                       "Unix time the first certificate of the CA's chain expires.", registry=r)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    if v == float("-inf"):
        return "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v))


# istiod counters whose registered name itself ends in _total (prometheus_client folds it away).
# prometheus-client's own counters keep the standard `_total` too (process_cpu_seconds_total...).
_NAMED_TOTAL = frozenset({"pilot_sds_certificate_errors", "process_cpu_seconds",
                          "python_gc_objects_collected", "python_gc_objects_uncollectable", "python_gc_collections",
                          "sidecar_injection_requests", "sidecar_injection_success", "sidecar_injection_failure",
                          "sidecar_injection_skip"})


def render(registry: CollectorRegistry) -> bytes:
    """Prometheus text exposition with istiod's names: counters keep their bare name
    (`pilot_xds_pushes`, not `pilot_xds_pushes_total`), as istiod's exporter writes them without
    the counter suffix, so existing dashboards and alerts keep working."""
    lines: list[str] = []
    for family in registry.collect():
        name = family.name + ("_total" if family.name in _NAMED_TOTAL else "")
        lines.append(f"# HELP {name} {family.documentation}")
        lines.append(f"# TYPE {name} {family.type}")
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            sample = name if family.type == "counter" and s.name == f"{family.name}_total" else s.name
            labels = ",".join(f'{k}="{_escape(str(v))}"' for k, v in s.labels.items())
            lines.append(f"{sample}{{{labels}}} {_number(s.value)}" if labels else f"{sample} {_number(s.value)}")
    return ("\n".join(lines) + "\n").encode()
