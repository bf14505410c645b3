"""Which pushes ztunnel's config needs beyond the ones sidecars already get (pure).

A Pod's IP, readiness, node or labels, a Namespace's labels (dataplane mode, waypoint) and a Node's
locality change Workloads only: they become endpoint-class pushes (the context's pods and ambient
inputs are refreshed, nothing else is rebuilt) that reach ztunnels alone, since no sidecar
generator reads those keys. Waypoint Gateways change who is pointed where: full pushes.
"""

from __future__ import annotations

from pilot.model import push_request as reasons
from pilot.model.push_request import PushRequest
from pilot.model.store import Event

WORKLOAD_KINDS = ("Pod", "Namespace", "Node")
WAYPOINT_KINDS = ("KubernetesGateway", "GatewayClass")


def ambient_push_request(events: list[Event]) -> PushRequest | None:
    keys = {ev.key for ev in events if ev.key.kind in WORKLOAD_KINDS}
    full_keys = {ev.key for ev in events if ev.key.kind in WAYPOINT_KINDS}
    req = None
    if keys:
        req = PushRequest(full=False, config_keys=keys)
        req.reasons[reasons.ENDPOINT_UPDATE] += len(keys)
    if full_keys:
        full = PushRequest(full=True, config_keys=full_keys)
        full.reasons[reasons.CONFIG_UPDATE] += len(full_keys)
        req = full if req is None else req.merge(full)
    return req
