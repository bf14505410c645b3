"""May a proven proxy be given the Secrets (credentials) of its namespace?

istiod's rule for credentialName secrets: the proxy's verified identity must be allowed by
Kubernetes RBAC to read Secrets in that namespace, asked of the apiserver with a
SubjectAccessReview (`list secrets` for `system:serviceaccount:NS:SA`) and cached briefly. So a
workload that happens to run in a gateway's namespace, but whose service account holds no
Secret permission, cannot pose as the gateway (the node id's proxy type is self-declared).

Without Kubernetes (file mode) there is no RBAC to ask: the namespace the caller proved on the
secure port is the boundary (pilot.xds.generators.sds enforces it together with ReferenceGrants).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pilot import logging as plog
from pilot.model.proxy import Proxy
from pilot.security import spiffe
from pilot.sources.kube.rbac import Rule

log = plog.get("sds")

RBAC = (Rule("cluster", "authorization.k8s.io", "subjectaccessreviews", frozenset({"create"})),)
ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
CACHE_SECONDS = 60.0  # istiod caches the verdict per identity too: RBAC changes apply within a minute
MAX_CACHED = 10_000  # identities, not proxies: bounded by the service accounts that connect


class SecretAccess:
    def __init__(self, kube: Any | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.clock = clock
        self._verdicts: dict[tuple[str, str], tuple[float, str | None]] = {}

    async def refusal(self, proxy: Proxy) -> str | None:
        """Why `proxy` may read no Secret of its namespace, or None when it may."""
        if not proxy.identity:
            return "the proxy has not proved an identity"
        try:
            ident = spiffe.parse(proxy.identity)
        except spiffe.SpiffeIdError as e:
            return f"unusable identity: {e}"
        if ident.namespace != proxy.namespace:
            return f"identity {ident} is not of the proxy's namespace {proxy.namespace}"
        if self.kube is None:
            return None
        key = (ident.namespace, ident.service_account)
        now = self.clock()
        hit = self._verdicts.get(key)
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        verdict, settled = await self._review(*key)
        if settled:  # a failed review is asked again next time, not held for a minute
            if len(self._verdicts) >= MAX_CACHED:
                self._verdicts.clear()
            self._verdicts[key] = (now, verdict)
        return verdict

    async def _review(self, namespace: str, service_account: str) -> tuple[str | None, bool]:
        """(refusal or None, whether the apiserver answered)."""
        user = f"system:serviceaccount:{namespace}:{service_account}"
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                         "resourceAttributes": {"namespace": namespace, "verb": "list", "resource": "secrets"}}}
        assert self.kube is not None  # without an apiserver nothing is reviewed (above)
        try:
            review = await self.kube.request("POST", ACCESS_REVIEW_PATH, body=body, timeout=10.0)
        except Exception as e:  # noqa: BLE001 - apiserver down, RBAC missing...: fail closed
            log.warning("SubjectAccessReview failed; credentials refused", user=user, error=str(e)[:200])
            return f"could not check {user}'s access to Secrets: {str(e)[:200]}", False
        status = (review or {}).get("status") or {}
        if status.get("allowed") is True:
            return None, True
        return f"{user} may not list secrets in {namespace} (Kubernetes RBAC)", True
