"""The mesh the traffic-management e2e tests share: a `reviews` service with two versions
(Pods labelled version=v1/v2 behind EndpointSlices pointing at their Pods), a `mirror` service,
one sidecar Envoy without iptables, and helpers to write rules and call through Envoy."""

from __future__ import annotations

import json
import textwrap

import aiohttp
import pytest

from tests.e2e.mesh_config import fqdn
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

NODE = sidecar_node_id("productpage-1")
REVIEWS = fqdn("reviews")


def mesh_yaml(port: int, v1: int, v2: int, mirror: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: reviews, namespace: default}}
        spec:
          ports: [{{name: http, port: {port}}}]
        ---
        apiVersion: v1
        kind: Pod
        metadata: {{name: reviews-v1, namespace: default, labels: {{app: reviews, version: v1}}}}
        status: {{podIP: 127.0.0.1}}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {{name: reviews-v2, namespace: default, labels: {{app: reviews, version: v2}}}}
        status: {{podIP: 127.0.0.2}}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: reviews-1
          namespace: default
          labels: {{kubernetes.io/service-name: reviews}}
        addressType: IPv4
        ports: [{{name: http, port: {v1}}}]
        endpoints:
        - addresses: ["127.0.0.1"]
          targetRef: {{kind: Pod, name: reviews-v1, namespace: default}}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: reviews-2
          namespace: default
          labels: {{kubernetes.io/service-name: reviews}}
        addressType: IPv4
        ports: [{{name: http, port: {v2}}}]
        endpoints:
        - addresses: ["127.0.0.1"]
          targetRef: {{kind: Pod, name: reviews-v2, namespace: default}}
        ---
        apiVersion: v1
        kind: Service
        metadata: {{name: mirror, namespace: default}}
        spec:
          ports: [{{name: http, port: {port}}}]
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: mirror-1
          namespace: default
          labels: {{kubernetes.io/service-name: mirror}}
        addressType: IPv4
        ports: [{{name: http, port: {mirror}}}]
        endpoints:
        - addresses: ["127.0.0.1"]
        """)


SUBSETS = """
    host: reviews
    subsets:
    - {name: v1, labels: {version: v1}}
    - {name: v2, labels: {version: v2}}
    """


class Mesh:
    def __init__(self, cp: ControlPlane, port: int, backends: dict[str, HttpBackend], envoy: Envoy) -> None:
        self.cp, self.port, self.backends, self.envoy = cp, port, backends, envoy

    async def get(self, path: str = "/", headers: dict | None = None, timeout: float = 5):
        """(status, backend name or None, response headers, body)."""
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.port}{path}", headers={"Host": REVIEWS, **(headers or {})},
                             allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                body = await r.text()
                try:
                    name = json.loads(body).get("name")
                except ValueError:
                    name = None
                return r.status, name, r.headers, body

    def virtual_service(self, spec: str) -> None:
        self.cp.write("vs.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\n"
                                 "metadata: {name: reviews, namespace: default}\nspec:\n"
                                 + textwrap.indent(textwrap.dedent(spec), "  "))

    async def until(self, check, message: str, timeout: float = 10):
        return await wait_for(check, timeout, message=f"{message}\n{self.cp.log_tail(10)}")


@pytest.fixture
async def mesh(tmp_path):
    backends = {n: await HttpBackend(n).start() for n in ("v1", "v2", "mirror")}
    port = free_port()
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mesh_yaml(port, backends["v1"].port, backends["v2"].port, backends["mirror"].port))
    cp.write("dr.yaml", destination_rule(SUBSETS))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port), tmp_path)
        await envoy.wait_ready()
        m = Mesh(cp, port, backends, envoy)

        async def up():
            return (await m.get())[0] == 200

        await m.until(up, "reviews reachable")
        yield m
    finally:
        await envoy.stop()
        await cp.stop()
        for b in backends.values():
            await b.stop()


def destination_rule(spec: str) -> str:
    return ("apiVersion: networking.istio.io/v1\nkind: DestinationRule\n"
            "metadata: {name: reviews, namespace: default}\nspec:\n" + textwrap.indent(textwrap.dedent(spec), "  "))
