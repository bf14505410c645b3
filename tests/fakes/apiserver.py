"""A faithful fake Kubernetes apiserver speaking the real HTTP/JSON protocol.

Built on aiohttp.web and meant for tests that drive the *real* kubernetes-asyncio
client (CoreV1Api, CustomObjectsApi, ``kubernetes_asyncio.watch.Watch``, ...)
against something that behaves like kube-apiserver where it matters for
informers and leader election:

* Objects are stored generically per (group, plural) and served under every
  registered version of that resource, with one global, monotonically increasing
  ``resourceVersion`` (a decimal string, as with etcd).
* LIST returns the collection ``metadata.resourceVersion``; items carry their
  own ``resourceVersion``/``uid``/``creationTimestamp``. Label selectors (``=``,
  ``==``, ``!=``, ``in``, ``notin``, ``k``, ``!k``) and field selectors
  (``metadata.name``, ``metadata.namespace`` or any dotted path, ``=``/``!=``)
  are honoured, as are ``limit``/``continue``.
* WATCH is a chunked stream of compact ``{"type","object"}`` JSON lines. RV
  ``""``/``"0"`` starts with synthetic ADDED events for the current state; RV N
  replays the retained history after N; an RV older than the retained window
  gets an ``ERROR`` event carrying a ``Status`` with ``reason: Expired, code:
  410`` and the stream ends. ``allowWatchBookmarks`` gives periodic and on-demand
  BOOKMARK events; ``timeoutSeconds`` ends the stream cleanly. As in the watch
  cache, a MODIFIED object that stops/starts matching the selector is delivered
  as DELETED/ADDED.
* Writes: POST (409 AlreadyExists), PUT (409 Conflict on a stale
  ``metadata.resourceVersion``; no-op updates do not bump the RV), PATCH (merge,
  strategic-merge treated as merge, JSON patch, apply treated as upsert+merge),
  DELETE (finalizers honoured through ``deletionTimestamp``; dependents whose owners are all
  gone are deleted at once, as the garbage collector's background propagation), DELETE collection,
  and the ``/status`` subresource. Every effective write bumps the RV and emits
  a watch event.
* Discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/G``, ``/apis/G/V``),
  ``/version``, ``/healthz``, TokenReview via a hook, and CRDs: registering a
  CRD (``register_crd`` or creating an apiextensions.k8s.io/v1
  CustomResourceDefinition object) serves its group/version; an unknown
  resource answers 404 with a ``Status`` (reason NotFound), which is what "CRD
  not installed" looks like.
* Validating admission webhooks (``admission``): CREATE/UPDATE of a resource that a stored
  ValidatingWebhookConfiguration matches is sent to the webhook over verified HTTPS
  (``webhook_services`` resolves a service reference) and refused as the apiserver refuses it.
* Fault injection: ``drop_watches()``, ``expire_history()``, ``fail_next()``,
  ``fail_when()``, ``hang_when()``, ``go_away()``/``come_back()`` (same port),
  and a request log with counters.

The store helpers (``create``/``update``/``patch``/``delete``/``get``/``list``)
are synchronous and must be called from the event loop thread (or before
``start``); writes behave like the HTTP verbs (RV bump, watch events).

The implementation is split across ``tests/fakes``: ``common`` (JSON, Status, errors),
``resources`` (resource types, registry, discovery), ``objects`` (the store, history and write
verbs), ``selectors``, ``patches``, ``watches`` (watch streams, bookmarks), ``faults`` (fault
injection, request log) and ``routing``; this module assembles ``FakeApiServer`` and serves HTTP.
Every public name is re-exported here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any, Self

from aiohttp import web

# Every public name of this module from before its split is importable from here; the ones
# only re-exported are marked `noqa: F401`.
from .admission import Admission
from .common import JSON, FakeApiError, _dumps, make_status, parse_bool
from .faults import Fault, FaultInjection, RequestInfo, RequestLog, RequestRecord
from .objects import ObjectStore, _Event
from .patches import json_patch, merge_patch  # noqa: F401
from .resources import (
    _BUILTINS,
    DEFAULT_VERBS,  # noqa: F401
    ResourceRegistry,
    ResourceType,
    _present,
    _Store,
    _unknown_resource,
)
from .routing import Router, _Route
from .selectors import parse_field_selector, parse_label_selector  # noqa: F401
from .watches import (
    _ABORT,
    INITIAL_EVENTS_END_ANNOTATION,  # noqa: F401
    WatchHub,
    _Watcher,
)

__all__ = [
    "FakeApiError",
    "FakeApiServer",
    "Fault",
    "RequestInfo",
    "RequestRecord",
    "ResourceType",
    "make_status",
    "parse_bool",
]


_SEED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


# ---------------------------------------------------------------------- server


class FakeApiServer(ResourceRegistry, ObjectStore, WatchHub, Router, FaultInjection, RequestLog, Admission):
    """A fake kube-apiserver on 127.0.0.1 (plain HTTP).

    ``history_limit``: watch events retained for resumption (older RVs get 410).
    ``bookmark_interval``: seconds between periodic BOOKMARKs on watches that
    allow them (None disables periodic bookmarks; ``send_bookmarks()`` still works).
    ``default_watch_timeout``: server-side watch timeout when the client gives
    no ``timeoutSeconds`` (None: never).
    ``require_namespaces``: reject namespaced creates into a missing namespace (404).
    ``seed_namespaces``: pre-create default, kube-system, kube-public, kube-node-lease.
    """

    def _token_request(self, namespace: str, name: str, body: JSON) -> JSON:
        """authentication.k8s.io/v1 TokenRequest for an existing ServiceAccount (404 otherwise)."""
        rtype = self._types[("", "v1", "serviceaccounts")]
        self._get(rtype, namespace, name)
        spec = dict(body.get("spec") or {})
        spec.setdefault("expirationSeconds", 3600)
        token = (self.token_issuer(namespace, name, spec) if self.token_issuer is not None
                 else f"fake-token:{namespace}:{name}:{','.join(spec.get('audiences') or [])}")
        return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec,
                "status": {"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"}}

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        history_limit: int = 10_000,
        bookmark_interval: float | None = 60.0,
        default_watch_timeout: float | None = None,
        require_namespaces: bool = False,
        seed_namespaces: bool = True,
    ) -> None:
        self.host = host
        self._port = port
        self.history_limit = history_limit
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self.require_namespaces = require_namespaces
        self.token_reviewer: Callable[[str, list[str]], JSON | Awaitable[JSON]] | None = None
        # SubjectAccessReview: spec -> allowed. None answers "not allowed", as a cluster whose
        # RBAC grants the subject nothing.
        self.access_reviewer: Callable[[JSON], bool] | None = None
        # TokenRequest (POST serviceaccounts/NAME/token): (namespace, name, spec) -> token. None
        # issues an opaque "fake-token:NS:NAME:AUDIENCES".
        self.token_issuer: Callable[[str, str, JSON], str] | None = None
        # Validating webhooks (admission.py): where a clientConfig.service is served.
        self.webhook_services: dict[tuple[str, str, int], Any] = {}
        self.admission_calls: list[tuple[str, str, str]] = []

        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._stores: dict[tuple[str, str], _Store] = {}
        self._rv = 0
        self._compacted_rv = 0  # a watch may start from any RV >= this
        self._history: deque[_Event] = deque()
        self._watchers: set[_Watcher] = set()
        self._changed: asyncio.Event | None = None  # created lazily, inside the loop
        self._faults: list[Fault] = []
        self.request_log: list[RequestInfo] = []
        self.counters: Counter[str] = Counter()
        self._next_cluster_ip = 10

        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._away = False

        for rtype in _BUILTINS:
            self._register_type(rtype)
        if seed_namespaces:
            for ns in _SEED_NAMESPACES:
                self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> Self:
        app = web.Application(client_max_size=16 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        await self._listen()
        return self

    async def stop(self) -> None:
        if self._runner is None:
            return
        self.clear_faults()
        await self._close_listener()
        self._end_watches(_ABORT)
        self._abort_connections()
        await self._runner.cleanup()
        self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    async def go_away(self) -> None:
        """Stop listening and cut every open connection (watches included)."""
        self._away = True
        await self._close_listener()
        self._end_watches(_ABORT)
        self._abort_connections()

    async def come_back(self) -> None:
        """Listen again on the same port."""
        if self._listener is None:
            await self._listen()
        self._away = False

    async def _listen(self) -> None:
        assert self._runner is not None and self._runner.server is not None
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self._runner.server, self.host, self._port,
                                                  reuse_address=True)
        self._port = self._listener.sockets[0].getsockname()[1]

    async def _close_listener(self) -> None:
        if self._listener is not None:
            listener, self._listener = self._listener, None
            listener.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.wait_closed(), 2.0)

    def _abort_connections(self) -> None:
        server = self._runner.server if self._runner else None
        if server is None:
            return
        for transport in list(server._connections.values()):
            if transport is not None:
                transport.abort()

    # ------------------------------------------------------ client helpers

    def client_configuration(self):
        """A kubernetes_asyncio Configuration pointing at this fake (no auth)."""
        from kubernetes_asyncio.client import Configuration

        cfg = Configuration(host=self.url)
        cfg.verify_ssl = False
        return cfg

    def api_client(self):
        """A new ``kubernetes_asyncio.client.ApiClient`` (use ``async with``)."""
        from kubernetes_asyncio.client import ApiClient

        return ApiClient(self.client_configuration())

    def kubeconfig(self, namespace: str = "default", context: str = "fake-apiserver",
                   token: str | None = None) -> JSON:
        """A kubeconfig dict for this fake (no credentials unless ``token``; the fake ignores auth)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": token} if token else {}}],
            "contexts": [{"name": context,
                          "context": {"cluster": context, "user": context, "namespace": namespace}}],
            "current-context": context,
            "preferences": {},
        }

    def write_kubeconfig(self, path, namespace: str = "default", context: str = "fake-apiserver",
                         token: str | None = None) -> str:
        """Write a kubeconfig (JSON is valid YAML) pointing at this fake; returns the path."""
        with open(path, "w") as f:
            json.dump(self.kubeconfig(namespace, context, token), f, indent=2)
        return str(path)

    # ------------------------------------------------------------ HTTP layer

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        query = {k: v for k, v in request.query.items()}
        info = RequestInfo(request.method, request.path, query, time.monotonic(),
                           user_agent=request.headers.get("User-Agent", ""))
        self.request_log.append(info)
        try:
            route = self._route(request.path)
        except FakeApiError as exc:
            route = None
            route_error: FakeApiError | None = exc
        else:
            route_error = None
        self._classify(info, route, request.method, query)
        self.counters[info.verb] += 1
        try:
            fault = next((f for f in self._faults if f.matches(info)), None)
            if fault is not None:
                fault.hits += 1
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        fault.remove()
                info.faulted = True
                if fault.hang is not None:
                    await fault.hang.wait()
                else:
                    info.status = fault.status
                    body = fault.body
                    if isinstance(body, dict):
                        body = _dumps(body)
                    if isinstance(body, str):
                        body = body.encode()
                    return web.Response(status=fault.status, body=body, content_type="application/json")
            if route_error is not None:
                raise route_error
            assert route is not None
            resp = await self._handle(request, route, query, info)
        except FakeApiError as exc:
            resp = _json_response(exc.status, exc.code)
        if info.status is None:
            info.status = resp.status
        return resp

    async def _read_body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            if "yaml" in (request.content_type or ""):
                import yaml

                try:
                    return yaml.safe_load(raw)
                except yaml.YAMLError as exc:
                    raise FakeApiError(400, "BadRequest", f"invalid YAML: {exc}") from exc
            raise FakeApiError(400, "BadRequest", "the body of the request was in an unknown format") from None

    async def _handle(self, request: web.Request, route: _Route, query: dict[str, str],
                      info: RequestInfo) -> web.StreamResponse:
        method = request.method
        if route.kind == "root":
            paths = sorted({"/api", "/api/v1", "/apis", "/version", "/healthz"}
                           | {f"/apis/{t.group}" for t in self._types.values() if t.group}
                           | {f"/apis/{t.group}/{t.version}" for t in self._types.values() if t.group})
            return _json_response({"paths": paths})
        if route.kind == "version":
            return _json_response({"major": "1", "minor": "30", "gitVersion": "v1.30.0-fake",
                                   "gitCommit": "0" * 40, "gitTreeState": "clean",
                                   "buildDate": "2024-01-01T00:00:00Z", "goVersion": "go1.22.0",
                                   "compiler": "gc", "platform": "linux/amd64"})
        if route.kind == "health":
            return web.Response(text="ok", content_type="text/plain")
        if route.kind == "api_versions":
            return _json_response({"kind": "APIVersions", "versions": ["v1"],
                                   "serverAddressByClientCIDRs": [
                                       {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]})
        if route.kind == "group_list":
            groups = sorted({t.group for t in self._types.values() if t.group})
            return _json_response({"kind": "APIGroupList", "apiVersion": "v1",
                                   "groups": [self._group_doc(g) for g in groups]})
        if route.kind == "group":
            doc = self._group_doc(route.group)
            doc.update({"kind": "APIGroup", "apiVersion": "v1"})
            return _json_response(doc)
        if route.kind == "resource_list":
            return _json_response(self._resource_list(route.group, route.version))
        if route.kind == "tokenreview":
            if method != "POST" or route.name is not None:
                raise FakeApiError(405, "MethodNotAllowed", "the server does not allow this method on the "
                                                            "requested resource")
            if route.rtype is not None and route.rtype.plural == "subjectaccessreviews":
                return self._access_review(await self._read_body(request))
            return await self._token_review(await self._read_body(request))

        rtype = route.rtype
        assert rtype is not None
        dry_run = bool(query.get("dryRun"))
        if route.subresource == "token" and rtype.plural == "serviceaccounts" and method == "POST":
            return _json_response(self._token_request(route.namespace or "", route.name or "",
                                                      await self._read_body(request)), 201)
        if route.subresource is not None:
            if route.subresource != "status" or not rtype.status_subresource:
                raise _unknown_resource()
            if method == "GET":
                return _json_response(_present(self._get(rtype, route.namespace, route.name), rtype))
            if method == "PUT":
                body = await self._read_body(request)
                obj = self._update(rtype, route.namespace, route.name, body, mode="status", dry_run=dry_run)
                return _json_response(_present(obj, rtype))
            if method == "PATCH":
                body = await self._read_body(request)
                obj = self._patch(rtype, route.namespace, route.name, body, request.headers.get(
                    "Content-Type", ""), subresource="status", field_manager=query.get("fieldManager"),
                                  dry_run=dry_run)
                return _json_response(_present(obj, rtype))
            raise FakeApiError(405, "MethodNotAllowed", "the server does not allow this method on the "
                                                        "requested resource")

        if route.name is None:  # collection
            if method == "GET":
                try:
                    watch = route.watch_path or parse_bool(query.get("watch", "false"))
                except ValueError as exc:
                    raise FakeApiError(400, "BadRequest", str(exc)) from exc
                if watch:
                    return await self._watch(request, rtype, route.namespace, query, info)
                return _json_response(self._list(rtype, route.namespace, query))
            if method == "POST":
                body = await self._read_body(request)
                if self._matching_webhooks(rtype, "CREATE"):
                    preview = self._create(rtype, route.namespace, body, keep_status=False, dry_run=True)
                    await self._admit(rtype, "CREATE", _present(preview, rtype), None, dry_run)
                obj = self._create(rtype, route.namespace, body, keep_status=False, dry_run=dry_run)
                return _json_response(_present(obj, rtype), 201)
            if method == "DELETE":
                match = self._matcher(route.namespace, query.get("labelSelector"), query.get("fieldSelector"))
                deleted = [_present(self._delete(rtype, o["metadata"].get("namespace"), o["metadata"]["name"]),
                                    rtype) for o in self._select(rtype, match)]
                return _json_response({"kind": rtype.list_kind, "apiVersion": rtype.api_version,
                                       "metadata": {"resourceVersion": self.resource_version},
                                       "items": deleted})
            raise FakeApiError(405, "MethodNotAllowed", "the server does not allow this method on the "
                                                        "requested resource")

        name = route.name
        if method == "GET":
            if route.watch_path:
                query = dict(query, fieldSelector=_and_selector(query.get("fieldSelector"),
                                                                f"metadata.name={name}"))
                return await self._watch(request, rtype, route.namespace, query, info)
            return _json_response(_present(self._get(rtype, route.namespace, name), rtype))
        if method == "PUT":
            body = await self._read_body(request)
            if self._matching_webhooks(rtype, "UPDATE"):
                old = _present(self._get(rtype, route.namespace, name), rtype)
                preview = self._update(rtype, route.namespace, name, body, mode="main", dry_run=True)
                await self._admit(rtype, "UPDATE", _present(preview, rtype), old, dry_run)
            obj = self._update(rtype, route.namespace, name, body, mode="main", dry_run=dry_run)
            return _json_response(_present(obj, rtype))
        if method == "PATCH":
            body = await self._read_body(request)
            existed = (route.namespace or "", name) in self._store(rtype).objects
            operation = "UPDATE" if existed else "CREATE"
            if self._matching_webhooks(rtype, operation):
                old = _present(self._get(rtype, route.namespace, name), rtype) if existed else None
                preview = self._patch(rtype, route.namespace, name, body, request.headers.get("Content-Type", ""),
                                      subresource=None, field_manager=query.get("fieldManager"), dry_run=True)
                await self._admit(rtype, operation, _present(preview, rtype), old, dry_run)
            obj = self._patch(rtype, route.namespace, name, body, request.headers.get("Content-Type", ""),
                              subresource=None, field_manager=query.get("fieldManager"), dry_run=dry_run)
            return _json_response(_present(obj, rtype), 200 if existed else 201)  # 201: apply created it
        if method == "DELETE":
            body = await self._read_body(request)
            obj = self._delete(rtype, route.namespace, name, body if isinstance(body, dict) else None,
                               dry_run=dry_run)
            return _json_response(_present(obj, rtype))
        raise FakeApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                                                    "resource")

    async def _token_review(self, body: Any) -> web.Response:
        if not isinstance(body, dict):
            raise FakeApiError(400, "BadRequest", "the body of the request was in an unknown format")
        spec = body.get("spec") or {}
        status: Any = {"authenticated": False}
        if self.token_reviewer is not None:
            status = self.token_reviewer(spec.get("token", ""), list(spec.get("audiences") or []))
            if inspect.isawaitable(status):
                status = await status
        out = {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
               "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}
        return _json_response(out, 201)

    def _access_review(self, body: Any) -> web.Response:
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise FakeApiError(400, "BadRequest", "the body of the request was in an unknown format")
        spec = body["spec"]
        allowed = bool(self.access_reviewer(spec)) if self.access_reviewer is not None else False
        self.counters["subjectaccessreviews"] += 1
        return _json_response({"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                               "metadata": {"creationTimestamp": None}, "spec": spec,
                               "status": {"allowed": allowed}}, 201)

    def _list(self, rtype: ResourceType, namespace: str | None, query: dict[str, str]) -> JSON:
        rv = query.get("resourceVersion", "")
        if rv and not rv.isdigit():
            raise FakeApiError(400, "BadRequest", f'invalid resource version "{rv}"')
        try:
            match = self._matcher(namespace, query.get("labelSelector"), query.get("fieldSelector"))
        except ValueError as exc:
            raise FakeApiError(400, "BadRequest", str(exc)) from exc
        items = self._select(rtype, match)
        list_rv = self._rv
        cont = query.get("continue")
        if cont:
            try:
                token = json.loads(base64.urlsafe_b64decode(cont.encode()))
                token_rv, start = int(token["rv"]), tuple(token["start"])
            except Exception as exc:
                raise FakeApiError(400, "BadRequest", f"invalid continue token: {exc}") from exc
            if token_rv < self._compacted_rv:
                raise FakeApiError(410, "Expired", "The provided continue parameter is too old to display a "
                                                   "consistent list result. You can start a new list without "
                                                   "the continue parameter.")
            items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > start]
            list_rv = token_rv
        meta: JSON = {"resourceVersion": str(list_rv)}
        limit = int(query.get("limit") or 0)
        if limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            token = {"rv": list_rv, "start": [last.get("namespace", ""), last["name"]]}
            meta["continue"] = base64.urlsafe_b64encode(_dumps(token).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {"kind": rtype.list_kind, "apiVersion": rtype.api_version, "metadata": meta,
                "items": [_present(o, rtype, in_list=True) for o in items]}


# ------------------------------------------------------------------- util


def _and_selector(existing: str | None, extra: str) -> str:
    return f"{existing},{extra}" if existing else extra


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=_dumps(body).encode(), content_type="application/json")
