"""SotW DiscoveryRequests read lazily: most of them are ACKs that repeat the whole subscription.

Envoy's every SotW ACK carries all the names it subscribes to: a thousand EDS names, from each of
a thousand proxies, on every push. Parsing those names into Python strings only to find them
unchanged was a large part of a push's cost. Here a request is first read as its envelope only
(version, type URL, nonce, and whether a node or error is present); the names are parsed only
when the subscription actually changed, which a digest of their bytes tells.
"""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_NAMES_TAG = 0x1A  # field 3 (resource_names), length-delimited


def _envelope_class():
    """DiscoveryRequest with the same field numbers minus resource_names (3): parsing skips the
    names in C. node and error_detail are read as bytes, only to know they are there."""
    f = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="pilot/xds/sotw_request_envelope.proto",
                                              package="pilot.xds.internal", syntax="proto3")
    msg = file.message_type.add(name="DiscoveryRequestEnvelope")
    for name, number, type_ in (("version_info", 1, f.TYPE_STRING), ("node", 2, f.TYPE_BYTES),
                                ("type_url", 4, f.TYPE_STRING), ("response_nonce", 5, f.TYPE_STRING),
                                ("error_detail", 6, f.TYPE_BYTES)):
        field = msg.field.add(name=name, number=number, type=type_, label=f.LABEL_OPTIONAL)
        if type_ == f.TYPE_BYTES:  # proto3 `optional`, so HasField says whether it was sent
            field.proto3_optional = True
            field.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=f"_{name}")
    pool = descriptor_pool.Default()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("pilot.xds.internal.DiscoveryRequestEnvelope"))


_Envelope = _envelope_class()


class SotwRequest:
    """A DiscoveryRequest whose envelope is read eagerly and whose body (names, node, error) is
    parsed on first use. Reads like the protobuf message for the fields the server uses."""

    __slots__ = ("_envelope", "_message", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._envelope = _Envelope.FromString(raw)
        self._message: discovery_pb2.DiscoveryRequest | None = None

    @classmethod
    def parse(cls, raw: bytes) -> SotwRequest:
        """The gRPC request deserializer."""
        return cls(raw)

    @property
    def message(self) -> discovery_pb2.DiscoveryRequest:
        if self._message is None:
            self._message = discovery_pb2.DiscoveryRequest.FromString(self.raw)
        return self._message

    @property
    def type_url(self) -> str:
        return self._envelope.type_url

    @property
    def version_info(self) -> str:
        return self._envelope.version_info

    @property
    def response_nonce(self) -> str:
        return self._envelope.response_nonce

    @property
    def node(self):
        return self.message.node

    @property
    def error_detail(self):
        return self.message.error_detail

    @property
    def resource_names(self):
        return self.message.resource_names

    def HasField(self, name: str) -> bool:  # the protobuf spelling: callers take either kind
        if name in ("node", "error_detail"):
            return self._envelope.HasField(name)
        return self.message.HasField(name)

    def names_digest(self) -> int:
        """A digest of the names exactly as sent. Clients serialise fields in number order, so
        the names are the bytes between the version and the type URL: hashed there without
        parsing them. Anything else (a node, an error, another layout) takes the slow path."""
        env = self._envelope
        if not env.HasField("node") and not env.HasField("error_detail"):
            start = _Envelope(version_info=env.version_info).ByteSize()
            end = len(self.raw) - _Envelope(type_url=env.type_url, response_nonce=env.response_nonce).ByteSize()
            if start == end or (start < end and self.raw[start] == _NAMES_TAG):
                return hash(self.raw[start:end])
        return names_digest(self.message)


def names_digest(req: discovery_pb2.DiscoveryRequest | SotwRequest) -> int:
    """A 64-bit digest of a request's resource names as serialised, order and repeats included:
    equal digests mean the same names (the odds of a collision are 2^-64). For a plain message
    it clears every other field: call it once the rest has been read."""
    if isinstance(req, SotwRequest):
        return req.names_digest()
    for fd, _ in req.ListFields():
        if fd.name != "resource_names":
            req.ClearField(fd.name)
    req.DiscardUnknownFields()
    return hash(req.SerializeToString())
