"""Gateway API in Kubernetes mode: the objects come from the (fake) apiserver through the real
informers, a real gateway Envoy serves them, and status goes back through the status
subresource: written by the leader replica only, only when it changed, and never causing a push.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.gateway_api_env import GW_LABEL, GW_NAME, GW_NS, ROUTER, SERVICE_PORT, conditions, request
from tests.fakes.apiserver import FakeApiServer
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(120)
API = "gateway.networking.k8s.io"
FAST_LEASES = {"PILOT_LEADER_LEASE_DURATION": "3s", "PILOT_LEADER_RENEW_DEADLINE": "2s",
               "PILOT_LEADER_RETRY_PERIOD": "500ms"}
LEASE = "istio-gateway-status-leader-default"  # the status writer's (per revision)
CRDS = (("v1", "gatewayclasses", "GatewayClass", False), ("v1", "gateways", "Gateway", True),
        ("v1", "httproutes", "HTTPRoute", True), ("v1", "grpcroutes", "GRPCRoute", True),
        ("v1alpha2", "tcproutes", "TCPRoute", True), ("v1alpha2", "tlsroutes", "TLSRoute", True),
        ("v1beta1", "referencegrants", "ReferenceGrant", True), ("v1", "backendtlspolicies", "BackendTLSPolicy", True))


def gateway(name: str, port: int, class_name: str = "istio") -> dict:
    return {"apiVersion": f"{API}/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": GW_NS},
            "spec": {"gatewayClassName": class_name, "listeners": [
                {"name": "http", "port": port, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": "All"}}}]}}


def http_route(name: str, host: str, section: str | None = None) -> dict:
    parent = {"name": GW_NAME, "namespace": GW_NS, **({"sectionName": section} if section else {})}
    return {"apiVersion": f"{API}/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": "default"},
            "spec": {"parentRefs": [parent], "hostnames": [host],
                     "rules": [{"backendRefs": [{"name": "alpha", "port": SERVICE_PORT}]}]}}


def service(name: str, namespace: str, port: int) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": [{"name": "http", "port": port}]}}


@pytest.fixture
async def cluster(tmp_path):
    fake = await FakeApiServer().start()
    for version, plural, kind, namespaced in CRDS:
        fake.register_crd(API, version, plural, kind, namespaced)
    for ns in (GW_NS, "istio-system"):
        fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    alpha = await HttpBackend("alpha").start()
    (port,) = free_ports(1)
    fake.create(service("alpha", "default", SERVICE_PORT))
    fake.create({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                 "metadata": {"name": "alpha-1", "namespace": "default",
                              "labels": {"kubernetes.io/service-name": "alpha"}},
                 "ports": [{"name": "http", "port": alpha.port}], "endpoints": [{"addresses": ["127.0.0.1"]}]})
    fake.create(service(f"{GW_NAME}-istio", GW_NS, port))
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    planes = {name: ControlPlane(tmp_path, kubeconfig=kubeconfig, name=name,
                                 env={**FAST_LEASES, "POD_NAME": name, "CA_KEY_TYPE": "EC"})
              for name in ("replica-a", "replica-b")}
    envoy = Envoy()
    try:
        await asyncio.gather(*(cp.start() for cp in planes.values()))
        yield fake, planes, envoy, port, tmp_path
    finally:
        await envoy.stop()
        await asyncio.gather(*(cp.stop() for cp in planes.values()))
        await alpha.stop()
        await fake.stop()


def status_of(fake: FakeApiServer, plural: str, name: str, namespace: str | None = None) -> dict:
    obj = fake.get(f"{plural}.{API}", name, namespace=namespace) or {}
    return obj.get("status") or {}


def status_writes(fake: FakeApiServer) -> list:
    return [r for r in fake.request_log if r.subresource == "status" and r.method in ("PUT", "PATCH")]


async def test_status_written_by_the_leader_only_when_changed_and_never_pushing(cluster):
    fake, planes, envoy, port, tmp_path = cluster
    # Created once both replicas run: each of these objects is then in a push of its own, before
    # any status is computed for it, so a push caused by a status write could not hide in it.
    # The `istio` GatewayClass is the leader's (created at start, as istiod does).
    await wait_for(lambda: fake.get(f"gatewayclasses.{API}", "istio"), 20, message="the leader's GatewayClass")
    fake.create(gateway(GW_NAME, port))
    fake.create(http_route("shop", "shop.example.com"))

    # The route serves through a gateway Envoy connected to either replica.
    any_plane = planes["replica-a"]
    await envoy.start(Envoy.bootstrap(ROUTER, any_plane.xds_port, metadata={
        "NAMESPACE": GW_NS, "LABELS": {GW_LABEL: GW_NAME}}), tmp_path)

    async def served():
        return (await request(port, "shop.example.com", "/")).backend == "alpha"

    await wait_for(served, 20, message="HTTPRoute from the apiserver served")

    # Status, from the apiserver, field by field.
    def settled():
        gw, route = status_of(fake, "gateways", GW_NAME, GW_NS), status_of(fake, "httproutes", "shop", "default")
        cls = status_of(fake, "gatewayclasses", "istio")
        return (gw, route, cls) if gw.get("listeners") and route.get("parents") and cls else None

    gw, route, cls = await wait_for(settled, 20, message="status written to the apiserver")
    assert conditions(cls) == {"Accepted": ("True", "Accepted")}
    assert conditions(gw) == {"Accepted": ("True", "Accepted"), "Programmed": ("True", "Programmed")}
    assert gw["addresses"] == [{"type": "Hostname", "value": f"{GW_NAME}-istio.{GW_NS}.svc.cluster.local"}]
    assert gw["listeners"][0]["attachedRoutes"] == 1
    generation = fake.get(f"gateways.{API}", GW_NAME, namespace=GW_NS)["metadata"]["generation"]
    assert {c["observedGeneration"] for c in gw["conditions"]} == {generation}
    (parent,) = route["parents"]
    assert parent["controllerName"] == "istio.io/gateway-controller"
    assert conditions(parent) == {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    # A status write changes nothing else: the spec, and its generation, stay.
    assert fake.get(f"gateways.{API}", GW_NAME, namespace=GW_NS)["spec"]["listeners"][0]["port"] == port

    # Only the leader wrote.
    leader = fake.get("leases.coordination.k8s.io", LEASE, namespace="istio-system")["spec"]["holderIdentity"]
    writers = {r.user_agent for r in status_writes(fake)}
    assert writers and all(f"({leader})" in ua for ua in writers), writers

    # Markers, one per watch stream the written objects travel on: a route of ours (its status
    # is written) and a Gateway of another class (no status). When their pushes are seen, the
    # status writes made before them have reached both replicas' informers too.
    writes_before = len(status_writes(fake))
    fake.create(http_route("marker", "marker.example.com", section="no-such-listener"))
    fake.create(gateway("other", port + 1, class_name="someone-else"))

    async def markers_pushed(cp: ControlPlane):
        keys = {k for p in (await cp.debug("/debug/push_status"))["pushes"] for k in p["config_keys"]}
        return {"HTTPRoute/default/marker", "KubernetesGateway/infra/other"} <= keys

    for cp in planes.values():
        await wait_for(lambda cp=cp: markers_pushed(cp), 20, message=f"{cp.workdir.name} saw the markers")
    marker = await wait_for(lambda: status_of(fake, "httproutes", "marker", "default").get("parents"), 20,
                            message="the marker's status")
    assert conditions(marker[0])["Accepted"] == ("False", "NoMatchingParent")
    # Exactly one more write, the marker's: nothing else changed, so nothing else was rewritten.
    assert len(status_writes(fake)) == writes_before + 1, [(r.method, r.path) for r in status_writes(fake)]
    assert status_of(fake, "gateways", "other", GW_NS) == {}  # not ours to report on
    # Status writes never pushed: the objects whose only later change was their status are in
    # exactly one push each, the one that created them.
    for cp in planes.values():
        keys = [k for p in (await cp.debug("/debug/push_status"))["pushes"] for k in p["config_keys"]]
        for key in ("KubernetesGateway/infra/web", "HTTPRoute/default/shop", "GatewayClass/istio"):
            assert keys.count(key) == 1, (cp.workdir.name, key, keys)

    # A spec change is written again (and only then): the route's backend goes away.
    fake.patch(f"httproutes.{API}", "shop", {"spec": {"rules": [{"backendRefs": [
        {"name": "gone", "port": SERVICE_PORT}]}]}}, namespace="default")

    def unresolved():
        parents = status_of(fake, "httproutes", "shop", "default").get("parents") or []
        return parents and conditions(parents[0])["ResolvedRefs"] == ("False", "BackendNotFound")

    await wait_for(unresolved, 20, message="ResolvedRefs turned False")
    (parent_after,) = status_of(fake, "httproutes", "shop", "default")["parents"]
    accepted = {c["type"]: c for c in parent_after["conditions"]}["Accepted"]
    assert accepted["lastTransitionTime"] == {c["type"]: c for c in parent["conditions"]}["Accepted"][
        "lastTransitionTime"]  # an unchanged condition keeps its transition time
    assert accepted["observedGeneration"] == fake.get(f"httproutes.{API}", "shop", namespace="default")[
        "metadata"]["generation"] == 2
    # The status is written from the same PushContext the push is made from, but the push can
    # reach Envoy after the write: wait for it.
    async def refused():
        return (await request(port, "shop.example.com", "/")).status == 500

    await wait_for(refused, 20, message="the route without its backend answers 500")


async def test_backend_tls_policy_from_the_apiserver_applies_and_gets_status(cluster):
    """A BackendTLSPolicy watched from the apiserver: its CA ConfigMap missing, the policy is
    not accepted and traffic fails closed (503); once the ConfigMap exists, Accepted, and the
    gateway originates TLS (to a plaintext backend here: still 503, now a TLS handshake failure
    rather than the refusal; the policy's status is what changes). Written by the leader."""
    from tests.support.certs import make_ca

    fake, planes, envoy, port, tmp_path = cluster
    await wait_for(lambda: fake.get(f"gatewayclasses.{API}", "istio"), 20, message="the leader's GatewayClass")
    fake.create(gateway(GW_NAME, port))
    fake.create(http_route("shop", "shop.example.com"))
    await envoy.start(Envoy.bootstrap(ROUTER, planes["replica-a"].xds_port, metadata={
        "NAMESPACE": GW_NS, "LABELS": {GW_LABEL: GW_NAME}}), tmp_path)

    async def answered(status: int, backend: str | None):
        r = await request(port, "shop.example.com", "/")
        return r.status == status and r.backend == backend

    await wait_for(lambda: answered(200, "alpha"), 20, message="plaintext to alpha before the policy")
    fake.create({"apiVersion": f"{API}/v1", "kind": "BackendTLSPolicy",
                 "metadata": {"name": "alpha-tls", "namespace": "default"},
                 "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "alpha"}],
                          "validation": {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "alpha-ca"}],
                                         "hostname": "alpha.example.com"}}})

    def ancestors(want: dict):
        def check():
            got = {(a["ancestorRef"]["kind"], a["controllerName"]): conditions(a)
                   for a in status_of(fake, "backendtlspolicies", "alpha-tls", "default").get("ancestors") or []}
            return got if got == want else None
        return check

    bad = {"Accepted": ("False", "NoValidCACertificate"), "ResolvedRefs": ("False", "InvalidCACertificateRef")}
    await wait_for(ancestors({("Service", "istio.io/mesh-controller"): bad,
                              ("Gateway", "istio.io/gateway-controller"): bad}), 20, message="refused in status")
    await wait_for(lambda: answered(503, None), 20, message="no valid CA: traffic fails closed")
    fake.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "alpha-ca", "namespace": "default"},
                 "data": {"ca.crt": make_ca().cert_pem.decode()}})
    ok = {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}
    await wait_for(ancestors({("Service", "istio.io/mesh-controller"): ok,
                              ("Gateway", "istio.io/gateway-controller"): ok}), 20, message="accepted in status")
    leader = fake.get("leases.coordination.k8s.io", LEASE, namespace="istio-system")["spec"]["holderIdentity"]
    writers = {r.user_agent for r in status_writes(fake) if "backendtlspolicies" in r.path}
    assert writers and all(f"({leader})" in ua for ua in writers), writers
    # The policy's TLS (not the plaintext of before) is what alpha's cluster now speaks.
    dump = await envoy.config_dump(resource="dynamic_active_clusters")
    (alpha,) = [c["cluster"] for c in dump["configs"] if c["cluster"]["name"].endswith("||alpha.default.svc.cluster.local")]
    assert alpha["transport_socket"]["typed_config"]["sni"] == "alpha.example.com"
    assert (await request(port, "shop.example.com", "/")).status == 503
