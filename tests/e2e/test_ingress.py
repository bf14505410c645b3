"""Kubernetes Ingress (an IngressClass of istio.io/ingress-controller) through a real Envoy
running as the ingress gateway: the Service istio-ingressgateway maps ports 80 and 443 to free
target ports (as istiod maps them), an Ingress rule routes Host + path to its backend, and a
`spec.tls` secretName is served over SDS to a real TLS client."""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.test_gateway import (  # noqa: F401 - fixture
    GW_NS,
    SERVICE_PORT,
    GatewayEnv,
    env,
    gateway_service_yaml,
    http_request,
    tls_request,
)
from tests.support.certs import issue, make_ca, tls_secret_yaml
from tests.support.ports import free_ports

INGRESS_CLASS = """\
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: istio}
spec: {controller: istio.io/ingress-controller}
"""

pytestmark = pytest.mark.timeout(90)


async def test_ingress_routes_host_and_path(env: GatewayEnv):  # noqa: F811 - the fixture
    (target,) = free_ports(1)
    env.cp.write("gw-svc.yaml", gateway_service_yaml(("http2", 80, target)))
    env.cp.write("ingress-class.yaml", INGRESS_CLASS)
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


async def test_ingress_tls_secret_served_to_a_real_tls_client(env: GatewayEnv):  # noqa: F811 - the fixture
    host = "secure.example.com"
    ca = make_ca()
    cert = issue(ca, [host])
    http_target, https_target = free_ports(2)
    env.cp.write("gw-svc.yaml", gateway_service_yaml(("http2", 80, http_target), ("https", 443, https_target)))
    # As istiod: the secretName is a Secret of the gateway's namespace (K8S_INGRESS_NS).
    env.cp.write("secret.yaml", tls_secret_yaml("secure-cert", GW_NS, cert))
    env.cp.write("ingress-class.yaml", INGRESS_CLASS)
    env.cp.write("ingress.yaml", textwrap.dedent(f"""\
        apiVersion: networking.k8s.io/v1
        kind: Ingress
        metadata: {{name: secure, namespace: default}}
        spec:
          ingressClassName: istio
          tls: [{{hosts: [{host}], secretName: secure-cert}}]
          rules:
          - host: {host}
            http:
              paths:
              - {{path: /, pathType: Prefix, backend: {{service: {{name: beta, port: {{number: {SERVICE_PORT}}}}}}}}}
        """))
    await env.start(verified=True)

    async def served():
        return await tls_request(https_target, host, ca) == (200, "beta", cert.serial)

    await env.until(served, "HTTPS through the Ingress with its secretName")
    # The same Ingress still answers plain HTTP on 80.
    assert await http_request(http_target, host, "/") == (200, "beta")


async def test_ingress_class_controller_change_reaches_the_gateway(env: GatewayEnv):  # noqa: F811 - the fixture
    """The IngressClass decides whether its Ingresses are ours: handing it to another controller
    takes the routes off the running gateway, handing it back restores them (a change of the
    IngressClass alone, no Ingress changes)."""
    (target,) = free_ports(1)
    env.cp.write("gw-svc.yaml", gateway_service_yaml(("http2", 80, target)))
    env.cp.write("ingress-class.yaml", INGRESS_CLASS)
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
              - {{path: /, pathType: Prefix, backend: {{service: {{name: alpha, port: {{number: {SERVICE_PORT}}}}}}}}}
        """))
    await env.start()

    async def status() -> int:
        return (await http_request(target, "shop.example.com", "/"))[0]

    async def served():
        return await status() == 200

    async def not_served():  # no Ingress left: no server on 80, so no listener either
        try:
            return await status() == 404
        except ConnectionRefusedError:
            return True

    await env.until(served, "the Ingress of class istio routes shop.example.com")
    env.cp.write("ingress-class.yaml", INGRESS_CLASS.replace("istio.io/ingress-controller", "k8s.io/ingress-nginx"))
    await env.until(not_served, "the IngressClass handed to nginx: the gateway stops serving the Ingress")
    env.cp.write("ingress-class.yaml", INGRESS_CLASS)
    await env.until(served, "the IngressClass ours again: the route is back")
