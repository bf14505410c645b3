"""The objects of Gateway API automated deployment (pilot/gateway_deploy/render.py), pure."""

from __future__ import annotations

import json

from pilot.config.validation import parse_object
from pilot.gateway_deploy.render import Inputs, controller_version_allows, is_managed, name_problem, render


def gw(name="web", listeners=None, addresses=None, labels=None, annotations=None):
    spec = {"gatewayClassName": "istio",
            "listeners": listeners or [{"name": "http", "port": 80, "protocol": "HTTP"}]}
    if addresses:
        spec["addresses"] = addresses
    return parse_object({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                         "metadata": {"name": name, "namespace": "apps", "uid": "u", "labels": labels or {},
                                      "annotations": annotations or {}}, "spec": spec})


def by_kind(objs):
    return {o["kind"]: o for o in objs}


def test_a_canary_revisions_gateway_reaches_istiod_canary_and_says_so():
    objs = by_kind(render(gw(), "istio", Inputs(revision="canary")))
    pod = objs["Deployment"]["spec"]["template"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["CA_ADDR"] == "istiod-canary.istio-system.svc:15012"
    assert json.loads(env["PROXY_CONFIG"])["discoveryAddress"] == "istiod-canary.istio-system.svc:15012"
    assert pod["metadata"]["annotations"]["istio.io/rev"] == "canary"
    # The Gateway's own labels and annotations are copied when spec.infrastructure sets none.
    objs = by_kind(render(gw(labels={"team": "a"}, annotations={"x": "1", "gateway.istio.io/service-account": "s"}),
                          "istio", Inputs()))
    assert objs["Service"]["metadata"]["labels"]["team"] == "a"
    assert objs["Service"]["metadata"]["annotations"] == {"x": "1"}
    assert objs["ServiceAccount"]["metadata"]["name"] == "s"
    assert objs["Service"]["metadata"]["labels"]["istio.io/dataplane-mode"] == "none"


def test_service_ports_one_per_listener_port_with_unique_names_and_the_type_annotation():
    g = gw(listeners=[{"name": "a.b", "port": 80, "protocol": "HTTP"},
                      {"name": "a-b", "port": 81, "protocol": "HTTP", "hostname": "x.example.com"},
                      {"name": "b", "port": 80, "protocol": "HTTP", "hostname": "y.example.com"}],
           annotations={"networking.istio.io/service-type": "ClusterIP"})
    svc = by_kind(render(g, "istio", Inputs()))["Service"]
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("status-port", 15021), ("a-b", 80), ("a-b-81", 81)]
    assert svc["spec"]["type"] == "ClusterIP"


def test_which_gateways_are_deployed():
    assert is_managed(gw().spec)
    assert is_managed(gw(addresses=[{"type": "IPAddress", "value": "10.0.0.1"}]).spec)
    assert not is_managed(gw(addresses=[{"type": "Hostname", "value": "lb.example.com"}]).spec)
    assert controller_version_allows({}) and controller_version_allows({"gateway.istio.io/controller-version": "5"})
    assert not controller_version_allows({"gateway.istio.io/controller-version": "6"})
    assert not controller_version_allows({"gateway.istio.io/controller-version": "x"})
    assert name_problem(gw(name="a" * 60), "istio") is not None and name_problem(gw(), "istio") is None


def test_service_ports_include_the_allowed_listener_sets_ports():
    """istiod's extractServicePorts(gw, listenersFromListenerSets): a merged port the Gateway
    already has is not repeated."""
    merged = parse_object({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "ListenerSet",
                           "metadata": {"name": "ls", "namespace": "apps"},
                           "spec": {"parentRef": {"name": "web"}, "listeners": [
                               {"name": "extra", "port": 8443, "protocol": "HTTPS",
                                "tls": {"certificateRefs": [{"name": "c"}]}},
                               {"name": "again", "port": 80, "protocol": "HTTP", "hostname": "a.example.com"}]}})
    svc = by_kind(render(gw(), "istio", Inputs(), tuple(merged.spec.listeners)))["Service"]
    assert [(p["name"], p["port"], p["appProtocol"]) for p in svc["spec"]["ports"]] == [
        ("status-port", 15021, "tcp"), ("http", 80, "http"), ("extra", 8443, "https")]


def proxy_config(namespace, name, spec, created=""):
    return parse_object({"apiVersion": "networking.istio.io/v1beta1", "kind": "ProxyConfig",
                         "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
                         "spec": spec})


def proxy_container(objs):
    return by_kind(objs)["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def test_proxy_configs_reach_the_gateway_in_istiods_precedence():
    values = {"global": {"hub": "docker.io/istio", "tag": "1.30.0"}}
    mesh = {"defaultConfig": {"concurrency": 1, "proxyMetadata": {"FROM_MESH": "1", "LEVEL": "mesh"}}}
    configs = [
        proxy_config("istio-system", "mesh-wide", {"concurrency": 2, "environmentVariables": {"LEVEL": "root"}}),
        proxy_config("apps", "namespace", {"concurrency": 3, "environmentVariables": {"LEVEL": "namespace"}}),
        proxy_config("apps", "other-gateway", {"selector": {"matchLabels": {
            "gateway.networking.k8s.io/gateway-name": "other"}}, "concurrency": 9}),
    ]
    c = proxy_container(render(gw(), "istio", Inputs(values=values, mesh=mesh), proxy_configs=configs))
    env = {e["name"]: e.get("value") for e in c["env"]}
    pc = json.loads(env["PROXY_CONFIG"])
    assert pc["concurrency"] == 3  # the namespace's over the root namespace's over the mesh's
    assert (env["FROM_MESH"], env["LEVEL"]) == ("1", "namespace")
    assert c["image"] == "docker.io/istio/proxyv2:1.30.0"

    # A ProxyConfig selecting this gateway's pods wins; its image type becomes the tag's suffix.
    configs.append(proxy_config("apps", "this-gateway", {
        "selector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "web"}},
        "concurrency": 4, "image": {"imageType": "distroless"}, "environmentVariables": {"LEVEL": "workload"}}))
    c = proxy_container(render(gw(), "istio", Inputs(values=values, mesh=mesh), proxy_configs=configs))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert json.loads(env["PROXY_CONFIG"])["concurrency"] == 4 and env["LEVEL"] == "workload"
    assert c["image"] == "docker.io/istio/proxyv2:1.30.0-distroless"
    # The Gateway's proxy.istio.io/config annotation sits between the namespace and the workload layers.
    c = proxy_container(render(gw(annotations={"proxy.istio.io/config": "concurrency: 7\n"}), "istio",
                               Inputs(values=values, mesh=mesh), proxy_configs=configs[:2]))
    assert json.loads({e["name"]: e.get("value") for e in c["env"]}["PROXY_CONFIG"])["concurrency"] == 7
