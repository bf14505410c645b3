"""Istio-style node identities shared by the Envoy and proxyless-gRPC helpers."""

from __future__ import annotations


def sidecar_node_id(
    pod: str, namespace: str = "default", ip: str = "127.0.0.1", kind: str = "sidecar"
) -> str:
    """``sidecar~IP~POD.NAMESPACE~NAMESPACE.svc.cluster.local``, the form istio-agent sends."""
    return f"{kind}~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local"


def namespace_from_node_id(node_id: str) -> str:
    """The namespace embedded in an Istio node id, or "default" if it has none."""
    parts = node_id.split("~")
    if len(parts) >= 3 and "." in parts[2]:
        return parts[2].split(".", 1)[1]
    if len(parts) >= 4 and parts[3]:
        return parts[3].split(".", 1)[0]
    return "default"
