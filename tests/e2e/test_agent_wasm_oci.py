"""WasmPlugin with OCI images: the real pilot-agent pulls them from a registry on loopback
(tests/support/oci_registry.py, with a Bearer token challenge), verifies the image digest, takes
the module out (Wasm artifact and Docker image formats) and hands Envoy a local file; a wrong
digest fails closed; a registry wanting credentials gets them from the plugin's imagePullSecret,
which the control plane hands only to proxies of the plugin's namespace."""

from __future__ import annotations

import base64
import json
import textwrap

import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.e2e.test_agent_wasm_remote import get
from tests.e2e.test_pilot_agent import NAMESPACE, POD, agent, plane
from tests.support.backends import HttpBackend
from tests.support.oci_registry import Registry, artifact_image, docker_config, docker_image, oci_image
from tests.support.ports import free_port
from tests.support.wait import wait_for
from tests.support.wasm_module import add_response_header_module
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(150)
PASSWORD = "s3cret-registry-password"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer("ES256")


def plugin(url: str, extra: str = "", namespace: str = NAMESPACE) -> str:
    return textwrap.dedent(f"""\
        apiVersion: extensions.istio.io/v1alpha1
        kind: WasmPlugin
        metadata: {{name: image, namespace: {namespace}}}
        spec:
          url: {url}
          phase: STATS
        """) + textwrap.indent(textwrap.dedent(extra), "  ")


def pull_secret(registry: str, namespace: str = NAMESPACE) -> str:
    data = base64.b64encode(docker_config(registry, "puller", PASSWORD).encode()).decode()
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Secret
        metadata: {{name: regcred, namespace: {namespace}}}
        type: kubernetes.io/dockerconfigjson
        data: {{.dockerconfigjson: {data}}}
        """)


async def test_oci_images_are_pulled_verified_and_their_pull_secret_used(tmp_path, issuer):
    artifact = artifact_image(add_response_header_module("x-wasm-oci", "artifact"))
    docker = docker_image(add_response_header_module("x-wasm-oci", "docker"))
    private = oci_image(add_response_header_module("x-wasm-oci", "private"))
    port = free_port()
    async with (plane(tmp_path, issuer) as cp, HttpBackend("backend") as backend, Registry() as public,
                Registry(users={"puller": PASSWORD}) as locked):
        public.push("wasm/header", "v1", artifact)
        public.push("wasm/header", "v2", docker)
        locked.push("private/header", "v1", private)
        cp.write("backend.yaml", service_yaml("backend", port, namespace=NAMESPACE) + "---\n"
                 + endpoint_slice_yaml("backend", backend.port, namespace=NAMESPACE))
        async with agent(tmp_path, cp, issuer) as a:
            await a.wait_ready()

            async def answer(status: int, header: str | None):
                got = await get(port)
                if got is None or got[0] != status:
                    return None
                return got if got[1].get("x-wasm-oci") == header else None

            async def seen(status: int, header: str | None, what: str) -> None:
                await wait_for(lambda: answer(status, header), timeout=40,
                               message=f"{what}\n{a.log_tail()}\n{cp.log_tail()}")

            await seen(200, None, "routed")

            # 1. The Wasm artifact format, anonymous token from the registry's challenge.
            cp.write("plugin.yaml", plugin(f"oci://{public.host}/wasm/header:v1"))
            await seen(200, "artifact", "the artifact image's module")
            assert public.served["unauthorized"] >= 1 and public.served["token"] >= 1
            ecds = json.dumps(await a.admin_json("/config_dump?resource=ecds_filters"))
            assert "var/lib/istio/data/" in ecds and "oci://" not in ecds and "ISTIO_META" not in ecds, ecds

            # 2. The Docker image format, no scheme (istiod reads it as oci://), pinned by its digest.
            cp.write("plugin.yaml", plugin(f"{public.host}/wasm/header:v2", f"sha256: {docker.hex}\n"))
            await seen(200, "docker", "the docker image's module")

            # 3. A digest the image does not have: FAIL_CLOSE (the default) denies every request.
            # (Not another image of the repository: istio-agent caches by repository and digest, so
            # that one's module, already held, would rightly be used.)
            cp.write("plugin.yaml", plugin(f"oci://{public.host}/wasm/header:v2", f"sha256: {'ab' * 32}\n"))
            await seen(403, None, "fail closed on a wrong digest")
            assert "cannot fetch Wasm module" in a.log_text()

            # 4. A registry that wants credentials, and no pull secret: refused, fails closed.
            cp.write("plugin.yaml", plugin(f"oci://{locked.host}/private/header:v1", "pluginConfig: {try: 1}\n"))
            await wait_for(lambda: locked.served["unauthorized"] >= 1, timeout=40, message="asked the registry")
            await seen(403, None, "no credentials: fail closed")

            # 5. The plugin's imagePullSecret (a Secret of its namespace), named before it exists:
            # the agent is told it has none; the Secret alone then reaches the proxy, and it pulls.
            cp.write("plugin.yaml", plugin(f"oci://{locked.host}/private/header:v1", "imagePullSecret: regcred\n"))
            await wait_for(lambda: "missing image pulling secret" in a.log_text(), timeout=40,
                           message=f"no such Secret yet\n{a.log_tail()}")
            await seen(403, None, "still failing closed")
            cp.write("secret.yaml", pull_secret(locked.host))
            await seen(200, "private", "pulled with the pull secret's credentials")
            assert locked.served["token"] >= 1
            ecds = json.dumps(await a.admin_json("/config_dump?resource=ecds_filters"))
            # The control plane's dump of what it sends shows the secret as istiod does: redacted.
            sent = json.dumps(await cp.debug(f"/debug/config_dump?proxyID={POD}.{NAMESPACE}"))
            assert "ISTIO_META_WASM_IMAGE_PULL_SECRET" in sent and "<Redacted>" in sent
            encoded = base64.b64encode(f"puller:{PASSWORD}".encode()).decode()  # as in the docker config
            for text in (ecds, sent, a.log_text(), cp.log_tail(100_000)):
                assert PASSWORD not in text and encoded not in text
            assert "ISTIO_META" not in ecds

            # 6. A root-namespace plugin reaches every proxy, its Secret only its own namespace's
            # (stricter than istiod): this proxy's agent gets none and fails closed.
            tokens = locked.served["token"]
            missing = a.log_text().count("missing image pulling secret")
            cp.write("secret.yaml", pull_secret(locked.host, "istio-system"))
            cp.write("plugin.yaml", plugin(f"oci://{locked.host}/private/header:v1",
                                           "imagePullSecret: regcred\nimagePullPolicy: Always\n",
                                           namespace="istio-system"))
            await seen(403, None, "root namespace secret withheld: fail closed")
            assert a.log_text().count("missing image pulling secret") > missing
            assert locked.served["token"] == tokens

            # The agent's Wasm metrics, under istio-agent's names, on the merged metrics endpoint.
            status, text = await a.get("status", "/stats/prometheus")
            assert status == 200
            assert 'istio_agent_wasm_remote_fetch_count{result="success"}' in text
            assert 'istio_agent_wasm_remote_fetch_count{result="checksum_mismatched"}' in text
            assert "istio_agent_wasm_cache_entries 3" in text
