"""ProxyConfig (networking.istio.io v1beta1) end to end in file mode: resources in the config
directory, real AdmissionReview JSON posted over TLS (verified against the control plane's root, as
istiod.istio-system.svc) to the running server's /inject, the JSONPatch applied; the injected
istio-proxy container carries the effective ProxyConfig in istiod's precedence (MeshConfig
defaultConfig < root namespace < namespace < proxy.istio.io/config < workload selector): its
concurrency as `--concurrency` and in PROXY_CONFIG, environmentVariables as container env, the
image type as the image tag's suffix. A ProxyConfig istiod would refuse is refused, by the file
source and the validation webhook, with the field named."""

from __future__ import annotations

import json
import ssl
import uuid

import aiohttp
import pytest
import yaml

from tests.support.admission import apply, container, deployment_pod, env, review_request
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(120)

SERVER_NAME = "istiod.istio-system.svc"
MESH = """\
defaultConfig:
  concurrency: 1
  proxyMetadata:
    FROM_MESH: mesh
    SHARED: mesh
"""


def proxy_config(namespace: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "networking.istio.io/v1beta1", "kind": "ProxyConfig",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


CONFIGS = [
    proxy_config("istio-system", "mesh-wide", {"environmentVariables": {"SHARED": "root", "FROM_ROOT": "r"},
                                               "image": {"imageType": "debug"}}),
    proxy_config("shop", "namespace-wide", {"concurrency": 3, "environmentVariables": {"SHARED": "shop"}}),
    proxy_config("shop", "web-only", {"selector": {"matchLabels": {"app": "web"}}, "concurrency": 5,
                                      "image": {"imageType": "distroless"},
                                      "environmentVariables": {"FROM_WORKLOAD": "w"}}),
]


class Https:
    def __init__(self, port: int, root_pem: str) -> None:
        self.url = f"https://127.0.0.1:{port}"
        self.ctx = ssl.create_default_context(cadata=root_pem)

    async def post(self, path: str, body: dict) -> dict:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ctx)) as s, \
                s.post(self.url + path, json=body, server_hostname=SERVER_NAME) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def inject(self, pod: dict) -> dict:
        answer = await self.post("/inject", review_request(pod))
        assert answer["response"]["allowed"] is True and "patch" in answer["response"], answer
        return container(apply(answer, pod), "istio-proxy")


def concurrency_arg(proxy: dict) -> str | None:
    args = proxy["args"]
    return args[args.index("--concurrency") + 1] if "--concurrency" in args else None


def proxy_config_env(proxy: dict) -> dict:
    return json.loads(env(proxy)["PROXY_CONFIG"])


async def test_proxy_configs_reach_the_injected_proxy_in_istiods_precedence(tmp_path):
    async with ControlPlane(tmp_path, secure_grpc=True, mesh_config=MESH) as cp:
        hook = Https(cp.https_port, cp.root_cert())
        cp.write("proxyconfigs.yaml", yaml.safe_dump_all(CONFIGS))

        async def loaded() -> bool:
            configs = (await cp.debug("/debug/configz"))["configs"]
            return sum(c["kind"] == "ProxyConfig" for c in configs) == len(CONFIGS)

        await wait_for(loaded, timeout=20, message="the ProxyConfigs are in /debug/configz")

        # The selected workload: its own ProxyConfig over everything; env maps merge by key.
        web = await hook.inject(deployment_pod(name="web", namespace="shop", labels={"app": "web"}))
        assert concurrency_arg(web) == "5"
        assert web["image"].endswith("-distroless")
        e = env(web)
        assert (e["FROM_MESH"], e["FROM_ROOT"], e["SHARED"], e["FROM_WORKLOAD"]) == ("mesh", "r", "shop", "w")
        pc = proxy_config_env(web)
        assert pc["concurrency"] == 5 and pc["image"] == {"imageType": "distroless"}
        assert pc["proxyMetadata"] == {"FROM_MESH": "mesh", "SHARED": "shop", "FROM_ROOT": "r", "FROM_WORKLOAD": "w"}

        # Another workload of the namespace: the namespace's, then the root namespace's image type.
        cart = await hook.inject(deployment_pod(name="cart", namespace="shop", labels={"app": "cart"}))
        assert concurrency_arg(cart) == "3" and cart["image"].endswith("-debug")
        assert "FROM_WORKLOAD" not in env(cart) and env(cart)["SHARED"] == "shop"

        # Another namespace: mesh-wide only, over MeshConfig defaultConfig.
        other = await hook.inject(deployment_pod(name="api", namespace="billing", labels={"app": "web"}))
        assert concurrency_arg(other) == "1" and other["image"].endswith("-debug")
        assert env(other)["SHARED"] == "root" and "FROM_WORKLOAD" not in env(other)

        # The annotation sits between the namespace and the workload's ProxyConfig, and the image
        # type annotation wins over all of them.
        note = {"proxy.istio.io/config": "concurrency: 7\nproxyMetadata: {SHARED: pod}"}
        cart = await hook.inject(deployment_pod(name="cart", namespace="shop", labels={"app": "cart"},
                                                annotations=note))
        assert concurrency_arg(cart) == "7" and env(cart)["SHARED"] == "pod"
        web = await hook.inject(deployment_pod(name="web", namespace="shop", labels={"app": "web"},
                                               annotations={**note, "sidecar.istio.io/proxyImageType": "default"}))
        assert concurrency_arg(web) == "5" and env(web)["SHARED"] == "pod"
        assert not web["image"].endswith(("-distroless", "-debug"))

        # Removing the workload's ProxyConfig: the next pod gets the namespace's.
        cp.write("proxyconfigs.yaml", yaml.safe_dump_all(CONFIGS[:2]))

        async def namespace_wide() -> bool:
            web = await hook.inject(deployment_pod(name="web", namespace="shop", labels={"app": "web"}))
            return concurrency_arg(web) == "3" and web["image"].endswith("-debug")

        await wait_for(namespace_wide, timeout=20, message="web falls back to the namespace's ProxyConfig")


