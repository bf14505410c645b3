"""PILOT_ENABLE_IP_AUTOALLOCATE: ServiceEntry addresses allocated as istiod decides who gets them,
stable across builds and additions, and used only by proxies that capture DNS."""

from __future__ import annotations

import ipaddress

import pytest
from envoy.config.listener.v3 import listener_pb2

from pilot.features import Features
from pilot.model import auto_allocate
from pilot.model.mesh_settings import GenerationKnobs
from pilot.model.push_context import PushContext

from .helpers import DOMAIN, World, proxy


def se(name: str, hosts: list[str], *, port: int = 3306, resolution: str = "STATIC", labels: dict | None = None,
       addresses: list[str] | None = None, created: str = "", protocol: str = "TCP") -> dict:
    spec: dict = {"hosts": hosts, "ports": [{"number": port, "name": protocol.lower(), "protocol": protocol}],
                  "resolution": resolution}
    if resolution == "STATIC":
        spec["endpoints"] = [{"address": "10.1.2.3"}]
    if addresses:
        spec["addresses"] = addresses
    meta: dict = {"name": name, "namespace": "default", "labels": labels or {}}
    if created:
        meta["creationTimestamp"] = created
    return {"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry", "metadata": meta, "spec": spec}


def allocated(w: World) -> dict:
    return dict(w.ctx().auto_addresses)


def test_who_gets_addresses_and_from_which_prefixes():
    w = World()
    w.apply(se("db", ["db.example.com", "*.wild.example.com"], port=80, protocol="HTTP"),
            se("dns", ["dns.example.com"], resolution="DNS"),
            se("none", ["none.example.com"], resolution="NONE"),
            se("mine", ["mine.example.com"], addresses=["10.9.9.9"]),
            se("opt-out", ["out.example.com"], labels={auto_allocate.OPT_OUT_LABEL: "False"}))
    got = allocated(w)
    assert set(got) == {("default", "db.example.com"), ("default", "dns.example.com")}
    for v4, v6 in got.values():
        assert ipaddress.ip_address(v4) in ipaddress.ip_network("240.240.0.0/16")
        assert ipaddress.ip_address(v6) in ipaddress.ip_network("2001:2::/48")
    assert len({v4 for v4, _ in got.values()}) == 2


def test_allocation_is_stable_across_builds_and_additions():
    w = World()
    w.apply(se("a", ["a.example.com"], created="2026-01-01T00:00:00Z"))
    first = allocated(w)
    assert allocated(w) == first  # every build (and replica) computes the same addresses
    w.apply(*(se(f"n{i}", [f"n{i}.example.com"], created="2026-02-01T00:00:00Z") for i in range(200)))
    later = allocated(w)
    assert later[("default", "a.example.com")] == first[("default", "a.example.com")]
    assert len({v for v, _ in later.values()}) == 201  # no two hosts share an address


def test_a_build_with_the_same_service_entries_reuses_the_allocation():
    """Allocating hashes every host: a full push that changed no ServiceEntry keeps the previous
    context's allocation (the same object, so the push sees no address change)."""
    w = World()
    w.apply(se("a", ["a.example.com"]), se("b", ["b.example.com"]))
    first = w.ctx()
    w.apply({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
             "metadata": {"name": "v", "namespace": "default"}, "spec": {"hosts": ["x.example.com"], "tcp": [{"route": [{"destination": {"host": "a.example.com"}}]}]}})
    same = PushContext.build(w.store, w.mesh.current, w.mesh.version, DOMAIN, "v-next", previous=first)
    assert same.auto_addresses is first.auto_addresses
    w.apply(se("c", ["c.example.com"]))
    grown = PushContext.build(w.store, w.mesh.current, w.mesh.version, DOMAIN, "v-grown", previous=same)
    assert set(grown.auto_addresses) == {("default", f"{n}.example.com") for n in "abc"}
    assert {k: v for k, v in grown.auto_addresses.items() if k[1] != "c.example.com"} == dict(first.auto_addresses)


def test_collisions_resolve_without_sharing_in_a_tiny_prefix():
    entries = World()
    entries.apply(*(se(f"s{i}", [f"s{i}.example.com"]) for i in range(14)))
    got = auto_allocate.allocate(entries.store.list(auto_allocate.ServiceEntry), ("10.0.0.0/28", "fd00::/124"))
    assert len(got) == 14 and len({v4 for v4, _ in got.values()}) == 14  # the /28's 14 host addresses
    entries.apply(se("s14", ["s14.example.com"]))
    got = auto_allocate.allocate(entries.store.list(auto_allocate.ServiceEntry), ("10.0.0.0/28", "fd00::/124"))
    assert len(got) == 14  # no room: the newest host gets none


def test_knobs_parse_with_istiods_defaults_and_off_allocates_nothing():
    f = Features.from_env({})
    assert f.generation_knobs().ip_autoallocate == ("240.240.0.0/16", "2001:2::/48")
    f = Features.from_env({"PILOT_ENABLE_IP_AUTOALLOCATE": "false"})
    assert f.generation_knobs().ip_autoallocate is None
    f = Features.from_env({"PILOT_IP_AUTOALLOCATE_IPV4_PREFIX": "100.64.0.0/24"})
    assert f.generation_knobs().ip_autoallocate == ("100.64.0.0/24", "2001:2::/48")
    with pytest.raises(ValueError):
        Features.from_env({"PILOT_IP_AUTOALLOCATE_IPV4_PREFIX": "2001:2::/48"})
    w = World()
    w.apply(se("db", ["db.example.com"]))
    w.mesh.refresh(w.store)
    ctx = PushContext.build(w.store, w.mesh.current, w.mesh.version, DOMAIN, "v1",
                            knobs=GenerationKnobs(ip_autoallocate=None))
    assert not ctx.auto_addresses


def _chains(w: World, p) -> list[tuple[str, ...]]:
    listener = w.lds(p)["0.0.0.0_3306"].message(listener_pb2.Listener)
    return [tuple(f"{r.address_prefix}/{r.prefix_len.value}" for r in c.filter_chain_match.prefix_ranges)
            for c in listener.filter_chains]


def test_dns_capturing_proxies_tell_tcp_service_entries_apart_by_their_addresses():
    w = World()
    w.apply(se("a", ["a.example.com"]), se("b", ["b.example.com"]))
    got = allocated(w)
    plain = proxy(interception="REDIRECT")
    # Without DNS capture, istiod's shape: no address to match, one chain for the port.
    assert _chains(w, plain) == [()]
    capturing = proxy(interception="REDIRECT")
    capturing.metadata["DNS_CAPTURE"] = "true"
    a, b = got[("default", "a.example.com")][0], got[("default", "b.example.com")][0]
    assert sorted(_chains(w, capturing)) == sorted([(f"{a}/32",), (f"{b}/32",)])
    dual = proxy(interception="REDIRECT", ip="10.0.0.1,fd00::1")
    dual.metadata["DNS_CAPTURE"] = "true"
    v6 = got[("default", "a.example.com")][1]
    assert (f"{a}/32", f"{v6}/128") in _chains(w, dual)
