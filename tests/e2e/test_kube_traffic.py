"""Traffic rules in Kubernetes mode: the weighted split and an ingress Gateway, with every object
coming from the (fake) apiserver through the real kubernetes-asyncio informers."""

from __future__ import annotations

import json
import ssl

import aiohttp
import pytest

from tests.e2e.mesh_config import fqdn
from tests.e2e.test_gateway import tls_request
from tests.fakes.apiserver import FakeApiServer
from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend, answered_by
from tests.support.certs import b64, issue, make_ca
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.verified_router import start_verified_router
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)
NET = "networking.istio.io"
ROUTER = "router~127.0.0.1~ingress-1.istio-system~istio-system.svc.cluster.local"
ISSUER = Issuer("ES256")  # signs the service-account token a verified gateway presents


def objects(port: int, v1: int, v2: int) -> list[dict]:
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4"}
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reviews", "namespace": "default"},
         "spec": {"ports": [{"name": "http", "port": port}]}},
        *({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"reviews-{v}", "namespace": "default", "labels": {"app": "reviews", "version": v}},
           "spec": {"containers": [{"name": "app", "image": "app"}]}, "status": {"podIP": "127.0.0.1"}}
          for v in ("v1", "v2")),
        *({**slice_, "metadata": {"name": f"reviews-{v}", "namespace": "default",
                                  "labels": {"kubernetes.io/service-name": "reviews"}},
           "ports": [{"name": "http", "port": p}],
           "endpoints": [{"addresses": ["127.0.0.1"], "targetRef": {"kind": "Pod", "name": f"reviews-{v}",
                                                                    "namespace": "default"}}]}
          for v, p in (("v1", v1), ("v2", v2))),
        {"apiVersion": f"{NET}/v1", "kind": "DestinationRule", "metadata": {"name": "reviews", "namespace": "default"},
         "spec": {"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}},
                                                  {"name": "v2", "labels": {"version": "v2"}}]}},
    ]


@pytest.fixture
async def cluster(tmp_path):
    fake = await FakeApiServer().start()
    # RBAC as the gateway chart grants it: the gateway's service account may read its Secrets.
    fake.access_reviewer = lambda spec: spec["user"] == "system:serviceaccount:istio-system:istio-ingressgateway"
    for plural, kind in (("virtualservices", "VirtualService"), ("destinationrules", "DestinationRule"),
                         ("gateways", "Gateway")):
        fake.register_crd(NET, "v1", plural, kind)
    fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
    backends = {n: await HttpBackend(n).start() for n in ("v1", "v2")}
    port, gw_port = free_ports(2)
    for obj in objects(port, backends["v1"].port, backends["v2"].port):
        fake.create(obj)
    cp = ControlPlane(tmp_path, kubeconfig=fake.write_kubeconfig(tmp_path / "kc"), secure_grpc=True,
                      env={"ENABLE_LEADER_ELECTION": "false", "JWT_RULE": ISSUER.rule()})
    envoys: list[Envoy | PilotAgent] = []
    try:
        await cp.start()
        yield fake, cp, envoys, backends, port, gw_port, tmp_path
    finally:
        for e in envoys:
            await e.stop()
        await cp.stop()
        for b in backends.values():
            await b.stop()
        await fake.stop()


async def get(port: int, host: str) -> tuple[int, str | None]:
    return await answered_by(f"http://127.0.0.1:{port}/", host)


