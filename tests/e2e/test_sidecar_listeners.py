"""Sidecar `egress` listeners with a port and `bind`, and `ingress` listeners with captureMode
NONE, through a real Envoy without iptables (a plain local Envoy, no mesh identity)."""

from __future__ import annotations

import textwrap

import aiohttp
import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.support.backends import HttpBackend, answered_by
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)
NODE = sidecar_node_id("client-1")
EGRESS_BIND = "127.0.0.5"


def sidecar_yaml(port: int, ingress_port: int, app_port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: client, namespace: default}}
        spec:
          workloadSelector: {{labels: {{app: client}}}}
          outboundTrafficPolicy: {{mode: REGISTRY_ONLY}}
          egress:
          - port: {{number: {port}, protocol: HTTP, name: http}}
            bind: {EGRESS_BIND}
            hosts: ["./{fqdn('alpha')}"]
          - hosts: ["./*"]
          ingress:
          - port: {{number: {ingress_port}, protocol: HTTP, name: web}}
            defaultEndpoint: 127.0.0.1:{app_port}
            captureMode: NONE
        """)


async def get(address: str, port: int, host: str) -> tuple[int, str | None]:
    return await answered_by(f"http://{address}:{port}/", host)


async def test_egress_port_listener_binds_its_address_and_sees_only_its_hosts(tmp_path):
    port, ingress_port = free_ports(2)
    alpha, beta, app = HttpBackend("alpha"), HttpBackend("beta"), HttpBackend("local-app")
    for b in (alpha, beta, app):
        await b.start()
    cp = ControlPlane(tmp_path)
    for name, backend in (("alpha", alpha), ("beta", beta)):
        cp.write(f"{name}.yaml", service_yaml(name, port) + "---\n" + endpoint_slice_yaml(name, backend.port))
    cp.write("sidecar.yaml", sidecar_yaml(port, ingress_port, app.port))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata={
            "NAMESPACE": "default", "INTERCEPTION_MODE": "NONE", "LABELS": {"app": "client"}}), tmp_path)

        async def routed():
            try:
                return await get(EGRESS_BIND, port, fqdn("alpha")) == (200, "alpha")
            except aiohttp.ClientError:
                return False

        await wait_for(routed, timeout=20, message=f"egress listener on {EGRESS_BIND}\n{cp.log_tail()}")
        listeners = await envoy.listener_ports()
        assert f"{EGRESS_BIND}_{port}" in listeners and f"127.0.0.1_{port}" not in listeners
        # beta shares the port but is not among that listener's hosts: not routed there.
        status, name = await get(EGRESS_BIND, port, fqdn("beta"))
        assert name != "beta" and status >= 400
        # The ingress listener delivers to the app at its defaultEndpoint.
        assert await get("127.0.0.1", ingress_port, "anything") == (200, "local-app")
    finally:
        await envoy.stop()
        await cp.stop()
        for b in (alpha, beta, app):
            await b.stop()
