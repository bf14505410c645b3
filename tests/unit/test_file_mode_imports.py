"""File mode does not load what only Kubernetes mode or the CA use: kubernetes_asyncio (its
client package alone is ~850 generated modules, ~35 MB of RSS), and, without --secureGRPCAddr,
cryptography and the injector's jinja2 templates (see docs/performance.md, Round 7).

The real `pilot-discovery discovery` over the examples (tests/support/control_plane.py), a sidecar
served CDS, EDS, LDS and RDS over gRPC, then SIGTERM; a test-only sitecustomize writes the
modules the process imported as it exits, so what start, generation, the debug pages and
shutdown import all count."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.service.discovery.v3 import discovery_pb2

from pilot.xds import typeurls as T
from tests.support.control_plane import REPO_ROOT, ControlPlane
from tests.support.wait import wait_for
from tests.unit.test_stream_sharing import Client

HOOK = REPO_ROOT / "tests" / "support" / "modules_at_exit"
NODE = base_pb2.Node(id="sidecar~10.1.0.9~productpage-1.default~default.svc.cluster.local")
KUBE_ONLY = ("kubernetes_asyncio",)
CA_ONLY = ("cryptography", "jinja2", "pilot.inject", "pilot.gateway_deploy")


async def _response(client: Client, type_url: str, seen: int) -> tuple[discovery_pb2.DiscoveryResponse, int]:
    """The next response of `type_url` after the first `seen` ones, ACKed."""
    async def arrived() -> discovery_pb2.DiscoveryResponse | None:
        for i in range(seen, len(client.responses)):
            r = discovery_pb2.DiscoveryResponse.FromString(client.responses[i])
            if r.type_url == type_url:
                return r
        return None

    r = await wait_for(arrived, 30, message=f"a {type_url} response")
    client.send(discovery_pb2.DiscoveryRequest(type_url=type_url, version_info=r.version_info,
                                               response_nonce=r.nonce))
    return r, len(client.responses)


async def _serve_a_sidecar(port: int) -> None:
    """What Envoy asks for first, in its order: clusters, their endpoints, listeners, routes."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
        client = Client(channel, delta=False)
        client.send(discovery_pb2.DiscoveryRequest(node=NODE, type_url=T.CLUSTER))
        cds, seen = await _response(client, T.CLUSTER, 0)
        clusters = [cluster_pb2.Cluster.FromString(a.value) for a in cds.resources]
        eds_names = [c.name for c in clusters if c.type == cluster_pb2.Cluster.EDS]
        assert any("reviews.default.svc.cluster.local" in n for n in eds_names), eds_names
        client.send(discovery_pb2.DiscoveryRequest(type_url=T.ENDPOINT, resource_names=eds_names))
        _eds, seen = await _response(client, T.ENDPOINT, seen)
        client.send(discovery_pb2.DiscoveryRequest(type_url=T.LISTENER))
        lds, seen = await _response(client, T.LISTENER, seen)
        routes = set()
        for raw in lds.resources:
            for chain in listener_pb2.Listener.FromString(raw.value).filter_chains:
                for f in chain.filters:
                    if f.typed_config.type_url.endswith("HttpConnectionManager"):
                        hcm = hcm_pb2.HttpConnectionManager.FromString(f.typed_config.value)
                        if hcm.HasField("rds"):
                            routes.add(hcm.rds.route_config_name)
        assert routes, "no listener names a route configuration"
        client.send(discovery_pb2.DiscoveryRequest(type_url=T.ROUTE, resource_names=sorted(routes)))
        rds, _ = await _response(client, T.ROUTE, seen)
        assert len(rds.resources) == len(routes)
        await client.close()


@pytest.mark.parametrize("secure_grpc", [False, True], ids=["no-ca", "ca-and-webhook"])
async def test_file_mode_leaves_kubernetes_modules_unloaded(tmp_path: Path, secure_grpc: bool) -> None:
    out = tmp_path / "modules.json"
    cp = ControlPlane(tmp_path, env={"PILOT_TEST_MODULES_OUT": str(out)}, python_path=[str(HOOK)],
                      mesh_config=(REPO_ROOT / "examples" / "mesh.yaml").read_text(), secure_grpc=secure_grpc)
    for f in (REPO_ROOT / "examples" / "mesh").glob("*.yaml"):
        shutil.copy(f, cp.config_dir / f.name)
    async with cp:
        assert ("https" in cp.ports) == secure_grpc  # the webhook (and its injector) runs with a CA
        await _serve_a_sidecar(cp.xds_port)
        assert (await cp.get("/debug/configz"))[0] == 200
    assert cp.proc is not None and cp.proc.returncode == 0, cp.log_tail()
    modules = json.loads(out.read_text())
    assert "pilot.bootstrap" in modules and "pilot.xds.generators.lds" in modules  # it did run, and serve
    unwanted = KUBE_ONLY if secure_grpc else KUBE_ONLY + CA_ONLY
    loaded = sorted({m for m in modules for u in unwanted if m == u or m.startswith(u + ".")})
    assert not loaded, f"file mode imported {loaded[:10]} ({len(loaded)} modules)"
