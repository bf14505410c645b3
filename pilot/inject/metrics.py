"""istiod's injection metrics (pkg/kube/inject/monitoring.go), on a registry the caller owns."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class InjectionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        # prometheus-client appends _total to counters: these expose istiod's exact names.
        self.requests = Counter(
            "sidecar_injection_requests", "Total number of sidecar injection requests.", registry=r
        )
        self.success = Counter(
            "sidecar_injection_success", "Total number of successful sidecar injection requests.", registry=r
        )
        self.failure = Counter(
            "sidecar_injection_failure", "Total number of failed sidecar injection requests.", registry=r
        )
        self.skip = Counter(
            "sidecar_injection_skip", "Total number of skipped sidecar injection requests.", registry=r
        )
        self.time = Histogram(
            "sidecar_injection_time_seconds",
            "Total time taken for injection in seconds.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
            registry=r,
        )
