"""Small helpers for building Envoy protos: Any packing and the shared config-source shape."""

from __future__ import annotations

from envoy.config.core.v3 import config_source_pb2
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message


def pack(msg: Message) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)
    return a


def duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def ads_config_source() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.ApiVersion.V3,
    )
