"""Gateway API HTTP through a real Envoy standing in for the Gateway's deployment: HTTPRoutes
translated into the gateway's config, and the status of every object checked field by field
against the spec's conditions at /debug/gatewayz (file mode)."""

from __future__ import annotations

import pytest

from tests.e2e.gateway_api_env import (
    GW_NAME,
    GW_NS,
    SERVICE_PORT,
    GatewayApiEnv,
    conditions,
    gateway_service_yaml,
    gateway_yaml,
    listener_status,
    parent_status,
    request,
    route_yaml,
)
from tests.support.backends import HttpBackend
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(90)

OK = ("True", "Accepted")
HTTP_KINDS = [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"},
              {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}]


@pytest.fixture
async def env(tmp_path):
    backends = {n: await HttpBackend(n).start() for n in ("alpha", "beta", "gamma")}
    e = GatewayApiEnv(tmp_path, backends)
    try:
        yield e
    finally:
        await e.stop()
        for b in backends.values():
            await b.stop()


async def test_http_route_by_host_and_path_and_its_status(env: GatewayApiEnv):
    (port,) = free_ports(1)
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: http
          port: {port}
          protocol: HTTP
          allowedRoutes: {{namespaces: {{from: All}}}}
        """) + "---\n" + gateway_service_yaml(port))
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "shop", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        hostnames: [shop.example.com]
        rules:
        - matches: [{{path: {{type: PathPrefix, value: /beta}}}}]
          backendRefs: [{{name: beta, port: {SERVICE_PORT}}}]
        - backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]
        """))
    await env.start()

    await env.served(port, "shop.example.com", "/", "alpha")
    assert (await request(port, "shop.example.com", "/beta")).backend == "beta"
    assert (await request(port, "shop.example.com", "/beta/x")).backend == "beta"
    # PathPrefix matches whole path segments: /betamax is not under /beta.
    assert (await request(port, "shop.example.com", "/betamax")).backend == "alpha"
    assert (await request(port, f"shop.example.com:{port}", "/beta")).backend == "beta"
    assert (await request(port, "other.example.com", "/")).status == 404

    # The status, field by field.
    cls = await env.status("GatewayClass", "istio", namespace="")
    assert [(c["type"], c["status"], c["reason"]) for c in cls["conditions"]] == [("Accepted", "True", "Accepted")]
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    assert conditions(gw) == {"Accepted": OK, "Programmed": ("True", "Programmed")}
    assert all(c["observedGeneration"] == 1 and c["lastTransitionTime"] for c in gw["conditions"])
    assert gw["addresses"] == [{"type": "Hostname", "value": f"{GW_NAME}-istio.{GW_NS}.svc.cluster.local"}]
    listener = listener_status(gw, "http")
    assert listener["attachedRoutes"] == 1
    assert listener["supportedKinds"] == HTTP_KINDS
    assert conditions(listener) == {"Accepted": OK, "Conflicted": ("False", "NoConflicts"),
                                    "Programmed": ("True", "Programmed"), "ResolvedRefs": ("True", "ResolvedRefs")}
    route = await env.status("HTTPRoute", "shop")
    parent = parent_status(route)
    assert parent["parentRef"] == {"name": GW_NAME, "namespace": GW_NS}
    assert parent["controllerName"] == "istio.io/gateway-controller"
    assert conditions(parent) == {"Accepted": OK, "ResolvedRefs": ("True", "ResolvedRefs")}

    # configz shows the same status on the object.
    configz = await env.cp.debug("/debug/configz")
    obj = next(c for c in configz["configs"] if c["kind"] == "HTTPRoute")
    assert obj["object"]["status"] == route

    # Without the deployment's Service the Gateway has no address: not Programmed, still served.
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: http
          port: {port}
          protocol: HTTP
          allowedRoutes: {{namespaces: {{from: All}}}}
        """))

    async def unprogrammed():
        s = await env.status("Gateway", GW_NAME, GW_NS)
        return s if conditions(s)["Programmed"] == ("False", "AddressNotUsable") else None

    gw2 = await env.until(unprogrammed, "the Gateway lost its address")
    assert "addresses" not in gw2
    accepted_before = next(c for c in gw["conditions"] if c["type"] == "Accepted")
    accepted_after = next(c for c in gw2["conditions"] if c["type"] == "Accepted")
    assert accepted_after["lastTransitionTime"] == accepted_before["lastTransitionTime"]  # unchanged condition
    assert (await request(port, "shop.example.com", "/")).backend == "alpha"