async def test_invalid_proxy_configs_are_refused_by_file_mode_and_the_webhook(tmp_path):
    async with ControlPlane(tmp_path, secure_grpc=True) as cp:
        hook = Https(cp.https_port, cp.root_cert())
        bad = proxy_config("shop", "bad", {"concurrency": -1})
        cp.write("bad.yaml", yaml.safe_dump(bad))

        async def file_reason() -> str | None:
            rejected = (await cp.debug("/debug/configz"))["rejected"]
            return next((r["reason"] for r in rejected if r["name"] == "bad"), None)

        reason = await wait_for(file_reason, timeout=20, message="file mode rejects bad.yaml")
        assert "concurrency" in reason

        for spec, named in (({"concurrency": -1}, "concurrency"), ({"image": {"imageType": "Bad Type"}}, "imageType"),
                            ({"environmentVariables": {"1=x": "y"}}, "environmentVariables"),
                            ({"concurency": 2}, "concurency")):
            obj = proxy_config("shop", "bad", spec)
            request = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": str(uuid.uuid4()), "operation": "CREATE",
                                   "kind": {"group": "networking.istio.io", "version": "v1beta1", "kind": "ProxyConfig"},
                                   "resource": {"group": "networking.istio.io", "version": "v1beta1",
                                                "resource": "proxyconfigs"},
                                   "namespace": "shop", "name": "bad", "object": obj, "oldObject": None}}
            answer = (await hook.post("/validate", request))["response"]
            assert answer["allowed"] is False and named in answer["status"]["message"], answer
        good = {**request, "request": {**request["request"], "object": proxy_config("shop", "ok", {"concurrency": 0})}}
        assert (await hook.post("/validate", good))["response"]["allowed"] is True


async def test_kubernetes_mode_watches_proxy_configs(tmp_path):
    """The same delivery from the apiserver: a ProxyConfig created after start reaches the next pod."""
    import base64

    from tests.fakes.apiserver import FakeApiServer

    async with FakeApiServer() as fake:
        fake.register_crd("networking.istio.io", "v1beta1", "proxyconfigs", "ProxyConfig")
        for ns, labels in (("istio-system", {}), ("shop", {"istio-injection": "enabled"})):
            fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}})
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        async with ControlPlane(tmp_path, kubeconfig=kubeconfig) as cp:
            secret = await wait_for(lambda: fake.get("secrets", "istio-ca-secret", namespace="istio-system"),
                                    timeout=30, message="the CA root is written")
            hook = Https(cp.https_port, base64.b64decode(secret["data"]["ca-cert.pem"]).decode())
            pod = deployment_pod(name="web", namespace="shop", labels={"app": "web"})
            assert concurrency_arg(await hook.inject(pod)) is None  # nothing set anywhere: the agent's default
            fake.create(CONFIGS[2])

            async def delivered() -> bool:
                web = await hook.inject(pod)
                return concurrency_arg(web) == "5" and env(web).get("FROM_WORKLOAD") == "w"

            await wait_for(delivered, timeout=30, message=f"the watched ProxyConfig applies\n{cp.log_tail()}")
