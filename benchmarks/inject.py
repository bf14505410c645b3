"""Injection figures for the closing note: `python -m benchmarks.inject [--requests N] [--starts N]`.

1. `/inject` latency: the real control plane (`pilot-discovery` in its own process, file mode
   with the secure port, so the webhook port serves TLS with a certificate from its CA) answers N
   AdmissionReviews of distinct Deployments (every render new: the worst case), posted one at a
   time over one keep-alive TLS connection that trusts only the mesh root. p50/p99/max of the
   round trip; the JSONPatch of each answer is checked to add istio-proxy.
2. Sidecar start: the pod as injected (the same injector code, values pointing at the control
   plane's secure port), laid out as the kubelet would (tests/support/kubelet.py: projected token,
   the root ConfigMap, downward API files), its istio-proxy command run as a process; the time
   from spawning it to its readiness probe (`/healthz/ready` on the injected status port)
   answering 200: certificate fetched, Envoy started and configured. Repeated `--starts` times.

Writes benchmarks/results/inject.json and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from pilot.inject.config import InjectorConfigHolder, default_config_text
from pilot.inject.review import InjectionContext
from tests.support.admission import apply, container, deployment_pod, review_request
from tests.support.agent import PilotAgent
from tests.support.control_plane import ControlPlane
from tests.support.injector import InjectorServer
from tests.support.kubelet import run_container
from tests.support.ports import free_ports
from tests.unit.test_authn import Issuer

RESULTS = Path(__file__).resolve().parent / "results" / "inject.json"
TRUST_DOMAIN = "cluster.local"


def _body(i: int) -> bytes:
    pod = deployment_pod(name=f"w{i}", annotations={"sidecar.istio.io/proxyCPU": "100m"} if i % 2 else None,
                         containers=[{"name": "app", "image": "x", "ports": [{"containerPort": 8080}],
                                      "readinessProbe": {"httpGet": {"path": "/r", "port": 8080}}}])
    return json.dumps(review_request(pod)).encode()


async def inject_latency(cp: ControlPlane, requests: int) -> dict:
    ctx = ssl.create_default_context(cadata=cp.root_cert())
    url = f"https://127.0.0.1:{cp.https_port}/inject"
    took: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1)) as session:
        async def post(body: bytes) -> dict:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                    server_hostname="istiod.istio-system.svc") as r:
                assert r.status == 200, await r.text()
                return await r.json()

        for i in range(1, 21):  # the TLS handshake and the first template renders are not measured
            await post(_body(-i))
        bodies = [_body(i) for i in range(requests)]
        started = time.perf_counter()
        for i, body in enumerate(bodies):
            t0 = time.perf_counter()
            answer = await post(body)
            took.append(time.perf_counter() - t0)
            if i % 100 == 0:  # the answer is a real patch that adds the sidecar
                pod = json.loads(body)["request"]["object"]
                assert container(apply(answer, pod), "istio-proxy")["name"] == "istio-proxy"
        wall = time.perf_counter() - started
    q = statistics.quantiles(took, n=100)
    return {"requests": requests, "p50_ms": round(q[49] * 1000, 2), "p99_ms": round(q[98] * 1000, 2),
            "max_ms": round(max(took) * 1000, 2), "per_second": round(requests / wall, 1)}


async def sidecar_start(cp: ControlPlane, issuer: Issuer, workdir: Path, run: int) -> float:
    secure = f"127.0.0.1:{cp.secure_port}"
    holder = InjectorConfigHolder()
    assert holder.update(default_config_text(), json.dumps({"global": {"caAddress": secure}})) is None
    status_port, admin_port = free_ports(2)
    pod = deployment_pod(name="web", annotations={
        "sidecar.istio.io/interceptionMode": "NONE",  # no iptables here: the sidecar binds real ports
        "proxy.istio.io/config": json.dumps({"proxyAdminPort": admin_port, "statusPort": status_port,
                                             "concurrency": 1})})
    ctx = InjectionContext(config=holder, namespace_labels=lambda _ns: None,
                           mesh={"trustDomain": TRUST_DOMAIN, "defaultConfig": {"discoveryAddress": secure}})
    async with InjectorServer(ctx) as srv:
        stored = apply(await srv.review(review_request(pod)), pod)
    stored["metadata"]["name"] = f"web-7d9f8b6c4d-run{run}"
    stored["spec"]["nodeName"] = "node-1"
    proc = run_container(stored, "istio-proxy", workdir / f"root{run}", token=issuer.token(namespace="shop", sa="web"),
                         configmaps={"istio-ca-root-cert": {"root-cert.pem": cp.root_cert()}})
    probe = container(stored, "istio-proxy")["readinessProbe"]["httpGet"]
    agent = PilotAgent(proc.cwd, env=proc.env, args=proc.args[2:], proxy_type=proc.args[1])
    url = f"http://127.0.0.1:{probe['port']}{probe['path']}"
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        await agent.start()
        try:
            while True:
                try:
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                        if r.status == 200:
                            return time.perf_counter() - t0
                except (aiohttp.ClientError, TimeoutError):
                    pass
                if agent.proc.returncode is not None or time.perf_counter() - t0 > 120:
                    raise RuntimeError(f"the sidecar never became ready\n{agent.log_tail()}")
                await asyncio.sleep(0.01)
        finally:
            await agent.stop()


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.inject")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--starts", type=int, default=3)
    args = p.parse_args(argv)
    issuer = Issuer("ES256")
    with tempfile.TemporaryDirectory() as tmp:
        cp = ControlPlane(tmp, secure_grpc=True, mesh_config=f"trustDomain: {TRUST_DOMAIN}\n",
                          env={"JWT_RULE": issuer.rule(), "CA_KEY_TYPE": "EC"})
        async with cp:
            latency = await inject_latency(cp, args.requests)
            starts = [await sidecar_start(cp, issuer, Path(tmp), i) for i in range(args.starts)]
    result = {"benchmark": "inject", "load_average_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
              "python": sys.version.split()[0], "inject_over_tls": latency,
              "sidecar_start_to_ready_s": {"runs": [round(s, 2) for s in starts],
                                           "median": round(statistics.median(starts), 2)}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
