"""The networking.istio.io kinds in Kubernetes mode: objects as the apiserver returns them (with
`status`, managedFields and the rest of the metadata) are accepted; a misspelt or unsupported
field is refused with one warning line naming source, kind, field path and reason, and the
refusal is listed in the Store's rejections (what /debug/configz shows)."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from pilot.config.kinds import BY_NAME
from pilot.model.store import Store
from pilot.sources.kube.client import Kube
from pilot.sources.kube.informer import Informer
from tests.fakes.apiserver import FakeApiServer
from tests.support.wait import wait_for

KINDS = ("VirtualService", "DestinationRule")


def _obj(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": kind,
            "metadata": {"name": name, "namespace": "shop"}, "spec": spec}


async def test_strict_networking_fields_through_the_informer() -> None:
    async with FakeApiServer() as fake:
        for kind in KINDS:
            fake.register_crd("networking.istio.io", "v1", BY_NAME[kind].plural, kind)
        fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        good = _obj("DestinationRule", "good",
                    {"host": "web", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}})
        good["status"] = {"observedGeneration": 1, "conditions": [{"type": "Reconciled", "status": "True"}]}
        good["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
        fake.create(good)
        fake.create(_obj("VirtualService", "typo", {"hosts": ["web"], "http": [
            {"route": [{"destination": {"host": "web"}}], "retrys": {"attempts": 3}}]}))
        fake.create(_obj("DestinationRule", "locality", {"host": "web", "trafficPolicy": {
            "loadBalancer": {"localityLbSetting": {"distribute": [{"from": "r1/*", "to": {"r1/za": 60}}]}}}}))
        store = Store()
        kube = Kube(fake.api_client())
        informers = [Informer(kube, BY_NAME[k], store) for k in KINDS]
        with capture_logs() as logs:
            tasks = [asyncio.create_task(i.run()) for i in informers]
            try:
                await wait_for(lambda: all(i.synced.is_set() for i in informers), timeout=10)
                assert [e.key.name for e in store.list("DestinationRule")] == ["good"]
                assert store.list("VirtualService") == []
                reasons = {r.name: (r.kind, r.source, r.reason) for r in store.rejections()}
                path = "/apis/networking.istio.io/v1/namespaces/shop/virtualservices/typo"
                assert reasons["typo"] == ("VirtualService", f"kube {path}",
                                           "spec.http[0].retrys: unknown field")
                assert reasons["locality"][2] == ("spec.trafficPolicy.loadBalancer.localityLbSetting: "
                                                  "distribute from 'r1/*': total locality weight 60 != 100")
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await kube.close()
    warnings = [e for e in logs if e.get("log_level") == "warning" and e.get("event") == "object rejected"]
    assert sorted((w["kind"], w["name"]) for w in warnings) == [("DestinationRule", "locality"),
                                                                ("VirtualService", "typo")]
    typo = next(w for w in warnings if w["name"] == "typo")
    assert typo["source"].endswith("/virtualservices/typo")
    assert typo["reason"] == "spec.http[0].retrys: unknown field"
