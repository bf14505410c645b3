"""Mesh mTLS in generated config: auto mTLS and ISTIO_MUTUAL on outbound clusters, tlsMode
endpoint metadata, and the inbound side (virtualInbound / bound inbound listeners) per
PeerAuthentication mode. Only proxies with a mesh identity get TLS: they have certificates."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from pilot.config.mesh import MeshConfig
from pilot.model.proxy import Proxy
from pilot.xds.cache import XdsCache
from pilot.xds.discovery import GENERATORS
from pilot.xds.generated import GenerationMemo
from pilot.xds.typeurls import LISTENER
from tests.support.envoy import envoy_validate
from tests.support.static_config import static_bootstrap

from .helpers import World, endpoint_slice, modified, proxy, service

pytestmark = pytest.mark.timeout(60)

REVIEWS = "reviews.default.svc.cluster.local"
CLUSTER = f"outbound|9080||{REVIEWS}"
REVIEWS_SA = "spiffe://cluster.local/ns/default/sa/bookinfo-reviews"


def reviews_service(target_port: int | str = 9080) -> dict:
    doc = service("reviews", ports=[{"name": "http", "port": 9080, "targetPort": target_port}])
    doc["spec"]["selector"] = {"app": "reviews"}
    return doc


def reviews_slice(port: int = 9080) -> dict:
    doc = endpoint_slice("reviews-1", "reviews", addresses=("10.1.0.1",), port=port)
    doc["endpoints"].append({"addresses": ["10.1.0.2"], "conditions": {"ready": True}, "zone": "zone-a",
                             "targetRef": {"kind": "Pod", "name": "legacy-1", "namespace": "default"}})
    doc["endpoints"][0]["targetRef"] = {"kind": "Pod", "name": "reviews-1", "namespace": "default"}
    return doc


def pod(name: str, ip: str, labels: dict, sa: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"serviceAccountName": sa}, "status": {"podIP": ip, "phase": "Running"}}


SIDECAR_POD = pod("reviews-1", "10.1.0.1", {"app": "reviews", "security.istio.io/tlsMode": "istio"}, "bookinfo-reviews")
LEGACY_POD = pod("legacy-1", "10.1.0.2", {"app": "reviews"}, "legacy")


def mesh_proxy(*, ip: str = "10.1.0.1", labels: dict | None = None, interception: str = "NONE",
               identity: bool = True, pod_name: str = "reviews-1") -> Proxy:
    p = proxy(ip=ip, interception=interception, pod_name=pod_name)
    p.metadata["LABELS"] = labels if labels is not None else {"app": "reviews"}
    if identity:
        p.identity = REVIEWS_SA
    return p


@pytest.fixture
def world() -> World:
    w = World()
    w.apply(reviews_service(), reviews_slice(), SIDECAR_POD, LEGACY_POD)
    return w


def cluster(world: World, p: Proxy, name: str = CLUSTER) -> cluster_pb2.Cluster:
    return world.cds(p)[name].message(cluster_pb2.Cluster)


def upstream_tls(socket) -> tls_pb2.UpstreamTlsContext:
    ctx = tls_pb2.UpstreamTlsContext()
    assert socket.name == "envoy.transport_sockets.tls"
    socket.typed_config.Unpack(ctx)
    return ctx


def test_auto_mtls_sends_mtls_only_to_sidecar_endpoints(world: World) -> None:
    c = cluster(world, mesh_proxy())
    assert not c.HasField("transport_socket")
    istio, plain = c.transport_socket_matches
    assert (istio.name, dict(istio.match)) == ("tlsMode-istio", {"tlsMode": "istio"})
    assert (plain.name, dict(plain.match), plain.transport_socket.name) == \
        ("tlsMode-disabled", {}, "envoy.transport_sockets.raw_buffer")
    ctx = upstream_tls(istio.transport_socket)
    assert ctx.sni == f"outbound_.9080_._.{REVIEWS}"
    common = ctx.common_tls_context
    assert [s.name for s in common.tls_certificate_sds_secret_configs] == ["default"]
    assert common.tls_certificate_sds_secret_configs[0].sds_config.api_config_source.grpc_services[0] \
        .envoy_grpc.cluster_name == "sds-grpc"
    combined = common.combined_validation_context
    assert combined.validation_context_sds_secret_config.name == "ROOTCA"
    # Only the identities of the service's workloads may answer.
    sans = [m.matcher.exact for m in combined.default_validation_context.match_typed_subject_alt_names]
    assert sans == ["spiffe://cluster.local/ns/default/sa/bookinfo-reviews",
                    "spiffe://cluster.local/ns/default/sa/legacy"]

    cla = world.eds(mesh_proxy(), {CLUSTER})[CLUSTER].message(endpoint_pb2.ClusterLoadAssignment)
    meta = {lb.endpoint.address.socket_address.address: dict(lb.metadata.filter_metadata["envoy.transport_socket_match"])
            for lb in cla.endpoints[0].lb_endpoints}
    assert meta == {"10.1.0.1": {"tlsMode": "istio"}, "10.1.0.2": {}}


def test_a_proxy_without_identity_gets_no_tls(world: World) -> None:
    c = cluster(world, mesh_proxy(identity=False))
    assert not c.transport_socket_matches and not c.HasField("transport_socket")
    listeners = world.lds(mesh_proxy(identity=False))
    assert not [n for n in listeners if n.startswith("inbound")]


@pytest.mark.parametrize(("mode", "expect"), [("ISTIO_MUTUAL", "mtls"), ("DISABLE", "plain"), ("SIMPLE", "simple")])
def test_destination_rule_tls_mode_wins_over_auto(world: World, mode: str, expect: str) -> None:
    tls: dict = {"mode": mode}
    if mode == "ISTIO_MUTUAL":
        tls["subjectAltNames"] = ["spiffe://cluster.local/ns/default/sa/pinned"]
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                 "metadata": {"name": "reviews", "namespace": "default"},
                 "spec": {"host": REVIEWS, "trafficPolicy": {"tls": tls}}})
    c = cluster(world, mesh_proxy())
    assert not c.transport_socket_matches
    if expect == "mtls":
        ctx = upstream_tls(c.transport_socket)
        assert ctx.common_tls_context.tls_certificate_sds_secret_configs[0].name == "default"
        assert [m.matcher.exact for m in ctx.common_tls_context.combined_validation_context
                .default_validation_context.match_typed_subject_alt_names] == tls["subjectAltNames"]
    elif expect == "plain":
        assert not c.HasField("transport_socket")
    else:  # the user's own TLS: no mesh certificate involved
        assert not upstream_tls(c.transport_socket).common_tls_context.tls_certificate_sds_secret_configs


def test_auto_mtls_off_in_mesh_config_means_plaintext() -> None:
    w = World(MeshConfig(enable_auto_mtls=False))
    w.apply(reviews_service(), reviews_slice(), SIDECAR_POD)
    c = cluster(w, mesh_proxy())
    assert not c.transport_socket_matches and not c.HasField("transport_socket")


def test_service_account_change_changes_the_verified_sans(world: World) -> None:
    before = cluster(world, mesh_proxy())
    world.apply(modified(SIDECAR_POD, **{"spec.serviceAccountName": "reviews-v2"}))
    after = cluster(world, mesh_proxy())
    sans = [m.matcher.exact for m in upstream_tls(after.transport_socket_matches[0].transport_socket)
            .common_tls_context.combined_validation_context.default_validation_context.match_typed_subject_alt_names]
    assert "spiffe://cluster.local/ns/default/sa/reviews-v2" in sans
    assert before.SerializeToString() != after.SerializeToString()


def downstream(chain) -> tls_pb2.DownstreamTlsContext:
    ctx = tls_pb2.DownstreamTlsContext()
    chain.transport_socket.typed_config.Unpack(ctx)
    return ctx


def test_none_mode_inbound_listener_is_bound_on_the_workload_address(world: World) -> None:
    listeners = world.lds(mesh_proxy())
    inbound = listeners["inbound_10.1.0.1_9080"].message(listener_pb2.Listener)
    assert inbound.address.socket_address.address == "10.1.0.1"
    assert inbound.address.socket_address.port_value == 9080
    # PERMISSIVE (no PeerAuthentication): mesh mTLS by ALPN, anything else in plaintext.
    secure, plain = inbound.filter_chains
    assert secure.filter_chain_match.transport_protocol == "tls"
    assert "istio" in secure.filter_chain_match.application_protocols
    ctx = downstream(secure)
    assert ctx.require_client_certificate.value
    assert ctx.common_tls_context.tls_certificate_sds_secret_configs[0].name == "default"
    assert not plain.HasField("transport_socket") and not plain.filter_chain_match.transport_protocol
    assert [f.name for f in inbound.listener_filters] == ["envoy.filters.listener.tls_inspector"]
    hcm = hcm_pb2.HttpConnectionManager()
    secure.filters[0].typed_config.Unpack(hcm)
    assert hcm.forward_client_cert_details == hcm_pb2.HttpConnectionManager.APPEND_FORWARD
    assert hcm.set_current_client_cert_details.uri
    assert hcm.route_config.virtual_hosts[0].routes[0].route.cluster == "inbound|9080||"
    plain.filters[0].typed_config.Unpack(hcm)
    assert hcm.forward_client_cert_details == hcm_pb2.HttpConnectionManager.SANITIZE

    app = cluster(world, mesh_proxy(), "inbound|9080||")
    addr = app.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (app.type, addr.address, addr.port_value) == (cluster_pb2.Cluster.STATIC, "127.0.0.1", 9080)


def test_inbound_follows_the_services_that_select_the_workload(world: World) -> None:
    other = mesh_proxy(labels={"app": "ratings"}, ip="10.1.0.7", pod_name="ratings-1")
    assert not [n for n in world.lds(other) if n.startswith("inbound")]
    # A named targetPort is the port the workload's own endpoint advertises under that name.
    world.apply(reviews_service(target_port="http"), reviews_slice(port=9999))
    assert "inbound_10.1.0.1_9999" in world.lds(mesh_proxy())


def test_redirect_mode_uses_virtual_inbound(world: World) -> None:
    p = mesh_proxy(interception="REDIRECT")
    vi = world.lds(p)["virtualInbound"].message(listener_pb2.Listener)
    assert vi.address.socket_address.port_value == 15006 and vi.use_original_dst.value
    assert {c.filter_chain_match.destination_port.value for c in vi.filter_chains} == {9080}
    assert vi.default_filter_chain.filters[0].name == "envoy.filters.network.tcp_proxy"
    passthrough = cluster(world, p, "InboundPassthroughCluster")
    assert passthrough.type == cluster_pb2.Cluster.ORIGINAL_DST
    assert passthrough.upstream_bind_config.source_address.address == "127.0.0.6"


def test_sidecar_ingress_defines_inbound_ports_even_without_identity(world: World) -> None:
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                 "metadata": {"name": "reviews", "namespace": "default"},
                 "spec": {"workloadSelector": {"labels": {"app": "reviews"}},
                          "ingress": [{"port": {"number": 9090, "protocol": "HTTP", "name": "web"},
                                       "defaultEndpoint": "127.0.0.1:8080", "captureMode": "NONE"}]}})
    p = mesh_proxy(identity=False, interception="REDIRECT")
    listeners = world.lds(p)
    inbound = listeners["inbound_10.1.0.1_9090"].message(listener_pb2.Listener)
    assert len(inbound.filter_chains) == 1 and not inbound.filter_chains[0].HasField("transport_socket")
    app = cluster(world, p, "inbound|9090||")
    assert app.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value == 8080
    assert "inbound_10.1.0.1_9080" not in listeners  # the Sidecar's ingress replaces the service ports


def test_generation_memo_does_not_share_inbound_between_workloads(world: World) -> None:
    memo = GenerationMemo(GENERATORS, XdsCache())
    ctx = world.ctx()
    reviews = memo.generate(ctx, LISTENER, mesh_proxy(), None)
    other = memo.generate(ctx, LISTENER, mesh_proxy(labels={"app": "x"}, ip="10.1.0.7", pod_name="x-1"), None)
    assert "inbound_10.1.0.1_9080" in reviews.versions()
    assert not [n for n in other.versions() if n.startswith("inbound")]


@pytest.mark.parametrize("interception", ["NONE", "REDIRECT"])
def test_mtls_config_passes_envoy_validate(world: World, interception: str, tmp_path: Path) -> None:
    config = static_bootstrap(world.ctx(), mesh_proxy(interception=interception))
    names = {c["name"] for c in config["static_resources"]["clusters"]}
    assert {"sds-grpc", "inbound|9080||", CLUSTER} <= names
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated mTLS config:\n{output}"


def test_a_workload_on_loopback_cannot_be_served_inbound_and_says_why(world: World) -> None:
    p = mesh_proxy(ip="127.0.0.1")
    assert not [n for n in world.lds(p) if n.startswith("inbound")]
    (problem,) = world.ctx().inbound_plan(p).problems
    assert "Service/default/reviews port 9080" in problem and "127.0.0.1" in problem
