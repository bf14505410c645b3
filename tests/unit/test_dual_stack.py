"""ISTIO_DUAL_STACK (default false), as istiod: dual-stack Services keep both cluster IPs, a Pod's
IPv4 and IPv6 endpoints are one endpoint with an additional address, and a proxy with addresses
of both families gets wildcard listeners on :: too, the inbound passthrough source ::6 and DNS
clusters resolving both families. Off, or for a single-family proxy, nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from pilot.features import Features
from pilot.model.mesh_settings import GenerationKnobs
from pilot.model.push_context import PushContext
from pilot.xds import typeurls as T
from pilot.xds.discovery import DiscoveryServer
from tests.support.envoy import envoy_validate
from tests.support.static_config import static_bootstrap

from .helpers import DOMAIN, World, proxy

pytestmark = pytest.mark.timeout(60)

V4_VIP, V6_VIP = "10.96.0.20", "fd00:10::20"
OUTBOUND = "outbound|9080||reviews.default.svc.cluster.local"
DNS_CLUSTER = "outbound|443||api.example.com"


def _slice(name: str, family: str, address: str) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": "reviews"}},
            "addressType": family, "ports": [{"name": "http", "port": 19080}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "name": "reviews-1", "namespace": "default"}}]}


def world() -> World:
    w = World()
    w.apply(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reviews", "namespace": "default"},
         "spec": {"clusterIP": V4_VIP, "clusterIPs": [V4_VIP, V6_VIP], "ipFamilies": ["IPv4", "IPv6"],
                  "ipFamilyPolicy": "RequireDualStack", "selector": {"app": "reviews"},
                  "ports": [{"name": "http", "port": 9080, "targetPort": 19080}]}},
        # The IPv6 slice first: the IPv4 address still leads the merged endpoint.
        _slice("reviews-v6", "IPv6", "fd00:1::9"), _slice("reviews-v4", "IPv4", "10.1.0.9"),
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "reviews-1", "namespace": "default", "labels": {"app": "reviews"}},
         "spec": {"serviceAccountName": "default"},
         "status": {"podIP": "10.1.0.9", "podIPs": [{"ip": "10.1.0.9"}, {"ip": "fd00:1::9"}], "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}]}},
        {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
         "metadata": {"name": "api", "namespace": "default"},
         "spec": {"hosts": ["api.example.com"], "resolution": "DNS", "location": "MESH_EXTERNAL",
                  "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}})
    return w


def ctx(w: World, dual_stack: bool) -> PushContext:
    w.mesh.refresh(w.store)
    return PushContext.build(w.store, w.mesh.current, w.mesh.version, DOMAIN, "v1",
                             knobs=GenerationKnobs(dual_stack=dual_stack))


def dual_proxy():
    """The reviews Pod's sidecar (so it has inbound ports), with both of its addresses."""
    p = proxy(interception="REDIRECT", ip="10.1.0.9,fd00:1::9", pod_name="reviews-1")
    p.metadata["LABELS"] = {"app": "reviews"}
    p.identity = "spiffe://cluster.local/ns/default/sa/default"  # a workload certificate: mTLS inbound
    return p


def _extra(listener: listener_pb2.Listener) -> list[tuple[str, int]]:
    return [(a.address.socket_address.address, a.address.socket_address.port_value)
            for a in listener.additional_addresses]


def test_knob_reads_istiods_name_and_default():
    assert Features.from_env({}).generation_knobs().dual_stack is False
    assert Features.from_env({"ISTIO_DUAL_STACK": "true"}).generation_knobs().dual_stack is True
    with pytest.raises(ValueError):
        Features.from_env({"ISTIO_DUAL_STACK": "yes"})


