"""Proxyless gRPC: grpcio's own xDS client (in a subprocess) configured by the control plane.

grpcio names every resource: LDS `echo.default.svc.cluster.local:7070` (an API listener), RDS of
the same name, CDS `outbound|7070||echo.default.svc.cluster.local`, then EDS for that cluster.
Moving the EndpointSlice must move the client's RPCs to the other backend.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.support.control_plane import ControlPlane
from tests.support.grpc_client_proc import GrpcXdsClientProcess
from tests.support.grpc_echo import GrpcEchoBackend

pytestmark = pytest.mark.timeout(60)

PORT = 7070  # proxyless clients bind nothing, so any number will do
HOST = "echo.default.svc.cluster.local"
CLUSTER = f"outbound|{PORT}||{HOST}"


@pytest.fixture
async def backends():
    one, two = GrpcEchoBackend("echo-1"), GrpcEchoBackend("echo-2")
    await one.start()
    await two.start()
    try:
        yield one, two
    finally:
        await one.stop()
        await two.stop()


# istio-agent marks proxyless clients with GENERATOR=grpc; a bare grpcio bootstrap does not, and
# the server must recognise the client from its named `host:port` LDS request instead.
@pytest.mark.parametrize("metadata", [{"NAMESPACE": "default", "GENERATOR": "grpc"}, {"NAMESPACE": "default"}],
                         ids=["generator-grpc", "no-generator"])
async def test_proxyless_client_follows_endpoint_changes(tmp_path, backends, metadata):
    one, two = backends
    cp = ControlPlane(tmp_path)
    cp.write("echo.yaml", service_yaml("echo", PORT, port_name="grpc"))
    cp.write("echo-eps.yaml", endpoint_slice_yaml("echo", one.port, port_name="grpc"))
    async with cp:
        client = GrpcXdsClientProcess(f"xds:///{HOST}:{PORT}", cp.xds_port, tmp_path, max_seconds=40,
                                      call_timeout=1.0, metadata=metadata)
        await client.start()
        try:
            await client.wait_for_reply("echo-1:", timeout=15, since=0)

            # The server sees a proxyless client that named exactly what it needs, all ACKed.
            proxy_id = client.bootstrap["node"]["id"]
            row = await cp.wait_synced(proxy_id)
            assert all(row[f"{t}_nack"] is None for t in ("cluster", "listener", "route", "endpoint")), row
            adsz = await cp.debug("/debug/adsz")
            watches = next(c["watches"] for c in adsz["clients"] if c["connectionId"] == row["connection_id"])
            assert watches["type.googleapis.com/envoy.config.listener.v3.Listener"] == [f"{HOST}:{PORT}"]
            assert watches["type.googleapis.com/envoy.config.cluster.v3.Cluster"] == [CLUSTER]
            assert watches["type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"] == [CLUSTER]

            mark = len(client.lines)
            cp.write("echo-eps.yaml", endpoint_slice_yaml("echo", two.port, port_name="grpc"))
            await client.wait_for_reply("echo-2:", timeout=10, since=mark)
            # Once switched, the client stays on backend 2 (the old endpoint is gone, not added to).
            settled = len(client.lines)
            await client.wait_for_line(lambda _line: True, timeout=5, since=settled + 4,
                                       message="four more attempts after the switch")
            assert client.replies(settled) and all(r.startswith("echo-2:") for r in client.replies(settled)), \
                client.describe()
        finally:
            await client.stop()


async def test_proxyless_client_sees_service_appear_and_go(tmp_path, backends):
    """The client starts before the Service exists: it gets errors, then replies once the Service
    is written, then a "does not exist" error once the Service file is deleted."""
    one, _two = backends
    async with ControlPlane(tmp_path) as cp:
        client = GrpcXdsClientProcess(f"xds:///{HOST}:{PORT}", cp.xds_port, tmp_path, max_seconds=40,
                                      call_timeout=1.0)
        await client.start()
        try:
            await client.wait_for_error("", timeout=10, since=0)
            cp.write("echo.yaml", service_yaml("echo", PORT, port_name="grpc"))
            cp.write("echo-eps.yaml", endpoint_slice_yaml("echo", one.port, port_name="grpc"))
            await client.wait_for_reply("echo-1:", timeout=15)

            cp.remove("echo.yaml")
            # SotW LDS omits the listener, which grpcio reads as "deleted".
            await client.wait_for_error("does not exist", timeout=10)
            row = await cp.sync_status(client.bootstrap["node"]["id"])
            assert row and all(row[f"{t}_nack"] is None for t in ("cluster", "listener", "route", "endpoint")), row
        finally:
            await client.stop()


def _sidecar(hosts: list[str]) -> str:
    return ("apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: default}\n"
            f"spec:\n  egress:\n  - hosts: {hosts}\n")


async def test_sidecar_egress_scope_limits_what_a_proxyless_client_is_given(tmp_path, backends):
    """istiod builds grpc clients' LDS and RDS from the Sidecar scope: a service the client's
    Sidecar hides has no listener (its RPCs fail); once the Sidecar shows it, it routes."""
    one, _two = backends
    cp = ControlPlane(tmp_path)
    cp.write("echo.yaml", service_yaml("echo", PORT, port_name="grpc"))
    cp.write("echo-eps.yaml", endpoint_slice_yaml("echo", one.port, port_name="grpc"))
    cp.write("sidecar.yaml", _sidecar(["./nothing.default.svc.cluster.local"]))
    async with cp:
        client = GrpcXdsClientProcess(f"xds:///{HOST}:{PORT}", cp.xds_port, tmp_path, max_seconds=40,
                                      call_timeout=1.0, metadata={"NAMESPACE": "default", "GENERATOR": "grpc"})
        await client.start()
        try:
            await client.wait_for_error("", timeout=10, since=0)
            await client.wait_for_line(lambda _line: True, timeout=10, since=3, message="three attempts")
            assert not client.replies(0), client.describe()  # never routed while hidden
            proxy_id = client.bootstrap["node"]["id"]
            # What the control plane sends this client: no listener and no route config for it.
            sent = json.dumps(await cp.debug(f"/debug/config_dump?proxyID={proxy_id}"))
            assert f'"{HOST}:{PORT}"' not in sent, sent[:2000]
            cp.write("sidecar.yaml", _sidecar(["./echo.default.svc.cluster.local"]))
            await client.wait_for_reply("echo-1:", timeout=15)
            assert f'"{HOST}:{PORT}"' in json.dumps(await cp.debug(f"/debug/config_dump?proxyID={proxy_id}"))
        finally:
            await client.stop()
