"""The push path's metrics record without prometheus-client's lock per value (pilot/metrics.py
LoopHistogram, LoopCounter); what /metrics shows must stay what a plain Histogram and Counter
would show for the same observations: every bucket, count and sum (to the last bit), scraped
at any moment, for labelled children and unlabelled metrics alike."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from pilot.metrics import _FOLD_AT, LoopCounter, LoopHistogram, Metrics, render

BUCKETS = (0.01, 0.1, 0.5, 1, 3)


def _pair(labels: tuple[str, ...] = ()):
    plain, loop = CollectorRegistry(), CollectorRegistry()
    return (plain, loop, Histogram("t_seconds", "d", labels, buckets=BUCKETS, registry=plain),
            LoopHistogram("t_seconds", "d", labels, buckets=BUCKETS, registry=loop),
            Counter("t_pushes", "d", labels, registry=plain), LoopCounter("t_pushes", "d", labels, registry=loop))


def _exposed(registry: CollectorRegistry) -> list[str]:
    return [line for line in render(registry).decode().splitlines() if not line.startswith("#")]


def test_the_exposition_is_a_plain_histogram_and_counters_at_every_scrape():
    plain, loop, h, lh, c, lc = _pair(("type",))
    rng = random.Random(7)
    # Bounds themselves (a value on a bound is in that bucket), below the first, beyond the
    # last, negative: as Histogram buckets them. More values than a fold holds, scraped between.
    values = [rng.expovariate(2) for _ in range(3 * _FOLD_AT)] + [*BUCKETS, 0.0, -1.0, 1e9, float("inf")]
    rng.shuffle(values)
    for i, v in enumerate(values):
        t = ("cds", "eds")[i % 2]
        h.labels(t).observe(v)
        lh.labels(t).observe(v)
        c.labels(t).inc()
        lc.labels(t).inc()
        if i % 997 == 0:
            c.labels(t).inc(2.5)  # not one: the counter's own path, after what it had counted
            lc.labels(t).inc(2.5)
            assert _exposed(loop) == _exposed(plain)
    exposed = _exposed(loop)
    assert exposed == _exposed(plain)
    assert any(line.startswith('t_seconds_sum{type="cds"}') for line in exposed)


def test_an_unlabelled_histogram_and_the_parent_of_labelled_ones():
    plain, loop, h, lh, _, _ = _pair()
    for v in (0.003, 0.2, 7.0, float("nan")):  # NaN: in no bucket, the sum NaN, as Histogram
        h.observe(v)
        lh.observe(v)
    assert _exposed(loop) == _exposed(plain)
    _, _, _, parent, _, counter_parent = _pair(("type",))
    with pytest.raises(ValueError, match="missing label values"):
        parent.observe(1.0)
    with pytest.raises(ValueError, match="missing label values"):
        counter_parent.inc()


def test_the_push_path_metrics_are_the_loop_kinds_and_keep_their_names():
    m = Metrics()
    for metric in (m.xds_send_time, m.xds_push_time, m.xds_config_size, m.proxy_queue_time, m.proxy_convergence_time):
        assert isinstance(metric, LoopHistogram)
    assert isinstance(m.xds_pushes, LoopCounter)
    m.xds_pushes.labels("cds").inc()
    m.xds_config_size.labels("cds").observe(2048)
    text = render(m.registry).decode()
    assert 'pilot_xds_pushes{type="cds"} 1.0' in text  # istiod's bare counter name
    assert 'pilot_xds_config_size_bytes_bucket{type="cds",le="1000.0"} 0.0' in text
    assert 'pilot_xds_config_size_bytes_bucket{type="cds",le="10000.0"} 1.0' in text
    assert 'pilot_xds_config_size_bytes_count{type="cds"} 1.0' in text
