"""The effective ProxyConfig of a workload, as istiod's EffectiveProxyConfig
(pilot/pkg/model/proxy_config.go) computes it for the injector.

Layers, lowest first: MeshConfig `defaultConfig`; the ProxyConfig without a selector in the root
namespace (mesh-wide); the one without a selector in the workload's namespace; the pod's
`proxy.istio.io/config` annotation; the ProxyConfig in the workload's namespace whose selector
matches its labels. Of several candidates for one layer the oldest wins (creation time, then
namespace/name), as istiod sorts them, so adding a second one never silently changes a workload.

Layers merge as protobuf's Merge does for these messages: maps merge by key (a namespace's
environmentVariables add to the mesh's proxyMetadata), nested messages merge field by field,
anything else set in a higher layer replaces the lower value. Pure: dicts and models in, dict out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pilot.config.networking.proxy_config import ProxyConfig


def _age(pc: ProxyConfig) -> tuple[str, str, str]:
    # RFC 3339 timestamps of one apiserver sort as strings; objects from files have none (""),
    # which sorts first, then by name as istiod's sortConfigByCreationTime does.
    return (pc.metadata.creation_timestamp, pc.metadata.namespace, pc.metadata.name)


def as_layer(pc: ProxyConfig) -> dict[str, Any]:
    """The CR's fields under MeshConfig ProxyConfig names (istiod's toMeshConfigProxyConfig):
    environmentVariables become proxyMetadata, the agent's and the injector's source of the
    istio-proxy container's environment."""
    out: dict[str, Any] = {}
    spec = pc.spec
    if spec.concurrency is not None:
        out["concurrency"] = spec.concurrency
    if spec.environment_variables:
        out["proxyMetadata"] = dict(spec.environment_variables)
    if spec.image is not None and spec.image.image_type:
        out["image"] = {"imageType": spec.image.image_type}
    return out


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def _namespace_layer(configs: list[ProxyConfig], namespace: str) -> ProxyConfig | None:
    return next((pc for pc in configs if pc.metadata.namespace == namespace and pc.spec.selector is None), None)


def _workload_layer(configs: list[ProxyConfig], namespace: str, labels: Mapping[str, str]) -> ProxyConfig | None:
    for pc in configs:
        sel = pc.spec.selector
        if pc.metadata.namespace != namespace or sel is None or not sel.match_labels:
            continue  # istiod: a selector with no labels selects nothing (nor is it namespace-wide)
        if all(labels.get(k) == v for k, v in sel.match_labels.items()):
            return pc
    return None


def effective(
    default_config: Mapping[str, Any],
    configs: Iterable[ProxyConfig],
    *,
    root_namespace: str,
    namespace: str,
    labels: Mapping[str, str],
    annotation: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The merged ProxyConfig (MeshConfig ProxyConfig field names, camelCase)."""
    ordered = sorted(configs, key=_age)
    out = merge({}, default_config)
    if root_namespace and (root := _namespace_layer(ordered, root_namespace)) is not None:
        out = merge(out, as_layer(root))
    if namespace != root_namespace and (ns := _namespace_layer(ordered, namespace)) is not None:
        out = merge(out, as_layer(ns))
    if annotation:
        out = merge(out, annotation)
    if (wl := _workload_layer(ordered, namespace, labels)) is not None:
        out = merge(out, as_layer(wl))
    return out

