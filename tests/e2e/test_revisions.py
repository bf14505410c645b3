"""Two control planes, REVISION=default and REVISION=canary, against one (fake) apiserver, driven
by kubernetes-asyncio and `pilotctl tag` as a user would:

- each reads only the config objects of its revision (and the unlabelled ones);
- a namespace labelled for one revision gets its pods injected by that revision only, pointing at
  that revision's Service (istiod-canary) for xDS and certificates; relabelled, the other one
  takes over;
- `pilotctl tag set default --revision canary` writes istio-revision-tag-default as istioctl
  does (the canary's injector, the default tag's selectors, the old default's webhooks turned
  off, istiod-default-validator) and from then on the canary injects `default` and
  `istio-injection=enabled` namespaces while the default revision leaves them alone.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import sys
from pathlib import Path

import aiohttp
import yaml
from kubernetes_asyncio import client as k8s

from pilot.deploy_revision import revision_objects
from tests.fakes.apiserver import FakeApiServer
from tests.support.admission import apply, container, deployment_pod, env, review_request
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for

NET = "networking.istio.io"
REPO = Path(__file__).resolve().parents[2]
MWC = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
VWC = "validatingwebhookconfigurations.admissionregistration.k8s.io"
FAST_LEASES = {"PILOT_LEADER_LEASE_DURATION": "3s", "PILOT_LEADER_RENEW_DEADLINE": "2s",
               "PILOT_LEADER_RETRY_PERIOD": "500ms"}


def bundles(fake: FakeApiServer, resource: str, name: str) -> set[str]:
    return {w.get("clientConfig", {}).get("caBundle", "") for w in fake.get(resource, name)["webhooks"]}


def virtual_service(name: str, revision: str | None) -> dict:
    meta: dict = {"name": name, "namespace": "shop"}
    if revision is not None:
        meta["labels"] = {"istio.io/rev": revision}
    return {"apiVersion": f"{NET}/v1", "kind": "VirtualService", "metadata": meta,
            "spec": {"hosts": [f"{name}.shop.svc.cluster.local"],
                     "http": [{"route": [{"destination": {"host": "web.shop.svc.cluster.local"}}]}]}}


class Injector:
    """POST /inject over TLS to one control plane, trusting the mesh root, by its Service name."""

    def __init__(self, cp: ControlPlane, fake: FakeApiServer, service: str) -> None:
        self.cp, self.fake, self.service = cp, fake, service

    async def review(self, pod: dict) -> dict:
        secret = self.fake.get("secrets", "istio-ca-secret", namespace="istio-system")
        root = base64.b64decode(secret["data"]["ca-cert.pem"]).decode()
        ctx = ssl.create_default_context(cadata=root)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
                s.post(f"https://127.0.0.1:{self.cp.https_port}/inject", json=review_request(pod),
                       server_hostname=f"{self.service}.istio-system.svc") as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def injected(self, namespace: str) -> dict | None:
        """The injected pod, or None when this control plane leaves the pod alone."""
        pod = deployment_pod(namespace=namespace)
        answer = await self.review(pod)
        if "patch" not in answer["response"]:
            assert answer["response"]["allowed"] is True, answer
            return None
        return apply(answer, pod)


def served_by(pod: dict | None) -> str | None:
    """Which Service the injected proxy reaches for xDS (PROXY_CONFIG) and certificates (CA_ADDR)."""
    if pod is None:
        return None
    e = env(container(pod, "istio-proxy"))
    discovery = json.loads(e["PROXY_CONFIG"])["discoveryAddress"]
    assert e["CA_ADDR"] == discovery, (e["CA_ADDR"], discovery)
    revision = pod["metadata"]["annotations"]["istio.io/rev"]  # the injecting revision, as istiod notes it
    assert discovery == f"istiod{'' if revision == 'default' else '-' + revision}.istio-system.svc:15012"
    return discovery


async def configz_names(cp: ControlPlane) -> set[str]:
    return {c["name"] for c in (await cp.debug("/debug/configz"))["configs"] if c["kind"] == "VirtualService"}


async def pilotctl(kubeconfig: str, *args: str, global_flag: bool = False) -> tuple[int, str, str]:
    """`pilotctl tag --kubeconfig K ARGS`, or with pilotctl's own flag: `pilotctl --kubeconfig K tag ARGS`."""
    flags = ["--kubeconfig", kubeconfig, "tag"] if global_flag else ["tag", "--kubeconfig", kubeconfig]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pilot.pilotctl", *flags, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(REPO))
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode, out.decode(), err.decode()


