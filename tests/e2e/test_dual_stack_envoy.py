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
from tests.unit.test_dual_stack import ctx, dual_proxy, v6_proxy, world

pytestmark = pytest.mark.timeout(60)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
async def _both_bound_addresses(envoy: Envoy) -> tuple[dict, dict]:
    """The socket addresses Envoy bound for its only listener: the main one and the one extra."""
    code, text = await envoy.admin_get("/listeners?format=json")
    assert code == 200, text
    (mine,) = json.loads(text)["listener_statuses"]
    (v6,) = [a["socket_address"] for a in mine["additional_local_addresses"]]
    return mine["local_address"]["socket_address"], v6


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
        v4, v6 = await _both_bound_addresses(envoy)
        assert (v4["address"], v6["address"]) == ("0.0.0.0", "::")
        for host, port in (("127.0.0.1", v4["port_value"]), ("::1", v6["port_value"])):
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            # The fallback chain closes it: the BlackHoleCluster has no endpoints.
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()

        async def blackholed() -> bool:
            return (await envoy.stats()).get("cluster.BlackHoleCluster.upstream_cx_none_healthy", 0) >= 2

        await wait_for(blackholed, 5, message="both connections reached the listener's chain")


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
async def test_an_ipv6_only_proxys_virtual_outbound_listens_on_ipv6(tmp_path):
    """An IPv6-only proxy (istiod's IPMode IPv6): Envoy binds its virtualOutbound on `::`, and an
    IPv6 connection takes the listener's chain."""
    w = world()
    w.apply(mesh_configmap({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}))
    config = static_bootstrap(ctx(w, False), v6_proxy())
    static = config["static_resources"]
    (listener,) = [ld for ld in static["listeners"] if ld["name"] == "virtualOutbound"]
    static["listeners"] = [listener]
    static["clusters"] = [c for c in static["clusters"] if c["name"] == "BlackHoleCluster"]
    listener["address"]["socket_address"]["port_value"] = 0
    async with Envoy() as envoy:
        await envoy.start(config, tmp_path)
        await envoy.wait_ready()
        code, text = await envoy.admin_get("/listeners?format=json")
        assert code == 200, text
        (mine,) = json.loads(text)["listener_statuses"]
        local = mine["local_address"]["socket_address"]
        assert local["address"] == "::" and not mine.get("additional_local_addresses")
        reader, writer = await asyncio.wait_for(asyncio.open_connection("::1", local["port_value"]), 5)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()

        async def blackholed() -> bool:
            return (await envoy.stats()).get("cluster.BlackHoleCluster.upstream_cx_none_healthy", 0) >= 1

        await wait_for(blackholed, 5, message="the IPv6 connection reached the listener's chain")


def _host_is_dual_stack() -> bool:
    from pilot.agent.host_ips import private_ips

    ips = private_ips()
    return any(":" in a for a in ips) and any(":" not in a for a in ips)


def _dual_stack_config(http_port: int, dns_port: int) -> str:
    return f"""apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {AGENT_NS}}}
spec:
  clusterIP: 10.96.0.40
  clusterIPs: [10.96.0.40, "fd00:10::40"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{{name: http, port: {http_port}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: api, namespace: {AGENT_NS}}}
spec:
  hosts: [api.example.com]
  resolution: DNS
  location: MESH_EXTERNAL
  ports: [{{number: {dns_port}, name: tls, protocol: TLS}}]
"""


AGENT_NS = "shop"


