"""The security.istio.io kinds in Kubernetes mode: the real informer, through the real
kubernetes-asyncio client, against the fake apiserver serving the CRDs at v1 and v1beta1."""

from __future__ import annotations

import asyncio

from pilot.config.kinds import BY_NAME
from pilot.model.security_policies import SecurityIndex
from pilot.model.store import Store
from pilot.sources.kube.client import Kube
from pilot.sources.kube.informer import Informer
from pilot.sources.kube.source import WATCHED_KINDS
from tests.fakes.apiserver import FakeApiServer
from tests.support.policies import authz, peer_authn, request_authn
from tests.support.wait import wait_for

SECURITY = ("PeerAuthentication", "AuthorizationPolicy", "RequestAuthentication")


def test_the_kube_source_watches_the_security_kinds() -> None:
    assert set(SECURITY) <= set(WATCHED_KINDS)


async def test_policies_from_the_apiserver_reach_the_store_and_bad_ones_are_rejected() -> None:
    async with FakeApiServer() as fake:
        for kind in SECURITY:
            for version in ("v1", "v1beta1"):
                fake.register_crd("security.istio.io", version, BY_NAME[kind].plural, kind)
        fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        good = authz("allow-get", "shop", rules=[{"to": [{"operation": {"methods": ["GET"]}}]}])
        good["apiVersion"] = "security.istio.io/v1beta1"  # written in the older version, read as v1
        fake.create(good)
        fake.create(peer_authn("strict", "shop", mtls={"mode": "STRICT"}))
        fake.create(authz("broken", "shop", action="DENY"))
        store = Store()
        kube = Kube(fake.api_client())
        informers = [Informer(kube, BY_NAME[k], store) for k in SECURITY]
        tasks = [asyncio.create_task(i.run()) for i in informers]
        try:
            await wait_for(lambda: all(i.synced.is_set() for i in informers), timeout=10)
            assert [e.key.name for e in store.list("AuthorizationPolicy")] == ["allow-get"]
            [rejection] = store.rejections()
            assert (rejection.kind, rejection.name) == ("AuthorizationPolicy", "broken")
            assert "DENY action without `rules`" in rejection.reason
            idx = SecurityIndex.build(store, "istio-system")
            assert idx.mtls_mode("shop", {"app": "web"}, 80) == "STRICT"
            # A watch event: a new RequestAuthentication arrives and selects the workload.
            fake.create(request_authn("jwt", "shop", jwtRules=[{"issuer": "https://iss"}]))
            await wait_for(lambda: store.list("RequestAuthentication"), timeout=10)
            wp = SecurityIndex.build(store, "istio-system").for_workload("shop", {"app": "web"})
            assert wp.origins == ("AuthorizationPolicy/shop/allow-get", "RequestAuthentication/shop/jwt")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await kube.close()
