"""PILOT_ENABLE_IP_AUTOALLOCATE through a real Envoy: a sidecar that captures DNS (iptables
shape, ISTIO_META_DNS_CAPTURE) holds, in its outbound listener for a TCP port shared by two
ServiceEntries without addresses, one chain per ServiceEntry matching its allocated address, and
the config is ACKed; with the knob off the same sidecar gets the single port-wide chain (the two
ServiceEntries cannot be told apart, istiod's shape without allocation)."""

from __future__ import annotations

import ipaddress
import textwrap

import pytest

from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)

NODE = sidecar_node_id("client-1")


def service_entry(name: str, host: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: ServiceEntry
        metadata: {{name: {name}, namespace: default}}
        spec:
          hosts: [{host}]
          ports: [{{number: 3306, name: tcp, protocol: TCP}}]
          resolution: STATIC
          endpoints: [{{address: 127.0.0.1}}]
        """)


async def chains_of(tmp_path, env: dict[str, str]) -> list[list[str]]:
    cp = ControlPlane(tmp_path, env=env, name=f"cp-{len(env)}")
    cp.write("se.yaml", service_entry("db-a", "a.db.example.com") + "---\n" + service_entry("db-b", "b.db.example.com"))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata={
            "NAMESPACE": "default", "INTERCEPTION_MODE": "REDIRECT", "DNS_CAPTURE": "true"}), tmp_path)
        await envoy.wait_ready()
        await cp.wait_synced(NODE, types=("cluster", "listener"))

        async def listener():
            dump = await envoy.config_dump(resource="dynamic_listeners")
            found = [d["active_state"]["listener"] for d in dump["configs"]
                     if d["name"] == "0.0.0.0_3306" and "active_state" in d]
            return found[0] if found else None

        got = await wait_for(listener, 15, message=f"0.0.0.0_3306 in Envoy\n{envoy.log_tail(10)}")
        registry = {s["hostname"]: s for s in await cp.debug("/debug/registryz")}
        shown = [registry[h].get("autoAllocatedIPv4Address") for h in ("a.db.example.com", "b.db.example.com")]
        assert all(shown) == (env.get("PILOT_ENABLE_IP_AUTOALLOCATE") != "false"), shown
        return [[f"{r['address_prefix']}/{r['prefix_len']}"
                 for r in c.get("filter_chain_match", {}).get("prefix_ranges", [])]
                for c in got["filter_chains"]]
    finally:
        await envoy.stop()
        await cp.stop()


async def test_a_dns_capturing_sidecar_matches_each_service_entry_by_its_allocated_address(tmp_path):
    chains = await chains_of(tmp_path, {})
    assert len(chains) == 2
    pool = ipaddress.ip_network("240.240.0.0/16")
    addresses = [ipaddress.ip_network(c[0]) for c in chains]
    assert all(len(c) == 1 for c in chains) and all(a.subnet_of(pool) and a.prefixlen == 32 for a in addresses)
    assert addresses[0] != addresses[1]
    # The knob off: nothing to tell them apart by, one chain for the port.
    assert await chains_of(tmp_path, {"PILOT_ENABLE_IP_AUTOALLOCATE": "false"}) == [[]]


async def test_an_address_moved_by_another_entrys_deletion_reaches_a_sidecar_scoped_proxy(tmp_path):
    """In a 6-address pool a.db and c.db hash to one slot; c.db is older and keeps it, a.db
    takes the next. Deleting c.db (a host the proxy's Sidecar does not show) moves a.db to its
    own slot: the Sidecar-scoped, DNS-capturing proxy must get a listener matching the new
    address, though nothing it sees changed in the Store."""
    cp = ControlPlane(tmp_path, env={"PILOT_IP_AUTOALLOCATE_IPV4_PREFIX": "240.240.0.0/29"})
    hosts = {"c": "c.db.example.com", "a": "a0.db.example.com", "b": "b0.db.example.com"}
    for year, (n, h) in zip((2020, 2021, 2022), hosts.items(), strict=True):
        cp.write(f"se-{n}.yaml", service_entry(f"db-{n}", h).replace(
            "namespace: default}", f"namespace: default, creationTimestamp: '{year}-01-01T00:00:00Z'}}"))
    cp.write("sidecar.yaml", textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: default, namespace: default}}
        spec:
          egress: [{{hosts: ["./{hosts['a']}", "./{hosts['b']}"]}}]
        """))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port, metadata={
            "NAMESPACE": "default", "INTERCEPTION_MODE": "REDIRECT", "DNS_CAPTURE": "true"}), tmp_path)
        await envoy.wait_ready()

        async def allocated() -> set[str]:
            registry = {s["hostname"]: s for s in await cp.debug("/debug/registryz")}
            return {registry[hosts[n]]["autoAllocatedIPv4Address"] for n in ("a", "b")}

        async def envoy_matches(want: set[str]):
            dump = await envoy.config_dump(resource="dynamic_listeners")
            found = [d["active_state"]["listener"] for d in dump["configs"]
                     if d["name"] == "0.0.0.0_3306" and "active_state" in d]
            got = {r["address_prefix"] for c in (found[0]["filter_chains"] if found else ())
                   for r in c.get("filter_chain_match", {}).get("prefix_ranges", [])}
            return got if got == want else None

        before = await allocated()
        await wait_for(lambda: envoy_matches(before), 15, message=f"chains for {before}\n{envoy.log_tail(10)}")
        cp.remove("se-c.yaml")

        async def moved() -> set[str] | None:
            now = await allocated()
            return now if now != before else None

        after = await wait_for(moved, 15, message="a0.db's address after c.db went")
        assert len(after & before) == 1  # b0.db kept its address; a0.db took c.db's slot
        await wait_for(lambda: envoy_matches(after), 15,
                       message=f"the scoped proxy's chains follow to {after}\n{cp.log_tail(10)}")
    finally:
        await envoy.stop()
        await cp.stop()
