"""Gateway API status with two revisions against one (fake) apiserver: each revision's leader
(its own `istio-gateway-status-leader-REV` lease, as istiod's per-revision election) writes the
status of its own Gateways only, and of the route parent entries naming them; one route attached
to a Gateway of each revision carries both entries, each written by its revision and left alone
by the other (both use the controllerName istio.io/gateway-controller).
"""

from __future__ import annotations

import pytest

from tests.e2e.gateway_api_env import conditions
from tests.e2e.test_gateway_api_kube import API, CRDS, FAST_LEASES, service, status_writes
from tests.fakes.apiserver import FakeApiServer
from tests.support.control_plane import ControlPlane
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(180)
NS = "edge"


def gateway(name: str, port: int, revision: str | None) -> dict:
    meta: dict = {"name": name, "namespace": NS}
    if revision is not None:
        meta["labels"] = {"istio.io/rev": revision}
    return {"apiVersion": f"{API}/v1", "kind": "Gateway", "metadata": meta,
            "spec": {"gatewayClassName": "istio", "listeners": [
                {"name": "http", "port": port, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}]}}


def writers_of(fake: FakeApiServer, path_part: str) -> set[str]:
    """The identities (user agent `pilot-discovery/V (POD_NAME)`) that wrote an object's status."""
    return {r.user_agent.rsplit("(", 1)[-1].rstrip(")") for r in status_writes(fake) if path_part in r.path}


async def test_each_revision_writes_the_status_of_its_own_gateways_and_route_parents(tmp_path):
    async with FakeApiServer() as fake:
        for version, plural, kind, namespaced in CRDS:
            fake.register_crd(API, version, plural, kind, namespaced)
        for ns in (NS, "istio-system"):
            fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        ports = free_ports(2)
        fake.create(service("alpha", "default", 8080))
        fake.create(gateway("gw-default", ports[0], None))  # unlabelled: the default revision's
        fake.create(gateway("gw-canary", ports[1], "canary"))
        fake.create({"apiVersion": f"{API}/v1", "kind": "HTTPRoute", "metadata": {"name": "shop", "namespace": "default"},
                     "spec": {"parentRefs": [{"name": "gw-default", "namespace": NS},
                                             {"name": "gw-canary", "namespace": NS}],
                              "hostnames": ["shop.example.com"],
                              "rules": [{"backendRefs": [{"name": "alpha", "port": 8080}]}]}})
        kubeconfig = str(fake.write_kubeconfig(tmp_path / "kubeconfig"))
        planes = {rev: ControlPlane(tmp_path, kubeconfig=kubeconfig, name=f"istiod-{rev}",
                                    env={"REVISION": rev, "POD_NAME": f"istiod-{rev}-1", **FAST_LEASES})
                  for rev in ("default", "canary")}
        async with planes["default"] as default, planes["canary"] as canary:
            def settled():
                gws = {name: fake.get(f"gateways.{API}", name, namespace=NS).get("status") or {}
                       for name in ("gw-default", "gw-canary")}
                route = fake.get(f"httproutes.{API}", "shop", namespace="default").get("status") or {}
                accepted = {p["parentRef"]["name"] for p in route.get("parents") or ()
                            if conditions(p).get("Accepted") == ("True", "Accepted")}
                if all(conditions(s).get("Accepted") == ("True", "Accepted") for s in gws.values()) \
                        and accepted == {"gw-default", "gw-canary"}:
                    return route
                return None

            route = await wait_for(settled, timeout=60,
                                   message=f"both revisions' status\n{default.log_tail()}\n{canary.log_tail()}")
            assert [p["controllerName"] for p in route["parents"]] == ["istio.io/gateway-controller"] * 2

            # Each revision's leader holds its own status lease and wrote only its own Gateway.
            for rev in ("default", "canary"):
                lease = fake.get("leases.coordination.k8s.io", f"istio-gateway-status-leader-{rev}",
                                 namespace="istio-system")
                assert lease["spec"]["holderIdentity"] == f"istiod-{rev}-1"
            assert writers_of(fake, "/gateways/gw-default/") == {"istiod-default-1"}
            assert writers_of(fake, "/gateways/gw-canary/") == {"istiod-canary-1"}
            # The route was written by both, each its own entry; neither removed the other's.
            assert writers_of(fake, "/httproutes/shop/") == {"istiod-default-1", "istiod-canary-1"}
