"""The response envelopes assembled from cached bytes decode with the real discovery protos."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from pilot.xds import wire
from pilot.xds.cache import CachedResource, XdsCache, framed
from pilot.xds.generators.wds import with_aliases
from pilot.xds.typeurls import CLUSTER, ENDPOINT


def _cluster(name: str, seconds: int = 1) -> cluster_pb2.Cluster:
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS)
    c.connect_timeout.seconds = seconds
    return c


def _resources() -> list[CachedResource]:
    return [CachedResource.from_message(n, _cluster(n), CLUSTER) for n in ("a", "outbound|80||b.default.svc.cluster.local")]


def test_field_numbers_match_the_real_protos() -> None:
    resp = discovery_pb2.DiscoveryResponse.DESCRIPTOR.fields_by_name
    assert (resp["version_info"].number, resp["resources"].number, resp["type_url"].number,
            resp["nonce"].number, resp["control_plane"].number) == (
        wire.SOTW_VERSION_INFO, wire.SOTW_RESOURCES, wire.SOTW_TYPE_URL, wire.SOTW_NONCE, wire.SOTW_CONTROL_PLANE)
    delta = discovery_pb2.DeltaDiscoveryResponse.DESCRIPTOR.fields_by_name
    assert (delta["system_version_info"].number, delta["resources"].number, delta["type_url"].number,
            delta["nonce"].number, delta["removed_resources"].number, delta["control_plane"].number) == (
        wire.DELTA_SYSTEM_VERSION, wire.DELTA_RESOURCES, wire.DELTA_TYPE_URL, wire.DELTA_NONCE,
        wire.DELTA_REMOVED, wire.DELTA_CONTROL_PLANE)
    res = discovery_pb2.Resource.DESCRIPTOR.fields_by_name
    assert (res["version"].number, res["resource"].number, res["name"].number) == (
        wire.RESOURCE_VERSION, wire.RESOURCE_ANY, wire.RESOURCE_NAME)


def test_sotw_response_decodes() -> None:
    resources = _resources()
    body = wire.sotw_response("2024-01-01T00:00:00Z/7", [r.sotw_field for r in resources], CLUSTER, "nonce-1")
    msg = discovery_pb2.DiscoveryResponse.FromString(body)
    assert msg.version_info == "2024-01-01T00:00:00Z/7"
    assert msg.type_url == CLUSTER
    assert msg.nonce == "nonce-1"
    assert [a.type_url for a in msg.resources] == [CLUSTER, CLUSTER]
    decoded = []
    for a in msg.resources:
        c = cluster_pb2.Cluster()
        assert a.Unpack(c)
        decoded.append(c)
    assert [c.name for c in decoded] == ["a", "outbound|80||b.default.svc.cluster.local"]
    assert decoded[0] == _cluster("a")
    # Re-serialising the decoded envelope gives back the exact bytes: nothing is lost or reordered.
    assert msg.SerializeToString(deterministic=True) == body


def test_sotw_response_with_control_plane_and_no_resources() -> None:
    cp = discovery_pb2.DiscoveryResponse(control_plane={"identifier": "istiod-1"}).SerializeToString()
    body = wire.sotw_response("v1", [], ENDPOINT, "n2", control_plane=cp)
    msg = discovery_pb2.DiscoveryResponse.FromString(body)
    assert (msg.version_info, msg.type_url, msg.nonce, len(msg.resources)) == ("v1", ENDPOINT, "n2", 0)
    assert msg.control_plane.identifier == "istiod-1"


def test_delta_response_decodes_with_resources_and_removals() -> None:
    resources = _resources()
    body = wire.delta_response("sys-3", [r.delta_field for r in resources], CLUSTER,
                               ["gone-1", "outbound|81||c.default.svc.cluster.local"], "nonce-9")
    msg = discovery_pb2.DeltaDiscoveryResponse.FromString(body)
    assert msg.system_version_info == "sys-3"
    assert msg.type_url == CLUSTER
    assert msg.nonce == "nonce-9"
    assert list(msg.removed_resources) == ["gone-1", "outbound|81||c.default.svc.cluster.local"]
    assert [(r.name, r.version) for r in msg.resources] == [(c.name, c.version) for c in resources]
    for r, cached in zip(msg.resources, resources):
        assert r.resource.type_url == CLUSTER
        assert r.resource.SerializeToString(deterministic=True) == cached.any_bytes
        c = cluster_pb2.Cluster()
        assert r.resource.Unpack(c)
        assert c.name == r.name


def test_delta_response_with_only_removals() -> None:
    body = wire.delta_response("", [], ENDPOINT, ["x"], "n")
    msg = discovery_pb2.DeltaDiscoveryResponse.FromString(body)
    assert (list(msg.removed_resources), len(msg.resources), msg.nonce, msg.type_url) == (["x"], 0, "n", ENDPOINT)


def test_cached_resource_fields_and_version() -> None:
    c = _cluster("a")
    r = CachedResource.from_message("a", c, CLUSTER)
    a = any_pb2.Any.FromString(r.any_bytes)
    assert a.type_url == CLUSTER
    assert cluster_pb2.Cluster.FromString(a.value) == c
    assert r.message(cluster_pb2.Cluster) == c
    # The version is a content hash: equal content, equal version; different content, different version.
    assert CachedResource.from_message("a", _cluster("a"), CLUSTER).version == r.version
    assert CachedResource.from_message("a", _cluster("a", seconds=2), CLUSTER).version != r.version
    # A SotW field is exactly DiscoveryResponse.resources[0]; a delta field exactly Resource.
    one = discovery_pb2.DiscoveryResponse.FromString(r.sotw_field)
    assert one.resources[0].SerializeToString(deterministic=True) == r.any_bytes
    d = discovery_pb2.DeltaDiscoveryResponse.FromString(r.delta_field)
    assert (d.resources[0].name, d.resources[0].version) == ("a", r.version)


def test_any_bytes_are_what_protobuf_writes_for_the_any() -> None:
    """The Any around each resource is framed by hand: byte for byte protobuf's own, so versions
    (a hash of these bytes) stay the same across releases and replicas."""
    big = endpoint_pb2.ClusterLoadAssignment(cluster_name="big")
    for i in range(3000):
        big.endpoints.add().lb_endpoints.add().endpoint.address.socket_address.address = f"10.0.{i // 250}.{i % 250}"
    for msg, type_url in ((_cluster("a"), CLUSTER), (cluster_pb2.Cluster(), CLUSTER), (big, ENDPOINT)):
        want = any_pb2.Any(type_url=type_url, value=msg.SerializeToString(deterministic=True))
        assert CachedResource.from_message("x", msg, type_url).any_bytes == want.SerializeToString(deterministic=True)


def test_large_resource_length_prefix() -> None:
    """Lengths above 127 and 16383 bytes need multi-byte varints."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name="big")
    group = cla.endpoints.add()
    for i in range(2000):
        ep = group.lb_endpoints.add()
        ep.endpoint.address.socket_address.address = f"10.{i // 250}.{i % 250}.1"
        ep.endpoint.address.socket_address.port_value = 8080
    r = CachedResource.from_message("big", cla, ENDPOINT)
    assert len(r.any_bytes) > 16384
    msg = discovery_pb2.DiscoveryResponse.FromString(wire.sotw_response("v", [r.sotw_field] * 3, ENDPOINT, "n"))
    assert len(msg.resources) == 3
    out = endpoint_pb2.ClusterLoadAssignment()
    assert msg.resources[2].Unpack(out)
    assert out == cla


