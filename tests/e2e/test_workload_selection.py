"""Workloads istiod's registries select, through a real Envoy: a Kubernetes Service whose
selector picks a WorkloadEntry (PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES, on by default) and a
ServiceEntry whose workloadSelector picks a Pod. Envoy holds each as an endpoint with the
entry's weight and sends traffic to it."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.e2e.mesh_config import fqdn
from tests.support.backends import HttpBackend, http_get
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)


def config(vm_svc_port: int, vm_port: int, se_port: int, pod_port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: legacy, namespace: default}}
        spec:
          selector: {{app: legacy}}
          ports: [{{name: http, port: {vm_svc_port}}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: legacy-vm, namespace: default}}
        spec:
          address: 127.0.0.1
          labels: {{app: legacy}}
          ports: {{http: {vm_port}}}
          weight: 7
        ---
        apiVersion: networking.istio.io/v1
        kind: ServiceEntry
        metadata: {{name: db, namespace: default}}
        spec:
          hosts: [db.internal]
          location: MESH_INTERNAL
          resolution: STATIC
          ports: [{{number: {se_port}, name: http, protocol: HTTP, targetPort: {pod_port}}}]
          workloadSelector: {{labels: {{app: db}}}}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {{name: db-1, namespace: default, labels: {{app: db}}}}
        spec: {{serviceAccountName: db}}
        status:
          podIP: 127.0.0.1
          phase: Running
          conditions: [{{type: Ready, status: "True"}}]
        """)


async def test_service_selects_workload_entry_and_service_entry_selects_pod(tmp_path):
    vm, db = HttpBackend("legacy-vm"), HttpBackend("db-pod")
    await vm.start()
    await db.start()
    svc_port, se_port = free_ports(2)
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", config(svc_port, vm.port, se_port, db.port))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(sidecar_node_id("app-1"), cp.xds_port), tmp_path)
        await envoy.wait_ready()

        async def answered(port: int, host: str, name: str) -> bool:
            status, body = await http_get(f"http://127.0.0.1:{port}/", headers={"Host": host}, timeout=3)
            try:
                return status == 200 and json.loads(body).get("name") == name
            except ValueError:
                return False

        await wait_for(lambda: answered(svc_port, fqdn("legacy"), "legacy-vm"), 30,
                       message=f"legacy -> WorkloadEntry\n{envoy.log_tail(15)}\n{cp.log_tail(15)}")
        await wait_for(lambda: answered(se_port, "db.internal", "db-pod"), 30,
                       message=f"db.internal -> Pod\n{envoy.log_tail(15)}")
        hosts = {c["name"]: c.get("host_statuses", []) for c in (await envoy.clusters())["cluster_statuses"]}
        legacy = hosts[f"outbound|{svc_port}||{fqdn('legacy')}"]
        assert [(h["address"]["socket_address"]["port_value"], h["weight"]) for h in legacy] == [(vm.port, 7)]
        pod = hosts[f"outbound|{se_port}||db.internal"]
        assert [h["address"]["socket_address"]["port_value"] for h in pod] == [db.port]
    finally:
        await envoy.stop()
        await cp.stop()
        await vm.stop()
        await db.stop()
