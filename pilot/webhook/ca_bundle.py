"""The leader keeps the ValidatingWebhookConfiguration `istio-validator[-REV]-NS` pointing at our
CA, as istiod's validation controller (pkg/webhooks/validation/controller) does:

- every webhook's `clientConfig.caBundle` is the CA root (base64 PEM in the JSON);
- `failurePolicy` stays `Ignore` (fail open, as deploy/ ships it) until a dry-run create of an
  invalid Gateway (marked `internal.istio.io/webhook-always-reject`) comes back "denied the
  request", i.e. the apiserver really reaches this webhook with the bundle we wrote; then it is
  `Fail`. A missing Gateway API resource (no CRD) or an apiserver that refuses dry runs counts as
  ready, as in istiod, since the check cannot be made;
- the object is watched, so a bundle someone blanks or edits is written back at once, and a new
  root (a reloaded plugged-in CA) is written as soon as it is loaded.

The configuration itself comes from the manifests: a missing one is waited for, never created.

The same writer keeps the injector's MutatingWebhookConfiguration `istio-sidecar-injector[-REV]`
pointing at our CA (`failure_policy=False`: its failurePolicy is the manifest's, as istiod's
injector webhook patcher only writes caBundle).
"""

from __future__ import annotations

import asyncio
import base64
import json

from pilot import logging as plog
from pilot.sources.kube.backoff import Backoff
from pilot.sources.kube.client import ApiError, Kube
from pilot.sources.kube.leader_worker import LeaderWorker
from pilot.sources.kube.rbac import Rule
from pilot.webhook.admission import ALWAYS_REJECT

log = plog.get("validationController")

PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
MUTATING_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
GATEWAYS = "/apis/networking.istio.io/v1/namespaces/{namespace}/gateways"
DENIED = "denied the request"
NO_RESOURCE = "the server could not find the requested resource"
NO_DRY_RUN = "does not support dry run"
# What this module calls: watch and GET the configuration (the injector's: LIST them by revision
# label), PUT the corrected copy; the dry-run
# create of the probe Gateway in the control plane's namespace (nothing is stored).
RBAC = (Rule("cluster", "admissionregistration.k8s.io", "validatingwebhookconfigurations",
             frozenset({"get", "watch", "update"})),
        Rule("cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations",
             frozenset({"list", "watch", "update"})),
        Rule("namespace", "networking.istio.io", "gateways", frozenset({"create"})))
WATCH_TIMEOUT_S = 300


def config_name(namespace: str, revision: str = "") -> str:
    """istiod's name: istio-validator-istio-system, or istio-validator-canary-istio-system."""
    rev = "" if revision in ("", "default") else f"-{revision}"
    return f"istio-validator{rev}-{namespace}"


def injector_config_name(revision: str = "") -> str:
    """istiod's injector webhook configuration: istio-sidecar-injector, or istio-sidecar-injector-canary."""
    return "istio-sidecar-injector" + ("" if revision in ("", "default") else f"-{revision}")