def test_dual_stack_proxy_listeners_bind_both_families_only_with_the_knob():
    w = world()
    for on, want in ((False, []), (True, [("::", 15001)])):
        lds = w.lds(dual_proxy(), ctx(w, on))
        assert _extra(lds["virtualOutbound"].message(listener_pb2.Listener)) == want
        inbound = [("::", 15006)] if on else []
        assert _extra(lds["virtualInbound"].message(listener_pb2.Listener)) == inbound
        port = [("::", 9080)] if on else []
        assert _extra(lds["0.0.0.0_9080"].message(listener_pb2.Listener)) == port
    # An IPv4-only proxy keeps one address even with the knob on (istiod's IPMode IPv4).
    lds = w.lds(proxy(interception="REDIRECT"), ctx(w, True))
    assert _extra(lds["virtualOutbound"].message(listener_pb2.Listener)) == []


def test_instance_ips_metadata_makes_a_proxy_dual_stack():
    p = proxy(interception="REDIRECT")
    assert not p.dual_stack
    p.metadata["INSTANCE_IPS"] = "10.0.0.1,fd00::1"
    assert p.dual_stack
    w = world()
    assert _extra(w.lds(p, ctx(w, True))["virtualOutbound"].message(listener_pb2.Listener)) == [("::", 15001)]


def v6_proxy():
    """A sidecar whose only address is IPv6 (istiod's IPMode IPv6)."""
    p = proxy(interception="REDIRECT", ip="fd00:1::9", pod_name="reviews-1")
    p.metadata["LABELS"] = {"app": "reviews"}
    p.identity = "spiffe://cluster.local/ns/default/sa/default"
    return p


def v4_proxy():
    p = proxy(interception="REDIRECT", ip="10.1.0.9", pod_name="reviews-1")
    p.metadata["LABELS"] = {"app": "reviews"}
    p.identity = "spiffe://cluster.local/ns/default/sa/default"
    return p


@pytest.mark.parametrize(("make", "on", "family"), [
    (v4_proxy, False, cluster_pb2.Cluster.V4_ONLY), (v4_proxy, True, cluster_pb2.Cluster.V4_ONLY),
    (dual_proxy, False, cluster_pb2.Cluster.V4_ONLY), (dual_proxy, True, cluster_pb2.Cluster.ALL),
    (v6_proxy, False, cluster_pb2.Cluster.V6_ONLY), (v6_proxy, True, cluster_pb2.Cluster.V6_ONLY)])
def test_dns_clusters_resolve_the_families_the_proxy_has(make, on, family):
    """istiod's SelectDNSLookupFamily: A records for an IPv4 proxy, AAAA for an IPv6-only one,
    both (Happy Eyeballs) for a dual-stack one only with ISTIO_DUAL_STACK."""
    w = world()
    assert w.cds(make(), ctx(w, on))[DNS_CLUSTER].message(cluster_pb2.Cluster).dns_lookup_family == family


def _passthrough_sources(p, on: bool) -> tuple[str, list[str]]:
    w = world()
    bind = w.cds(p, ctx(w, on))["InboundPassthroughCluster"].message(cluster_pb2.Cluster).upstream_bind_config
    return bind.source_address.address, [e.address.address for e in bind.extra_source_addresses]


def test_inbound_passthrough_binds_the_sources_of_the_proxys_families():
    """As istiod's buildInboundPassthroughCluster (with or without the knob): 127.0.0.6 for IPv4,
    ::6 for an IPv6-only proxy, and ::6 beside 127.0.0.6 for a dual-stack one."""
    for on in (False, True):
        assert _passthrough_sources(v4_proxy(), on) == ("127.0.0.6", [])
        assert _passthrough_sources(dual_proxy(), on) == ("127.0.0.6", ["::6"])
        assert _passthrough_sources(v6_proxy(), on) == ("::6", [])


def test_ipv4_proxies_share_every_cluster_and_other_families_only_what_is_the_same():
    """The family is in a cluster's cache key only where it changes the cluster: an IPv4 and a
    dual-stack proxy share the EDS clusters' bytes (the same cached object), not the DNS one's."""
    w = world()
    push = ctx(w, True)
    v4, dual, v6 = (w.cds(p, push) for p in (v4_proxy(), dual_proxy(), v6_proxy()))
    assert v4[OUTBOUND] is dual[OUTBOUND] is v6[OUTBOUND]
    assert v4["BlackHoleCluster"] is dual["BlackHoleCluster"] is v6["BlackHoleCluster"]
    assert v4[DNS_CLUSTER] is not dual[DNS_CLUSTER] and v4[DNS_CLUSTER] is not v6[DNS_CLUSTER]
    assert w.cds(v4_proxy(), push)[DNS_CLUSTER] is v4[DNS_CLUSTER]


