"""An ExternalName Service through a real Envoy: its cluster resolves the external name by DNS
(istiod's DNSLB resolution), here `localhost`, and reaches a local backend on the service port."""

from __future__ import annotations

import textwrap

import aiohttp
import pytest

from tests.e2e.mesh_config import fqdn
from tests.support.backends import HttpBackend, answered_by
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)
NODE = sidecar_node_id("client-1")
# The sidecar's listener for the port binds here, so the backend can own 127.0.0.1:PORT, where
# `localhost` resolves (an ExternalName has no target port: the service port is used).
EGRESS_BIND = "127.0.0.5"


async def test_external_name_service_resolves_by_dns(tmp_path):
    (port,) = free_ports(1)
    backend = HttpBackend("outside", port=port)
    await backend.start()
    cp = ControlPlane(tmp_path)
    cp.write("ext.yaml", textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: ext, namespace: default}}
        spec:
          type: ExternalName
          externalName: localhost
          ports: [{{name: http, port: {port}}}]
        ---
        apiVersion: v1
        kind: Service
        metadata: {{name: broken, namespace: default}}
        spec:
          type: ExternalName
          externalName: "not a host!"
          ports: [{{name: http, port: {port}}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: client, namespace: default}}
        spec:
          egress:
          - port: {{number: {port}, protocol: HTTP, name: http}}
            bind: {EGRESS_BIND}
            hosts: ["./*"]
        """))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port), tmp_path)

        async def routed() -> bool:
            try:
                return await answered_by(f"http://{EGRESS_BIND}:{port}/", fqdn("ext")) == (200, "outside")
            except (aiohttp.ClientError, TimeoutError):
                return False

        await wait_for(routed, timeout=30, message=f"ExternalName through DNS\n{cp.log_tail()}")
        clusters = await envoy.admin_get("/clusters?format=json")
        assert f"outbound|{port}||{fqdn('ext')}" in clusters[1]
        config = (await envoy.admin_get("/config_dump?resource=dynamic_active_clusters"))[1]
        assert '"STRICT_DNS"' in config and '"localhost"' in config
        # The bad one is refused, with its object and the reason, and gets no cluster.
        assert f"outbound|{port}||{fqdn('broken')}" not in clusters[1]
        rejected = (await cp.debug("/debug/configz"))["rejected"]
        assert [(r["kind"], r["namespace"], r["name"]) for r in rejected] == [("Service", "default", "broken")]
        assert "not a DNS name" in rejected[0]["reason"]
    finally:
        await envoy.stop()
        await cp.stop()
        await backend.stop()
