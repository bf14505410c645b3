"""`metadata.filter_metadata.istio` on clusters and routes, in istiod's shape.

istioctl proxy-config (DESTINATION RULE / VIRTUAL SERVICE columns), `istioctl x describe` and
telemetry read these keys, so their names and value shapes follow istiod's
pilot/pkg/networking/util (BuildConfigInfoMetadata, AddSubsetToMetadata, AddALPNOverrideToMetadata)
and the cluster builder's `services` list:

    istio:
      services: [{host: FQDN, name: SHORT, namespace: NS}]   # clusters
      config: /apis/GROUP/VERSION/namespaces/NS/KEBAB-KIND/NAME # the DestinationRule / VirtualService
      subset: NAME                                           # subset clusters
      alpn_override: "false"                                 # DR tls mode SIMPLE or MUTUAL
"""

from __future__ import annotations

import re
from typing import Any

from envoy.config.core.v3 import base_pb2

ISTIO = "istio"

# Group/version of each kind a `config` path can name (the served storage versions istiod uses).
_GROUP_VERSION = {
    "DestinationRule": "networking.istio.io/v1",
    "VirtualService": "networking.istio.io/v1",
    "Gateway": "networking.istio.io/v1",
    "HTTPRoute": "gateway.networking.k8s.io/v1",
    "GRPCRoute": "gateway.networking.k8s.io/v1",
    "TLSRoute": "gateway.networking.k8s.io/v1",
    "TCPRoute": "gateway.networking.k8s.io/v1",
}


def kebab(kind: str) -> str:
    """istiod's gvk.KebabKind: `DestinationRule` -> `destination-rule`, `HTTPRoute` -> `http-route`
    (a run of capitals is one word)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", kind).lower()


def config_path(kind: str, namespace: str, name: str) -> str:
    """The `config` value naming one object, as istiod's AddConfigInfoMetadata writes it."""
    gv = _GROUP_VERSION.get(kind, "networking.istio.io/v1")
    return f"/apis/{gv}/namespaces/{namespace}/{kebab(kind)}/{name}"


def origin_path(origin: str) -> str:
    """`Kind/namespace/name` (how debug views name config objects) -> its `config` path."""
    kind, _, rest = origin.partition("/")
    namespace, _, name = rest.partition("/")
    return config_path(kind, namespace, name)


# Fields are set one by one rather than with Struct.update(dict): ~2.5x faster on upb, and
# every cluster of a cold push goes through here.
def set_config(md: base_pb2.Metadata, path: str) -> None:
    md.filter_metadata[ISTIO].fields["config"].string_value = path


def route_metadata(path: str) -> base_pb2.Metadata:
    md = base_pb2.Metadata()
    set_config(md, path)
    return md


def set_services(md: base_pb2.Metadata, services) -> Any:
    """`istio.services`: [{host, name, namespace}] of (host, name, namespace) tuples."""
    fields = md.filter_metadata[ISTIO].fields
    values = fields["services"].list_value.values
    for host, name, namespace in services:
        svc = values.add().struct_value.fields
        svc["host"].string_value = host
        svc["name"].string_value = name
        svc["namespace"].string_value = namespace
    return fields


def set_cluster_metadata(md: base_pb2.Metadata, host: str, name: str, namespace: str,
                         destination_rule: str = "", subset: str = "", tls_mode: str | None = None) -> None:
    """The outbound cluster's `istio` metadata. `destination_rule` is the rule's `config` path
    ("" for none); `subset` is written only with a rule, as istiod does."""
    fields = set_services(md, ((host, name, namespace),))
    if destination_rule:
        fields["config"].string_value = destination_rule
        if subset:
            fields["subset"].string_value = subset
        if tls_mode in ("SIMPLE", "MUTUAL"):
            fields["alpn_override"].string_value = "false"
