"""Listener addresses by the proxy's IP families, as istiod picks them (listener_address.go):
an IPv6-only router's gateway listeners on `::` (`::_PORT`), a NONE-mode sidecar's outbound
listeners on `::1` (IPv6-only) or 127.0.0.1 plus `::1` (dual-stack), an IPv6-only proxy's inbound
clusters to the app at [::1], and
ISTIO_ENABLE_IPV4_OUTBOUND_LISTENER_FOR_IPV6_CLUSTERS (an IPv6-only proxy's virtualOutbound also on
0.0.0.0, its DNS clusters resolving both families). IPv4 proxies keep their addresses and bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from pilot.features import Features
from pilot.model.mesh_settings import GenerationKnobs
from pilot.model.push_context import PushContext
from pilot.xds.generators import cds
from tests.support.envoy import envoy_validate
from tests.support.static_config import static_bootstrap

from .helpers import DOMAIN, World, proxy
from .test_dual_stack import DNS_CLUSTER, _extra, dual_proxy, v4_proxy, v6_proxy, world
from .test_gateway_config import gateway, http_server, router

pytestmark = pytest.mark.timeout(60)


def ctx(w: World, dual_stack: bool = False, ipv4_for_ipv6: bool = False) -> PushContext:
    w.mesh.refresh(w.store)
    return PushContext.build(w.store, w.mesh.current, w.mesh.version, DOMAIN, "v1",
                             knobs=GenerationKnobs(dual_stack=dual_stack, ipv4_outbound_for_ipv6=ipv4_for_ipv6))


def _router(ips: str, pod: str = "gw-1"):
    p = router(pod=pod)
    p.metadata["INSTANCE_IPS"] = ips
    return p


def _address(listener: listener_pb2.Listener) -> tuple[str, int]:
    return listener.address.socket_address.address, listener.address.socket_address.port_value


def _hcm(listener: listener_pb2.Listener) -> hcm_pb2.HttpConnectionManager:
    out = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(out)
    return out


@pytest.mark.parametrize("dual_stack", [False, True])
def test_an_ipv6_only_routers_gateway_listener_binds_ipv6(dual_stack: bool):
    """istiod's wildcard for an IPv6-only router: `::_8080` on [::]:8080 (no extra address: it has
    no IPv4), routing through the same `http.8080` routes; IPv4 routers keep `0.0.0.0_8080`."""
    w = World()
    w.apply(gateway())
    c = ctx(w, dual_stack)
    v6 = w.lds(_router("fd00::9"), c)
    assert set(v6) == {"::_8080"}
    listener = v6["::_8080"].message(listener_pb2.Listener)
    assert _address(listener) == ("::", 8080) and _extra(listener) == []
    hcm = _hcm(listener)
    assert hcm.stat_prefix == "outbound_::_8080" and hcm.rds.route_config_name == "http.8080"
    v4 = w.lds(_router("10.0.0.9"), c)
    assert set(v4) == {"0.0.0.0_8080"}
    assert _address(v4["0.0.0.0_8080"].message(listener_pb2.Listener)) == ("0.0.0.0", 8080)


def test_routers_of_one_family_share_the_listener_bytes():
    """The bind is in the listener's cache key, not the router: two IPv6-only routers get the
    same resource, two IPv4 ones another."""
    w = World()
    w.apply(gateway())
    c = ctx(w)
    a, b = w.lds(_router("fd00::9"), c)["::_8080"], w.lds(_router("fd00::10", "gw-2"), c)["::_8080"]
    assert a is b
    x, y = w.lds(_router("10.0.0.9"), c)["0.0.0.0_8080"], w.lds(_router("10.0.0.10", "gw-2"), c)["0.0.0.0_8080"]
    assert x is y and x.any_bytes != a.any_bytes


def test_a_servers_own_bind_is_kept_for_an_ipv6_only_router():
    w = World()
    server = dict(http_server(8081, name="http-own"), bind="fd00::9")
    w.apply(gateway(servers=[http_server(8080), server]))
    lds = w.lds(_router("fd00::9"), ctx(w))
    assert set(lds) == {"::_8080", "fd00::9_8081"}
    assert _address(lds["fd00::9_8081"].message(listener_pb2.Listener)) == ("fd00::9", 8081)


def test_ipv6_only_gateway_config_passes_envoy_validate(tmp_path: Path):
    w = World()
    w.apply(gateway())
    config = static_bootstrap(ctx(w), _router("fd00::9"))
    (listener,) = config["static_resources"]["listeners"]
    assert listener["address"]["socket_address"]["address"] == "::"
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated config:\n{output}"


def _none_proxy(ips: str):
    p = proxy(interception="NONE", ip=ips.split(",")[0])
    p.metadata["INSTANCE_IPS"] = ips
    return p


@pytest.mark.parametrize("dual_stack", [False, True])
def test_a_none_mode_sidecar_binds_the_loopback_of_its_families(dual_stack: bool):
    """istiod's localHosts: 127.0.0.1 (IPv4), `::1` (IPv6-only, named `::1_9080`), 127.0.0.1 with
    `::1` as an additional address (dual-stack; istiod's sidecar outbound listeners add it
    whether or not ISTIO_DUAL_STACK is set)."""
    w = world()
    c = ctx(w, dual_stack)
    cases = (("10.1.0.9", "127.0.0.1", []), ("fd00:1::9", "::1", []),
             ("10.1.0.9,fd00:1::9", "127.0.0.1", [("::1", 9080)]))
    for ips, bind, extra in cases:
        lds = w.lds(_none_proxy(ips), c)
        listener = lds[f"{bind}_9080"].message(listener_pb2.Listener)
        assert _address(listener) == (bind, 9080) and _extra(listener) == extra, ips
        assert "virtualOutbound" not in lds


def test_a_sidecar_egress_bind_wins_over_the_loopback():
    w = world()
    w.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
             "metadata": {"name": "default", "namespace": "default"},
             "spec": {"egress": [{"port": {"number": 9080, "name": "http", "protocol": "HTTP"},
                                  "bind": "127.0.0.2", "hosts": ["./*"]},
                                 {"hosts": ["./*"], "captureMode": "NONE"}]}})
    for ips in ("fd00:1::9", "10.1.0.9,fd00:1::9"):
        lds = w.lds(_none_proxy(ips), ctx(w))
        listener = lds["127.0.0.2_9080"].message(listener_pb2.Listener)
        assert _address(listener) == ("127.0.0.2", 9080) and _extra(listener) == []


@pytest.mark.parametrize("ips", ["fd00:1::9", "10.1.0.9,fd00:1::9"])
def test_none_mode_loopback_config_passes_envoy_validate(ips: str, tmp_path: Path):
    config = static_bootstrap(ctx(world(), True), _none_proxy(ips))
    assert any(ld["name"] == "::1_9080" or "additional_addresses" in ld
               for ld in config["static_resources"]["listeners"])
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated config:\n{output}"


def _dns_family(w: World, p, c: PushContext) -> int:
    res = {r.name: r for r in cds.generate(c, p, None, w.cache)}
    return res[DNS_CLUSTER].message(cluster_pb2.Cluster).dns_lookup_family


def test_ipv4_outbound_for_ipv6_clusters():
    """ISTIO_ENABLE_IPV4_OUTBOUND_LISTENER_FOR_IPV6_CLUSTERS (default off, as istiod): an
    IPv6-only proxy's virtualOutbound also takes IPv4 on 0.0.0.0:15001 and its DNS clusters
    resolve both families (ALL, not V6_ONLY); IPv4 and dual-stack proxies are not changed by it."""
    assert Features.from_env({}).ipv4_outbound_for_ipv6 is False
    assert Features.from_env(
        {"ISTIO_ENABLE_IPV4_OUTBOUND_LISTENER_FOR_IPV6_CLUSTERS": "true"}).generation_knobs().ipv4_outbound_for_ipv6
    w = world()
    family = cluster_pb2.Cluster.DnsLookupFamily
    for on in (False, True):
        c = ctx(w, ipv4_for_ipv6=on)
        vo = w.lds(v6_proxy(), c)["virtualOutbound"].message(listener_pb2.Listener)
        assert _address(vo) == ("::", 15001)
        assert _extra(vo) == ([("0.0.0.0", 15001)] if on else [])
        assert _dns_family(w, v6_proxy(), c) == (family.Value("ALL") if on else family.Value("V6_ONLY"))
        v4 = w.lds(v4_proxy(), c)["virtualOutbound"].message(listener_pb2.Listener)
        assert _address(v4) == ("0.0.0.0", 15001) and _extra(v4) == []
        assert _dns_family(w, v4_proxy(), c) == family.Value("V4_ONLY")


def test_ipv4_outbound_for_ipv6_config_passes_envoy_validate(tmp_path: Path):
    config = static_bootstrap(ctx(world(), ipv4_for_ipv6=True), v6_proxy())
    listeners = {ld["name"]: ld for ld in config["static_resources"]["listeners"]}
    assert listeners["virtualOutbound"]["additional_addresses"][0]["address"]["socket_address"]["address"] == "0.0.0.0"
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated config:\n{output}"


def _inbound_endpoint(w: World, p, c: PushContext) -> tuple[str, int]:
    res = {r.name: r for r in cds.generate(c, p, None, w.cache)}
    cluster = res["inbound|19080||"].message(cluster_pb2.Cluster)
    sa = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    return sa.address, sa.port_value


def test_an_ipv6_only_proxys_inbound_cluster_reaches_the_app_on_ipv6_loopback():
    """istiod's inbound clusters reach the app on the proxy's first loopback: [::1] for an
    IPv6-only proxy, 127.0.0.1 for IPv4 and dual-stack ones (which keep sharing the bytes)."""
    w = world()
    c = ctx(w, True)
    assert _inbound_endpoint(w, v6_proxy(), c) == ("::1", 19080)
    assert _inbound_endpoint(w, v4_proxy(), c) == ("127.0.0.1", 19080)
    assert _inbound_endpoint(w, dual_proxy(), c) == ("127.0.0.1", 19080)
    v4 = {r.name: r for r in cds.generate(c, v4_proxy(), None, w.cache)}["inbound|19080||"]
    assert {r.name: r for r in cds.generate(c, dual_proxy(), None, w.cache)}["inbound|19080||"] is v4


def test_one_push_keeps_the_inbound_plans_of_two_families_apart():
    """Two replicas with one node-id IP whose INSTANCE_IPS differ in family: each gets its own
    inbound endpoint in one push (the plan's memo key has the family)."""
    w = world()
    c = ctx(w)
    v4, v6 = v4_proxy(), v4_proxy()
    v6.metadata["INSTANCE_IPS"] = "fd00:1::9"
    assert _inbound_endpoint(w, v4, c) == ("127.0.0.1", 19080)
    assert _inbound_endpoint(w, v6, c) == ("::1", 19080)
