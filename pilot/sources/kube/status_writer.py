"""Gateway API status written to the apiserver, by the leader only (istiod's status controller).

Each new PushContext hands over the status its translation computed. The writer compares it,
object by object, with the status the informers last saw (ours and other controllers'), and
PUTs the status subresource only where it differs:
- lastTransitionTime is carried over while a condition keeps its status, so an unchanged status
  compares equal and is never written again;
- a route's `parents` entries of other controllers are kept as they are and where they are;
  ours are updated in place, and removed when the route no longer names our Gateway; a
  BackendTLSPolicy's `ancestors` likewise (ours: istio.io/gateway-controller and
  istio.io/mesh-controller);
- condition types we do not set (another controller's, on a Gateway, a listener or our own
  parent entry) are kept, as istiod's SetListenerConditions keeps them;
- the PUT carries the resourceVersion the informer saw: a conflict (someone wrote meanwhile) is
  retried once the informer has the newer object;
- with several revisions, each revision's leader writes only for the Gateways that are its own
  (`owns_gateway`: istiod's tag watcher, IsMine): their status, their ListenerSets', the route parent entries
  naming them. Another revision's entries carry the same controllerName, so they are told
  apart by the Gateway they name and kept as they are.
A status write changes only `status`, which the Gateway API models leave out of `spec_equal`: the
Store sees no change, so it never causes a push.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from pilot.config.base import K8sObject
from pilot.config.gateway_api import CONTROLLER_NAME, GROUP, ROUTE_KINDS
from pilot.config.gateway_api.common import GatewayApiObject
from pilot.config.kinds import BY_NAME
from pilot.model.gateway_api.backend_tls import MESH_CONTROLLER
from pilot.model.gateway_api.conditions import Status, merge_ancestors, merge_parents, stamp
from pilot.model.store import ConfigKey
from pilot.sources.kube.client import Kube
from pilot.sources.kube.rbac import Rule
from pilot.sources.kube.status_put import StatusPutWorker
from pilot.status.view import now_rfc3339

STATUS_KINDS = ("GatewayClass", "KubernetesGateway", "ListenerSet", *ROUTE_KINDS, "BackendTLSPolicy")
_POLICY_CONTROLLERS = frozenset({CONTROLLER_NAME, MESH_CONTROLLER})
# What _write calls: PUT on the status subresource of every kind that has a status, cluster-wide.
RBAC = tuple(Rule("cluster", BY_NAME[k].group, f"{BY_NAME[k].plural}/status", frozenset({"update"}))
             for k in STATUS_KINDS)


class StatusWriter(StatusPutWorker):
    task_name = "gateway-status-writer"

    def __init__(self, kube: Kube, lookup: Callable[[ConfigKey], K8sObject | None],
                 objects_of: Callable[[str], Iterable[K8sObject]], clock: Callable[[], str] = now_rfc3339,
                 owns_gateway: Callable[[str, str], bool] = lambda _namespace, _name: True) -> None:
        """`lookup(key)` is the informers' latest copy of an object (with its status and
        resourceVersion); `objects_of(kind)` every object of a kind they hold; `owns_gateway(ns,
        name)` whether a Gateway is this revision's to report on."""
        super().__init__(kube)
        self.owns_gateway = owns_gateway
        self.lookup = lookup
        self.objects_of = objects_of
        self.clock = clock
        self._desired: Mapping[ConfigKey, Status] = {}

    def offer(self, desired: Mapping[ConfigKey, Status]) -> None:
        """The status a new PushContext computed (a GatewayStatusView listener)."""
        self._desired = desired
        if self.active:
            self._wake.set()

    async def reconcile_all(self) -> bool:
        """One pass over everything; False when some write must be retried."""
        desired = self._desired
        ok = True
        for key, status in desired.items():
            if key.kind == "KubernetesGateway" and not self.owns_gateway(key.namespace, key.name):
                continue  # another revision's Gateway: its own leader writes it
            if key.kind == "ListenerSet" and not self._owns_listener_set(key):
                continue  # a ListenerSet of another revision's Gateway: alike
            ok &= await self._reconcile(key, status)
        for kind in ROUTE_KINDS:  # routes that stopped naming our Gateways: drop our parents
            for obj in list(self.objects_of(kind)):
                key = ConfigKey.of(obj)
                if key not in desired and isinstance(obj, GatewayApiObject) and any(
                        self._mine(p, key.namespace) for p in obj.status.get("parents") or ()):
                    ok &= await self._reconcile(key, {"parents": []})
        self._forget_except(desired)
        return ok

    async def _reconcile(self, key: ConfigKey, desired: Status) -> bool:
        obj = self.lookup(key)
        if obj is None:
            return True  # gone, or not seen yet: its next event brings another push
        assert isinstance(obj, GatewayApiObject)  # statuses are written for Gateway API objects only
        current: Status = obj.status or {}
        rv = obj.metadata.resource_version
        if key.kind in ROUTE_KINDS:
            ours = [p for p in desired.get("parents") or () if self._owns_parent(p.get("parentRef"), key.namespace)]
            desired = {**current, "parents": merge_parents(
                current.get("parents"), ours, CONTROLLER_NAME,
                keep=lambda p: not self._owns_parent(p.get("parentRef"), key.namespace))}
        elif key.kind == "BackendTLSPolicy":  # other controllers' ancestors stay as they are
            desired = {**current, "ancestors": merge_ancestors(current.get("ancestors"), desired.get("ancestors") or [],
                                                               _POLICY_CONTROLLERS)}
        new = stamp(current, desired, self.clock())
        if new == current:
            return True
        return await self._put(key, rv, new)

    def _owns_listener_set(self, key: ConfigKey) -> bool:
        obj = self.lookup(key)
        ref = getattr(getattr(obj, "spec", None), "parent_ref", None)
        return ref is None or self.owns_gateway(ref.namespace or key.namespace, ref.name)

    def _mine(self, parent: object, route_namespace: str) -> bool:
        """A route parent entry this leader wrote and still answers for."""
        return (isinstance(parent, dict) and parent.get("controllerName") == CONTROLLER_NAME
                and self._owns_parent(parent.get("parentRef"), route_namespace))

    def _owns_parent(self, ref: object, route_namespace: str) -> bool:
        """Gateway parents by their Gateway's revision; a Service (mesh) parent is every
        revision's alike (each computes it from the same route)."""
        if not isinstance(ref, dict):
            return True
        if ref.get("kind", "Gateway") != "Gateway" or ref.get("group", GROUP) != GROUP:
            return True
        return self.owns_gateway(str(ref.get("namespace") or route_namespace), str(ref.get("name", "")))
