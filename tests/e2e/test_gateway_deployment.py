"""Gateway API automated deployment against the (fake) apiserver, driven by kubernetes-asyncio:
the leader creates the `istio` GatewayClass; a Gateway of that class gets a ServiceAccount,
Deployment and Service named NAME-istio, owned by it, whose pods run `pilot-agent proxy router`
(the args parse with our own pilot-agent), honouring `gateway.istio.io/service-account` and
`spec.infrastructure`; its status addresses come from that Service; deleting the Gateway removes
them (the apiserver's garbage collector, which the fake implements, follows the ownerReferences).
"""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client as k8s

from pilot.agent.cli import build_parser
from pilot.inject.config import default_config_text
from tests.fakes.apiserver import FakeApiServer
from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend, answered_by
from tests.support.control_plane import ControlPlane
from tests.support.kubelet import run_container
from tests.support.ports import free_ports
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(120)
API = "gateway.networking.k8s.io"
CRDS = (("v1", "gatewayclasses", "GatewayClass", False), ("v1", "gateways", "Gateway", True),
        ("v1", "httproutes", "HTTPRoute", True), ("v1", "grpcroutes", "GRPCRoute", True),
        ("v1alpha2", "tcproutes", "TCPRoute", True), ("v1alpha2", "tlsroutes", "TLSRoute", True),
        ("v1beta1", "referencegrants", "ReferenceGrant", True), ("v1", "listenersets", "ListenerSet", True))


def gateway(name: str, class_name: str = "istio", labels: dict | None = None, annotations: dict | None = None,
            infrastructure: dict | None = None) -> dict:
    spec: dict = {"gatewayClassName": class_name, "listeners": [
        {"name": "http", "port": 8080, "protocol": "HTTP"},
        {"name": "db.tcp", "port": 9000, "protocol": "TCP"},
        {"name": "http-again", "port": 8080, "protocol": "HTTP", "hostname": "b.example.com"}]}
    if infrastructure:
        spec["infrastructure"] = infrastructure
    spec["allowedListeners"] = {"namespaces": {"from": "Same"}}
    return {"apiVersion": f"{API}/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": "apps", "labels": labels or {}, "annotations": annotations or {}},
            "spec": spec}


def deployed(fake: FakeApiServer, name: str, sa: str) -> tuple[dict, dict, dict] | None:
    objs = (fake.get("deployments.apps", name, namespace="apps"), fake.get("services", name, namespace="apps"),
            fake.get("serviceaccounts", sa, namespace="apps"))
    return objs if all(objs) else None  # type: ignore[return-value]


