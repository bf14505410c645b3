"""SotW requests are read envelope-first; the digest of their names decides whether the names
need parsing at all, so it must tell every change of names and nothing else."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2

from pilot.xds.sotw_request import SotwRequest, names_digest

EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
NAMES = [f"outbound|8080||svc-{i}.ns{i % 3}.svc.cluster.local" for i in range(50)]


def request(names, version="v1", nonce="1-1", **fields) -> SotwRequest:
    msg = discovery_pb2.DiscoveryRequest(type_url=EDS, version_info=version, response_nonce=nonce,
                                         resource_names=names, **fields)
    return SotwRequest.parse(msg.SerializeToString())


def test_envelope_fields_read_like_the_message():
    req = request(NAMES, version="2024/7", nonce="a-9")
    assert (req.type_url, req.version_info, req.response_nonce) == (EDS, "2024/7", "a-9")
    assert not req.HasField("node") and not req.HasField("error_detail")
    assert list(req.resource_names) == NAMES
    nack = request(NAMES, error_detail=status_pb2.Status(code=13, message="bad port"),
                   node=base_pb2.Node(id="sidecar~1.2.3.4~a.b~b.svc.cluster.local"))
    assert nack.HasField("error_detail") and nack.error_detail.message == "bad port"
    assert nack.HasField("node") and nack.node.id.startswith("sidecar~")


def test_digest_follows_the_names_and_nothing_else():
    base = names_digest(request(NAMES))
    assert names_digest(request(NAMES, version="v2", nonce="1-2")) == base  # an ACK of a later push
    assert names_digest(request(NAMES, version="", nonce="")) == base
    assert names_digest(request(NAMES[:-1])) != base  # one name fewer
    assert names_digest(request(NAMES + ["outbound|8080||new.ns0.svc.cluster.local"])) != base
    assert names_digest(request([*NAMES[:-1], NAMES[-1] + "x"])) != base  # one name longer
    assert names_digest(request(list(reversed(NAMES)))) != base  # order counts; sets are compared next
    assert names_digest(request([])) == names_digest(request([], version="v9", nonce="9-9"))


def test_fast_and_slow_digests_agree():
    """A node or an error makes the digest parse the names; a proxy's first request (with its
    node) and its later ACKs must still get the same digest for the same names."""
    with_node = request(NAMES, node=base_pb2.Node(id="sidecar~1.2.3.4~a.b~b.svc.cluster.local"))
    assert names_digest(with_node) == names_digest(request(NAMES, version="v3", nonce="3-3"))
    plain = discovery_pb2.DiscoveryRequest(type_url=EDS, version_info="v1", resource_names=NAMES)
    assert names_digest(plain) == names_digest(request(NAMES))  # secure xDS hands over messages
