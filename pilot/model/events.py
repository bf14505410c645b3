"""Which push a batch of Store events calls for (pure: events in, PushRequest out)."""

from __future__ import annotations

from pilot.model import push_request as reasons
from pilot.model.push_request import PushRequest
from pilot.model.store import ConfigKey, Event

# The synthetic key an endpoint change carries: the service whose endpoints moved.
SERVICE_ENDPOINTS = "ServiceEndpoints"
# Every service of a namespace (a Pod's labels changed: subsets may have changed members).
NAMESPACE_ENDPOINTS = "NamespaceEndpoints"
TRAFFIC_KINDS = ("VirtualService", "DestinationRule", "ServiceEntry", "Sidecar", "Gateway",
                 "Secret",  # gateway credentials (SDS)
                 "GatewayClass", "KubernetesGateway", "HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute",
                 "ReferenceGrant")
# Inbound filters (mTLS mode, jwt_authn, RBAC) of the workloads they select.
SECURITY_KINDS = ("PeerAuthentication", "AuthorizationPolicy", "RequestAuthentication")


def push_request_for(events: list[Event], mesh_configmap: ConfigKey) -> PushRequest | None:
    """None when nothing generated can change (Pods, Namespaces other than label changes, and
    unrelated ConfigMaps are kept for the registry but feed no generator)."""
    req: PushRequest | None = None
    for ev in events:
        r = _one(ev, mesh_configmap)
        if r is not None:
            req = r if req is None else req.merge(r)
    return req


def _one(ev: Event, mesh_configmap: ConfigKey) -> PushRequest | None:
    kind = ev.key.kind
    if kind == "EndpointSlice":
        keys = {ev.key}
        for entry in (ev.old, ev.new):
            svc = entry.obj.service_name if entry else None  # type: ignore[attr-defined]
            if svc:
                keys.add(ConfigKey(SERVICE_ENDPOINTS, ev.key.namespace, svc))
        r = PushRequest(full=False, config_keys=keys)
        r.reasons[reasons.ENDPOINT_UPDATE] += 1
        return r
    if kind == "Service":
        r = PushRequest(full=True, config_keys={ev.key})
        r.reasons[reasons.SERVICE_UPDATE] += 1
        return r
    if kind in TRAFFIC_KINDS or kind in SECURITY_KINDS:
        r = PushRequest(full=True, config_keys={ev.key})
        r.reasons[reasons.CONFIG_UPDATE] += 1
        return r
    if kind == "WorkloadEntry":
        # WorkloadEntries are endpoints of the ServiceEntries that select them, in their namespace.
        r = PushRequest(full=False, config_keys={ev.key, ConfigKey(NAMESPACE_ENDPOINTS, "", ev.key.namespace)})
        r.reasons[reasons.ENDPOINT_UPDATE] += 1
        return r
    if kind == "Pod" and ev.old is not None and ev.new is not None and \
            ev.old.obj.metadata.labels != ev.new.obj.metadata.labels:
        # Subset membership follows Pod labels: refresh the namespace's endpoints.
        r = PushRequest(full=False, config_keys={ev.key, ConfigKey(NAMESPACE_ENDPOINTS, "", ev.key.namespace)})
        r.reasons[reasons.ENDPOINT_UPDATE] += 1
        return r
    if kind == "Namespace" and ev.old is not None and ev.new is not None and \
            ev.old.obj.metadata.labels != ev.new.obj.metadata.labels:
        # Gateway API listeners may admit routes by their namespace's labels.
        r = PushRequest(full=True, config_keys={ev.key})
        r.reasons[reasons.CONFIG_UPDATE] += 1
        return r
    if ev.key == mesh_configmap:
        r = PushRequest(full=True, config_keys={ev.key})
        r.reasons[reasons.MESH_UPDATE] += 1
        return r
    return None
