"""What a user sees when the MeshConfig or the environment asks for something this control plane
does not do: it starts (as istiod does), says so once at warning, and /debug/mesh lists it."""

from __future__ import annotations

import pytest

from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)

MESH = """\
trustDomain: td.example
enableEnvoyAccessLogService: true
disableEnvoyListenerLog: true
extensionProviders: [{name: authz, envoyExtAuthzGrpc: {service: authz.svc, port: 9000}}]
"""

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: istio, namespace: istio-system}
data:
  mesh: |
    trustDomain: td.example
    enableEnvoyAccessLogService: true
  meshNetworks: |
    networks: {}
"""


def warnings(cp: ControlPlane, text: str) -> list[str]:
    return [line for line in cp.log_tail(400).splitlines() if "warn" in line.lower() and text in line]


async def test_unsupported_mesh_fields_and_unknown_knobs_are_reported_not_fatal(tmp_path):
    async with ControlPlane(tmp_path, mesh_config=MESH, env={"PILOT_ENABLE_CDS_CACHE": "false"}) as cp:
        mesh = await cp.debug("/debug/mesh")
        assert mesh["mesh"]["trustDomain"] == "td.example"  # the rest applies
        assert mesh["unsupported"] == ["disableEnvoyListenerLog", "enableEnvoyAccessLogService"]
        unknown = mesh["unknownEnv"]
        assert "PILOT_ENABLE_CDS_CACHE" in unknown and "PILOT_DEBOUNCE_AFTER" not in unknown
        assert len(warnings(cp, "MeshConfig fields not supported")) == 1
        assert len(warnings(cp, "PILOT_ENABLE_CDS_CACHE")) == 1

        # The ConfigMap takes over: its own unsupported fields (and keys) replace the file's.
        cp.write("istio.yaml", CONFIGMAP)

        async def switched():
            m = await cp.debug("/debug/mesh")
            return m if m["source"].startswith("configmap") else None
        mesh = await wait_for(switched, message="the ConfigMap's MeshConfig in force")
        # (its meshNetworks key is applied: pilot/model/networks.py)
        assert mesh["unsupported"] == ["enableEnvoyAccessLogService"]
        assert len(warnings(cp, "MeshConfig fields not supported")) == 2
