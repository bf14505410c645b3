"""The upstream TLS of a BackendTLSPolicy (pilot/model/gateway_api/backend_tls.py) on a cluster.

SNI is the policy's hostname; the server's chain is verified against the ConfigMap's CA (inline:
it is public) or the proxy's system bundle, and its certificate must carry one of the names
(DNS or URI SANs, typed as written). A policy with no valid CA pins a certificate hash no
certificate has, so its connections fail and requests get 503, as the spec requires.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2

from pilot.model.gateway_api.backend_tls import SYSTEM_CA_BUNDLE, BackendTLS
from pilot.networking.protos import pack

# No SHA-256 digest is all zeros: a validation context that refuses every certificate.
_NO_CERTIFICATE = "00" * 32
_ALPN_H2 = ("h2",)


def apply_backend_tls(c: cluster_pb2.Cluster, tls: BackendTLS, http2: bool) -> None:
    ctx = tls_pb2.UpstreamTlsContext(sni=tls.sni or "")
    common = ctx.common_tls_context
    if http2:
        common.alpn_protocols.extend(_ALPN_H2)  # istiod: ALPNH2Only for an HTTP/2 cluster
    v = common.validation_context
    if tls.verify_nothing:
        v.verify_certificate_hash.append(_NO_CERTIFICATE)
    else:
        if tls.system_ca:
            v.trusted_ca.CopyFrom(base_pb2.DataSource(filename=SYSTEM_CA_BUNDLE))
        else:
            v.trusted_ca.CopyFrom(base_pb2.DataSource(inline_string=tls.ca_pem))
        for name in tls.subject_alt_names:
            v.match_typed_subject_alt_names.add(san_type=common_pb2.SubjectAltNameMatcher.DNS,
                                                matcher=string_pb2.StringMatcher(exact=name))
        for uri in tls.san_uris:
            v.match_typed_subject_alt_names.add(san_type=common_pb2.SubjectAltNameMatcher.URI,
                                                matcher=string_pb2.StringMatcher(exact=uri))
    c.ClearField("transport_socket_matches")
    c.transport_socket.name = "envoy.transport_sockets.tls"
    c.transport_socket.typed_config.CopyFrom(pack(ctx))