async def start_gateway(fake, cp, envoys, tmp, server: dict, subset: str, verified: bool = False) -> None:
    """A router Envoy labelled istio=ingressgateway, the Gateway `web` with `server`, and a
    VirtualService sending shop.example.com to a subset of reviews. `verified`: the router runs
    under pilot-agent on the secure port, so it may be given credentials."""
    if verified:
        root = await wait_for(lambda: (fake.get("configmaps", "istio-ca-root-cert", namespace="istio-system")
                                       or {}).get("data", {}).get("root-cert.pem"), 20, message="root ConfigMap")
        agent, gateway = await start_verified_router(
            cp, tmp / "router", ISSUER, namespace="istio-system", service_account="istio-ingressgateway",
            pod="ingress-1", labels={"istio": "ingressgateway"}, root_cert=root)
        envoys.append(agent)
    else:
        gateway = Envoy()
        envoys.append(gateway)
        await gateway.start(Envoy.bootstrap(ROUTER, cp.xds_port, metadata={
            "NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}}), tmp)
    fake.create({"apiVersion": f"{NET}/v1", "kind": "Gateway", "metadata": {"name": "web", "namespace": "istio-system"},
                 "spec": {"selector": {"istio": "ingressgateway"},
                          "servers": [{"hosts": ["shop.example.com"], **server}]}})
    fake.create({"apiVersion": f"{NET}/v1", "kind": "VirtualService", "metadata": {"name": "shop", "namespace": "default"},
                 "spec": {"hosts": ["shop.example.com"], "gateways": ["istio-system/web"],
                          "http": [{"route": [{"destination": {"host": "reviews", "subset": subset}}]}]}})


async def test_weighted_split_from_kubernetes(cluster):
    fake, cp, envoys, _backends, port, _, tmp = cluster
    envoy = Envoy()
    envoys.append(envoy)
    await envoy.start(Envoy.bootstrap(sidecar_node_id("client"), cp.xds_port), tmp)
    await envoy.wait_ready()
    fake.create({"apiVersion": f"{NET}/v1", "kind": "VirtualService",
                 "metadata": {"name": "reviews", "namespace": "default"},
                 "spec": {"hosts": ["reviews"], "http": [{"route": [
                     {"destination": {"host": "reviews", "subset": "v1"}, "weight": 80},
                     {"destination": {"host": "reviews", "subset": "v2"}, "weight": 20}]}]}})

    async def split_in_envoy():
        return "weighted_clusters" in json.dumps(await envoy.config_dump(resource="dynamic_route_configs"))

    await wait_for(split_in_envoy, timeout=20, message="split from the apiserver reached Envoy")
    counts = {"v1": 0, "v2": 0}
    for _ in range(300):
        status, name = await get(port, fqdn("reviews"))
        assert status == 200
        counts[name] += 1
    assert 0.66 <= counts["v1"] / 300 <= 0.93, counts  # 80% +- 5 sigma


async def test_ingress_gateway_from_kubernetes(cluster):
    fake, cp, envoys, _backends, _port, gw_port, tmp = cluster
    await start_gateway(fake, cp, envoys, tmp, {"port": {"number": gw_port, "name": "http", "protocol": "HTTP"}}, "v2")

    async def served():
        try:
            return await get(gw_port, "shop.example.com") == (200, "v2")
        except aiohttp.ClientError:
            return False

    await wait_for(served, timeout=20, message="gateway route from the apiserver")


async def test_gateway_credential_from_an_opaque_secret(cluster):
    """A generic Secret with tls.crt/tls.key serves HTTPS, as istiod accepts; service-account
    tokens are never even listed by the control plane."""
    fake, cp, envoys, _backends, _port, gw_port, tmp = cluster
    ca = make_ca()
    leaf = issue(ca, ["shop.example.com"])
    fake.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                 "metadata": {"name": "shop-cert", "namespace": "istio-system"},
                 "data": {"tls.crt": b64(leaf.cert_pem), "tls.key": b64(leaf.key_pem)}})
    fake.create({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                 "metadata": {"name": "default-token", "namespace": "istio-system"},
                 "data": {"token": b64(b"secret-token")}})
    await start_gateway(fake, cp, envoys, tmp, {"port": {"number": gw_port, "name": "https", "protocol": "HTTPS"},
                                                 "tls": {"mode": "SIMPLE", "credentialName": "shop-cert"}}, "v1",
                        verified=True)

    async def served():
        try:
            status, name, serial = await tls_request(gw_port, "shop.example.com", ca)
        except (OSError, ssl.SSLError, TimeoutError):
            return False
        return (status, name, serial) == (200, "v1", leaf.serial)

    await wait_for(served, timeout=20, message="HTTPS with the Opaque Secret's certificate")
    secrets = {c["name"] for c in (await cp.debug("/debug/configz"))["configs"] if c["kind"] == "Secret"}
    assert "shop-cert" in secrets and "default-token" not in secrets
