"""ServiceEntry address auto-allocation (istiod's PILOT_ENABLE_IP_AUTOALLOCATE, default on).

Which ServiceEntries get addresses is istiod's rule (pilot/pkg/networking/serviceentry
ShouldV2AutoAllocateIP): resolution is not NONE (a passthrough cluster could not honour an
address it never saw), `spec.addresses` is empty (the user's addresses always win), and the label
`networking.istio.io/enable-autoallocate-ip` is not "false". Each non-wildcard host gets one IPv4
and one IPv6 address, from PILOT_IP_AUTOALLOCATE_IPV4_PREFIX (240.240.0.0/16) and _IPV6_PREFIX
(2001:2::/48).

How addresses are chosen differs from istiod on purpose: istiod's controller hands out the next
free address and writes it to `status.addresses` through the Kubernetes API, so every replica
reads one answer back. Here there is no status write (file mode has nowhere to write it), so the
answer must be the same on every replica and every restart without coordination: a host's slot is
a hash of `namespace/hostname` (FNV-1a, as istiod's older allocator), collisions resolved by
double hashing in age order (creation time, then namespace/name), so an existing ServiceEntry
keeps its address when another is added. The same slot indexes both prefixes, so a host's IPv4 and
IPv6 addresses pair up. Pure: entries in, mapping out.

The addresses are for proxies that capture DNS (ISTIO_META_DNS_CAPTURE): their DNS proxy answers
the host with them, and the outbound listener tells TCP ServiceEntries sharing a port apart by
them. Other proxies never see them, as in istiod.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from pilot.config.networking import ServiceEntry
from pilot.model.services import MeshService
from pilot.model.store import Entry

OPT_OUT_LABEL = "networking.istio.io/enable-autoallocate-ip"
_PRIME = 65011  # the double-hashing step's modulus (istiod's)


def eligible(entry: Entry[ServiceEntry]) -> bool:
    se = entry.obj
    if se.spec.resolution == "NONE" or se.spec.addresses:
        return False
    return se.metadata.labels.get(OPT_OUT_LABEL, "").lower() != "false"


def _fnv1a(text: str) -> int:
    h = 0x811C9DC5
    for b in text.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def with_addresses(svc: MeshService, allocated: Mapping[tuple[str, str], tuple[str, str]],
                   ipv4: bool, ipv6: bool) -> MeshService:
    """The service as a DNS-capturing proxy of those IP families sees it (istiod filters the
    allocated addresses by the proxy's families)."""
    if svc.kind != "ServiceEntry" or svc.cluster_ip or svc.extra_addresses:
        return svc
    pair = allocated.get((svc.namespace, svc.hostname))
    if pair is None:
        return svc
    mine = [a for a, ok in zip(pair, (ipv4, ipv6), strict=True) if ok]
    if not mine:
        return svc
    return replace(svc, cluster_ip=mine[0], extra_addresses=tuple(mine[1:]))


def allocate(entries: Iterable[Entry[ServiceEntry]], prefixes: tuple[str, str]
             ) -> Mapping[tuple[str, str], tuple[str, str]]:
    """(namespace, hostname) -> (IPv4, IPv6) for every eligible host. Hosts beyond the prefixes'
    room get nothing (istiod logs "out of IPs"; they keep the port-wide chain)."""
    v4, v6 = (ipaddress.ip_network(p) for p in prefixes)
    # Usable slots: the v4 prefix's host addresses (not its network or broadcast address), and no
    # more than the v6 prefix holds.
    slots = min(v4.num_addresses - 2, v6.num_addresses - 1)
    taken: dict[int, tuple[str, str]] = {}
    keys: dict[tuple[str, str], None] = {}
    for e in sorted(entries, key=lambda e: (e.obj.metadata.creation_timestamp, e.key.namespace, e.key.name)):
        if not eligible(e):
            continue
        for host in e.obj.spec.hosts:
            key = (e.key.namespace, host)
            if host.startswith("*") or key in keys:
                continue
            keys[key] = None
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for key in list(keys)[:slots]:
        h = _fnv1a(f"{key[0]}/{key[1]}")
        slot, step, tries = h % slots, _PRIME - (h % _PRIME), 0
        while slot in taken:
            tries += 1
            # a step sharing a factor with `slots` cycles through a subset: probe linearly then
            slot = (slot + (step if tries < 64 else 1)) % slots
        address = (str(v4.network_address + 1 + slot), str(v6.network_address + 1 + slot))
        taken[slot] = key
        out[key] = address
    return MappingProxyType(out)
