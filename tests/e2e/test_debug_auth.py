"""Debug endpoints off localhost: a bearer token the control plane's authenticators accept, with
istiod's scoping (the system namespace reads everything, others only their own proxies)."""

from __future__ import annotations

import asyncio
import ipaddress
import json

import aiohttp
import grpc
import psutil
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from tests.support.control_plane import ControlPlane
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(60)

SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


def external_address() -> str | None:
    """An address of this host that is not loopback, so the server sees a remote caller."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            try:
                ip = ipaddress.ip_address(a.address)
            except ValueError:
                continue
            if ip.version == 4 and not ip.is_loopback and not ip.is_link_local:
                return a.address
    return None


@pytest.fixture
async def plane(tmp_path):
    addr = external_address()
    if addr is None:
        pytest.skip("this host has no non-loopback IPv4 address to call from")
    issuer = Issuer("ES256")
    cp = ControlPlane(tmp_path, env={"JWT_RULE": issuer.rule()}, extra_args=["--httpAddr", "0.0.0.0:0"])
    async with cp:
        yield cp, issuer, addr


async def status(addr: str, port: int, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.get(f"http://{addr}:{port}{path}", headers=headers,
                                                    timeout=aiohttp.ClientTimeout(total=5)) as r:
        return r.status, await r.text()


async def put_level(addr: str, port: int, scope: str, level: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.put(f"http://{addr}:{port}/debug/scopes/{scope}", headers=headers,
                                                    json={"output_level": level},
                                                    timeout=aiohttp.ClientTimeout(total=5)) as r:
        return r.status, await r.text()


async def test_remote_debug_needs_a_token_and_is_scoped_by_namespace(plane):
    cp, issuer, addr = plane
    port = cp.ports["http"]
    assert (await status("127.0.0.1", port, "/debug/syncz"))[0] == 200  # localhost: trusted
    code, body = await status(addr, port, "/debug/syncz")
    assert code == 401 and "Bearer" in body
    assert (await status(addr, port, "/debug/syncz", "not-a-jwt"))[0] == 401
    assert (await status(addr, port, "/debug/syncz", Issuer("ES256").token(namespace="istio-system")))[0] == 401

    admin = issuer.token(namespace="istio-system", sa="istiod")
    assert (await status(addr, port, "/debug/configz", admin))[0] == 200

    tenant = issuer.token(namespace="default", sa="sleep")
    code, body = await status(addr, port, "/debug/configz", tenant)
    assert code == 403 and "default/sleep" in body
    own = "sidecar~10.0.0.1~app-1.default~default.svc.cluster.local"
    code, _ = await status(addr, port, f"/debug/config_dump?proxyID={own}", tenant)
    assert code not in (401, 403)  # admitted (the proxy is not connected: the view says so)
    other = "sidecar~10.0.0.2~app-1.payments~payments.svc.cluster.local"
    assert (await status(addr, port, f"/debug/config_dump?proxyID={other}", tenant))[0] == 403
    assert (await status(addr, port, "/ready"))[0] == 200  # health is not debug

    # Changing a log level is a debug write: the same rule, and the change is real.
    assert (await put_level(addr, port, "ads", "debug"))[0] == 401
    assert (await put_level(addr, port, "ads", "debug", tenant))[0] == 403
    code, body = await put_level(addr, port, "ads", "debug", admin)
    assert code == 200 and '"output_level": "debug"' in body.replace('":"', '": "'), body
    scopes = {s["name"]: s["output_level"] for s in json.loads((await status("127.0.0.1", port, "/debug/scopes"))[1])}
    assert scopes["ads"] == "debug" and scopes["default"] == "info"

    # config_dump finds proxies by a part of their id (istiod's rule); a tenant must not reach a
    # proxy of another namespace whose id merely contains a name of its own namespace.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        call = ch.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
        md = struct_pb2.Struct()
        md.update({"NAMESPACE": "default-prod"})
        await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=base_pb2.Node(
            id="sidecar~10.0.0.3~web-1.default-prod~default-prod.svc.cluster.local", metadata=md)))
        await asyncio.wait_for(call.read(), 10)
        code, body = await status(addr, port, "/debug/config_dump?proxyID=default", tenant)
        assert code == 404 and "Proxy not connected" in body, body
        code, body = await status(addr, port, "/debug/config_dump?proxyID=default", admin)
        assert code == 200 and "ClustersConfigDump" in body  # the system namespace finds it
        call.cancel()
