"""DeltaDiscoveryRequests counted before they are parsed.

A delta request can carry a map of initial_resource_versions; parsing a map entry costs ~10x a
repeated string (100k entries: ~0.2 s to parse and as much again to copy into a dict, on the
event loop). A hostile client that sends 270k of them in 4 MiB must be refused for the count
without paying for the map. So the bytes are first read as an envelope in which every repeated
field (names and map entries alike) is plain `repeated bytes`, cheap to count; only a request
within the bounds is parsed for real.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# DeltaDiscoveryRequest field numbers of what a request may carry many of.
_COUNTED = (("resource_names_subscribe", 3), ("resource_names_unsubscribe", 4),
            ("initial_resource_versions", 5), ("resource_locators_subscribe", 8),
            ("resource_locators_unsubscribe", 9))


def _counter_class():
    f = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="pilot/xds/delta_request_counter.proto",
                                              package="pilot.xds.internal", syntax="proto3")
    msg = file.message_type.add(name="DeltaDiscoveryRequestCounter")
    for name, number in _COUNTED:
        msg.field.add(name=name, number=number, type=f.TYPE_BYTES, label=f.LABEL_REPEATED)
    pool = descriptor_pool.Default()
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("pilot.xds.internal.DeltaDiscoveryRequestCounter"))


_Counter = _counter_class()


@dataclass(frozen=True)
class TooMany:
    """What the deserializer returns instead of a request over the bounds: the stream refuses it."""

    field: str
    count: int
    limit: int


def parser(limit: int):
    """The gRPC request deserializer for DeltaAggregatedResources with at most `limit` entries
    in any repeated field. Malformed bytes raise, as protobuf's own parser does."""

    def parse(raw: bytes) -> discovery_pb2.DeltaDiscoveryRequest | TooMany:
        counted = _Counter.FromString(raw)
        for name, _ in _COUNTED:
            n = len(getattr(counted, name))
            if n > limit:
                return TooMany(name, n, limit)
        return discovery_pb2.DeltaDiscoveryRequest.FromString(raw)

    return parse
