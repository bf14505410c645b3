"""ISTIO_DUAL_STACK with a real Envoy: the generated virtualOutbound listener of a dual-stack
proxy binds 0.0.0.0 and [::], and an IPv6 connection to it takes its chain. Needs IPv6 loopback
(skipped without ::1)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from tests.support.envoy import Envoy
from tests.support.static_config import static_bootstrap
from tests.support.wait import wait_for
from tests.unit.helpers import mesh_configmap
from tests.unit.test_dual_stack import ctx, dual_proxy, world

pytestmark = pytest.mark.timeout(60)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
async def test_virtual_outbound_accepts_ipv4_and_ipv6(tmp_path):
    w = world()
    # REGISTRY_ONLY: the fallback chain is the BlackHoleCluster, so a direct connection (no
    # iptables original destination) ends there rather than looping back into the listener.
    w.apply(mesh_configmap({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}))
    config = static_bootstrap(ctx(w, True), dual_proxy())
    static = config["static_resources"]
    # Only virtualOutbound: the inbound side waits for pilot-agent's SDS, absent here.
    (listener,) = [ld for ld in static["listeners"] if ld["name"] == "virtualOutbound"]
    static["listeners"] = [listener]
    # And the one cluster it uses (mTLS clusters too would wait for that SDS).
    static["clusters"] = [c for c in static["clusters"] if c["name"] == "BlackHoleCluster"]
    assert [a["address"]["socket_address"]["address"] for a in listener["additional_addresses"]] == ["::"]
    # Port 0 for both addresses so concurrent tests never collide on 15001.
    listener["address"]["socket_address"]["port_value"] = 0
    listener["additional_addresses"][0]["address"]["socket_address"]["port_value"] = 0
    async with Envoy() as envoy:
        await envoy.start(config, tmp_path)
        await envoy.wait_ready()
        code, text = await envoy.admin_get("/listeners?format=json")
        assert code == 200, text
        (mine,) = json.loads(text)["listener_statuses"]
        v4 = mine["local_address"]["socket_address"]
        (v6,) = [a["socket_address"] for a in mine["additional_local_addresses"]]
        assert (v4["address"], v6["address"]) == ("0.0.0.0", "::")
        for host, port in (("127.0.0.1", v4["port_value"]), ("::1", v6["port_value"])):
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            # The fallback chain closes it: the BlackHoleCluster has no endpoints.
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()

        async def blackholed() -> bool:
            return (await envoy.stats()).get("cluster.BlackHoleCluster.upstream_cx_none_healthy", 0) >= 2

        await wait_for(blackholed, 5, message="both connections reached the listener's chain")