def test_unicode_names_are_utf8() -> None:
    r = CachedResource.from_message("名前", _cluster("名前"), CLUSTER)
    msg = discovery_pb2.DeltaDiscoveryResponse.FromString(
        wire.delta_response("v", [r.delta_field], CLUSTER, ["削除"], "n"))
    assert msg.resources[0].name == "名前" and list(msg.removed_resources) == ["削除"]


def test_responses_from_generator_output_via_cache() -> None:
    cache = XdsCache()
    res = [cache.resource(CLUSTER, n, _cluster, n) for n in ("x", "y")]
    assert res[0] is cache.resource(CLUSTER, "x", _cluster, "x")  # cross-push hit
    msg = discovery_pb2.DiscoveryResponse.FromString(wire.sotw_response("v2", [r.sotw_field for r in res], CLUSTER, "n"))
    names = []
    for a in msg.resources:
        c = cluster_pb2.Cluster()
        a.Unpack(c)
        names.append(c.name)
    assert names == ["x", "y"]


def test_delta_response_with_control_plane() -> None:
    # The control_plane argument is already framed as the envelope's own field (7 for delta).
    cp = discovery_pb2.DeltaDiscoveryResponse(control_plane={"identifier": "istiod-1"}).SerializeToString()
    body = wire.delta_response("v", [], CLUSTER, [], "n", control_plane=cp)
    assert discovery_pb2.DeltaDiscoveryResponse.FromString(body).control_plane.identifier == "istiod-1"


def test_framed_resources_decode_as_responses_and_keep_one_copy_of_each_resource() -> None:
    """A cached resource keeps its Any once and only the framing around it per protocol; a
    response's resources decode the same either way, delta aliases included."""
    resources = [CachedResource.from_message(f"c{i}", _cluster(f"c{i}", i + 1), CLUSTER) for i in range(3)]
    assert all(len(r.sotw_prefix) < 8 and len(r.delta_prefix) < 64 for r in resources)
    sotw = discovery_pb2.DiscoveryResponse.FromString(framed(resources, delta=False))
    assert [bytes(a.SerializeToString(deterministic=True)) for a in sotw.resources] == [r.any_bytes for r in resources]
    aliased = with_aliases(resources[1], ("alias-a", "alias-b"))
    delta = discovery_pb2.DeltaDiscoveryResponse.FromString(framed([resources[0], aliased], delta=True))
    assert [(r.name, r.version, list(r.aliases)) for r in delta.resources] == [
        ("c0", resources[0].version, []), ("c1", resources[1].version, ["alias-a", "alias-b"])]
    assert delta.resources[1].resource.SerializeToString(deterministic=True) == resources[1].any_bytes