async def test_a_gateway_gets_its_deployment_service_and_account_and_takes_them_away(tmp_path):
    async with FakeApiServer() as fake:
        for version, plural, kind, namespaced in CRDS:
            fake.register_crd(API, version, plural, kind, namespaced)
        for ns in ("istio-system", "apps"):
            fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        # Someone else's Service under a name a Gateway would take: never touched.
        fake.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "theirs-istio", "namespace": "apps"},
                     "spec": {"ports": [{"name": "http", "port": 1234}]}})
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        cp = ControlPlane(tmp_path, kubeconfig=kubeconfig, env={"ENABLE_LEADER_ELECTION": "false"})
        async with cp, fake.api_client() as api_client:
            api = k8s.CustomObjectsApi(api_client)
            cls = await wait_for(lambda: fake.get(f"gatewayclasses.{API}", "istio"), timeout=20,
                                 message=f"the leader creates the istio GatewayClass\n{cp.log_tail()}")
            assert cls["spec"]["controllerName"] == "istio.io/gateway-controller"

            created = await api.create_namespaced_custom_object(API, "v1", "apps", "gateways", gateway(
                "web", labels={"team": "shop"},
                annotations={"gateway.istio.io/service-account": "web-sa", "note": "not copied"},
                infrastructure={"labels": {"cost-center": "42", "gateway.networking.k8s.io/x": "dropped"},
                                "annotations": {"owner": "ops"}}))
            uid = created["metadata"]["uid"]
            dep, svc, sa = await wait_for(lambda: deployed(fake, "web-istio", "web-sa"), timeout=20,
                                          message=f"the Gateway's objects\n{cp.log_tail()}")
            for obj in (dep, svc, sa):
                meta = obj["metadata"]
                assert meta["ownerReferences"] == [{"apiVersion": f"{API}/v1", "kind": "Gateway", "name": "web",
                                                    "uid": uid}]
                assert meta["labels"]["gateway.istio.io/managed"] == "istio.io-gateway-controller"
                assert meta["labels"]["gateway.networking.k8s.io/gateway-name"] == "web"
                assert meta["labels"]["cost-center"] == "42"  # spec.infrastructure, not the Gateway's own
                assert "team" not in meta["labels"] and "gateway.networking.k8s.io/x" not in meta["labels"]
                assert meta["annotations"] == {"owner": "ops"}
            pod = dep["spec"]["template"]
            assert dep["spec"]["selector"] == {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "web"}}
            assert pod["metadata"]["labels"]["gateway.networking.k8s.io/gateway-name"] == "web"
            assert pod["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
            assert pod["spec"]["serviceAccountName"] == "web-sa"
            (proxy,) = pod["spec"]["containers"]
            args = [a.replace("$(POD_NAMESPACE)", "apps") for a in proxy["args"]]
            parsed = build_parser().parse_args(args)  # what our pilot-agent makes of it
            assert (parsed.command, parsed.type, parsed.domain) == ("proxy", "router", "apps.svc.cluster.local")
            env = {e["name"]: e.get("value", e.get("valueFrom")) for e in proxy["env"]}
            assert env["CA_ADDR"] == "istiod.istio-system.svc:15012"
            assert json.loads(env["PROXY_CONFIG"])["discoveryAddress"] == "istiod.istio-system.svc:15012"
            assert env["ISTIO_META_WORKLOAD_NAME"] == "web-istio"
            token = next(v for v in pod["spec"]["volumes"] if v["name"] == "istio-token")
            assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "istio-ca"
            assert proxy["readinessProbe"]["httpGet"] == {"path": "/healthz/ready", "port": 15020, "scheme": "HTTP"}
            assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [
                ("status-port", 15021), ("http", 8080), ("db-tcp", 9000)]
            assert svc["spec"]["selector"] == {"gateway.networking.k8s.io/gateway-name": "web"}
            assert svc["spec"]["type"] == "LoadBalancer"

            # Status: the address is the Service the controller created.
            def programmed():
                status = fake.get(f"gateways.{API}", "web", namespace="apps").get("status") or {}
                cond = {c["type"]: c["status"] for c in status.get("conditions") or []}
                return status if cond.get("Programmed") == "True" else None

            status = await wait_for(programmed, timeout=20, message=f"Gateway programmed\n{cp.log_tail()}")
            assert status["addresses"] == [{"type": "Hostname", "value": "web-istio.apps.svc.cluster.local"}]

            # A ListenerSet the Gateway allows (watched): its port joins the Service, as istiod's
            # deployment controller adds it, and the leader writes the ListenerSet's status.
            await api.create_namespaced_custom_object(API, "v1", "apps", "listenersets", {
                "apiVersion": f"{API}/v1", "kind": "ListenerSet", "metadata": {"name": "extra", "namespace": "apps"},
                "spec": {"parentRef": {"name": "web"}, "listeners": [{"name": "more", "port": 8443, "protocol": "HTTP"}]}})

            def listener_set_programmed():
                ports = [p["port"] for p in fake.get("services", "web-istio", namespace="apps")["spec"]["ports"]]
                ls_status = fake.get(f"listenersets.{API}", "extra", namespace="apps").get("status") or {}
                cond = {c["type"]: c["status"] for c in ls_status.get("conditions") or []}
                return ls_status if 8443 in ports and cond == {"Accepted": "True", "Programmed": "True"} else None

            ls_status = await wait_for(listener_set_programmed, timeout=20,
                                       message=f"the ListenerSet's port on the Service, its status\n{cp.log_tail()}")
            assert [(e["name"], e["attachedRoutes"]) for e in ls_status["listeners"]] == [("more", 0)]
            gw_status = await wait_for(lambda: (s := fake.get(f"gateways.{API}", "web", namespace="apps")["status"])
                                       .get("attachedListenerSets") == 1 and s, timeout=20,
                                       message="attachedListenerSets on the Gateway")
            assert {c["type"]: c["status"] for c in gw_status["conditions"]}["Programmed"] == "True"

            # Not ours: another controller's class, another revision, a Hostname address, a
            # name already taken by an unmanaged object.
            fake.create({"apiVersion": f"{API}/v1", "kind": "GatewayClass", "metadata": {"name": "other"},
                         "spec": {"controllerName": "example.com/other"}})
            for body in (gateway("foreign", "other"), gateway("canary", labels={"istio.io/rev": "canary"}),
                         {**gateway("pinned"), "spec": {**gateway("pinned")["spec"], "addresses": [
                             {"type": "Hostname", "value": "lb.example.com"}]}},
                         gateway("theirs")):
                await api.create_namespaced_custom_object(API, "v1", "apps", "gateways", body)
            # A Gateway created after them all is deployed: the ones before it were judged.
            await api.create_namespaced_custom_object(API, "v1", "apps", "gateways", gateway("zz-last"))
            await wait_for(lambda: deployed(fake, "zz-last-istio", "zz-last-istio"), timeout=20,
                           message=f"the last Gateway's objects\n{cp.log_tail()}")
            for name in ("foreign-other", "canary-istio", "pinned-istio"):
                assert fake.get("deployments.apps", name, namespace="apps") is None, name
            theirs = fake.get("services", "theirs-istio", namespace="apps")
            assert "gateway.istio.io/managed" not in (theirs["metadata"].get("labels") or {})
            assert [p["port"] for p in theirs["spec"]["ports"]] == [1234]

            # Deleting the Gateway takes its objects with it.
            await api.delete_namespaced_custom_object(API, "v1", "apps", "gateways", "web")
            await wait_for(lambda: not any((fake.get("deployments.apps", "web-istio", namespace="apps"),
                                            fake.get("services", "web-istio", namespace="apps"),
                                            fake.get("serviceaccounts", "web-sa", namespace="apps"))),
                           timeout=20, message="the Gateway's objects are collected with it")
            assert deployed(fake, "zz-last-istio", "zz-last-istio") is not None  # other Gateways' stay


async def test_the_deployed_gateway_pod_runs_as_a_router_and_serves_its_routes(tmp_path):
    """Be the kubelet for the Deployment the controller wrote: its istio-proxy container (command,
    env, volumes) run as a process gets a certificate from the control plane, its Envoy gets the
    Gateway's listener, and an HTTPRoute through it reaches the backend."""
    issuer = Issuer("ES256")
    backend = await HttpBackend("shop").start()
    listener_port, status_port, admin_port = free_ports(3)
    try:
        async with FakeApiServer() as fake:
            for version, plural, kind, namespaced in CRDS:
                fake.register_crd(API, version, plural, kind, namespaced)
            for ns in ("istio-system", "apps"):
                fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            fake.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "shop", "namespace": "apps"},
                         "spec": {"ports": [{"name": "http", "port": 80}]}})
            fake.create({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                         "metadata": {"name": "shop-1", "namespace": "apps",
                                      "labels": {"kubernetes.io/service-name": "shop"}},
                         "ports": [{"name": "http", "port": backend.port}],
                         "endpoints": [{"addresses": ["127.0.0.1"]}]})
            kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
            cp = ControlPlane(tmp_path, kubeconfig=kubeconfig, secure_grpc=True,
                              env={"ENABLE_LEADER_ELECTION": "false", "JWT_RULE": issuer.rule(), "CA_KEY_TYPE": "EC"})
            async with cp:
                secure = f"127.0.0.1:{cp.secure_port}"
                # Here the mesh's Service names do not resolve: point proxies at the secure port.
                fake.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": "istio-system"},
                             "data": {"mesh": json.dumps({"defaultConfig": {
                                 "discoveryAddress": secure, "statusPort": status_port,
                                 "proxyAdminPort": admin_port, "concurrency": 1}})}})
                fake.create({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "istio-sidecar-injector", "namespace": "istio-system"},
                             "data": {"config": default_config_text(),
                                      "values": json.dumps({"global": {"caAddress": secure}})}})
                fake.create(gateway_with_port("web", listener_port))
                fake.create({"apiVersion": f"{API}/v1", "kind": "HTTPRoute", "metadata": {"name": "shop", "namespace": "apps"},
                             "spec": {"parentRefs": [{"name": "web"}], "hostnames": ["shop.example.com"],
                                      "rules": [{"backendRefs": [{"name": "shop", "port": 80}]}]}})

                def rendered():
                    dep = fake.get("deployments.apps", "web-istio", namespace="apps")
                    if dep is None:
                        return None
                    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
                    discovery = json.loads(env["PROXY_CONFIG"])["discoveryAddress"]
                    return dep if env["CA_ADDR"] == discovery == secure else None  # the ConfigMaps above

                dep = await wait_for(rendered, timeout=30, message=f"the gateway Deployment\n{cp.log_tail()}")
                root = await wait_for(lambda: (fake.get("configmaps", "istio-ca-root-cert", namespace="apps")
                                               or {}).get("data", {}).get("root-cert.pem"), 20, message="root ConfigMap")
                # The ReplicaSet's pod, as the apiserver stores it once scheduled.
                pod = {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {**dep["spec"]["template"]["metadata"], "name": "web-istio-5d8f7c9b6-x2x7q",
                                    "namespace": "apps", "uid": "pod-uid"},
                       "spec": {**dep["spec"]["template"]["spec"], "nodeName": "node-1"}}
                proc = run_container(pod, "istio-proxy", tmp_path / "rootfs",
                                     token=issuer.token(namespace="apps", sa="web-istio"),
                                     configmaps={"istio-ca-root-cert": {"root-cert.pem": root}})
                assert proc.args[:2] == ["proxy", "router"]
                agent = PilotAgent(proc.cwd, env=proc.env, args=proc.args[2:], proxy_type=proc.args[1])
                async with agent:
                    await agent.wait_ready(timeout=60)
                    probe = pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]
                    assert probe["port"] == status_port and (await agent.get("status", probe["path"]))[0] == 200

                    async def served():
                        return await answered_by(f"http://127.0.0.1:{listener_port}/", "shop.example.com")

                    assert await wait_for(served, timeout=30,
                                          message=f"routed by the deployed gateway\n{agent.log_tail()}") == (200, "shop")
    finally:
        await backend.stop()


def gateway_with_port(name: str, port: int) -> dict:
    return {"apiVersion": f"{API}/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": "apps"},
            "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": port, "protocol": "HTTP"}]}}
