"""Gateway API automated deployment, run by the leader as istiod's deployment controller is:

- the `istio` GatewayClass (controller istio.io/gateway-controller) is created when missing;
- every Gateway of a class whose controller is ours, that is this revision's (`TagState.is_mine`:
  its `istio.io/rev` label, else its namespace's, against this revision and its tags), with no
  Hostname address, and not marked by a newer controller version, gets the objects of
  pilot/gateway_deploy/render.py, written by server-side apply (field manager
  `istio.io-gateway-controller`, as istiod), so fields others own (an HPA's replicas) stay theirs;
- an object of that name that is not labelled `gateway.istio.io/managed` is someone else's and is
  left alone (istiod's canManage);
- nothing is deleted here: the objects are owned by the Gateway (ownerReferences), and the
  garbage collector removes them with it.

Reconciled on a change of a Gateway, GatewayClass or Namespace (labels decide revision), of the
tags, of the injector's values, and every RESYNC_S (a deleted Deployment comes back).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from pilot import logging as plog
from pilot.config.gateway_api import KubernetesGateway, ListenerSet
from pilot.config.gateway_api.common import CONTROLLER_NAME, DEFAULT_CLASS
from pilot.gateway_deploy.render import (
    MANAGED_LABEL,
    Inputs,
    controller_version_allows,
    is_managed,
    name_problem,
    render,
)
from pilot.model.gateway_api.listener_sets import by_gateway, parent_of
from pilot.model.revisions import TagState
from pilot.model.store import ConfigKey, Entry, Event, Store
from pilot.sources.kube.backoff import Backoff
from pilot.sources.kube.client import ApiError, Kube
from pilot.sources.kube.leader_worker import LeaderWorker
from pilot.sources.kube.rbac import Rule

log = plog.get("gateway")

FIELD_MANAGER = "istio.io-gateway-controller"
APPLY = "application/apply-patch+yaml"
GATEWAY_CLASSES = "/apis/gateway.networking.k8s.io/v1/gatewayclasses"
RESYNC_S = 60.0
PATHS = {"ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
         "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
         "Service": "/api/v1/namespaces/{ns}/services"}
# GET each object (is it managed?), then apply it (PATCH); create the istio GatewayClass.
RBAC = (Rule("cluster", "", "serviceaccounts", frozenset({"get", "patch"})),
        Rule("cluster", "apps", "deployments", frozenset({"get", "patch"})),
        Rule("cluster", "", "services", frozenset({"get", "patch"})),
        Rule("cluster", "gateway.networking.k8s.io", "gatewayclasses", frozenset({"create"})))

ISTIO_CLASS = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
               "metadata": {"name": DEFAULT_CLASS},
               "spec": {"controllerName": CONTROLLER_NAME, "description": "The default Istio GatewayClass"}}
WATCHED = ("KubernetesGateway", "GatewayClass", "Namespace", "ListenerSet")


class DeploymentController(LeaderWorker):
    task_name = "gateway-deployment"

    def __init__(self, kube: Kube, store: Store, tags: Callable[[], TagState],
                 inputs: Callable[[], Inputs], resync_keys: frozenset[ConfigKey] = frozenset()) -> None:
        """`inputs()` gives the injector values and MeshConfig now in force; a change of one of
        `resync_keys` (their ConfigMaps) redeploys every Gateway."""
        super().__init__()
        self.kube, self.store, self.tags, self.inputs = kube, store, tags, inputs
        self.resync_keys = resync_keys
        self.applies = 0
        self._dirty: set[ConfigKey] = set()
        self._class_created = False
        store.subscribe(self._on_events)

    # --- triggers ---------------------------------------------------------------------------
    def _on_start(self) -> None:
        self._class_created = False
        self.resync()

    def resync(self) -> None:
        """Everything again (tags or injector values changed, or the periodic pass)."""
        self._dirty |= {e.key for e in self.store.list("KubernetesGateway")}
        self._wake.set()

    def _on_events(self, events: list[Event]) -> None:
        if not self.active:
            return
        if any(e.key.kind in ("GatewayClass", "Namespace", "ProxyConfig") or e.key in self.resync_keys
               for e in events):
            self.resync()
            return
        keys = {e.key for e in events if e.key.kind == "KubernetesGateway" and e.new is not None}
        # A ListenerSet's ports go on its Gateway's Service (before and after a change of parent).
        keys |= {ConfigKey("KubernetesGateway", *where) for e in events if e.key.kind == "ListenerSet"
                 for x in (e.old, e.new) if x is not None and (where := parent_of(cast(Entry[ListenerSet], x)))}
        if keys:
            self._dirty |= keys
            self._wake.set()

    # --- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=RESYNC_S)
            except TimeoutError:
                self.resync()
            self._wake.clear()
            failed = False
            if not self._class_created:
                failed |= not await self._create_class()
            dirty, self._dirty = self._dirty, set()
            for key in sorted(dirty):
                try:
                    await self._reconcile(key)
                except Exception as e:  # noqa: BLE001 - one Gateway's failure is retried, never fatal
                    log.warning("could not deploy the gateway", gateway=f"{key.namespace}/{key.name}", error=str(e))
                    self._dirty.add(key)
                    failed = True
            if failed:
                loop.call_later(backoff.next(), self._wake.set)
            else:
                backoff.reset()

    async def _create_class(self) -> bool:
        if self.store.get(ConfigKey("GatewayClass", "", DEFAULT_CLASS)) is not None:
            self._class_created = True
            return True
        try:
            await self.kube.request("POST", GATEWAY_CLASSES, body=ISTIO_CLASS)
            log.info("created the GatewayClass", name=DEFAULT_CLASS)
        except ApiError as e:
            if e.status == 404:  # no Gateway API CRDs: nothing to deploy either
                return True
            if e.status != 409:
                log.warning("could not create the GatewayClass", name=DEFAULT_CLASS, error=e.reason)
                return False
        self._class_created = True
        return True

    def _class_of(self, gw: Any) -> str | None:
        """The class name when its controller is ours (the istio class counts before it exists)."""
        name = gw.spec.gateway_class_name
        entry = self.store.get(ConfigKey("GatewayClass", "", name))
        controller = entry.obj.spec.controller_name if entry is not None else (  # type: ignore[attr-defined]
            CONTROLLER_NAME if name == DEFAULT_CLASS else None)
        return name if controller == CONTROLLER_NAME else None

    async def _reconcile(self, key: ConfigKey) -> None:
        entry = self.store.get(key)
        if entry is None:
            return  # deleted: the garbage collector removes what it owned
        gw = entry.obj
        class_name = self._class_of(gw)
        if class_name is None:
            return
        ns = self.store.get(ConfigKey("Namespace", "", key.namespace))
        if not self.tags().is_mine(gw.metadata.labels, ns.obj.metadata.labels if ns is not None else None):
            log.debug("gateway is not for this revision", gateway=f"{key.namespace}/{key.name}")
            return
        if not is_managed(gw.spec) or not controller_version_allows(gw.metadata.annotations):  # type: ignore[attr-defined]
            return
        problem = name_problem(gw, class_name)
        if problem:
            log.warning("cannot deploy the gateway", gateway=f"{key.namespace}/{key.name}", reason=problem)
            return
        labels = {e.key.name: e.obj.metadata.labels for e in self.store.list("Namespace")}
        # The ListenerSets translation merges, in its precedence order (their statuses are the
        # status writer's business, not the deployment's).
        sets = by_gateway(self.store.list(ListenerSet), {(key.namespace, key.name): cast(Entry[KubernetesGateway], entry)},
                          labels, {})
        merged = tuple(listener for s in sets.get((key.namespace, key.name), ()) for listener in s.obj.spec.listeners)
        proxy_configs = [e.obj for e in self.store.list("ProxyConfig")]
        for obj in render(gw, class_name, self.inputs(), merged, proxy_configs):
            await self._apply(obj)

    async def _apply(self, obj: dict) -> None:
        meta = obj["metadata"]
        path = PATHS[obj["kind"]].format(ns=meta["namespace"])
        try:
            current = await self.kube.request("GET", f"{path}/{meta['name']}")
        except ApiError as e:
            if e.status != 404:
                raise
            current = None
        if current is not None and MANAGED_LABEL not in ((current.get("metadata") or {}).get("labels") or {}):
            log.info("not managing an existing object", kind=obj["kind"], namespace=meta["namespace"], name=meta["name"])
            return
        if current is not None and obj["kind"] == "Deployment":
            # The selector is immutable: keep the one an earlier version wrote.
            selector = (current.get("spec") or {}).get("selector")
            if selector:
                obj["spec"]["selector"] = selector
        await self.kube.request("PATCH", f"{path}/{meta['name']}", body=obj, content_type=APPLY,
                                query={"fieldManager": FIELD_MANAGER, "force": "true"})
        self.applies += 1