def test_one_push_keeps_dual_stack_and_single_family_clusters_apart():
    """A dual-stack and a single-family proxy of one namespace and identity, in one push: the
    outbound walk they share within a push (ctx.memoized in CDS) is keyed on the family, so the
    second one generated, in either order, gets its own dns_lookup_family."""
    want = {True: cluster_pb2.Cluster.ALL, False: cluster_pb2.Cluster.V4_ONLY}
    for order in ((True, False), (False, True)):
        w = world()
        push = ctx(w, True)
        for dual in order:
            p = dual_proxy()
            if not dual:
                p = proxy(interception="REDIRECT")
                p.identity = dual_proxy().identity
            got = w.cds(p, push)[DNS_CLUSTER].message(cluster_pb2.Cluster).dns_lookup_family
            assert got == want[dual], (order, dual)


def test_the_servers_generation_memo_keeps_dual_stack_and_single_family_proxies_apart():
    """Through the server's GenerationMemo: two plaintext sidecars of one namespace (equal traits,
    the one empty inbound plan), one of them dual-stack, in one push. In either order each gets
    its own families in CDS and LDS (they shared one output before the memo key had the family)."""
    want = {True: (cluster_pb2.Cluster.ALL, [("::", 15001)]), False: (cluster_pb2.Cluster.V4_ONLY, [])}
    for order in ((True, False), (False, True)):
        w = world()
        push = ctx(w, True)
        memo = DiscoveryServer(w.store, w.mesh, Features.from_env({"ISTIO_DUAL_STACK": "true"})).generated
        for dual in order:
            p = proxy(interception="REDIRECT", ip="10.0.0.2,fd00::2" if dual else "10.0.0.1",
                      pod_name=f"app-{int(dual)}")
            clusters = {r.name: r for r in memo.generate(push, T.CLUSTER, p, None).resources}
            listeners = {r.name: r for r in memo.generate(push, T.LISTENER, p, None).resources}
            got = (clusters[DNS_CLUSTER].message(cluster_pb2.Cluster).dns_lookup_family,
                   _extra(listeners["virtualOutbound"].message(listener_pb2.Listener)))
            assert got == want[dual], (order, dual)

def _endpoints(w: World, on: bool) -> list[tuple[str, list[str]]]:
    cla = w.eds(dual_proxy(), {OUTBOUND}, ctx(w, on))[OUTBOUND].message(endpoint_pb2.ClusterLoadAssignment)
    return sorted((e.endpoint.address.socket_address.address,
                   [a.address.socket_address.address for a in e.endpoint.additional_addresses])
                  for g in cla.endpoints for e in g.lb_endpoints)


def test_a_pods_two_slices_are_one_endpoint_with_the_knob():
    w = world()
    assert _endpoints(w, False) == [("10.1.0.9", []), ("fd00:1::9", [])]
    assert _endpoints(w, True) == [("10.1.0.9", ["fd00:1::9"])]


def test_service_entry_selected_pod_carries_its_other_pod_ip():
    w = world()
    w.apply({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
             "metadata": {"name": "internal", "namespace": "default"},
             "spec": {"hosts": ["internal.example.com"], "resolution": "STATIC", "location": "MESH_INTERNAL",
                      "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 19080}],
                      "workloadSelector": {"labels": {"app": "reviews"}}}})
    name = "outbound|80||internal.example.com"
    for on, extra in ((False, []), (True, ["fd00:1::9"])):
        cla = w.eds(dual_proxy(), {name}, ctx(w, on))[name].message(endpoint_pb2.ClusterLoadAssignment)
        eps = [e.endpoint for g in cla.endpoints for e in g.lb_endpoints]
        assert [e.address.socket_address.address for e in eps] == ["10.1.0.9"]
        assert [a.address.socket_address.address for a in eps[0].additional_addresses] == extra


