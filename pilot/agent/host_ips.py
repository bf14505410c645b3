"""The host's (or pod's) own addresses, as istio-agent reports them in INSTANCE_IPS: every
address of every interface that is up, less loopback and link-local ones, in interface order
(istio-agent's GetPrivateIPs). istiod reads the proxy's IP families from them (dual stack).

getifaddrs(3) through ctypes: the standard library lists interface names but not their
addresses, and an agent dependency for one call is not worth it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import socket
import sys

IFF_UP = 0x1
IFF_LOOPBACK = 0x8


class _Sockaddr(ctypes.Structure):
    _fields_ = [("head", ctypes.c_uint16), ("data", ctypes.c_uint8 * 26)]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [("next", ctypes.POINTER(_IfAddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_Sockaddr)), ("netmask", ctypes.POINTER(_Sockaddr)),
                     ("ifu", ctypes.c_void_p), ("data", ctypes.c_void_p)]


def _family(sa: _Sockaddr) -> int:
    # Linux: a 16-bit sa_family; the BSDs (macOS): an 8-bit sa_len, then an 8-bit sa_family.
    return sa.head if sys.platform.startswith("linux") else bytes(sa)[1]


def _ip(sa: _Sockaddr) -> str | None:
    raw = bytes(sa)
    family = _family(sa)
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[4:8])
    if family == socket.AF_INET6:  # sockaddr_in6: family, port, flowinfo, then the address
        return socket.inet_ntop(socket.AF_INET6, raw[8:24])
    return None


def interface_addresses() -> list[tuple[str, int, str]]:
    """(interface name, its flags, address) for every IPv4 and IPv6 address, in getifaddrs'
    order; [] where getifaddrs is not available."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if not hasattr(libc, "getifaddrs"):
        return []
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return []
    out = []
    try:
        node = head
        while ctypes.cast(node, ctypes.c_void_p).value:  # not NULL: the list goes on
            ifa = node.contents
            if ifa.addr:
                ip = _ip(ifa.addr.contents)
                if ip is not None:
                    out.append(((ifa.name or b"").decode(errors="replace"), ifa.flags, ip))
            node = ifa.next
    finally:
        libc.freeifaddrs(head)
    return out


def private_ips(exclude_interfaces: frozenset[str] = frozenset()) -> list[str]:
    """istio-agent's GetPrivateIPs: addresses of interfaces that are up and not loopback, less
    loopback, link-local and unspecified addresses (IPv4-mapped IPv6 ones as IPv4), without
    those of `exclude_interfaces` (the pod's traffic.sidecar.istio.io/excludeInterfaces)."""
    out: list[str] = []
    for name, flags, text in interface_addresses():
        if not flags & IFF_UP or flags & IFF_LOOPBACK or name in exclude_interfaces:
            continue
        ip = ipaddress.ip_address(text)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_loopback or ip.is_link_local or ip.is_unspecified or (ip.is_multicast and ip.is_link_local):
            continue
        if str(ip) not in out:
            out.append(str(ip))
    return out
