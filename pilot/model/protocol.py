"""Protocol selection as istiod does it: appProtocol first, then the port-name prefix.

A port that names no known protocol is UNSUPPORTED (istiod's `protocol.Unsupported`): not TCP, but
"find out per connection". Sidecars sniff such ports (pilot/networking/sniffing.py) while the
`PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_*` knobs allow it, and treat them as TCP otherwise.
"""

from __future__ import annotations

from enum import Enum


class Protocol(str, Enum):
    HTTP = "HTTP"
    HTTP2 = "HTTP2"
    GRPC = "GRPC"
    GRPC_WEB = "GRPC-Web"
    HTTPS = "HTTPS"
    TLS = "TLS"
    TCP = "TCP"
    MONGO = "Mongo"
    REDIS = "Redis"
    MYSQL = "MySQL"
    UDP = "UDP"
    UNSUPPORTED = "UnsupportedProtocol"  # istiod's name for it, as its debug views show it

    @property
    def is_http(self) -> bool:
        return self in (Protocol.HTTP, Protocol.HTTP2, Protocol.GRPC, Protocol.GRPC_WEB)

    @property
    def is_unsupported(self) -> bool:
        return self is Protocol.UNSUPPORTED

    @property
    def is_http2(self) -> bool:
        return self in (Protocol.HTTP2, Protocol.GRPC)


_NAMES = {
    "http": Protocol.HTTP,
    "http2": Protocol.HTTP2,
    "grpc": Protocol.GRPC,
    "grpc-web": Protocol.GRPC_WEB,
    "https": Protocol.HTTPS,
    "tls": Protocol.TLS,
    "tcp": Protocol.TCP,
    "mongo": Protocol.MONGO,
    "redis": Protocol.REDIS,
    "mysql": Protocol.MYSQL,
    "udp": Protocol.UDP,
}
_APP_PROTOCOLS = {
    **_NAMES,
    "kubernetes.io/h2c": Protocol.HTTP2,
    "kubernetes.io/ws": Protocol.HTTP,
    "kubernetes.io/wss": Protocol.HTTPS,
}


def select_protocol(port_name: str, app_protocol: str | None, transport: str = "TCP") -> Protocol:
    if transport == "UDP":
        return Protocol.UDP
    if app_protocol:
        p = _APP_PROTOCOLS.get(app_protocol.lower())
        if p is not None:
            return p
    name = port_name.lower()
    if name in _NAMES:
        return _NAMES[name]
    # "grpc-web" must win over "grpc", so try the longest prefix that ends at a dash.
    for prefix in sorted(_NAMES, key=len, reverse=True):
        if name.startswith(prefix + "-"):
            return _NAMES[prefix]
    return Protocol.UNSUPPORTED