def _domains(w: World, p, on: bool) -> set[str]:
    route = w.rds(p, {"9080"}, ctx(w, on))["9080"].message(route_pb2.RouteConfiguration)
    return {d for vh in route.virtual_hosts for d in vh.domains}


@pytest.mark.parametrize(("make", "on", "want"), [
    (dual_proxy, True, {V4_VIP, f"[{V6_VIP}]"}),  # every cluster IP
    (dual_proxy, False, {V4_VIP}),  # without the knob: the first address's family
    (v4_proxy, True, {V4_VIP}), (v4_proxy, False, {V4_VIP}),
    (v6_proxy, True, {f"[{V6_VIP}]"}), (v6_proxy, False, {f"[{V6_VIP}]"})])
def test_a_proxy_reaches_the_cluster_ips_of_its_families(make, on, want):
    """istiod's GetAllAddressesForProxy: a dual-stack Service's clusterIPs, as a proxy of each
    IP family sees them in its virtual host domains."""
    w = world()
    assert w.ctx().by_host["reviews.default.svc.cluster.local"].addresses == (V4_VIP, V6_VIP)
    domains = _domains(w, make(), on)
    assert {ip for ip in (V4_VIP, f"[{V6_VIP}]") if ip in domains} == want
    assert {ip for ip in (V4_VIP, f"[{V6_VIP}]") if f"{ip}:9080" in domains} == want


def _tcp_world() -> World:
    w = world()
    w.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "default"},
             "spec": {"clusterIP": "10.96.0.30", "clusterIPs": ["10.96.0.30", "fd00:10::30"],
                      "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                      "ports": [{"name": "tcp-db", "port": 5432}]}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cache", "namespace": "default"},
             "spec": {"clusterIP": "10.96.0.31", "ports": [{"name": "tcp-cache", "port": 5432}]}})
    return w


def _port_listener(p, port: int) -> str:
    return f"::_{port}" if p.ip_families == (False, True) else f"0.0.0.0_{port}"  # IPv6-only: `::`


def _prefixes(w: World, p, on: bool) -> dict[str, list[str]]:
    """The TCP chains of the 5432 listener: destination cluster -> the addresses it matches."""
    listener = w.lds(p, ctx(w, on))[_port_listener(p, 5432)].message(listener_pb2.Listener)
    out = {}
    for chain in listener.filter_chains:
        tcp = tcp_proxy_pb2.TcpProxy()
        chain.filters[0].typed_config.Unpack(tcp)
        out[tcp.cluster] = [r.address_prefix for r in chain.filter_chain_match.prefix_ranges]
    return out


def test_tcp_chains_match_the_cluster_ips_of_the_proxys_families():
    """The other family's cluster IP is no destination for a proxy without it; a single-stack
    Service keeps its one address for every proxy (istiod's GetAddressForProxy fallback)."""
    w = _tcp_world()
    db, cache = "outbound|5432||db.default.svc.cluster.local", "outbound|5432||cache.default.svc.cluster.local"
    for on in (False, True):
        assert _prefixes(w, v4_proxy(), on) == {db: ["10.96.0.30"], cache: ["10.96.0.31"]}
        assert _prefixes(w, v6_proxy(), on) == {db: ["fd00:10::30"], cache: ["10.96.0.31"]}
    assert _prefixes(w, dual_proxy(), True) == {db: ["10.96.0.30", "fd00:10::30"], cache: ["10.96.0.31"]}
    assert _prefixes(w, dual_proxy(), False) == {db: ["10.96.0.30"], cache: ["10.96.0.31"]}


