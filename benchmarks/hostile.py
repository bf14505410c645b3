"""Hostile xDS clients against the real control plane, with an event-loop lag probe.

    .venv/bin/python -m benchmarks.hostile [NAME=VALUE ...]   # server env, e.g. PILOT_XDS_SEND_TIMEOUT=2s

Runs the control plane in a child process (`serve`: bootstrap.ControlPlane plus a task that
sleeps 5 ms and records how late it wakes, i.e. how long the loop was blocked), then:
- a client that subscribes and keeps asking for CDS without ever reading (memory growth);
- one delta request with BIG_N (default 700,000) initial_resource_versions (answer, loop lag, memory).
Prints JSON. Measurement, not a test: figures move with the machine's load.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import psutil
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
SERVICES = 300
NAMES = [f"outbound|8080||s{i}.default.svc.cluster.local" for i in range(SERVICES)]


# --- the server side ------------------------------------------------------------------------
async def _probe(lag_file: str) -> None:
    interval = 0.005
    with open(lag_file, "w", buffering=1) as f:  # noqa: ASYNC230 - the probe writes a local file, line-buffered
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(interval)
            lag = time.perf_counter() - t0 - interval
            if lag > 0.002:
                f.write(f"{time.time():.4f} {lag * 1000:.1f}\n")


async def _serve(config_dir: str, lag_file: str, ports_file: str) -> None:
    from pilot import features as feat
    from pilot import logging as plog
    from pilot.bootstrap import ControlPlane
    from pilot.cli import Options

    opts = Options(config_dir=config_dir, kubeconfig=None, mesh_config="/nonexistent",
                   grpc_addr="127.0.0.1:0", secure_grpc_addr="", http_addr="127.0.0.1:0",
                   monitoring_addr="127.0.0.1:0", https_addr="",
                   domain="cluster.local", keepalive_max_server_connection_age=None,
                   log_output_level="default:info", log_as_json=False, ports_file=ports_file)
    plog.configure(plog.parse_level(opts.log_output_level), False)
    gc.set_threshold(50_000, 20, 20)  # as pilot.bootstrap.run does
    cp = ControlPlane(opts, feat.Features.from_env(dict(os.environ)))
    probe = asyncio.get_running_loop().create_task(_probe(lag_file))
    await cp.run_until_signalled()
    probe.cancel()


# --- the clients ------------------------------------------------------------------------------
def _node(i: int) -> base_pb2.Node:
    md = struct_pb2.Struct()
    md.update({"NAMESPACE": "default", "INTERCEPTION_MODE": "NONE"})
    return base_pb2.Node(id=f"sidecar~10.0.0.{i}~att-{i}.default~default.svc.cluster.local", metadata=md)


def _write_config(d: str) -> None:
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/svcs.yaml", "w") as f:
        f.write("---\n".join(f"""apiVersion: v1
kind: Service
metadata: {{name: s{i}, namespace: default}}
spec:
  clusterIP: 10.96.{i // 250}.{i % 250 + 1}
  ports: [{{name: http, port: 8080}}]
""" for i in range(SERVICES)))


def _lag_max(path: str, since: float, until: float) -> float:
    worst = 0.0
    with open(path) as f:
        for line in f:
            t, lag = map(float, line.split())
            if since <= t <= until:
                worst = max(worst, lag)
    return worst


async def _never_reading(port: int, seconds: float = 12.0) -> dict:
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = ch.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                            response_deserializer=None)()
    await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=_node(1)))
    n, end, held_back = 0, time.monotonic() + seconds, False
    while time.monotonic() < end:
        try:
            more = discovery_pb2.DiscoveryRequest(type_url=CDS, resource_names=NAMES)
            await asyncio.wait_for(call.write(more), 1.0)
        except TimeoutError:
            held_back = True  # the server stopped reading us: flow control holds the client
            break
        except Exception as e:  # noqa: BLE001 - the server ended the stream
            return {"requests_written": n, "ended": type(e).__name__}
        n += 1
    call.cancel()
    await ch.close()
    return {"requests_written": n, "held_back_by_flow_control": held_back}


async def _big_delta(port: int, count: int) -> dict:
    big = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=big)
    call = ch.stream_stream(DELTA, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
    req = discovery_pb2.DeltaDiscoveryRequest(type_url=EDS, node=_node(2))
    for i in range(count):
        req.initial_resource_versions[f"{i:07d}"] = "1"
    t0 = time.monotonic()
    await call.write(req)
    try:
        await asyncio.wait_for(call.read(), 20)
        answer = "response"
    except grpc.aio.AioRpcError as e:
        answer = f"{e.code().name}: {e.details()[:120]}"
    except TimeoutError:
        answer = "no answer in 20 s"
    took = time.monotonic() - t0
    call.cancel()
    await ch.close()
    return {"count": count, "bytes": req.ByteSize(), "answer": answer, "answer_s": round(took, 2)}


async def main(env: dict[str, str]) -> None:
    tmp = tempfile.mkdtemp(prefix="hostile-")
    cfg, ports_file, lag_file = f"{tmp}/cfg", f"{tmp}/ports.json", f"{tmp}/lag.txt"
    _write_config(cfg)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    log = open(f"{tmp}/server.log", "w")  # noqa: SIM115, ASYNC230 - open for the child's lifetime
    args = [sys.executable, "-m", "benchmarks.hostile", "serve", cfg, lag_file, ports_file]
    proc = subprocess.Popen(args, env={**os.environ, "PYTHONPATH": root, **env}, stdout=log,  # noqa: ASYNC220 - started once, before measuring
                            stderr=subprocess.STDOUT, cwd=root)
    try:
        def ports() -> dict:
            if not os.path.exists(ports_file):
                return {}
            with open(ports_file) as f:
                return json.load(f)
        for _ in range(600):
            if "grpc" in ports():
                break
            await asyncio.sleep(0.05)
        port = ports()["grpc"]
        server = psutil.Process(proc.pid)
        await asyncio.sleep(1.0)
        out: dict = {"server_env": env}
        rss0, t0 = server.memory_info().rss, time.time()
        out["never_reading"] = await _never_reading(port)
        out["never_reading"].update(seconds=round(time.time() - t0, 1),
                                    rss_growth_mb=round((server.memory_info().rss - rss0) / 2**20, 1))
        await asyncio.sleep(1.0)
        rss0, t0 = server.memory_info().rss, time.time()
        out["big_delta"] = await _big_delta(port, int(os.environ.get("BIG_N", "700000")))
        await asyncio.sleep(0.5)
        out["big_delta"].update(max_loop_lag_ms=_lag_max(lag_file, t0 - 0.1, time.time()),
                                rss_growth_mb=round((server.memory_info().rss - rss0) / 2**20, 1))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        log.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        asyncio.run(_serve(*sys.argv[2:5]))
    else:
        asyncio.run(main(dict(a.split("=", 1) for a in sys.argv[1:])))
