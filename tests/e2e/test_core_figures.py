"""The core issue's figures (marked slow: `make bench` runs them), printed as FIGURES lines:
file write -> Envoy's EDS ACK at the default 100 ms debounce, SotW and delta; cold start of an
Envoy to /ready against 100 services; the server's peak RSS meanwhile."""

from __future__ import annotations

import json
import statistics
import time

import psutil
import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_file_write_to_ack(tmp_path, delta, capsys):
    backends = [await HttpBackend(n).start() for n in "ab"]
    cp = ControlPlane(tmp_path, env={"PILOT_DEBOUNCE_AFTER": "100ms"})
    cp.write("svc.yaml", service_yaml("web", free_port()))
    cp.write("eps.yaml", endpoint_slice_yaml("web", backends[0].port))
    node = sidecar_node_id("figures")
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(node, cp.xds_port, delta=delta), tmp_path)
        await envoy.wait_ready()
        await cp.wait_synced(node)
        samples = []
        for i in range(25):
            before = (await cp.sync_status(node))["endpoint_acked"]
            t0 = time.monotonic()
            cp.write("eps.yaml", endpoint_slice_yaml("web", backends[(i + 1) % 2].port))

            async def acked(before=before) -> bool:
                row = await cp.sync_status(node)
                return row["endpoint_acked"] != before and row["endpoint_sent"] == row["endpoint_acked"]

            await wait_for(acked, timeout=10, interval=0.005)
            samples.append((time.monotonic() - t0) * 1000)
        samples.sort()
        with capsys.disabled():
            print("\nFIGURES " + json.dumps({"write_to_ack_ms": {"mode": "delta" if delta else "sotw",
                                                                 "edits": len(samples),
                                                                 "median": round(statistics.median(samples), 1),
                                                                 "p99": round(samples[-1], 1)}}))
    finally:
        await envoy.stop()
        await cp.stop()
        for b in backends:
            await b.stop()


async def test_cold_start_against_100_services(tmp_path, capsys):
    cp = ControlPlane(tmp_path)
    for i in range(100):
        cp.write(f"svc{i}.yaml", service_yaml(f"svc{i}", 20000 + i) + "---\n"
                 + endpoint_slice_yaml(f"svc{i}", 9000))
    await cp.start()
    server = psutil.Process(cp.proc.pid)
    peak = server.memory_info().rss
    times = []
    try:
        for k in range(5):
            envoy = Envoy()
            t0 = time.monotonic()
            await envoy.start(Envoy.bootstrap(sidecar_node_id(f"cold{k}"), cp.xds_port), tmp_path)
            await envoy.wait_ready(30)
            times.append(time.monotonic() - t0)
            peak = max(peak, server.memory_info().rss)
            await envoy.stop()
        with capsys.disabled():
            print("\nFIGURES " + json.dumps({"cold_start_100_services_s": {
                "median": round(statistics.median(times), 3), "max": round(max(times), 3)},
                "server_peak_rss_mb": round(peak / 2**20, 1)}))
    finally:
        await cp.stop()
