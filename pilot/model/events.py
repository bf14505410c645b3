"""Which push a batch of Store events calls for (pure: events in, PushRequest out).

This decides only how much of the PushContext to rebuild: nothing (a kind no index reads),
the endpoint indexes (PushContext.ENDPOINT_KINDS), or all of it. Which proxies and types a
change reaches is not decided here: pilot/model/dependencies.py matches the changed keys
against what each proxy's generated config read.
"""

from __future__ import annotations

from collections.abc import Callable

from pilot.config.core import ConfigMap, EndpointSlice, Service
from pilot.model import push_request as reasons
from pilot.model.credentials import CA_KEYS
from pilot.model.push_context import CONTEXT_KINDS, ENDPOINT_KINDS
from pilot.model.push_request import PushRequest
from pilot.model.store import ConfigKey, Event

# The synthetic key an endpoint change carries: the service whose endpoints moved.
SERVICE_ENDPOINTS = "ServiceEndpoints"


def _never(_svc: Service) -> bool:
    return False


def push_request_for(events: list[Event], mesh_configmap: ConfigKey,
                     status_matters: Callable[[Service], bool] = _never) -> PushRequest | None:
    """None when no index of the PushContext reads what changed (ConfigMaps other than the mesh's
    that hold no CA bundle, kinds kept for the registry only, a Service's status when it is no
    network gateway: `status_matters` says which are, pilot/model/networks.py)."""
    req: PushRequest | None = None
    for ev in events:
        if _status_only(ev) and not any(status_matters(e.obj) for e in (ev.old, ev.new)
                                        if e is not None and isinstance(e.obj, Service)):
            continue
        r = _one(ev, mesh_configmap)
        if r is not None:
            req = r if req is None else req.merge(r)
    return req


def _status_only(ev: Event) -> bool:
    """A Service update that changed only its status (a load balancer address). The Store keeps
    it (Ingress status and network gateways read it) but only a gateway's changes generated config."""
    if ev.op != "update" or ev.old is None or ev.new is None:
        return False
    old, new = ev.old.obj, ev.new.obj
    return isinstance(old, Service) and isinstance(new, Service) and old.status != new.status \
        and old.spec_equal(new.model_copy(update={"status": old.status}))


def _one(ev: Event, mesh_configmap: ConfigKey) -> PushRequest | None:
    kind = ev.key.kind
    if ev.key == mesh_configmap:
        r = PushRequest(full=True, config_keys={ev.key})
        r.reasons[reasons.MESH_UPDATE] += 1
        return r
    if kind not in CONTEXT_KINDS:
        return None
    if kind == "ConfigMap" and not any(
            isinstance(e.obj, ConfigMap) and any(e.obj.data.get(k) for k in CA_KEYS) for e in (ev.old, ev.new) if e):
        return None  # only a CA bundle (ca.crt, as istiod filters them) can be a BackendTLSPolicy's
    keys = {ev.key}
    if kind == "EndpointSlice":
        for entry in (ev.old, ev.new):
            svc = entry.obj.service_name if entry and isinstance(entry.obj, EndpointSlice) else None
            if svc:
                keys.add(ConfigKey(SERVICE_ENDPOINTS, ev.key.namespace, svc))
    full = kind not in ENDPOINT_KINDS
    r = PushRequest(full=full, config_keys=keys)
    r.reasons[reasons.ENDPOINT_UPDATE if not full else
              reasons.SERVICE_UPDATE if kind == "Service" else reasons.CONFIG_UPDATE] += 1
    return r
