"""One generic list+watch informer for any kind in the registry.

LIST with a resourceVersion, then WATCH from it with bookmarks; restart the watch from the last
version when the server ends the stream (timeoutSeconds); re-LIST on 410 Expired and hand the
Store the full state, which keeps only real differences, so a relist never causes a push when
nothing changed. Errors, and streams that end without a single event, back off with jitter.
A kind whose API is missing (a CRD not installed: 404) is retried until it appears.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from pilot import logging as plog
from pilot.config.base import K8sObject
from pilot.config.kinds import Kind
from pilot.config.validation import InvalidObject, Rejection, parse_object
from pilot.model.store import ConfigKey, Store
from pilot.sources.kube.backoff import Backoff
from pilot.sources.kube.client import ApiError, Kube

log = plog.get("kube")

WATCH_TIMEOUT_S = 300  # server-side; the stream then ends and is resumed from the last version
QUICK_END_S = 1.0  # a watch that ends this fast with no events is treated as an error (backoff)


class Expired(Exception):
    """The resourceVersion is too old (410 Gone): only a fresh LIST can continue."""


class Informer:
    def __init__(self, kube: Kube, kind: Kind, store: Store,
                 accept: Callable[[K8sObject], bool] = lambda _o: True,
                 field_selector: str | None = None, watch_timeout: int = WATCH_TIMEOUT_S) -> None:
        self.kube = kube
        self.kind = kind
        self.store = store
        self.accept = accept
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.owner = f"kube:{kind.kind}/"
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.lists = 0
        self.watches = 0
        self.missing_api = False
        # Everything the apiserver holds for this kind (even objects `accept` filters out), so a
        # change of the filter (discovery selectors) re-applies without a round trip.
        self.objects: dict[ConfigKey, K8sObject] = {}
        self._rejections: dict[ConfigKey, Rejection] = {}
        # Told of every object seen, even a change the Store ignores (a status-only update).
        self.on_object: list[Callable[[K8sObject], None]] = []

    # --- the loop -----------------------------------------------------------------------------
    async def run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self._list()
                backoff.reset()
                while True:
                    started = time.monotonic()
                    events = await self._watch()
                    if events == 0 and time.monotonic() - started < QUICK_END_S:
                        # An empty stream that ends at once (an apiserver answering 500 with no
                        # body looks like this) must not become a hot loop.
                        await asyncio.sleep(backoff.next())
                    elif events:
                        backoff.reset()
            except asyncio.CancelledError:
                raise
            except Expired:
                log.info("watch expired; listing again", kind=self.kind.kind, resource_version=self.resource_version)
                continue
            except ApiError as e:
                if e.status == 404:
                    if not self.missing_api:
                        log.warning("API not served (CRD not installed?); retrying", kind=self.kind.kind,
                                    path=self.kind.path())
                    self.missing_api = True
                    self.synced.set()  # nothing to wait for: an absent API has no objects
                else:
                    log.warning("list/watch failed", kind=self.kind.kind, status=e.status, reason=e.reason)
                await asyncio.sleep(backoff.next())
            except Exception as e:  # noqa: BLE001 - connection refused, reset, timeouts, bad JSON
                log.warning("list/watch failed", kind=self.kind.kind, error=f"{type(e).__name__}: {e}")
                await asyncio.sleep(backoff.next())

    def _query(self) -> dict:
        q: dict = {}
        if self.field_selector:
            q["fieldSelector"] = self.field_selector
        return q

    async def _list(self) -> None:
        data = await self.kube.request("GET", self.kind.path(), query={**self._query(), "resourceVersion": ""})
        self.lists += 1
        self.missing_api = False
        objects: dict[ConfigKey, K8sObject] = {}
        self._rejections = {}
        for item in data.get("items") or []:
            obj = self._parse(item)
            if obj is not None:
                objects[ConfigKey.of(obj)] = obj
        self.objects = objects
        self.resource_version = (data.get("metadata") or {}).get("resourceVersion", "")
        self._publish_rejections()
        self.resync()
        self.synced.set()

    def resync(self) -> None:
        """Hand the Store the full current state (after a LIST, or when `accept` changed)."""
        self.store.sync(self.owner, [(o, self._source(k)) for k, o in self.objects.items() if self.accept(o)])

    async def _watch(self) -> int:
        query = {**self._query(), "watch": "true", "resourceVersion": self.resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(self.watch_timeout)}
        resp = await self.kube.open("GET", self.kind.path(), query=query, timeout=self.watch_timeout + 30)
        self.watches += 1
        events = 0
        try:
            while True:
                line = await resp.content.readline()
                if not line:
                    return events
                line = line.strip()
                if not line:
                    continue
                events += 1
                self._event(json.loads(line))
        finally:
            resp.release()

    # --- events ---------------------------------------------------------------------------------
    def _event(self, ev: dict) -> None:
        etype = ev.get("type")
        obj = ev.get("object") or {}
        if etype == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Expired(obj.get("message", ""))
            raise ApiError(int(code or 500), f"{obj.get('reason', '')}: {obj.get('message', '')}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if etype == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        if etype in ("ADDED", "MODIFIED"):
            parsed = self._parse(obj)
            if parsed is not None:
                key = ConfigKey.of(parsed)
                self.objects[key] = parsed
                for hook in self.on_object:
                    hook(parsed)
                if self.accept(parsed):
                    self.store.apply(parsed, self._source(key))
                else:
                    self.store.delete(key)
            self._publish_rejections()
        elif etype == "DELETED":
            meta = obj.get("metadata") or {}
            key = ConfigKey(self.kind.config_kind, meta.get("namespace", "") if self.kind.namespaced else "", meta.get("name", ""))
            self.objects.pop(key, None)
            if self._rejections.pop(key, None) is not None:
                self._publish_rejections()
            self.store.delete(key)
        if rv:
            self.resource_version = rv

    def _parse(self, item: dict) -> K8sObject | None:
        # LIST items carry no apiVersion/kind; the collection does.
        item = {**item, "apiVersion": item.get("apiVersion") or self.kind.api_version,
                "kind": item.get("kind") or self.kind.kind}
        meta = item.get("metadata") or {}
        key = ConfigKey(self.kind.config_kind, meta.get("namespace", "") if self.kind.namespaced else "", meta.get("name", ""))
        try:
            obj = parse_object(item, default_namespace="default")
        except InvalidObject as e:
            source = f"kube {self.kind.path(key.namespace, key.name)}"
            kind = e.kind or self.kind.config_kind
            self._rejections[key] = Rejection(source, kind, key.namespace, key.name, e.reason)
            # One line per refusal, as the file source writes it: where, what, and why (the reason
            # names the field path).
            log.warning("object rejected", source=source, kind=self.kind.kind, namespace=key.namespace,
                        name=key.name, reason=e.reason)
            return None
        self._rejections.pop(key, None)
        return obj

    def _publish_rejections(self) -> None:
        self.store.set_rejections(self.owner, list(self._rejections.values()))

    def _source(self, key: ConfigKey) -> str:
        return f"{self.owner}{key.namespace}/{key.name}"
