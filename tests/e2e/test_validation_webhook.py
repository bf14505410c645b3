"""The validation webhook (--httpsAddr) against the real server process: real TLS verified
against the CA root for istiod.istio-system.svc, real AdmissionReview JSON, the same reasons
file mode gives; in Kubernetes mode the fake apiserver calls the webhook as kube-apiserver does,
and the leader keeps the configuration's caBundle (and fail-closed policy) current."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
import uuid
from pathlib import Path

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from pilot.config.validation import InvalidObject, parse_object
from tests.fakes.apiserver import FakeApiServer
from tests.support.admission import apply, deployment_pod, review_request
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)

SERVER_NAME = "istiod.istio-system.svc"
NET = "networking.istio.io"
WEBHOOK_CONFIG = "istio-validator-istio-system"
DEPLOY_WEBHOOK = Path(__file__).resolve().parents[2] / "deploy" / "webhook.yaml"
DEPLOY_INJECTOR = Path(__file__).resolve().parents[2] / "deploy" / "mutatingwebhook.yaml"


def virtual_service(name: str, weights: tuple[int, ...] = (100,), **meta) -> dict:
    route = [{"destination": {"host": f"reviews-{i}"}, "weight": w} for i, w in enumerate(weights)]
    return {"apiVersion": f"{NET}/v1", "kind": "VirtualService",
            "metadata": {"name": name, "namespace": "default", **meta},
            "spec": {"hosts": ["reviews"], "http": [{"route": route}]}}


def review(obj: dict | None, operation: str = "CREATE", uid: str | None = None) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid or str(uuid.uuid4()), "operation": operation,
                        "kind": {"group": NET, "version": "v1", "kind": "VirtualService"},
                        "resource": {"group": NET, "version": "v1", "resource": "virtualservices"},
                        "namespace": "default", "name": (obj or {}).get("metadata", {}).get("name", ""),
                        "object": obj, "oldObject": None, "dryRun": False}}


def reason_of(obj: dict) -> str:
    with pytest.raises(InvalidObject) as e:
        parse_object(obj)
    return e.value.reason


class Webhook:
    """An HTTPS client that trusts only `root_pem` and checks the name istiod.istio-system.svc."""

    def __init__(self, port: int, root_pem: str) -> None:
        self.url = f"https://127.0.0.1:{port}"
        self.ctx = ssl.create_default_context(cadata=root_pem)

    async def post(self, body: bytes | dict, path: str = "/validate",
                   content_type: str = "application/json") -> tuple[int, str]:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ctx)) as s, \
                s.post(self.url + path, data=data, headers={"Content-Type": content_type},
                       server_hostname=SERVER_NAME) as r:
            return r.status, await r.text()

    async def review(self, body: dict, path: str = "/validate") -> dict:
        status, text = await self.post(body, path)
        assert status == 200, text
        answer = json.loads(text)
        assert answer["apiVersion"] == body["apiVersion"] and answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == body["request"]["uid"]
        return answer["response"]


async def test_file_mode_webhook_answers_with_the_reasons_file_mode_gives(tmp_path):
    async with ControlPlane(tmp_path, secure_grpc=True) as cp:
        hook = Webhook(cp.https_port, cp.root_cert())
        good, bad = virtual_service("good", (60, 40)), virtual_service("bad", (70, 50))

        # The same invalid object in the config directory: what file mode says about it.
        cp.write("bad.yaml", yaml.safe_dump(bad))

        async def file_reason() -> str | None:
            rejected = (await cp.debug("/debug/configz"))["rejected"]
            return next((r["reason"] for r in rejected if r["name"] == "bad"), None)

        reason = await wait_for(file_reason, timeout=10, message="file mode rejects bad.yaml")
        assert "100" in reason  # the weights must add up to 100

        request = review(good)
        assert await hook.review(request) == {"uid": request["request"]["uid"], "allowed": True}
        denied = await hook.review(review(bad))
        assert denied["allowed"] is False
        assert denied["status"] == {"code": 400, "message": f"configuration is invalid: {reason}"}
        # UPDATE is validated as CREATE; the old path name answers too; v1beta1 reviews are answered in kind.
        assert (await hook.review(review(bad, "UPDATE"), path="/admitpilot"))["allowed"] is False
        v1beta1 = {**review(bad), "apiVersion": "admission.k8s.io/v1beta1"}
        assert (await hook.review(v1beta1, path="/validate/"))["allowed"] is False

        # DELETE is never refused; kinds outside Istio's groups are not ours to judge.
        assert (await hook.review(review(None, "DELETE")))["allowed"] is True
        widget = {"apiVersion": "example.com/v1", "kind": "Widget",
                  "metadata": {"name": "w", "namespace": "default"}, "spec": {"anything": 1}}
        assert (await hook.review(review(widget)))["allowed"] is True
        # Telemetry is one of ours now: strict, as every served kind.
        telemetry = {"apiVersion": "telemetry.istio.io/v1", "kind": "Telemetry",
                     "metadata": {"name": "t", "namespace": "default"}, "spec": {"anything": 1}}
        refused = await hook.review(review(telemetry))
        assert refused["allowed"] is False and "spec.anything" in refused["status"]["message"], refused

        # istiod's always-reject marker (its readiness probe and istio's tests use it).
        marked = virtual_service("marked", annotations={"internal.istio.io/webhook-always-reject": "true"})
        assert (await hook.review(review(marked)))["status"]["message"] == (
            'configuration is invalid: "internal.istio.io/webhook-always-reject" annotation found, rejecting')
        extra = {**good, "extra": {}}
        assert (await hook.review(review(extra)))["status"]["message"] == (
            'unknown field "extra" on VirtualService resource default/good')

        # Not AdmissionReviews: clear errors, and the server keeps answering.
        assert await hook.post(b"") == (400, "no body found")
        assert (await hook.post(b"{}", content_type="text/plain"))[0] == 415
        status, text = await hook.post(b"{not json")
        assert status == 400 and text.startswith("could not decode body")
        assert (await hook.post(b"[1]"))[0] == 400
        no_uid = review(good)
        del no_uid["request"]["uid"]
        assert await hook.post(no_uid) == (400,
                                           "could not decode body: the AdmissionReview request has no uid")
        no_object = review(good)
        no_object["request"]["object"] = "nope"
        assert (await hook.review(no_object))["status"]["message"].startswith("cannot decode configuration")
        assert (await hook.review(review(good)))["allowed"] is True

        # istiod's metric names.
        metrics = await cp.metrics()
        passed = ('galley_validation_passed{group="networking.istio.io",version="v1",'
                  'resource="virtualservices"}')
        assert passed in metrics
        assert 'reason="invalid_config"' in metrics and "galley_validation_http_error{" in metrics

        # The certificate is issued for istiod's names only, by this CA only.
        other = ssl.create_default_context()
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=other)) as s:
                await s.post(hook.url + "/validate", data=b"{}", server_hostname=SERVER_NAME)
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=hook.ctx)) as s:
                await s.post(hook.url + "/validate", data=b"{}", server_hostname="evil.istio-system.svc")


def webhook_config(fake: FakeApiServer) -> dict:
    return (fake.get("validatingwebhookconfigurations.admissionregistration.k8s.io", WEBHOOK_CONFIG)
            or {"webhooks": [{}]})


def injector_bundles(fake: FakeApiServer) -> set[str]:
    config = fake.get("mutatingwebhookconfigurations.admissionregistration.k8s.io", "istio-sidecar-injector")
    return {base64.b64decode(wh.get("clientConfig", {}).get("caBundle", "")).decode()
            for wh in (config or {}).get("webhooks", [])}


def bundle_of(fake: FakeApiServer) -> tuple[str, str]:
    [wh] = webhook_config(fake)["webhooks"]
    bundle = base64.b64decode(wh.get("clientConfig", {}).get("caBundle", "")).decode()
    return bundle, wh.get("failurePolicy", "")


async def test_kube_mode_apiserver_refuses_invalid_config_through_the_webhook_and_the_bundle_follows_the_ca(
        tmp_path):
    from tests.unit.ca_fixtures import make_intermediate, root_files, write_dir

    cacerts = tmp_path / "cacerts"
    old_root, new_root = root_files("EC"), root_files("RSA")
    write_dir(cacerts, make_intermediate(old_root, cn="intermediate one"))
    async with FakeApiServer() as fake:
        for plural, kind in (("virtualservices", "VirtualService"), ("gateways", "Gateway")):
            fake.register_crd(NET, "v1", plural, kind)
        fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
        fake.create(yaml.safe_load(DEPLOY_WEBHOOK.read_text()))  # as deploy/ ships it: fail open, no bundle
        fake.create(yaml.safe_load(DEPLOY_INJECTOR.read_text()))  # the injector's, no bundle either
        fake.create({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": "shop", "labels": {"istio-injection": "enabled"}}})
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        cp = ControlPlane(tmp_path, kubeconfig=kubeconfig,
                          env={"ROOT_CA_DIR": str(cacerts), "PILOT_LEADER_RETRY_PERIOD": "500ms"})

        def istiod_endpoint() -> tuple[str, int] | None:
            """The Service istiod:443 -> 15017 (deploy/service.yaml), as soon as the port listens."""
            ports_file = cp.workdir / "ports.json"
            ports = json.loads(ports_file.read_text()) if ports_file.exists() else {}
            return ("127.0.0.1", ports["https"]) if "https" in ports else None

        fake.webhook_services[("istio-system", "istiod", 443)] = istiod_endpoint
        async with cp, fake.api_client() as api_client:
            old_pem = old_root["ca-cert.pem"]
            # The leader writes the root, then sees its probe refused and fails closed.
            await wait_for(lambda: bundle_of(fake) == (old_pem, "Fail"), timeout=30,
                           message=f"caBundle written and failurePolicy Fail\n{cp.log_tail()}")
            probe_refusal = 'denied: configuration is invalid: "internal.istio.io/webhook-always-reject"'
            assert any(name == "validation.istio.io" and outcome.startswith(probe_refusal)
                       for name, _op, outcome in fake.admission_calls)
            assert fake.get("gateways.networking.istio.io", "invalid-gateway",
                            namespace="istio-system") is None  # a dry run
            # The injector's configuration gets the same root, on every one of its webhooks.
            await wait_for(lambda: injector_bundles(fake) == {old_pem}, timeout=15,
                           message=f"injector caBundle written\n{cp.log_tail()}")
            # ... and /inject answers beside /validate on the same port and certificate.
            pod = deployment_pod(namespace="shop")
            status, text = await Webhook(cp.https_port, old_pem).post(review_request(pod), path="/inject")
            assert status == 200, text
            injected = apply(json.loads(text), pod)  # asserts allowed, with a JSONPatch
            assert "istio-proxy" in [c["name"] for c in injected["spec"]["containers"]]

            api = k8s.CustomObjectsApi(api_client)
            bad = virtual_service("bad", (70, 50))
            with pytest.raises(ApiException) as e:
                await api.create_namespaced_custom_object(NET, "v1", "default", "virtualservices", bad)
            assert e.value.status == 400
            message = json.loads(e.value.body)["message"]
            assert message == ('admission webhook "validation.istio.io" denied the request: '
                               f"configuration is invalid: {reason_of(bad)}")
            assert fake.get("virtualservices.networking.istio.io", "bad", namespace="default") is None
            await api.create_namespaced_custom_object(NET, "v1", "default", "virtualservices",
                                                      virtual_service("good", (60, 40)))
            # An UPDATE that breaks it is refused too; the stored object is unchanged.
            stored = fake.get("virtualservices.networking.istio.io", "good", namespace="default")
            broken = copy.deepcopy(stored)
            broken["spec"]["http"][0]["route"][0]["weight"] = 10
            with pytest.raises(ApiException) as e:
                await api.replace_namespaced_custom_object(NET, "v1", "default", "virtualservices", "good",
                                                           broken)
            assert e.value.status == 400 and "denied the request" in e.value.body

            # Someone blanks the bundle: written back.
            config = webhook_config(fake)
            config["webhooks"][0]["clientConfig"]["caBundle"] = ""
            fake.update(config)
            await wait_for(lambda: bundle_of(fake) == (old_pem, "Fail"), timeout=15,
                           message=f"caBundle restored\n{cp.log_tail()}")

            # The plugged-in CA rotates to a new root: the bundle and the serving certificate follow,
            # so the apiserver still reaches the webhook (no "failed calling webhook").
            write_dir(cacerts, make_intermediate(new_root, cn="intermediate two"))
            await wait_for(lambda: bundle_of(fake)[0] == new_root["ca-cert.pem"], timeout=30,
                           message=f"caBundle follows the new root\n{cp.log_tail()}")
            await wait_for(lambda: injector_bundles(fake) == {new_root["ca-cert.pem"]}, timeout=15,
                           message=f"injector caBundle follows the new root\n{cp.log_tail()}")

            async def refused_by_the_webhook() -> str | None:
                try:
                    await api.create_namespaced_custom_object(NET, "v1", "default", "virtualservices", bad)
                except ApiException as exc:
                    return exc.body if exc.status == 400 else None
                return None

            body = await wait_for(refused_by_the_webhook, timeout=15,
                                  message="webhook reached after rotation")
            assert "denied the request" in body
            hook = Webhook(cp.https_port, new_root["ca-cert.pem"])
            assert (await hook.review(review(virtual_service("ok"))))["allowed"] is True

            # Failing closed: with the control plane gone, the apiserver refuses rather than admits.
            await cp.stop()
            with pytest.raises(ApiException) as e:
                await api.create_namespaced_custom_object(NET, "v1", "default", "virtualservices",
                                                          virtual_service("later"))
            assert e.value.status == 500
            assert 'failed calling webhook "validation.istio.io"' in json.loads(e.value.body)["message"]


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_validate_latency_over_1000_reviews(tmp_path):
    """`make bench`: p50/p99 of /validate, measured by the client over one kept-alive TLS
    connection to the server process (half valid, half invalid VirtualServices). Prints JSON."""
    import statistics
    import time

    async with ControlPlane(tmp_path, secure_grpc=True) as cp:
        hook = Webhook(cp.https_port, cp.root_cert())
        bodies = [json.dumps(review(virtual_service(f"vs-{i}", (60, 40) if i % 2 else (70, 50)))).encode()
                  for i in range(1000)]
        latencies = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=hook.ctx, limit=1)) as s:
            for i, body in enumerate([bodies[0]] * 20 + bodies):  # 20 warm-up requests, not counted
                start = time.perf_counter()
                async with s.post(hook.url + "/validate", data=body, server_hostname=SERVER_NAME,
                                  headers={"Content-Type": "application/json"}) as r:
                    answer = await r.json()
                if i >= 20:
                    latencies.append(time.perf_counter() - start)
                    assert answer["response"]["allowed"] is bool((i - 20) % 2)
        q = statistics.quantiles(latencies, n=100)
        result = {"benchmark": "webhook_validate", "reviews": len(latencies),
                  "p50_ms": round(q[49] * 1000, 2), "p99_ms": round(q[98] * 1000, 2),
                  "max_ms": round(max(latencies) * 1000, 2)}

        # The same 1,000 from 8 concurrent connections (an apiserver with several requests in flight).
        async def one(s: aiohttp.ClientSession, body: bytes) -> float:
            start = time.perf_counter()
            async with s.post(hook.url + "/validate", data=body, server_hostname=SERVER_NAME,
                              headers={"Content-Type": "application/json"}) as r:
                await r.read()
            return time.perf_counter() - start

        concurrent: list[float] = []
        pending = iter(bodies)

        async def worker(s: aiohttp.ClientSession) -> None:  # one request in flight per worker
            for body in pending:
                concurrent.append(await one(s, body))

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=hook.ctx, limit=8)) as s:
            await asyncio.gather(*(one(s, bodies[0]) for _ in range(8)))  # open the 8 connections
            started = time.perf_counter()
            await asyncio.gather(*(worker(s) for _ in range(8)))
            elapsed = time.perf_counter() - started
        q8 = statistics.quantiles(concurrent, n=100)
        result["concurrent_8"] = {"p50_ms": round(q8[49] * 1000, 2), "p99_ms": round(q8[98] * 1000, 2),
                                  "reviews_per_s": round(len(bodies) / elapsed)}
        print(json.dumps(result))
        assert result["p99_ms"] < 100, result
