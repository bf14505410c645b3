"""What istiod applies where a user writes little, read back from a real Envoy configured by the
real control plane: the least-request balancer, the mesh's h2UpgradePolicy, an abort without a
percentage (aborts nothing, as istiod's unset percentage), a ServiceEntry's every address.

The unit tests (tests/unit/test_istiod_defaults.py) pin the generated protos; here Envoy's own
/config_dump and an HTTP call through it show that Envoy took them as meant."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.support.backends import HttpBackend, http_get
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)


def mesh_configmap(mesh: str) -> str:
    return textwrap.dedent("""\
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: istio, namespace: istio-system}
        data:
          mesh: |
        """) + textwrap.indent(mesh or "{}", "    ") + "\n"


def virtual_service(fault: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {{name: alpha, namespace: default}}
        spec:
          hosts: [alpha]
          http:
          - fault: {fault}
            route: [{{destination: {{host: alpha}}}}]
        """)


def service_entry(port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: ServiceEntry
        metadata: {{name: legacy, namespace: default}}
        spec:
          hosts: [legacy.internal]
          location: MESH_INTERNAL
          resolution: STATIC
          addresses: [10.20.0.1, 10.20.0.2, 192.168.0.0/16]
          endpoints: [{{address: 127.0.0.1}}]
          ports: [{{number: {port}, name: http, protocol: HTTP}}]
        """)


async def _dynamic(envoy: Envoy, what: str) -> list[dict]:
    dump = await envoy.config_dump(resource=what)
    return [c.get("cluster") or c.get("route_config") or c for c in dump.get("configs", [])]


async def test_envoy_holds_istiods_defaults(tmp_path):
    backend = await HttpBackend("a").start()
    port = free_port()
    cp = ControlPlane(tmp_path)
    cp.write("svc-alpha.yaml", service_yaml("alpha", port))
    cp.write("eps-alpha.yaml", endpoint_slice_yaml("alpha", backend.port))
    cp.write("se-legacy.yaml", service_entry(port))
    cp.write("mesh.yaml", mesh_configmap(""))
    node_id = sidecar_node_id("app-1")
    envoy = Envoy()
    name = f"outbound|{port}||{fqdn('alpha')}"
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(node_id, cp.xds_port), tmp_path)
        await envoy.wait_ready()

        async def cluster() -> dict | None:
            return next((c for c in await _dynamic(envoy, "dynamic_active_clusters") if c["name"] == name), None)

        alpha = await wait_for(cluster, 15, message=f"{name} in Envoy\n{cp.log_tail(15)}")
        assert alpha["lb_policy"] == "LEAST_REQUEST"
        assert "http2_protocol_options" not in json.dumps(alpha)

        # Every address of the ServiceEntry is a name Envoy routes by.
        routes = await _dynamic(envoy, "dynamic_route_configs")
        domains = {d for rc in routes for vh in rc.get("virtual_hosts", []) for d in vh.get("domains", [])}
        assert {"10.20.0.1", "10.20.0.2", f"10.20.0.2:{port}"} <= domains

        # An abort without a percentage aborts nothing; with 100% every request.
        async def answer() -> tuple[int, str]:
            return await http_get(f"http://127.0.0.1:{port}/", headers={"Host": fqdn("alpha")}, timeout=3)

        async def status_is(code: int):
            async def check() -> bool:
                return (await answer())[0] == code
            return check

        cp.write("vs-alpha.yaml", virtual_service("{abort: {httpStatus: 418, percentage: {value: 100}}}"))
        await wait_for(await status_is(418), 15, message="the 100% abort reaches Envoy")
        cp.write("vs-alpha.yaml", virtual_service("{abort: {httpStatus: 418}}"))
        await wait_for(await status_is(200), 15, message="an abort without percentage aborts nothing")
        for _ in range(5):
            assert (await answer())[0] == 200

        # The mesh's h2UpgradePolicy reaches the HTTP port's cluster.
        cp.write("mesh.yaml", mesh_configmap("h2UpgradePolicy: UPGRADE"))

        async def upgraded() -> bool:
            c = await cluster()
            return c is not None and "http2_protocol_options" in json.dumps(c)

        await wait_for(upgraded, 15, message=f"h2 upgrade in Envoy's cluster\n{cp.log_tail(15)}")
    finally:
        await envoy.stop()
        await cp.stop()
        await backend.stop()
