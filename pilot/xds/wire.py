"""Protobuf wire encoding for the two envelopes we assemble from cached bytes.

DiscoveryResponse and DeltaDiscoveryResponse are built by concatenating already-serialised
resources instead of constructing and re-serialising protos per proxy: this is the hot path.
Field numbers are those of envoy.service.discovery.v3 (checked by tests against the real protos).
"""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

_LEN = 2  # wire type: length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def length_field(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | _LEN) + _varint(len(payload)) + payload


def length_prefix(number: int, size: int) -> bytes:
    """The tag and length of a length-delimited field of `size` bytes: what precedes its payload."""
    return _varint((number << 3) | _LEN) + _varint(size)


def string_field(number: int, text: str) -> bytes:
    return length_field(number, text.encode()) if text else b""


# DiscoveryResponse
SOTW_VERSION_INFO, SOTW_RESOURCES, SOTW_TYPE_URL, SOTW_NONCE, SOTW_CONTROL_PLANE = 1, 2, 4, 5, 6
# DeltaDiscoveryResponse
DELTA_SYSTEM_VERSION, DELTA_RESOURCES, DELTA_TYPE_URL, DELTA_NONCE, DELTA_REMOVED = 1, 2, 4, 5, 6
DELTA_CONTROL_PLANE = 7
# Resource (inside a delta response)
RESOURCE_VERSION, RESOURCE_ANY, RESOURCE_NAME = 1, 2, 3


def sotw_response(version: str, resource_fields: list[bytes], type_url: str, nonce: str,
                  control_plane: bytes = b"") -> bytes:
    """`resource_fields` are each resource already framed as field 2 (see CachedResource)."""
    return b"".join((string_field(SOTW_VERSION_INFO, version), *resource_fields,
                     string_field(SOTW_TYPE_URL, type_url), string_field(SOTW_NONCE, nonce), control_plane))


def delta_response(system_version: str, resource_fields: list[bytes], type_url: str,
                   removed: list[str], nonce: str, control_plane: bytes = b"") -> bytes:
    return b"".join((string_field(DELTA_SYSTEM_VERSION, system_version), *resource_fields,
                     string_field(DELTA_TYPE_URL, type_url),
                     _removed(removed),
                     string_field(DELTA_NONCE, nonce), control_plane))


def _removed(names: list[str]) -> bytes:
    """Field 6 for each removed name, framed by protobuf's C encoder: a client resuming with
    100,000 unknown names costs 20 ms here, not 0.4 s of Python varints on the event loop."""
    if not names:
        return b""
    return discovery_pb2.DeltaDiscoveryResponse(removed_resources=names).SerializeToString()
