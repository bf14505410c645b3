"""Istio mutual TLS: the TLS contexts of mesh traffic, with certificates served by pilot-agent.

The workload certificate and the mesh root never pass through the control plane: generated
config names them (`default`, `ROOTCA`) and Envoy fetches them over SDS from the agent next to it,
through the static `sds-grpc` cluster the agent writes into every bootstrap (istio-agent's contract).
"""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2, config_source_pb2, grpc_service_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2

from pilot.networking.protos import pack

SDS_CLUSTER = "sds-grpc"
WORKLOAD_SECRET = "default"
ROOT_SECRET = "ROOTCA"
TLS_SOCKET = "envoy.transport_sockets.tls"
RAW_SOCKET = "envoy.transport_sockets.raw_buffer"

# What a sidecar client offers on mesh connections, and what an inbound listener accepts as
# "this is the mesh, not the app's own TLS" (istiod's ALPNInMesh* values).
CLIENT_ALPN_TCP = ("istio-peer-exchange", "istio")
CLIENT_ALPN_H2 = ("istio-peer-exchange", "istio", "h2")
MESH_ALPNS = ("istio-peer-exchange", "istio", "istio-http/1.0", "istio-http/1.1", "istio-h2")
SERVER_ALPN_HTTP = ("h2", "http/1.1")

# Endpoint metadata that auto mTLS matches on (the value of the pod label
# `security.istio.io/tlsMode`): only endpoints with a sidecar get mTLS.
TRANSPORT_SOCKET_MATCH = "envoy.transport_socket_match"


def sds_config() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        api_config_source=config_source_pb2.ApiConfigSource(
            api_type=config_source_pb2.ApiConfigSource.GRPC,
            transport_api_version=config_source_pb2.ApiVersion.V3,
            set_node_on_first_message_only=True,
            grpc_services=[grpc_service_pb2.GrpcService(
                envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=SDS_CLUSTER))],
        ),
        resource_api_version=config_source_pb2.ApiVersion.V3,
    )


def _mesh_common(sans: tuple[str, ...], alpn: tuple[str, ...]) -> tls_pb2.CommonTlsContext:
    common = tls_pb2.CommonTlsContext(alpn_protocols=list(alpn))
    common.tls_certificate_sds_secret_configs.append(
        secret_pb2.SdsSecretConfig(name=WORKLOAD_SECRET, sds_config=sds_config()))
    combined = common.combined_validation_context
    combined.default_validation_context.SetInParent()
    for san in sans:
        combined.default_validation_context.match_typed_subject_alt_names.add(
            san_type=common_pb2.SubjectAltNameMatcher.URI, matcher=string_pb2.StringMatcher(exact=san))
    combined.validation_context_sds_secret_config.CopyFrom(
        secret_pb2.SdsSecretConfig(name=ROOT_SECRET, sds_config=sds_config()))
    return common


def istio_upstream_tls(sni: str, sans: tuple[str, ...], http2: bool) -> tls_pb2.UpstreamTlsContext:
    """Client side of mesh mTLS. `sans`: the SPIFFE identities the server may present (empty:
    any certificate the mesh root signed)."""
    return tls_pb2.UpstreamTlsContext(
        sni=sni, common_tls_context=_mesh_common(sans, CLIENT_ALPN_H2 if http2 else CLIENT_ALPN_TCP))


def istio_downstream_tls(http: bool, sans: tuple[str, ...] = (),
                         alpn: tuple[str, ...] | None = None) -> tls_pb2.DownstreamTlsContext:
    """Server side: the peer must present a certificate from the mesh root (and, with `sans`, one
    of those identities). Which identities may do what is otherwise authorization's job."""
    if alpn is None:
        alpn = SERVER_ALPN_HTTP if http else ()
    ctx = tls_pb2.DownstreamTlsContext(common_tls_context=_mesh_common(sans, alpn))
    ctx.require_client_certificate.value = True
    return ctx


def tls_socket(ctx) -> base_pb2.TransportSocket:
    return base_pb2.TransportSocket(name=TLS_SOCKET, typed_config=pack(ctx))


def raw_socket() -> base_pb2.TransportSocket:
    return base_pb2.TransportSocket(name=RAW_SOCKET, typed_config=pack(raw_buffer_pb2.RawBuffer()))


def outbound_sni(port: int, subset: str, hostname: str) -> str:
    """istiod's SNI for mesh connections: routers in AUTO_PASSTHROUGH mode route on it."""
    return f"outbound_.{port}_.{subset}_.{hostname}"
