"""Which revision tags point at this control plane, as istiod's tag watcher (pkg/revisions) learns it.

Every replica watches, leader or not (the injector on each one answers for its tags):

- MutatingWebhookConfigurations labelled `istio.io/tag` (the `istio-revision-tag-TAG` objects
  `pilotctl tag set` and `istioctl tag set` write): their `istio.io/rev` says which revision the
  tag points at;
- the ValidatingWebhookConfiguration `istiod-default-validator`, whose `istio.io/rev` names the
  default revision.

Only labels are kept. The result is a `TagState` (pilot/model/revisions.py), recomputed on every
change and handed to the listeners; before the first LIST it holds the revision alone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from pilot import logging as plog
from pilot.model.revisions import DEFAULT_VALIDATOR, TAG_LABEL, TagState, tag_state
from pilot.sources.kube.backoff import Backoff
from pilot.sources.kube.client import Kube
from pilot.sources.kube.rbac import Rule

log = plog.get("tags")

MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
WATCH_TIMEOUT_S = 300
# LIST then WATCH of both, cluster-scoped (the objects are cluster-scoped).
RBAC = (Rule("cluster", "admissionregistration.k8s.io", "mutatingwebhookconfigurations",
             frozenset({"list", "watch"})),
        Rule("cluster", "admissionregistration.k8s.io", "validatingwebhookconfigurations",
             frozenset({"list", "watch"})))


class _Labels:
    """Labels of the objects of one collection that a selector picks, kept by list+watch."""

    def __init__(self, kube: Kube, path: str, query: dict[str, str], changed: Callable[[], None]) -> None:
        self.kube, self.path, self.query, self.changed = kube, path, query, changed
        self.objects: dict[str, dict[str, str]] = {}
        self.synced = asyncio.Event()

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                rv = await self._list()
                backoff.reset()
                while rv:
                    rv, events = await self._watch(rv)
                    if not events:  # an empty stream that ends at once must not spin
                        await asyncio.sleep(backoff.next())
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - apiserver errors and lost connections: retried
                log.warning("tag watch failed; retrying", path=self.path, error=str(e))
                # Start does not wait on tags it cannot read: the revision alone serves meanwhile.
                self.synced.set()
            await asyncio.sleep(backoff.next())

    async def _list(self) -> str:
        data = await self.kube.request("GET", self.path, query=self.query)
        self.objects = {(i.get("metadata") or {}).get("name", ""): dict((i.get("metadata") or {}).get("labels") or {})
                        for i in data.get("items") or []}
        self.synced.set()
        self.changed()
        return (data.get("metadata") or {}).get("resourceVersion", "")

    async def _watch(self, rv: str) -> tuple[str, int]:
        """One watch stream: the version to resume from ("" to list again), and its event count."""
        query = {**self.query, "watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(WATCH_TIMEOUT_S)}
        resp = await self.kube.open("GET", self.path, query=query, timeout=WATCH_TIMEOUT_S + 30)
        events = 0
        try:
            while line := await resp.content.readline():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return "", events
                meta = obj.get("metadata") or {}
                rv = meta.get("resourceVersion", rv)
                events += 1
                if kind == "DELETED":
                    self.objects.pop(meta.get("name", ""), None)
                elif kind in ("ADDED", "MODIFIED"):
                    self.objects[meta.get("name", "")] = dict(meta.get("labels") or {})
                else:
                    continue
                self.changed()
        finally:
            resp.release()
        return rv, events


class TagWatcher:
    def __init__(self, kube: Kube, revision: str) -> None:
        self.revision = revision
        self.state = TagState(revision)
        self.listeners: list[Callable[[TagState], None]] = []
        self._webhooks = _Labels(kube, MUTATING, {"labelSelector": TAG_LABEL}, self._changed)
        self._validator = _Labels(kube, VALIDATING, {"fieldSelector": f"metadata.name={DEFAULT_VALIDATOR}"},
                                  self._changed)
        self._tasks: list[asyncio.Task] = []

    def _changed(self) -> None:
        state = tag_state(self.revision, self._webhooks.objects.values(), self._validator.objects.get(DEFAULT_VALIDATOR))
        if state != self.state:
            log.info("revision tags changed", revision=self.revision, tags=sorted(state.tags),
                     default_revision=state.default_revision)
            self.state = state
            for listener in self.listeners:
                listener(state)

    def current(self) -> TagState:
        return self.state

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(w.run(), name=f"tag-watch-{i}")
                       for i, w in enumerate((self._webhooks, self._validator))]

    async def wait_synced(self) -> None:
        await asyncio.gather(self._webhooks.synced.wait(), self._validator.synced.wait())

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
