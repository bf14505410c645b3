"""A frozen Envoy (SIGSTOP) must not slow anyone else's config: the next push never waits for a
proxy that is not reading, PILOT_XDS_SEND_TIMEOUT closes its stream with a logged reason, and
once thawed it reconnects and converges."""

from __future__ import annotations

import contextlib
import json
import signal
import time

from tests.e2e.test_stream_limits import metric, services_yaml
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.wait import wait_for

FROZEN = sidecar_node_id("frozen-1")
HEALTHY = sidecar_node_id("healthy-1")
SEND_TIMEOUT = 8.0  # long enough that the frozen stream is still stalled while others are measured
DEBOUNCE_MAX = 10.0  # istiod's default, explicit: before the fix every edit took this long
FAST = 5.0  # an edit must reach the healthy Envoy well within DEBOUNCE_MAX, even on a busy machine
SERVICE = """
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: 10.97.0.{n}
  ports: [{{name: http, port: 8080}}]
"""


def cluster(name: str) -> str:
    return f"outbound|8080||{name}.default.svc.cluster.local"


async def active_clusters(envoy: Envoy) -> set[str]:
    dump = await envoy.config_dump(resource="dynamic_active_clusters", mask="cluster.name")
    return {c["cluster"]["name"] for c in dump.get("configs", [])}


def small_windows(bootstrap: dict) -> dict:
    """HTTP/2 windows of 64 KiB on the xDS connection (Envoy's default is 256 MiB): a frozen
    Envoy then stops the server's writes after one response, not after hundreds of megabytes."""
    xds = next(c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "xds-grpc")
    protocol = xds["typed_extension_protocol_options"]
    options = protocol["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    options["explicit_http_config"]["http2_protocol_options"] = {
        "initial_stream_window_size": 65536, "initial_connection_window_size": 65536}
    return bootstrap


async def test_a_frozen_envoy_does_not_slow_the_others_and_converges_after_thawing(tmp_path):
    cp = ControlPlane(tmp_path, env={"PILOT_XDS_SEND_TIMEOUT": f"{SEND_TIMEOUT:g}s",
                                     "PILOT_DEBOUNCE_MAX": f"{DEBOUNCE_MAX:g}s"})
    cp.write("svcs.yaml", services_yaml(300))
    async with cp, \
            Envoy(small_windows(Envoy.bootstrap(FROZEN, cp.xds_port)), tmp_path) as frozen, \
            Envoy(Envoy.bootstrap(HEALTHY, cp.xds_port), tmp_path) as healthy:
        await frozen.wait_ready(20)
        await healthy.wait_ready(20)
        await cp.wait_synced(FROZEN, types=("cluster", "listener"), timeout=30)
        await cp.wait_synced(HEALTHY, types=("cluster", "listener"), timeout=30)

        async def edit_reaches_healthy(n: int) -> float:
            name = f"edit{n}"
            t0 = time.monotonic()
            cp.write(f"{name}.yaml", SERVICE.format(name=name, n=n))
            await wait_for(lambda: _has(healthy, cluster(name)), 20, message=f"{name} at the healthy Envoy")
            return time.monotonic() - t0

        async def frozen_row() -> dict | None:
            rows = await cp.debug("/debug/connections")
            return next((r for r in rows if r["proxy"] == FROZEN), None)

        frozen.proc.send_signal(signal.SIGSTOP)
        try:
            # Edits until the frozen Envoy's stream has a response it does not read.
            latencies = []
            stalled = None
            for n in range(1, 20):
                latencies.append(await edit_reaches_healthy(n))
                row = await frozen_row()
                if row is not None and row["state"] == "writing":
                    stalled = row
                    break
            assert stalled is not None, f"the frozen Envoy's stream never stalled: {await frozen_row()}"
            assert stalled["bytesQueued"] > 0
            # While it is stalled, an edit reaches the healthy Envoy at debounce speed, not
            # after PILOT_DEBOUNCE_MAX (10 s), which is what it took when pushes waited for it.
            during = await edit_reaches_healthy(100)
            still_stalled = await frozen_row()
            latencies.append(during)
            print(json.dumps({"healthy_edit_latency_s": [round(x, 3) for x in latencies],
                              "during_stall_s": round(during, 3), "frozen_row": still_stalled}))
            assert max(latencies) < FAST, latencies
            assert still_stalled is not None and still_stalled["state"] == "writing", still_stalled

            # The frozen stream is closed, with its reason logged, and counted.
            await wait_for(lambda: _closed_line(cp), SEND_TIMEOUT + 15, message="frozen stream closed")
            assert "PILOT_XDS_SEND_TIMEOUT" in _closed_line(cp)
            await wait_for(lambda: frozen_row_gone(cp), 10, message="frozen stream left /debug/connections")
            assert metric(await cp.metrics(), "pilot_xds_write_timeout") >= 1
            # Others keep converging after it left, too.
            assert await edit_reaches_healthy(101) < FAST
        finally:
            with contextlib.suppress(ProcessLookupError):
                frozen.proc.send_signal(signal.SIGCONT)

        # Thawed, it reconnects (Envoy retries ADS on its own) and gets everything it missed.
        await wait_for(lambda: _has(frozen, cluster("edit101")), 60, message="the thawed Envoy converged")
        await wait_for(lambda: _has(frozen, cluster("edit100")), 5)


async def _has(envoy: Envoy, name: str) -> bool:
    return name in await active_clusters(envoy)


def _closed_line(cp: ControlPlane) -> str:
    for line in cp.log_path.read_text().splitlines():
        if "closing stream: the proxy is not reading" in line and FROZEN in line:
            return line
    return ""


async def frozen_row_gone(cp: ControlPlane) -> bool:
    return all(r["proxy"] != FROZEN for r in await cp.debug("/debug/connections"))