@pytest.mark.skipif(not _host_is_dual_stack(), reason="this host has no IPv4 and IPv6 addresses to report")
@pytest.mark.timeout(90)
@pytest.mark.parametrize("knob", ["true", "false"])
async def test_an_agent_run_sidecar_on_a_dual_stack_host_gets_dual_stack_config(tmp_path, knob: str):
    """pilot-agent reports every address of this (dual-stack) host in INSTANCE_IPS, as
    istio-agent does, so the control plane treats its sidecar as dual-stack: with
    ISTIO_DUAL_STACK the real Envoy's DNS cluster resolves both families (ALL) and the dual-stack
    Service's route has its IPv6 cluster IP too; without, istiod's V4_ONLY and the IPv4 IP alone."""
    from tests.e2e.test_pilot_agent import NODE_ID, POD, agent, plane
    from tests.support.ports import free_ports
    from tests.unit.test_authn import Issuer

    issuer = Issuer("ES256")
    http_port, dns_port = free_ports(2)
    cp = plane(tmp_path, issuer)
    cp.env["ISTIO_DUAL_STACK"] = knob
    async with cp:
        cp.write("dual.yaml", _dual_stack_config(http_port, dns_port))
        async with agent(tmp_path, cp, issuer) as a:
            await a.wait_ready()
            await cp.wait_synced(NODE_ID, types=("cluster", "listener", "route"))
            (client,) = [c for c in (await cp.debug("/debug/adsz"))["clients"] if c["metadata"].get("NAME") == POD]
            ips = client["metadata"]["INSTANCE_IPS"].split(",")
            assert ips[0] == "127.0.0.1" and any(":" in ip for ip in ips) and len(ips) >= 3

            async def dumped() -> tuple[str, set[str]] | None:
                clusters = await a.admin_json("/config_dump?resource=dynamic_active_clusters")
                family = next((c["cluster"].get("dns_lookup_family", "AUTO") for c in clusters["configs"]
                               if c["cluster"]["name"] == f"outbound|{dns_port}||api.example.com"), None)
                routes = await a.admin_json("/config_dump?resource=dynamic_route_configs")
                domains = {d for r in routes["configs"] if r["route_config"]["name"] == str(http_port)
                           for vh in r["route_config"].get("virtual_hosts", ()) for d in vh["domains"]}
                return (family, domains) if family is not None and domains else None

            family, domains = await wait_for(dumped, 30, message="Envoy holds the DNS cluster and the route")
            on = knob == "true"
            assert family == ("ALL" if on else "V4_ONLY")
            assert "10.96.0.40" in domains
            assert ("[fd00:10::40]" in domains) is on


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
async def test_an_ipv6_only_routers_gateway_listener_serves_http_over_ipv6(tmp_path):
    """An IPv6-only router (istiod's IPMode IPv6): Envoy binds its gateway listener `::_PORT` on
    `::`, and an HTTP request over IPv6 gets the gateway's answer (404: no VirtualService binds
    to the server, istiod's blackhole virtual host)."""
    from tests.unit.helpers import World
    from tests.unit.test_gateway_config import gateway, http_server
    from tests.unit.test_ipv6_only_listeners import _router
    from tests.unit.test_ipv6_only_listeners import ctx as v6_ctx

    w = World()
    w.apply(gateway(servers=[http_server(8080)]))
    config = static_bootstrap(v6_ctx(w), _router("fd00::9"))
    (listener,) = config["static_resources"]["listeners"]
    assert listener["name"] == "::_8080"
    listener["address"]["socket_address"]["port_value"] = 0  # concurrent tests never collide
    async with Envoy() as envoy:
        await envoy.start(config, tmp_path)
        await envoy.wait_ready()
        code, text = await envoy.admin_get("/listeners?format=json")
        assert code == 200, text
        (mine,) = json.loads(text)["listener_statuses"]
        local = mine["local_address"]["socket_address"]
        assert (mine["name"], local["address"]) == ("::_8080", "::")
        reader, writer = await asyncio.wait_for(asyncio.open_connection("::1", local["port_value"]), 5)
        writer.write(b"GET / HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n")
        response = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert response.startswith(b"HTTP/1.1 404"), response[:200]


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
async def test_a_dual_stack_none_mode_sidecars_listener_binds_both_loopbacks(tmp_path):
    """A NONE-mode dual-stack sidecar: Envoy binds the outbound listener on 127.0.0.1 and ::1
    (istiod's localHosts for IPMode Dual), and takes a connection on each."""
    from tests.unit.test_ipv6_only_listeners import _none_proxy
    from tests.unit.test_ipv6_only_listeners import ctx as v6_ctx

    config = static_bootstrap(v6_ctx(world()), _none_proxy("10.1.0.9,fd00:1::9"))
    static = config["static_resources"]
    (listener,) = [ld for ld in static["listeners"] if ld["name"] == "127.0.0.1_9080"]
    static["listeners"] = [listener]
    static["clusters"] = [c for c in static["clusters"] if c["name"] == OUTBOUND_REVIEWS]
    for address in (listener["address"], listener["additional_addresses"][0]["address"]):
        address["socket_address"]["port_value"] = 0  # concurrent tests never collide on 9080
    async with Envoy() as envoy:
        await envoy.start(config, tmp_path)
        await envoy.wait_ready()
        v4, v6 = await _both_bound_addresses(envoy)
        assert (v4["address"], v6["address"]) == ("127.0.0.1", "::1")
        for host, port in (("127.0.0.1", v4["port_value"]), ("::1", v6["port_value"])):
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            writer.close()

        async def accepted() -> bool:
            return (await envoy.stats()).get("listener.127.0.0.1_0.downstream_cx_total", 0) >= 2

        await wait_for(accepted, 5, message="the listener took both connections")


OUTBOUND_REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"
