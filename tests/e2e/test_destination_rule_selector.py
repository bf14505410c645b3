"""A DestinationRule with a workloadSelector reaches only the sidecars it selects: two real Envoys
in one namespace, each read through its own admin /config_dump. The rule without a selector keeps
applying to the other sidecar, and a sidecar of another namespace with matching labels is not
selected either (istiod's rule: a selector rule exists only in its own namespace)."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)

CLUSTER = "outbound|9080||reviews.default.svc.cluster.local"

MESH = textwrap.dedent("""\
    apiVersion: v1
    kind: Service
    metadata: {name: reviews, namespace: default}
    spec:
      ports: [{name: http, port: 9080}]
    ---
    apiVersion: networking.istio.io/v1
    kind: DestinationRule
    metadata: {name: reviews, namespace: default}
    spec:
      host: reviews
      trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}
    """)

SELECTED = textwrap.dedent("""\
    apiVersion: networking.istio.io/v1
    kind: DestinationRule
    metadata: {name: reviews-for-productpage, namespace: default}
    spec:
      host: reviews
      exportTo: ["."]
      workloadSelector: {matchLabels: {app: productpage}}
      trafficPolicy: {connectionPool: {tcp: {maxConnections: 1}}}
    """)


def sidecar(pod: str, namespace: str, labels: dict[str, str], xds_port: int) -> dict:
    return Envoy.bootstrap(sidecar_node_id(pod, namespace), xds_port, cluster=f"{pod}.{namespace}",
                           metadata={"NAMESPACE": namespace, "INTERCEPTION_MODE": "NONE", "LABELS": labels})


async def cds_state(envoy: Envoy) -> tuple[str, int | None]:
    """(CDS version, max_connections of the reviews cluster) as this Envoy holds them."""
    dump = await envoy.config_dump(resource="dynamic_active_clusters")
    for c in dump.get("configs", []):
        cluster = c.get("cluster", {})
        if cluster.get("name") == CLUSTER:
            thresholds = cluster.get("circuit_breakers", {}).get("thresholds", [])
            value = thresholds[0].get("max_connections") if thresholds else None
            return c.get("version_info", ""), value
    return "", None


async def test_workload_selector_reaches_only_the_selected_sidecar(tmp_path):
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", MESH)
    envoys = {}
    try:
        await cp.start()
        for pod, ns, labels in (("productpage-1", "default", {"app": "productpage"}),
                                ("details-1", "default", {"app": "details"}),
                                ("productpage-9", "other", {"app": "productpage"})):
            e = Envoy()
            await e.start(sidecar(pod, ns, labels, cp.xds_port), tmp_path / pod)
            await e.wait_ready()
            envoys[pod] = e

        async def everyone(value: int):
            states = {p: await cds_state(e) for p, e in envoys.items()}
            return states if all(v == value for _, v in states.values()) else None

        await wait_for(lambda: everyone(7), 20,
                       message=f"the rule without a selector everywhere\n{cp.log_tail(10)}")

        cp.write("selected.yaml", SELECTED)

        async def selected_applied():
            return (await cds_state(envoys["productpage-1"]))[1] == 1

        await wait_for(selected_applied, 20,
                       message=f"selected sidecar got the selector rule\n{cp.log_tail(10)}")
        # The others must not have it. To know their view is current (not merely not pushed yet),
        # change the selector-less rule for everyone and wait until each Envoy holds the change.
        cp.write("mesh.yaml", MESH.replace("maxConnections: 7", "maxConnections: 8"))

        async def settled():
            states = {p: await cds_state(e) for p, e in envoys.items()}
            return states if states["productpage-1"][1] == 1 and states["details-1"][1] == 8 \
                and states["productpage-9"][1] == 8 else None

        states = await wait_for(settled, 20,
                                message=f"the rule without a selector moved to 8\n{cp.log_tail(10)}")
        assert states["productpage-1"][1] == 1, json.dumps(states)
        assert states["details-1"][1] == 8 and states["productpage-9"][1] == 8, json.dumps(states)
    finally:
        for e in envoys.values():
            await e.stop()
        await cp.stop()
