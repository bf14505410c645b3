"""The sidecar injector end to end: AdmissionReview v1 posted over real TLS to `/inject` (the
handler in an aiohttp app, certificate for istiod.istio-system.svc), the JSONPatch applied with
`jsonpatch`, and then the kubelet's part: the injected istio-proxy container's command, args, env
and volumes laid out and run as a process against the real control plane on its secure port. It
gets a certificate, Envoy gets config, and the rewritten app probe and merged metrics answer."""

from __future__ import annotations

import json
import os
import statistics
import time

import pytest
from aiohttp import web

from pilot.inject.config import InjectorConfigHolder, default_config_text
from pilot.inject.review import InjectionContext
from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.support.admission import apply, container, deployment_pod, env, review_request
from tests.support.agent import PilotAgent
from tests.support.backends import serve
from tests.support.control_plane import ControlPlane
from tests.support.injector import InjectorServer
from tests.support.kubelet import run_container
from tests.support.ports import free_ports
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(120)

NAMESPACES = {"shop": {"istio-injection": "enabled"}, "plain": {}}
TRUST_DOMAIN = "example.org"


def context(**kw) -> InjectionContext:
    kw.setdefault("config", InjectorConfigHolder())
    return InjectionContext(namespace_labels=NAMESPACES.get, **kw)


async def test_pods_are_injected_over_tls_and_bad_requests_get_istiods_answers():
    async with InjectorServer(context()) as srv:
        # A Deployment's pod with annotations, init containers and probes.
        pod = deployment_pod(
            annotations={
                "sidecar.istio.io/proxyCPU": "300m",
                "traffic.sidecar.istio.io/excludeOutboundPorts": "5432",
            },
            init_containers=[{"name": "migrate", "image": "migrate:1"}],
            containers=[
                {
                    "name": "web",
                    "image": "nginx",
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
                }
            ],
        )
        req = review_request(pod)
        resp = await srv.review(req)
        assert resp["response"]["uid"] == req["request"]["uid"]
        out = apply(resp, pod)
        assert [c["name"] for c in out["spec"]["initContainers"]] == ["migrate", "istio-init"]
        assert [c["name"] for c in out["spec"]["containers"]] == ["web", "istio-proxy"]
        assert container(out, "istio-proxy")["resources"] == {"requests": {"cpu": "300m"}}
        init_args = container(out, "istio-init", "initContainers")["args"]
        assert init_args[init_args.index("-o") + 1] == "5432"
        assert container(out, "web")["readinessProbe"]["httpGet"] == {
            "path": "/app-health/web/readyz",
            "port": 15020,
        }

        # Without annotations, on istiod's alias path.
        plain = deployment_pod(name="cart")
        out = apply(await srv.review(review_request(plain), "/inject/cluster/east/net/n1"), plain)
        assert env(container(out, "istio-proxy"))["ISTIO_META_CLUSTER_ID"] == "east"

        # hostNetwork pods and unselected namespaces are allowed untouched.
        for skip in (deployment_pod(hostNetwork=True), deployment_pod(namespace="plain")):
            r = (await srv.review(review_request(skip)))["response"]
            assert r["allowed"] is True and "patch" not in r

        # A bad annotation: refused, named.
        bad = deployment_pod(annotations={"sidecar.istio.io/interceptionMode": "IPVS"})
        r = (await srv.review(review_request(bad)))["response"]
        assert r["allowed"] is False and "sidecar.istio.io/interceptionMode" in r["status"]["message"]

        # istiod's HTTP answers: no body 400, wrong content type 415, not JSON: a refusing review.
        assert (await srv.post("/inject", b""))[0] == 400
        assert (await srv.post("/inject", b"{}", content_type="text/plain"))[0] == 415
        status, doc = await srv.post("/inject", b"{nope")
        assert status == 200 and doc["response"]["allowed"] is False
        assert doc["response"]["status"]["message"].startswith("could not decode body")


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer("ES256")