class CABundleWriter(LeaderWorker):
    task_name = "webhook-ca-bundle"

    def __init__(self, kube: Kube, namespace: str, revision: str, root_pem: str, *, path: str = PATH,
                 name: str | None = None, failure_policy: bool = True) -> None:
        super().__init__()
        self.kube = kube
        self.namespace = namespace
        self.revision = revision
        self.path = path
        self.name = name or config_name(namespace, revision)
        self.failure_policy = failure_policy  # also switch failurePolicy to Fail once probed
        self.root_pem = root_pem
        self.fail_closed_ready = False
        self.writes = 0

    def set_root(self, root_pem: str) -> None:
        if root_pem != self.root_pem:
            self.root_pem = root_pem
            self._wake.set()

    def _on_start(self) -> None:
        # A new leader checks again: the previous one's probe result says nothing about this one.
        self.fail_closed_ready = False

    async def _run(self) -> None:
        watcher = asyncio.get_running_loop().create_task(self._watch(), name="webhook-config-watch")
        backoff = Backoff()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                try:
                    retry = await self._reconcile()
                except Exception as e:  # noqa: BLE001 - retried; never fatal
                    log.warning("could not update the validating webhook configuration", name=self.name,
                                error=str(e))
                    retry = True
                if retry:  # as istiod, checked again with a growing delay until ready to fail closed
                    asyncio.get_running_loop().call_later(backoff.next(), self._wake.set)
                else:
                    backoff.reset()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _reconcile(self) -> bool:
        """One pass; True when it should run again soon (not yet ready to fail closed)."""
        try:
            current = await self.kube.request("GET", f"{self.path}/{self.name}")
        except ApiError as e:
            if e.status == 404:
                log.info("webhook configuration not found; waiting for it", name=self.name)
                return False
            raise
        bundle = base64.b64encode(self.root_pem.encode()).decode()
        if self.failure_policy and not self.fail_closed_ready:
            self.fail_closed_ready = await self._probe()
        policy = "Fail" if self.fail_closed_ready else "Ignore"
        webhooks = current.get("webhooks") or []
        dirty = False
        for wh in webhooks:
            client = wh.setdefault("clientConfig", {})
            if client.get("caBundle") != bundle:
                client["caBundle"], dirty = bundle, True
            if self.failure_policy and wh.get("failurePolicy") != policy:
                wh["failurePolicy"], dirty = policy, True
        if dirty:
            await self.kube.request("PUT", f"{self.path}/{self.name}", body=current)
            self.writes += 1
            log.info("updated the webhook configuration", name=self.name,
                     failure_policy=policy if self.failure_policy else "unchanged")
        return self.failure_policy and not self.fail_closed_ready

    async def _probe(self) -> bool:
        """Does the apiserver send our kinds here and get them refused? A dry run: nothing is stored."""
        probe = {"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
                 "metadata": {"name": "invalid-gateway", "namespace": self.namespace,
                              "labels": {"istio.io/rev": self.revision or "default"},
                              "annotations": {ALWAYS_REJECT: "true"}},
                 "spec": {}}
        try:
            await self.kube.request("POST", GATEWAYS.format(namespace=self.namespace), body=probe,
                                    query={"dryRun": "All"})
        except ApiError as e:
            text = f"{e.reason} {e.body}"
            if DENIED in text:
                log.info("the webhook rejected the probe; switching validation to fail-close", name=self.name)
                return True
            if e.status == 404 and NO_RESOURCE in text:
                log.warning("no Gateway CRD: cannot check the webhook; assuming it is ready", name=self.name)
                return True
            if NO_DRY_RUN in text:
                log.warning("dry run not supported: cannot check the webhook; assuming it is ready",
                            name=self.name)
                return True
            log.info("not ready to fail closed: the probe was refused for another reason", error=e.reason)
            return False
        log.info("not ready to fail closed: the probe was not rejected", name=self.name)
        return False

    def _selector(self) -> dict[str, str]:
        return {"fieldSelector": f"metadata.name={self.name}"}

    async def _watch(self) -> None:
        """Wake the reconcile on every change of the configuration (someone blanking the bundle,
        the manifests being applied later). A plain watch by name; resumed from the last version."""
        backoff = Backoff()
        rv = ""
        while True:
            try:
                query = {"watch": "true", **self._selector(),
                         "timeoutSeconds": str(WATCH_TIMEOUT_S), "allowWatchBookmarks": "true"}
                if rv:
                    query["resourceVersion"] = rv
                resp = await self.kube.open("GET", self.path, query=query, timeout=WATCH_TIMEOUT_S + 30)
                events = 0
                try:
                    while line := await resp.content.readline():
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            rv = ""  # expired: start over from the current state
                            break
                        rv = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion", rv)
                        events += 1
                        if event.get("type") != "BOOKMARK":
                            self._wake.set()
                finally:
                    resp.release()
                if events:
                    backoff.reset()
                else:  # a stream that ends with nothing must not become a hot loop
                    await asyncio.sleep(backoff.next())
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the apiserver went away: back off and watch again
                log.debug("webhook configuration watch ended", error=str(e))
                await asyncio.sleep(backoff.next())


INJECTOR_SUFFIX = "sidecar-injector.istio.io"


class InjectorBundleWriter(CABundleWriter):
    """The injector's caBundle, as istiod's webhook patcher (pkg/webhooks/webhookpatch.go) keeps
    it: in every MutatingWebhookConfiguration labelled `istio.io/rev=REVISION` (the revision's own
    `istio-sidecar-injector[-REV]` and its tags' `istio-revision-tag-TAG`), on each webhook whose
    name ends in `sidecar-injector.istio.io`; failurePolicy is the manifests'."""

    def __init__(self, kube: Kube, namespace: str, revision: str, root_pem: str) -> None:
        super().__init__(kube, namespace, revision, root_pem, path=MUTATING_PATH,
                         name=injector_config_name(revision), failure_policy=False)
        self.label_selector = f"istio.io/rev={revision or 'default'}"

    def _selector(self) -> dict[str, str]:
        return {"labelSelector": self.label_selector}

    async def _reconcile(self) -> bool:
        bundle = base64.b64encode(self.root_pem.encode()).decode()
        configs = (await self.kube.request("GET", self.path, query=self._selector())).get("items") or []
        for config in configs:
            dirty = False
            for wh in config.get("webhooks") or []:
                client = wh.setdefault("clientConfig", {})
                if wh.get("name", "").endswith(INJECTOR_SUFFIX) and client.get("caBundle") != bundle:
                    client["caBundle"], dirty = bundle, True
            if dirty:
                name = config["metadata"]["name"]
                await self.kube.request("PUT", f"{self.path}/{name}", body=config)
                self.writes += 1
                log.info("updated the injector webhook configuration", name=name)
        return False
