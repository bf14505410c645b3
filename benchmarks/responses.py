"""What a simulated proxy must learn from an xDS response, found cheaply enough for one process
to play a thousand proxies.

A proxy needs the names of the resources it received, and the names they reference downstream:
the EDS service name of every EDS cluster (to subscribe to endpoints) and the route config name
of every HTTP listener (to subscribe to routes). Parsing a thousand Clusters per proxy per push
would make the load generator, not the server, the bottleneck. But a control plane that shares
bytes sends every proxy the same resource bytes, so the resources region of a response (the
bytes between the version and the trailing type_url/nonce) is fingerprinted with a C-speed CRC
and its contents parsed once per distinct region, then shared by every proxy that receives it.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
SHORT = {CDS: "cds", EDS: "eds", LDS: "lds", RDS: "rds"}
TYPE_URL = {v: k for k, v in SHORT.items()}
_HCM_TYPE = "type.googleapis.com/" + hcm_pb2.HttpConnectionManager.DESCRIPTOR.full_name

_FIELD_VERSION, _FIELD_RESOURCES = 1, 2  # the same numbers in both envelopes
_RESOURCES_TAG = (_FIELD_RESOURCES << 3) | 2
_CACHE_SIZE = 1024


class Contents:
    """The resources of one response, shared by every proxy that received the same bytes."""

    __slots__ = ("_all_refs", "_name_set", "names", "refs")

    def __init__(self, names: tuple[str, ...], refs: tuple[frozenset[str], ...]) -> None:
        self.names = names
        self.refs = refs  # per resource: the EDS names (CDS) or route names (LDS) it references
        self._name_set: frozenset[str] | None = None
        self._all_refs: frozenset[str] | None = None

    @property
    def name_set(self) -> frozenset[str]:
        if self._name_set is None:
            self._name_set = frozenset(self.names)
        return self._name_set

    @property
    def all_refs(self) -> frozenset[str]:
        if self._all_refs is None:
            self._all_refs = frozenset().union(*self.refs)
        return self._all_refs


EMPTY = Contents((), ())
_cache: OrderedDict[tuple, Contents] = OrderedDict()
stats = {"parsed": 0, "shared": 0, "unfingerprinted": 0}


def _refs(type_url: str, value: bytes) -> tuple[str, frozenset[str]]:
    """Name of one serialised resource and what it makes an Envoy subscribe to next."""
    if type_url == CDS:
        c = cluster_pb2.Cluster.FromString(value)
        if c.WhichOneof("cluster_discovery_type") == "type" and c.type == cluster_pb2.Cluster.EDS:
            return c.name, frozenset((c.eds_cluster_config.service_name or c.name,))
        return c.name, frozenset()
    if type_url == LDS:
        listener = listener_pb2.Listener.FromString(value)
        chains = list(listener.filter_chains)
        if listener.HasField("default_filter_chain"):
            chains.append(listener.default_filter_chain)
        routes = set()
        for chain in chains:
            for f in chain.filters:
                if f.typed_config.type_url == _HCM_TYPE:
                    hcm = hcm_pb2.HttpConnectionManager.FromString(f.typed_config.value)
                    if hcm.HasField("rds"):
                        routes.add(hcm.rds.route_config_name)
        return listener.name, frozenset(routes)
    if type_url == EDS:
        return endpoint_pb2.ClusterLoadAssignment.FromString(value).cluster_name, frozenset()
    if type_url == RDS:
        return route_pb2.RouteConfiguration.FromString(value).name, frozenset()
    return "", frozenset()


def _parse(resp, delta: bool) -> Contents:
    names, refs = [], []
    for r in resp.resources:
        a: any_pb2.Any = r.resource if delta else r
        name, ref = _refs(a.type_url or resp.type_url, a.value)
        names.append(r.name if delta and r.name else name)
        refs.append(ref)
    return Contents(tuple(names), tuple(refs))


def _region_key(resp, raw: bytes, delta: bool) -> tuple | None:
    """(type, length, CRC) of the bytes holding exactly the resources, or None if this response is
    not laid out as version, resources..., everything else (then it is parsed the slow way)."""
    tail = type(resp)()
    for fd, value in resp.ListFields():
        if fd.number in (_FIELD_VERSION, _FIELD_RESOURCES):
            continue
        if fd.is_repeated:
            getattr(tail, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(tail, fd.name).CopyFrom(value)
        else:
            setattr(tail, fd.name, value)
    head = type(resp)()
    version_field = "system_version_info" if delta else "version_info"
    setattr(head, version_field, getattr(resp, version_field))
    start, end = head.ByteSize(), len(raw) - tail.ByteSize()
    if end <= start or raw[start] != _RESOURCES_TAG or (start and raw[0] != (_FIELD_VERSION << 3) | 2):
        return None
    if type(resp).FromString(raw[end:]) != tail:
        return None
    region = memoryview(raw)[start:end]
    return resp.type_url, delta, end - start, zlib.crc32(region)


def contents(resp, raw: bytes, delta: bool) -> Contents:
    """`resp` is the parsed envelope of `raw` (a DiscoveryResponse or DeltaDiscoveryResponse)."""
    if not resp.resources:
        return EMPTY
    key = _region_key(resp, raw, delta)
    if key is None:
        stats["unfingerprinted"] += 1
        return _parse(resp, delta)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        stats["shared"] += 1
        return hit
    stats["parsed"] += 1
    found = _cache[key] = _parse(resp, delta)
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return found


def parse_envelope(raw: bytes, delta: bool):
    """Only the envelope is decoded here: resource payloads stay as (aliased) bytes."""
    cls = discovery_pb2.DeltaDiscoveryResponse if delta else discovery_pb2.DiscoveryResponse
    return cls.FromString(raw)
