"""Protocol sniffing: ports that name no protocol carry HTTP or TCP, decided per connection.

As istiod does it: the `http_inspector` listener filter reads the first bytes of a plaintext
connection and, for HTTP/1.x or HTTP/2 prior knowledge (h2c), sets the connection's application
protocol; a filter chain matching those application protocols (and transport `raw_buffer`, i.e.
not TLS) runs the HTTP connection manager with the port's routes, every other connection takes
the TCP chains. The inspector waits for the client to speak first: with istiod's default
`protocolDetectionTimeout: 0s` it waits for ever, so server-first protocols (MySQL...) need a port
name or appProtocol; with a timeout the connection continues as TCP when it expires.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.listener.http_inspector.v3 import http_inspector_pb2

from pilot.networking.protos import duration, pack

HTTP_INSPECTOR = "envoy.filters.listener.http_inspector"
RAW_BUFFER = "raw_buffer"
TLS = "tls"
# What a sidecar client offers over mesh mTLS for HTTP it detected, and for everything else
# (istiod's mtlsHTTPALPNs and mtlsTCPWithMxcALPNs).
MTLS_HTTP_ALPNS = ("istio-http/1.0", "istio-http/1.1", "istio-h2")
MTLS_TCP_ALPNS = ("istio-peer-exchange", "istio")


def plaintext_http_alpns(http10: bool) -> tuple[str, ...]:
    """What the HTTP inspector reports for HTTP (istiod's plaintextHTTPALPNs). HTTP/1.0 only with
    PILOT_HTTP10: otherwise the connection manager would refuse it, and as TCP it still passes."""
    return ("http/1.0", "http/1.1", "h2c") if http10 else ("http/1.1", "h2c")


def http_inspector(only_ports: Iterable[int] = ()) -> listener_components_pb2.ListenerFilter:
    """`only_ports`: inspect connections to these original destination ports only (virtualInbound
    serves sniffed and declared ports alike; a declared TCP port must not wait for client bytes)."""
    f = listener_components_pb2.ListenerFilter(name=HTTP_INSPECTOR, typed_config=pack(http_inspector_pb2.HttpInspector()))
    ports = sorted(set(only_ports))
    if ports:
        wanted = listener_components_pb2.ListenerFilterChainMatchPredicate()
        for p in ports:
            r = wanted.or_match.rules.add().destination_port_range
            r.start, r.end = p, p + 1
        if len(ports) == 1:
            wanted = wanted.or_match.rules[0]
        f.filter_disabled.not_match.CopyFrom(wanted)
    return f


def match_http(chain: listener_components_pb2.FilterChain, alpns: tuple[str, ...],
               transport: str = RAW_BUFFER) -> listener_components_pb2.FilterChain:
    chain.filter_chain_match.application_protocols.extend(alpns)
    chain.filter_chain_match.transport_protocol = transport
    return chain


def set_detection_timeout(listener: listener_pb2.Listener, seconds: float) -> None:
    """How long listener filters may wait for bytes; then the connection goes on (as TCP)."""
    listener.listener_filters_timeout.CopyFrom(duration(seconds))
    listener.continue_on_listener_filters_timeout = True