def test_proxies_of_one_family_set_share_listeners_and_routes():
    """Filtered services are built once per family set and push: two IPv6-only proxies share
    their bytes; an IPv4 one shares a dual-stack one's (without the knob both see the IPv4 IP)."""
    w = _tcp_world()
    push = ctx(w, False)
    a, b = (w.lds(p, push)["::_5432"] for p in (v6_proxy(), v6_proxy()))
    assert a is b
    v4, dual = (w.lds(p, push)["0.0.0.0_5432"] for p in (v4_proxy(), dual_proxy()))
    assert v4.any_bytes == dual.any_bytes and v4.any_bytes != a.any_bytes
    r4, r6 = (w.rds(p, {"9080"}, push)["9080"] for p in (v4_proxy(), v6_proxy()))
    assert r4.any_bytes != r6.any_bytes


def test_a_single_stack_mesh_builds_no_view_per_family():
    """No Service with addresses of two families: every family set gets the one shared view."""
    w = World()
    w.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cache", "namespace": "default"},
             "spec": {"clusterIP": "10.96.0.31", "ports": [{"name": "tcp-cache", "port": 5432}]}})
    push = ctx(w, True)
    views = {id(push.view(None, None, f)) for f in ((True, False), (False, True), (True, True))}
    assert views == {id(push.full_view)}


@pytest.mark.parametrize("on", [False, True])
def test_dual_stack_config_passes_envoy_validate(on: bool, tmp_path: Path):
    w = world()
    config = static_bootstrap(ctx(w, on), dual_proxy())
    listeners = {ld["name"]: ld for ld in config["static_resources"]["listeners"]}
    assert ("additional_addresses" in listeners["virtualOutbound"]) is on
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated config:\n{output}"


def test_dual_stack_router_gateway_listener_binds_both_families():
    from tests.unit.test_gateway_config import gateway, router

    w = world()
    w.apply(gateway())
    dual = router()
    dual.metadata["INSTANCE_IPS"] = "10.0.0.9,fd00::9"
    for p, on, want in ((dual, False, []), (dual, True, [("::", 8080)]), (router(), True, [])):
        listener = w.lds(p, ctx(w, on))["0.0.0.0_8080"].message(listener_pb2.Listener)
        assert _extra(listener) == want


def test_dual_stack_gateway_config_passes_envoy_validate(tmp_path: Path):
    from tests.unit.test_gateway_config import gateway, router

    w = world()
    w.apply(gateway())
    dual = router()
    dual.metadata["INSTANCE_IPS"] = "10.0.0.9,fd00::9"
    config = static_bootstrap(ctx(w, True), dual)
    assert any("additional_addresses" in ld for ld in config["static_resources"]["listeners"])
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated config:\n{output}"


def _address(listener: listener_pb2.Listener) -> str:
    return listener.address.socket_address.address


def test_an_ipv6_only_proxys_wildcard_listeners_bind_ipv6():
    """istiod's wildcard for IPMode IPv6: virtualOutbound, virtualInbound and the per-port
    listeners on `::` (named `::_PORT`), with or without the knob; IPv4 proxies keep 0.0.0.0 and
    their bytes."""
    w = world()
    for on in (False, True):
        lds = w.lds(v6_proxy(), ctx(w, on))
        assert _address(lds["virtualOutbound"].message(listener_pb2.Listener)) == "::"
        assert _address(lds["virtualInbound"].message(listener_pb2.Listener)) == "::"
        assert "0.0.0.0_9080" not in lds and _address(lds["::_9080"].message(listener_pb2.Listener)) == "::"
        assert all(not _extra(r.message(listener_pb2.Listener)) for r in lds.values())
        v4 = w.lds(v4_proxy(), ctx(w, on))
        assert _address(v4["virtualOutbound"].message(listener_pb2.Listener)) == "0.0.0.0"
        assert "0.0.0.0_9080" in v4


def test_ipv6_only_config_passes_envoy_validate(tmp_path: Path):
    config = static_bootstrap(ctx(world(), True), v6_proxy())
    listeners = {ld["name"]: ld for ld in config["static_resources"]["listeners"]}
    assert listeners["virtualOutbound"]["address"]["socket_address"]["address"] == "::"
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated config:\n{output}"
