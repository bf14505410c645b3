"""The resource cache stays within PILOT_XDS_CACHE_SIZE and keeps what is in use: a resource
looked up again and again is never rebuilt, however many others come and go."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2

from pilot.xds.cache import XdsCache
from pilot.xds.typeurls import CLUSTER


def cluster(name: str) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(name=name)


def test_cache_is_bounded_and_keeps_resources_in_use():
    cache = XdsCache(max_size=100)
    hot = cache.resource(CLUSTER, "hot", cluster, "hot")
    for i in range(1000):
        cache.resource(CLUSTER, f"c{i}", cluster, f"c{i}")
        assert cache.resource(CLUSTER, "hot", cluster, "hot") is hot  # in use: never rebuilt
        assert len(cache) <= 100
    stats = cache.stats()
    assert stats["builds_by_type"][CLUSTER] == 1001
    assert stats["misses"] == 1001 and stats["hits"] == 1000
    assert stats["evictions"] >= 1000 - 100
    # Something not used for a long time was evicted: asking again builds it again.
    cache.resource(CLUSTER, "c0", cluster, "c0")
    assert cache.stats()["misses"] == 1002


def test_cached_resource_is_shared_until_an_input_changes():
    cache = XdsCache(max_size=10)
    a = cache.resource(CLUSTER, "a", cluster, "a")
    assert cache.resource(CLUSTER, "a", cluster, "a") is a
    b = cache.resource(CLUSTER, "a", cluster, "a-renamed")
    assert b is not a and b.version != a.version
