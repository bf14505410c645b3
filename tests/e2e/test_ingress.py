"""Kubernetes Ingress (class istio) through a real Envoy running as the ingress gateway: the
Service istio-ingressgateway maps port 80 to a free target port (as istiod maps it), and an
Ingress rule routes Host + path to its backend."""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.test_gateway import GW_NS, SERVICE_PORT, GatewayEnv, env, http_request  # noqa: F401 - fixture
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(90)


async def test_ingress_routes_host_and_path(env: GatewayEnv):  # noqa: F811 - the fixture
    (target,) = free_ports(1)
    env.cp.write("gw-svc.yaml", textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: istio-ingressgateway, namespace: {GW_NS}}}
        spec:
          selector: {{istio: ingressgateway}}
          ports: [{{name: http2, port: 80, targetPort: {target}}}]
        """))
    env.cp.write("ingress.yaml", textwrap.dedent(f"""\
        apiVersion: networking.k8s.io/v1
        kind: Ingress
        metadata: {{name: shop, namespace: default}}
        spec:
          ingressClassName: istio
          rules:
          - host: shop.example.com
            http:
              paths:
              - {{path: /beta, pathType: Prefix, backend: {{service: {{name: beta, port: {{number: {SERVICE_PORT}}}}}}}}}
              - {{path: /, pathType: Prefix, backend: {{service: {{name: alpha, port: {{number: {SERVICE_PORT}}}}}}}}}
        """))
    # Another controller's Ingress: not served.
    env.cp.write("ingress-nginx.yaml", textwrap.dedent(f"""\
        apiVersion: networking.k8s.io/v1
        kind: Ingress
        metadata: {{name: other, namespace: default}}
        spec:
          ingressClassName: nginx
          rules:
          - host: other.example.com
            http:
              paths:
              - {{path: /, pathType: Prefix, backend: {{service: {{name: alpha, port: {{number: {SERVICE_PORT}}}}}}}}}
        """))
    await env.start()

    async def routed():
        return await http_request(target, "shop.example.com", "/") == (200, "alpha")

    await env.until(routed, "the Ingress routes shop.example.com")
    assert await http_request(target, "shop.example.com", "/beta/x") == (200, "beta")
    assert await http_request(target, "shop.example.com", "/beta") == (200, "beta")
    # Prefix matches whole segments: /betamax is not under /beta.
    assert await http_request(target, "shop.example.com", "/betamax") == (200, "alpha")
    assert (await http_request(target, "other.example.com", "/"))[0] == 404