class _App:
    """The application container: /ready for its readiness probe, /metrics for Prometheus."""

    def __init__(self) -> None:
        self.healthy = True
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        async def ready(_r):
            return web.Response(status=200 if self.healthy else 503, text="ok")

        async def metrics(_r):
            return web.Response(text="# TYPE app_orders_total counter\napp_orders_total 7\n")

        app = web.Application()
        app.add_routes([web.get("/ready", ready), web.get("/metrics", metrics)])
        self.runner, self.port = await serve(app)


async def test_the_injected_istio_proxy_runs_as_the_kubelet_would_run_it(tmp_path, issuer):
    app = _App()
    await app.start()
    cp = ControlPlane(
        tmp_path,
        secure_grpc=True,
        mesh_config=f"trustDomain: {TRUST_DOMAIN}\n",
        env={"JWT_RULE": issuer.rule(), "CA_KEY_TYPE": "EC"},
    )
    # A service in the mesh: its (auto-mTLS) cluster makes Envoy ask the agent for `default`
    # (Envoy's own xDS connection goes through the agent and needs no certificate).
    cp.write("backend.yaml", service_yaml("backend", 18080, namespace="shop") + "---\n"
             + endpoint_slice_yaml("backend", 18081, namespace="shop"))
    try:
        await cp.start(timeout=60)  # a busy 2-core machine: start is CPU-bound, not a hang
        secure = f"127.0.0.1:{cp.secure_port}"
        holder = InjectorConfigHolder()
        assert holder.update(default_config_text(), json.dumps({"global": {"caAddress": secure}})) is None
        mesh = {"trustDomain": TRUST_DOMAIN, "defaultConfig": {"discoveryAddress": secure}}
        status_port, admin_port = free_ports(2)
        pod = deployment_pod(
            name="web",
            service_account="web",
            annotations={
                # No iptables on a test machine: the sidecar binds real ports (docs/architecture.md, Contracts).
                "sidecar.istio.io/interceptionMode": "NONE",
                "proxy.istio.io/config": json.dumps(
                    {"proxyAdminPort": admin_port, "statusPort": status_port, "concurrency": 1}
                ),
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(app.port),
            },
            containers=[
                {
                    "name": "web",
                    "image": "nginx",
                    "ports": [{"containerPort": app.port, "name": "http"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "timeoutSeconds": 10},
                }
            ],
        )
        async with InjectorServer(context(config=holder, mesh=mesh)) as srv:
            stored = apply(await srv.review(review_request(pod)), pod)
        # The apiserver names the pod after admission; the scheduler picks the node.
        stored["metadata"]["name"] = stored["metadata"]["generateName"] + "x2x7q"
        stored["spec"]["nodeName"] = "node-1"
        name = stored["metadata"]["name"]
        assert "initContainers" not in stored["spec"]

        root = tmp_path / "rootfs"
        proc = run_container(
            stored,
            "istio-proxy",
            root,
            token=issuer.token(namespace="shop", sa="web"),
            configmaps={"istio-ca-root-cert": {"root-cert.pem": cp.root_cert()}},
        )
        assert proc.command == ["pilot-agent"] and proc.args[:2] == ["proxy", "sidecar"]
        assert proc.args[2:4] == ["--domain", "shop.svc.cluster.local"]  # $(POD_NAMESPACE) expanded
        assert proc.cwd == root
        assert (root / "var/run/secrets/tokens/istio-token").is_file()
        assert (root / "var/run/secrets/istio/root-cert.pem").is_file()
        agent = PilotAgent(proc.cwd, env=proc.env, args=proc.args[2:], proxy_type=proc.args[1])
        async with agent:
            await agent.wait_ready(timeout=60)
            # The kubelet's readiness probe of istio-proxy, as injected.
            probe = container(stored, "istio-proxy")["readinessProbe"]["httpGet"]
            assert probe["port"] == status_port
            assert (await agent.get("status", probe["path"]))[0] == 200
            node_id = f"sidecar~127.0.0.1~{name}.shop~shop.svc.cluster.local"
            await cp.wait_synced(node_id, types=("cluster", "listener"), timeout=30)
            adsz = await cp.debug("/debug/adsz")
            (client,) = [c for c in adsz["clients"] if c["metadata"].get("NAME") == name]
            md = client["metadata"]
            assert md["NAMESPACE"] == "shop" and md["SERVICE_ACCOUNT"] == "web"
            assert md["WORKLOAD_NAME"] == "web" and md["MESH_ID"] == TRUST_DOMAIN
            assert md["INTERCEPTION_MODE"] == "NONE" and md["CLUSTER_ID"] == "Kubernetes"
            assert md["LABELS"]["security.istio.io/tlsMode"] == "istio"  # from the downward API file
            assert md["LABELS"]["app"] == "web" and "pod-template-hash" not in md["LABELS"]
            dump = await agent.admin_json("/config_dump?resource=dynamic_active_secrets")
            assert any(s["name"] == "default" for s in dump["configs"]), "no workload certificate in Envoy"

            # The app's readiness probe, rewritten to the agent, follows the app's health.
            app_probe = container(stored, "web")["readinessProbe"]["httpGet"]
            assert app_probe == {"path": "/app-health/web/readyz", "port": status_port}
            assert (await agent.get("status", app_probe["path"], timeout=15))[0] == 200
            app.healthy = False
            assert (await agent.get("status", app_probe["path"], timeout=15))[0] == 503
            app.healthy = True

            # Merged metrics where the rewritten annotations point: Envoy's and the app's.
            ann = stored["metadata"]["annotations"]
            assert (ann["prometheus.io/port"], ann["prometheus.io/path"]) == (
                str(status_port),
                "/stats/prometheus",
            )
            status, text = await agent.get("status", ann["prometheus.io/path"], timeout=15)
            assert status == 200 and "envoy_server_live" in text and "app_orders_total 7" in text
    finally:
        await cp.stop()
        await app.runner.cleanup()


@pytest.mark.slow
async def test_inject_latency_over_tls():
    """p50/p99 of `POST /inject` (TLS, keep-alive, one client in the same process) over 1,000
    AdmissionReviews: first 1,000 distinct Deployments (every render parsed anew, the worst case),
    then 1,000 replicas of 50 Deployments (a rollout: replicas render the same text). Prints JSON."""

    def body(i: int) -> bytes:
        pod = deployment_pod(
            name=f"w{i}",
            annotations={"sidecar.istio.io/proxyCPU": "100m"} if i % 2 else None,
            containers=[
                {
                    "name": "app",
                    "image": "x",
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/r", "port": 8080}},
                }
            ],
        )
        return json.dumps(review_request(pod)).encode()

    results = {}
    async with InjectorServer(context()) as srv:
        for b in [body(-i) for i in range(1, 21)]:  # warm up the connection and the template
            await srv.post("/inject", b)
        for scenario, bodies in (
            ("distinct", [body(i) for i in range(1000)]),
            ("replicas", [body(i % 50) for i in range(1000)]),
        ):
            took = []
            cpu0, started = time.process_time(), time.perf_counter()
            for b in bodies:
                t0 = time.perf_counter()
                status, doc = await srv.post("/inject", b)
                took.append(time.perf_counter() - t0)
                assert status == 200 and doc["response"]["allowed"] is True and doc["response"]["patch"]
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
            q = statistics.quantiles(took, n=100)
            results[scenario] = {
                "requests": len(took),
                "p50_ms": round(q[49] * 1000, 2),
                "p99_ms": round(q[98] * 1000, 2),
                "max_ms": round(max(took) * 1000, 2),
                "cpu_ms_per_request": round(cpu / len(took) * 1000, 2),
                "per_second": round(len(took) / wall, 1),
            }
    print(json.dumps({"benchmark": "inject_latency", "load_average": os.getloadavg()[0], **results}))
    # Loose bounds (a shared 2-core machine): CPU per request is what the server costs.
    assert results["distinct"]["cpu_ms_per_request"] < 30 and results["replicas"]["cpu_ms_per_request"] < 15