async def test_each_revision_serves_its_namespaces_and_config_and_a_tag_moves_them(tmp_path):
    async with FakeApiServer() as fake:
        fake.register_crd(NET, "v1", "virtualservices", "VirtualService")
        fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
        fake.create(yaml.safe_load((REPO / "deploy" / "mutatingwebhook.yaml").read_text()))
        fake.create(yaml.safe_load((REPO / "deploy" / "webhook.yaml").read_text()))
        for obj in revision_objects("canary"):  # what `python -m pilot.deploy_revision canary` applies
            if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                fake.create(obj)
        fake.create({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": "shop", "labels": {"istio.io/rev": "canary"}}})
        fake.create({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": "legacy", "labels": {"istio-injection": "enabled"}}})
        for name, rev in (("vs-canary", "canary"), ("vs-default", "default"), ("vs-global", None)):
            fake.create(virtual_service(name, rev))
        kubeconfig = str(fake.write_kubeconfig(tmp_path / "kubeconfig"))
        planes = {rev: ControlPlane(tmp_path, kubeconfig=kubeconfig, name=f"istiod-{rev}",
                                    env={"REVISION": rev, "POD_NAME": f"istiod-{rev}-1", **FAST_LEASES})
                  for rev in ("default", "canary")}
        for rev, cp in planes.items():  # the Services istiod and istiod-canary, port 443 -> 15017
            fake.webhook_services[("istio-system", "istiod" + ("" if rev == "default" else f"-{rev}"), 443)] = \
                lambda cp=cp: ("127.0.0.1", cp.https_port) if cp.ports.get("https") else None
        async with planes["default"] as default, planes["canary"] as canary, fake.api_client() as api_client:
            core = k8s.CoreV1Api(api_client)
            inject_default = Injector(default, fake, "istiod")
            inject_canary = Injector(canary, fake, "istiod-canary")

            # Each revision's leader keeps its own webhook configurations pointing at the CA.
            root = fake.get("secrets", "istio-ca-secret", namespace="istio-system")["data"]["ca-cert.pem"]
            for resource, name in ((MWC, "istio-sidecar-injector"), (MWC, "istio-sidecar-injector-canary"),
                                   (VWC, "istio-validator-istio-system"),
                                   (VWC, "istio-validator-canary-istio-system")):
                await wait_for(lambda r=resource, n=name: bundles(fake, r, n) == {root}, timeout=30,
                               message=f"{name} caBundle\n{canary.log_tail()}")
            leases = {fake.get("leases.coordination.k8s.io", f"istio-gateway-deployment-{rev}",
                               namespace="istio-system")["spec"]["holderIdentity"] for rev in ("default", "canary")}
            assert leases == {"istiod-default-1", "istiod-canary-1"}

            # Config: the revision's own objects and the global ones, never the other revision's.
            assert await configz_names(default) == {"vs-default", "vs-global"}
            assert await configz_names(canary) == {"vs-canary", "vs-global"}
            # A label moved to the other revision moves the object.
            api = k8s.CustomObjectsApi(api_client)
            await api.patch_namespaced_custom_object(NET, "v1", "shop", "virtualservices", "vs-global",
                                                     {"metadata": {"labels": {"istio.io/rev": "canary"}}},
                                                     _content_type="application/merge-patch+json")
            async def left_default() -> bool:
                return await configz_names(default) == {"vs-default"}

            await wait_for(left_default, timeout=20, message="the relabelled object leaves the default revision")
            assert await configz_names(canary) == {"vs-canary", "vs-global"}

            # Injection: shop is canary's; its proxies go to istiod-canary.
            assert served_by(await inject_canary.injected("shop")) == "istiod-canary.istio-system.svc:15012"
            assert await inject_default.injected("shop") is None
            assert served_by(await inject_default.injected("legacy")) == "istiod.istio-system.svc:15012"
            assert await inject_canary.injected("legacy") is None

            # The namespace moves to the default revision: the default control plane takes it over.
            await core.patch_namespace("shop", {"metadata": {"labels": {"istio.io/rev": "default"}}})

            async def moved() -> bool:
                return (served_by(await inject_default.injected("shop")) == "istiod.istio-system.svc:15012"
                        and await inject_canary.injected("shop") is None)

            await wait_for(moved, timeout=20, message="shop served by the default revision after relabelling")

            # Tag `default` -> canary: as istioctl writes it.
            code, out, err = await pilotctl(kubeconfig, "set", "default", "--revision", "canary")
            assert code == 0, err
            assert "Revision tag 'default' created, referencing control plane revision 'canary'" in out
            tag = fake.get(MWC, "istio-revision-tag-default")
            assert tag["metadata"]["labels"]["istio.io/tag"] == "default"
            assert tag["metadata"]["labels"]["istio.io/rev"] == "canary"
            assert [w["name"] for w in tag["webhooks"]] == [
                "rev.namespace.sidecar-injector.istio.io", "rev.object.sidecar-injector.istio.io",
                "namespace.sidecar-injector.istio.io", "object.sidecar-injector.istio.io"]
            for w in tag["webhooks"]:
                assert w["clientConfig"]["service"] == {"name": "istiod-canary", "namespace": "istio-system",
                                                        "path": "/inject", "port": 443}
            assert tag["webhooks"][0]["namespaceSelector"]["matchExpressions"][0] == {
                "key": "istio.io/rev", "operator": "In", "values": ["default"]}
            old = fake.get(MWC, "istio-sidecar-injector")
            assert all(w["namespaceSelector"] == {"matchLabels": {"istio.io/deactivated": "never-match"}}
                       for w in old["webhooks"])
            validator = fake.get(VWC, "istiod-default-validator")
            assert validator["webhooks"][0]["clientConfig"]["service"]["name"] == "istiod-canary"
            assert fake.get("services", "istiod-revision-tag-default", namespace="istio-system")["spec"][
                "selector"] == {"app": "istiod", "istio.io/rev": "canary"}

            # The canary's leader keeps the tag's caBundle current, as its own (istiod's webhook patcher).
            assert bundles(fake, MWC, "istio-revision-tag-default") == {root}
            for w in tag["webhooks"]:
                w["clientConfig"]["caBundle"] = ""
            fake.update(tag)
            await wait_for(lambda: bundles(fake, MWC, "istio-revision-tag-default") == {root}, timeout=20,
                           message=f"the tag webhook's caBundle restored\n{canary.log_tail()}")

            # From now on the canary injects what the default tag selects; the default revision does not.
            async def tagged() -> bool:
                return (served_by(await inject_canary.injected("shop")) == "istiod-canary.istio-system.svc:15012"
                        and served_by(await inject_canary.injected("legacy")) == "istiod-canary.istio-system.svc:15012"
                        and await inject_default.injected("shop") is None
                        and await inject_default.injected("legacy") is None)

            await wait_for(tagged, timeout=20, message="the default tag moved injection to the canary")

            code, out, err = await pilotctl(kubeconfig, "list")
            # pilotctl's own --kubeconfig (before the command) reaches the tag commands too.
            code2, out2, err2 = await pilotctl(kubeconfig, "list", global_flag=True)
            assert (code2, out2) == (code, out), err2
            assert code == 0, err
            lines = out.strip().splitlines()
            assert lines[0].split() == ["TAG", "REVISION", "NAMESPACES"]
            assert ["default", "canary", "shop"] in [line.split() for line in lines[1:]]

            # `generate` prints what `set` would write and writes nothing.
            code, out, err = await pilotctl(kubeconfig, "generate", "prod", "--revision", "canary")
            assert code == 0, err
            assert [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out)] == [
                ("MutatingWebhookConfiguration", "istio-revision-tag-prod"), ("Service", "istiod-revision-tag-prod")]
            assert fake.get(MWC, "istio-revision-tag-prod") is None
            # A tag may not take a revision's name.
            code, _out, err = await pilotctl(kubeconfig, "set", "canary", "--revision", "default")
            assert code == 1 and "found existing control plane revision with same name" in err

            # A second `set` of the same tag needs --overwrite, as with istioctl.
            code, _out, err = await pilotctl(kubeconfig, "set", "default", "--revision", "canary")
            assert code == 1 and "already exists, and --overwrite is false" in err
            code, out, err = await pilotctl(kubeconfig, "remove", "default", "-y")
            assert code == 0 and "Revision tag default removed" in out, err
            assert fake.get(MWC, "istio-revision-tag-default") is None
            assert fake.get(VWC, "istiod-default-validator") is None
