"""Label selectors as Kubernetes and Istio use them: every selector label must be present with
the same value (an empty selector matches everything; callers that treat it as "selects
nothing" say so where they call this)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol


def selects(selector: Mapping[str, str] | Iterable[tuple[str, str]], labels: Mapping[str, str]) -> bool:
    pairs = selector.items() if isinstance(selector, Mapping) else selector
    return all(labels.get(k) == v for k, v in pairs)


GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
GATEWAY_API_GROUP = "gateway.networking.k8s.io"


class TargetRef(Protocol):
    @property
    def group(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...


def targets_gateway_of(refs: Iterable[TargetRef], policy_namespace: str, namespace: str,
                       labels: Mapping[str, str]) -> bool:
    """The targetRefs half of istiod's WorkloadPolicyMatcher.ShouldAttachPolicy for a proxy that
    is not a waypoint: a Gateway API Gateway's proxy (its `gateway-name` label) is selected by a
    policy of its own namespace naming that Gateway; nothing else is ever selected by targetRefs
    (sidecars, other namespaces' gateways, Service targets, which are for waypoints)."""
    gateway = labels.get(GATEWAY_NAME_LABEL)
    return gateway is not None and policy_namespace == namespace and any(
        r.kind == "Gateway" and r.group == GATEWAY_API_GROUP and r.name == gateway
        and r.namespace in ("", namespace) for r in refs)
