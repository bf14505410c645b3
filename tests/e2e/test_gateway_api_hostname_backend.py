"""A backendRef of kind Hostname (networking.istio.io) through a real gateway Envoy: the route
reaches the ServiceEntry's endpoint by its host; the status says ResolvedRefs; the ServiceEntry
going away makes it BackendNotFound and the rule answers 500."""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.gateway_api_env import (
    GW_NAME,
    GW_NS,
    GatewayApiEnv,
    conditions,
    gateway_service_yaml,
    gateway_yaml,
    parent_status,
    request,
    route_yaml,
    running_env,
)
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def env(tmp_path):
    async with running_env(tmp_path, ("alpha", "external")) as e:
        yield e


async def test_a_hostname_backend_reaches_the_service_entry(env: GatewayApiEnv):
    gw_port, se_port = free_ports(2)
    external = env.backends["external"]
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: http
          port: {gw_port}
          protocol: HTTP
          allowedRoutes: {{namespaces: {{from: All}}}}
        """) + "---\n" + gateway_service_yaml(gw_port))
    env.cp.write("se.yaml", textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: ServiceEntry
        metadata: {{name: api, namespace: egress}}
        spec:
          hosts: [api.example.test]
          ports: [{{number: {se_port}, name: http, protocol: HTTP}}]
          resolution: STATIC
          endpoints: [{{address: 127.0.0.1, ports: {{http: {external.port}}}}}]
        """))
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "to-host", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        rules:
        - backendRefs: [{{group: networking.istio.io, kind: Hostname, name: api.example.test, port: {se_port}}}]
        """))
    await env.start()
    await env.served(gw_port, "any.example.com", "/", "external")
    parent = parent_status(await env.status("HTTPRoute", "to-host"))
    assert conditions(parent)["ResolvedRefs"] == ("True", "ResolvedRefs")

    env.cp.remove("se.yaml")

    async def not_found():
        p = parent_status(await env.status("HTTPRoute", "to-host"))
        r = await request(gw_port, "any.example.com", "/")
        return p if conditions(p)["ResolvedRefs"] == ("False", "BackendNotFound") and r.status == 500 else None

    await env.until(not_found, "the Hostname backend gone: BackendNotFound, 500")
