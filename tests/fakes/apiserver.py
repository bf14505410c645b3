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
  DELETE (finalizers honoured through ``deletionTimestamp``), DELETE collection,
  and the ``/status`` subresource. Every effective write bumps the RV and emits
  a watch event.
* Discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/G``, ``/apis/G/V``),
  ``/version``, ``/healthz``, TokenReview via a hook, and CRDs: registering a
  CRD (``register_crd`` or creating an apiextensions.k8s.io/v1
  CustomResourceDefinition object) serves its group/version; an unknown
  resource answers 404 with a ``Status`` (reason NotFound), which is what "CRD
  not installed" looks like.
* Fault injection: ``drop_watches()``, ``expire_history()``, ``fail_next()``,
  ``fail_when()``, ``hang_when()``, ``go_away()``/``come_back()`` (same port),
  and a request log with counters.

The store helpers (``create``/``update``/``patch``/``delete``/``get``/``list``)
are synchronous and must be called from the event loop thread (or before
``start``); writes behave like the HTTP verbs (RV bump, watch events).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as _dt
import inspect
import json
import random
import re
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

from aiohttp import web

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

JSON = dict[str, Any]

DEFAULT_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"


# --------------------------------------------------------------------------- helpers


def parse_bool(value: str) -> bool:
    """Parse a boolean exactly like Go's strconv.ParseBool (ValueError otherwise)."""
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{value}": invalid syntax')


def make_status(code: int, reason: str, message: str, details: JSON | None = None) -> JSON:
    """A ``metav1.Status`` failure object, as kube-apiserver returns it."""
    status: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        status["details"] = details
    return status


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _version_priority(version: str) -> tuple:
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, version)
    major = int(m.group(1))
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    minor = int(m.group(3) or 0)
    return (stage, -major, -minor)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (returns a new value; inputs are not mutated)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer_parts(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"invalid JSON pointer {pointer!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def json_patch(doc: Any, ops: list[JSON]) -> Any:
    """RFC 6902 JSON patch (add/remove/replace/move/copy/test). Raises ValueError."""
    doc = copy.deepcopy(doc)

    def resolve(parts: list[str]) -> tuple[Any, str]:
        parent = doc
        for part in parts[:-1]:
            if isinstance(parent, list):
                parent = parent[int(part)]
            elif isinstance(parent, dict):
                parent = parent[part]
            else:
                raise ValueError("path does not exist")  # noqa: TRY004 - callers catch ValueError
        return parent, parts[-1]

    def get(parts: list[str]) -> Any:
        value = doc
        for part in parts:
            value = value[int(part)] if isinstance(value, list) else value[part]
        return value

    def remove(parts: list[str]) -> Any:
        parent, last = resolve(parts)
        if isinstance(parent, list):
            return parent.pop(int(last))
        return parent.pop(last)

    def add(parts: list[str], value: Any) -> None:
        nonlocal doc
        if not parts:
            doc = value
            return
        parent, last = resolve(parts)
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            else:
                idx = int(last)
                if idx < 0 or idx > len(parent):
                    raise ValueError("index out of range")
                parent.insert(idx, value)
        elif isinstance(parent, dict):
            parent[last] = value
        else:
            raise ValueError("path does not exist")  # noqa: TRY004 - callers catch ValueError

    if not isinstance(ops, list):
        raise ValueError("json patch must be a list of operations")  # noqa: TRY004
    try:
        for op in ops:
            kind = op["op"]
            parts = _pointer_parts(op["path"])
            if kind == "add":
                add(parts, copy.deepcopy(op["value"]))
            elif kind == "remove":
                remove(parts)
            elif kind == "replace":
                get(parts)  # must exist
                if parts:
                    remove(parts)
                add(parts, copy.deepcopy(op["value"]))
            elif kind == "move":
                value = remove(_pointer_parts(op["from"]))
                add(parts, value)
            elif kind == "copy":
                add(parts, copy.deepcopy(get(_pointer_parts(op["from"]))))
            elif kind == "test":
                if get(parts) != op["value"]:
                    raise ValueError(f"test operation failed at {op['path']}")
            else:
                raise ValueError(f"unknown json patch op {kind!r}")
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"json patch failed: {exc!r}") from exc
    return doc


# ----------------------------------------------------------------- selectors


_LABEL_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (p.strip() for p in parts) if p]


def parse_label_selector(selector: str) -> Callable[[dict[str, str]], bool]:
    """Compile a label selector string into a predicate over a labels dict."""
    reqs: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_selector(selector or ""):
        m = re.fullmatch(r"\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*", term)
        if m:
            key, op, val = m.groups()
            if op == "!=":
                reqs.append(lambda lb, k=key, v=val: lb.get(k) != v)
            else:
                reqs.append(lambda lb, k=key, v=val: lb.get(k) == v)
            continue
        m = _LABEL_SET_RE.match(term)
        if not m:
            raise ValueError(f"unable to parse requirement: {term!r}")
        neg, key, op, values = m.groups()
        if op:
            if neg:
                raise ValueError(f"unable to parse requirement: {term!r}")
            vals = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                reqs.append(lambda lb, k=key, vs=vals: k in lb and lb[k] in vs)
            else:
                reqs.append(lambda lb, k=key, vs=vals: lb.get(k) not in vs)
        elif neg:
            reqs.append(lambda lb, k=key: k not in lb)
        else:
            reqs.append(lambda lb, k=key: k in lb)
    return lambda labels: all(r(labels) for r in reqs)


def _field_value(obj: JSON, path: str) -> str | None:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(selector: str) -> Callable[[JSON], bool]:
    """Compile a field selector (``path=v``, ``path==v``, ``path!=v``) into an object predicate."""
    reqs: list[Callable[[JSON], bool]] = []
    for term in _split_selector(selector or ""):
        m = re.fullmatch(r"\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*", term)
        if not m:
            raise ValueError(f"invalid field selector term {term!r}")
        path, op, val = m.groups()
        if op == "!=":
            reqs.append(lambda o, p=path, v=val: (_field_value(o, p) or "") != v)
        else:
            reqs.append(lambda o, p=path, v=val: (_field_value(o, p) or "") == v)
    return lambda obj: all(r(obj) for r in reqs)


# --------------------------------------------------------------------- model


@dataclass(frozen=True)
class ResourceType:
    """One served (group, version, plural)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False
    builtin: bool = True
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = DEFAULT_VERBS
    virtual: bool = False  # not stored (e.g. tokenreviews)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def store_key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        """``pods`` or ``leases.coordination.k8s.io``: how kube names it in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


class FakeApiError(Exception):
    """An apiserver error; ``.status`` is the ``Status`` object sent on the wire."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None):
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.status = make_status(code, reason, message, details)


def _not_found(rtype: ResourceType, name: str) -> FakeApiError:
    details = {"name": name, "kind": rtype.plural}
    if rtype.group:
        details["group"] = rtype.group
    return FakeApiError(404, "NotFound", f'{rtype.qualified} "{name}" not found', details)


def _conflict(rtype: ResourceType, name: str, why: str | None = None) -> FakeApiError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    details = {"name": name, "kind": rtype.plural}
    if rtype.group:
        details["group"] = rtype.group
    return FakeApiError(409, "Conflict", f'Operation cannot be fulfilled on {rtype.qualified} "{name}": {why}',
                        details)


def _unknown_resource() -> FakeApiError:
    return FakeApiError(404, "NotFound", "the server could not find the requested resource", {})


class _Store:
    def __init__(self, kind: str, namespaced: bool):
        self.kind = kind
        self.namespaced = namespaced
        self.objects: dict[tuple[str, str], JSON] = {}


@dataclass
class _Event:
    rv: int
    key: tuple[str, str]
    type: str
    obj: JSON
    old: JSON | None


class _Marker:
    def __init__(self, name: str, rv: int = 0):
        self.name = name
        self.rv = rv


_CLOSE = "close"
_ABORT = "abort"
_BOOKMARK = "bookmark"


@dataclass(eq=False)
class _Watcher:
    rtype: ResourceType
    namespace: str | None
    match: Callable[[JSON], bool]
    queue: asyncio.Queue
    start_rv: int


class RequestRecord(NamedTuple):
    """(method, path, query) of one request, as logged in ``FakeApiServer.requests``."""

    method: str
    path: str
    query: dict[str, str]


@dataclass
class RequestInfo:
    """Everything the fake knows about one request (``FakeApiServer.request_log``)."""

    method: str
    path: str
    query: dict[str, str]
    at: float  # time.monotonic()
    verb: str = "unknown"  # list/watch/get/create/update/patch/delete/deletecollection/discovery/...
    resource: str | None = None  # plural
    group: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    status: int | None = None  # None while a watch stream is still open
    faulted: bool = False
    user_agent: str = ""  # tells replicas of one client apart

    @property
    def record(self) -> RequestRecord:
        return RequestRecord(self.method, self.path, self.query)


@dataclass(eq=False)
class Fault:
    """An injected failure; returned by ``fail_next``/``fail_when``/``hang_when``."""

    predicate: Callable[[RequestInfo], bool] | None
    status: int = 500
    body: str | bytes | dict = ""
    remaining: int | None = None  # None: unlimited
    hang: asyncio.Event | None = None
    hits: int = 0
    _owner: FakeApiServer | None = None

    def matches(self, info: RequestInfo) -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        return self.predicate is None or bool(self.predicate(info))

    def release(self) -> None:
        """For ``hang_when`` faults: let held requests (and future ones) proceed."""
        if self.hang is not None:
            self.hang.set()
        self.remove()

    def remove(self) -> None:
        if self._owner is not None and self in self._owner._faults:
            self._owner._faults.remove(self)


@dataclass
class _Route:
    kind: str  # root/api_versions/group_list/group/resource_list/resource/version/health/tokenreview
    group: str = ""
    version: str = ""
    rtype: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    watch_path: bool = False


# ------------------------------------------------------------------ built-ins

_BUILTINS: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, status_subresource=True,
                 short_names=("ns",)),
    ResourceType("", "v1", "services", "Service", status_subresource=True, short_names=("svc",)),
    ResourceType("", "v1", "pods", "Pod", status_subresource=True, short_names=("po",)),
    ResourceType("", "v1", "nodes", "Node", namespaced=False, status_subresource=True, short_names=("no",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    ResourceType("", "v1", "secrets", "Secret"),
    ResourceType("", "v1", "endpoints", "Endpoints", short_names=("ep",)),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    ResourceType("", "v1", "events", "Event", short_names=("ev",)),
    ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                 "MutatingWebhookConfiguration", namespaced=False),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                 "ValidatingWebhookConfiguration", namespaced=False),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                 namespaced=False, status_subresource=True, short_names=("crd", "crds")),
    ResourceType("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False,
                 verbs=("create",), virtual=True),
)

_SEED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


# ---------------------------------------------------------------------- server


class FakeApiServer:
    """A fake kube-apiserver on 127.0.0.1 (plain HTTP).

    ``history_limit``: watch events retained for resumption (older RVs get 410).
    ``bookmark_interval``: seconds between periodic BOOKMARKs on watches that
    allow them (None disables periodic bookmarks; ``send_bookmarks()`` still works).
    ``default_watch_timeout``: server-side watch timeout when the client gives
    no ``timeoutSeconds`` (None: never).
    ``require_namespaces``: reject namespaced creates into a missing namespace (404).
    ``seed_namespaces``: pre-create default, kube-system, kube-public, kube-node-lease.
    """

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

    # --------------------------------------------------------- registration

    def _register_type(self, rtype: ResourceType) -> ResourceType:
        self._types[(rtype.group, rtype.version, rtype.plural)] = rtype
        if not rtype.virtual and rtype.store_key not in self._stores:
            self._stores[rtype.store_key] = _Store(rtype.kind, rtype.namespaced)
        return rtype

    def register_crd(
        self,
        group: str,
        version: str,
        plural: str,
        kind: str,
        namespaced: bool = True,
        *,
        status_subresource: bool = True,
        short_names: Iterable[str] = (),
        singular: str | None = None,
    ) -> ResourceType:
        """Install a CRD (creates/updates its CustomResourceDefinition object too)."""
        crd_rtype = self._types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
        crd_name = f"{plural}.{group}"
        version_spec: JSON = {
            "name": version, "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }
        if status_subresource:
            version_spec["subresources"] = {"status": {}}
        existing = self._stores[crd_rtype.store_key].objects.get(("", crd_name))
        if existing is None:
            self.create({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": crd_name},
                "spec": {
                    "group": group,
                    "names": {"plural": plural, "singular": singular or kind.lower(), "kind": kind,
                              "listKind": kind + "List", "shortNames": list(short_names)},
                    "scope": "Namespaced" if namespaced else "Cluster",
                    "versions": [version_spec],
                },
            })
        else:
            crd = copy.deepcopy(existing)
            versions = [v for v in crd["spec"]["versions"] if v["name"] != version]
            for v in versions:
                v["storage"] = False
            crd["spec"]["versions"] = versions + [version_spec]
            crd["metadata"].pop("resourceVersion", None)
            self.update(crd)
        return self._types[(group, version, plural)]

    def unregister_crd(self, group: str, plural: str) -> None:
        """Uninstall a CRD: its objects are deleted (DELETED events) and its watches end."""
        self.delete("customresourcedefinitions.apiextensions.k8s.io", f"{plural}.{group}")

    def _crd_installed(self, crd: JSON) -> None:
        spec = crd.get("spec") or {}
        group = spec.get("group", "")
        names = spec.get("names") or {}
        plural, kind = names.get("plural", ""), names.get("kind", "")
        namespaced = spec.get("scope", "Namespaced") == "Namespaced"
        served = set()
        for v in spec.get("versions") or []:
            if not v.get("served", True):
                continue
            served.add(v["name"])
            self._register_type(ResourceType(
                group, v["name"], plural, kind, namespaced=namespaced,
                status_subresource="status" in (v.get("subresources") or {}), builtin=False,
                short_names=tuple(names.get("shortNames") or ())))
        for key in [k for k in self._types if k[0] == group and k[2] == plural and k[1] not in served]:
            del self._types[key]

    def _crd_status(self, crd: JSON) -> None:
        spec = crd.get("spec") or {}
        crd["status"] = {
            "acceptedNames": copy.deepcopy(spec.get("names") or {}),
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": _now()},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": _now()},
            ],
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
        }

    def _crd_removed(self, crd: JSON) -> None:
        spec = crd.get("spec") or {}
        group = spec.get("group", "")
        plural = (spec.get("names") or {}).get("plural", "")
        key = (group, plural)
        store = self._stores.get(key)
        types = [t for k, t in self._types.items() if k[0] == group and k[2] == plural]
        if store is not None and types:
            for obj in list(store.objects.values()):
                meta = obj["metadata"]
                self._remove(types[0], meta.get("namespace", ""), meta["name"])
        for w in list(self._watchers):
            if w.rtype.store_key == key:
                w.queue.put_nowait(_Marker(_CLOSE))
        for t in types:
            del self._types[(t.group, t.version, t.plural)]
        self._stores.pop(key, None)

    # ------------------------------------------------------------ resolution

    def resource_types(self) -> list[ResourceType]:
        return list(self._types.values())

    def resolve(self, resource: str | JSON | ResourceType, version: str | None = None) -> ResourceType:
        """Find a served type from ``pods``, ``leases.coordination.k8s.io``,
        ``virtualservices.v1beta1.networking.istio.io``, a ResourceType or an object dict."""
        if isinstance(resource, ResourceType):
            return resource
        if isinstance(resource, dict):
            api_version = resource.get("apiVersion", "")
            kind = resource.get("kind", "")
            group, _, ver = api_version.rpartition("/")
            for t in self._types.values():
                if t.group == group and t.version == ver and t.kind == kind:
                    return t
            raise FakeApiError(404, "NotFound", f"no resource registered for {api_version} {kind}")
        plural, _, rest = resource.partition(".")
        candidates = [t for t in self._types.values() if t.plural == plural or plural in t.short_names]
        if rest:
            first, _, remainder = rest.partition(".")
            by_version = [t for t in candidates if t.version == first and t.group == remainder]
            candidates = by_version or [t for t in candidates if t.group == rest]
        else:
            core = [t for t in candidates if t.group == ""]
            candidates = core or candidates
        if version is not None:
            candidates = [t for t in candidates if t.version == version]
        if not candidates:
            raise FakeApiError(404, "NotFound", f"no resource registered for {resource!r}")
        candidates.sort(key=lambda t: _version_priority(t.version))
        return candidates[0]

    # ------------------------------------------------------------ state/RV

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def _bump(self, obj: JSON) -> int:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        return self._rv

    def _store(self, rtype: ResourceType) -> _Store:
        store = self._stores.get(rtype.store_key)
        if store is None:
            raise _unknown_resource()
        return store

    def _record(self, rtype: ResourceType, etype: str, obj: JSON, old: JSON | None) -> None:
        event = _Event(self._rv, rtype.store_key, etype, obj, old)
        self._history.append(event)
        while len(self._history) > max(self.history_limit, 0):
            dropped = self._history.popleft()
            self._compacted_rv = max(self._compacted_rv, dropped.rv)
        if self.history_limit <= 0:
            self._compacted_rv = self._rv
        for w in list(self._watchers):
            if w.rtype.store_key == rtype.store_key:
                delivered = self._filter_event(w, etype, obj, old)
                if delivered is not None:
                    w.queue.put_nowait(delivered)

    @staticmethod
    def _filter_event(w: _Watcher, etype: str, obj: JSON, old: JSON | None) -> tuple[str, JSON] | None:
        cur = w.match(obj)
        if etype in ("ADDED", "DELETED"):
            return (etype, obj) if cur else None
        prev = old is not None and w.match(old)
        if cur and prev:
            return ("MODIFIED", obj)
        if cur:
            return ("ADDED", obj)
        if prev:
            return ("DELETED", obj)
        return None

    def expire_history(self, before: int | str | None = None) -> None:
        """Make every RV older than ``before`` (default: the current RV) too old to watch from."""
        cut = self._rv if before is None else int(before)
        self._compacted_rv = max(self._compacted_rv, cut)
        while self._history and self._history[0].rv <= self._compacted_rv:
            self._history.popleft()

    def history(self) -> list[tuple[int, str, str, str, str]]:
        """Retained events as (rv, type, qualified resource, namespace, name)."""
        out = []
        for e in self._history:
            meta = e.obj["metadata"]
            res = f"{e.key[1]}.{e.key[0]}" if e.key[0] else e.key[1]
            out.append((e.rv, e.type, res, meta.get("namespace", ""), meta["name"]))
        return out

    # ------------------------------------------------------- core operations

    def _matcher(self, namespace: str | None, label_selector: str | None,
                 field_selector: str | None) -> Callable[[JSON], bool]:
        lsel = parse_label_selector(label_selector or "")
        fsel = parse_field_selector(field_selector or "")

        def match(obj: JSON) -> bool:
            meta = obj.get("metadata") or {}
            if namespace is not None and meta.get("namespace", "") != namespace:
                return False
            return lsel(meta.get("labels") or {}) and fsel(obj)

        return match

    def _select(self, rtype: ResourceType, match: Callable[[JSON], bool]) -> list[JSON]:
        store = self._store(rtype)
        items = [o for o in store.objects.values() if match(o)]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items

    def _get(self, rtype: ResourceType, namespace: str | None, name: str) -> JSON:
        obj = self._store(rtype).objects.get((namespace or "", name))
        if obj is None:
            raise _not_found(rtype, name)
        return obj

    def _check_namespace(self, rtype: ResourceType, namespace: str | None) -> str:
        if not rtype.namespaced:
            return ""
        if not namespace:
            raise FakeApiError(400, "BadRequest", "the namespace is required for namespaced resources")
        if self.require_namespaces and ("", namespace) not in self._stores[("", "namespaces")].objects:
            raise FakeApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})
        return namespace

    def _create(self, rtype: ResourceType, namespace: str | None, body: JSON, *, keep_status: bool,
                dry_run: bool = False) -> JSON:
        if not isinstance(body, dict):
            raise FakeApiError(400, "BadRequest", "the body of the request was in an unknown format")
        obj = copy.deepcopy(body)
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise FakeApiError(400, "BadRequest", "metadata must be an object")
        if rtype.namespaced:
            body_ns = meta.get("namespace")
            if namespace and body_ns and body_ns != namespace:
                raise FakeApiError(400, "BadRequest", "the namespace of the provided object does not match "
                                                      "the namespace sent on the request")
            meta["namespace"] = self._check_namespace(rtype, namespace or body_ns)
        else:
            meta.pop("namespace", None)
        name = meta.get("name")
        if not name:
            prefix = meta.get("generateName")
            if not prefix:
                raise FakeApiError(422, "Invalid", f"{rtype.kind} \"\" is invalid: metadata.name: Required "
                                                   "value: name or generateName is required",
                                   {"kind": rtype.kind, "causes": [{"reason": "FieldValueRequired",
                                                                    "field": "metadata.name"}]})
            name = prefix + "".join(random.choice(_NAME_CHARS) for _ in range(5))
            meta["name"] = name
        store = self._store(rtype)
        key = (meta.get("namespace", ""), name)
        if key in store.objects:
            details = {"name": name, "kind": rtype.plural}
            if rtype.group:
                details["group"] = rtype.group
            raise FakeApiError(409, "AlreadyExists", f'{rtype.qualified} "{name}" already exists', details)
        obj["apiVersion"] = rtype.api_version
        obj["kind"] = rtype.kind
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "selfLink"):
            meta.pop(k, None)
        if rtype.status_subresource:
            meta["generation"] = 1
            if not keep_status:
                obj.pop("status", None)
        self._defaults_on_create(rtype, obj)
        if dry_run:
            return obj
        self._bump(obj)
        store.objects[key] = obj
        if rtype.store_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._crd_installed(obj)
        self._record(rtype, "ADDED", obj, None)
        return obj

    def _defaults_on_create(self, rtype: ResourceType, obj: JSON) -> None:
        if rtype.group != "" and rtype.store_key != ("apiextensions.k8s.io", "customresourcedefinitions"):
            return
        if rtype.plural == "namespaces":
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
            obj.setdefault("status", {}).setdefault("phase", "Active")
        elif rtype.plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        elif rtype.plural == "services":
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if spec["type"] != "ExternalName" and not spec.get("clusterIP"):
                n = self._next_cluster_ip
                self._next_cluster_ip += 1
                spec["clusterIP"] = f"10.96.{n // 256}.{n % 256}"
            if spec.get("clusterIP"):
                spec.setdefault("clusterIPs", [spec["clusterIP"]])
            spec.setdefault("sessionAffinity", "None")
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                if "port" in port:
                    port.setdefault("targetPort", port["port"])
            obj.setdefault("status", {"loadBalancer": {}})
        elif rtype.plural == "customresourcedefinitions":
            self._crd_status(obj)

    def _update(self, rtype: ResourceType, namespace: str | None, name: str, body: JSON, *,
                mode: str, check_rv: bool = True, dry_run: bool = False) -> JSON:
        """mode: "main" (PUT: status kept), "status" (PUT /status), "all" (helper: replace everything)."""
        if not isinstance(body, dict):
            raise FakeApiError(400, "BadRequest", "the body of the request was in an unknown format")
        namespace = namespace or ""
        old = self._get(rtype, namespace, name)
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise FakeApiError(400, "BadRequest", f'the name of the object ({meta.get("name")}) does not match '
                                                  f"the name on the URL ({name})")
        if rtype.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise FakeApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                                                  "namespace sent on the request")
        body_rv = meta.get("resourceVersion")
        if check_rv and body_rv not in (None, "") and str(body_rv) != old["metadata"]["resourceVersion"]:
            raise _conflict(rtype, name)
        if mode == "status":
            new = copy.deepcopy(old)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(body)
            new.setdefault("metadata", {})
            if mode == "main" and rtype.status_subresource:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
        nmeta = new["metadata"]
        ometa = old["metadata"]
        nmeta["name"] = name
        if rtype.namespaced:
            nmeta["namespace"] = namespace
        else:
            nmeta.pop("namespace", None)
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "generation", "resourceVersion"):
            if k in ometa:
                nmeta[k] = ometa[k]
            else:
                nmeta.pop(k, None)
        new["apiVersion"] = rtype.api_version
        new["kind"] = rtype.kind
        self._defaults_on_update(rtype, new, old)
        if "generation" in ometa and _spec_part(new) != _spec_part(old):
            nmeta["generation"] = ometa["generation"] + 1
        if _comparable(new) == _comparable(old):
            return old  # no-op: no RV bump, no event
        if dry_run:
            return new
        if ometa.get("deletionTimestamp") and not nmeta.get("finalizers"):
            # Last finalizer gone from a deleting object: it is deleted now.
            self._store(rtype).objects[(namespace, name)] = new
            return self._remove(rtype, namespace, name)
        self._bump(new)
        self._store(rtype).objects[(namespace, name)] = new
        if rtype.store_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._crd_installed(new)
        self._record(rtype, "MODIFIED", new, old)
        return new

    def _defaults_on_update(self, rtype: ResourceType, new: JSON, old: JSON) -> None:
        if rtype.group != "":
            return
        if rtype.plural == "namespaces":
            new["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = new["metadata"]["name"]
        elif rtype.plural == "services":
            spec = new.setdefault("spec", {})
            ospec = old.get("spec") or {}
            spec.setdefault("type", ospec.get("type", "ClusterIP"))
            if not spec.get("clusterIP") and ospec.get("clusterIP") and spec["type"] != "ExternalName":
                spec["clusterIP"] = ospec["clusterIP"]
                spec.setdefault("clusterIPs", ospec.get("clusterIPs", [ospec["clusterIP"]]))
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                if "port" in port:
                    port.setdefault("targetPort", port["port"])

    def _patch(self, rtype: ResourceType, namespace: str | None, name: str, patch: Any, content_type: str,
               *, subresource: str | None, field_manager: str | None = None, force_mode: str | None = None,
               dry_run: bool = False) -> JSON:
        ctype = content_type.split(";")[0].strip().lower()
        store = self._store(rtype)
        exists = (namespace or "", name) in store.objects
        if ctype == "application/apply-patch+yaml":
            if not field_manager:
                raise FakeApiError(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: "
                                                   "Required value: is required for apply patch")
            if not isinstance(patch, dict):
                raise FakeApiError(400, "BadRequest", "apply patch must be an object")
            if not exists:
                if subresource:
                    raise _not_found(rtype, name)
                body = copy.deepcopy(patch)
                body.setdefault("metadata", {})["name"] = name
                return self._create(rtype, namespace, body, keep_status=False, dry_run=dry_run)
        if not exists:
            raise _not_found(rtype, name)
        old = self._get(rtype, namespace, name)
        if ctype == "application/json-patch+json":
            if not isinstance(patch, list):
                raise FakeApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type "
                                                      "jsonpatch.Patch")
            try:
                new = json_patch(old, patch)
            except ValueError as exc:
                raise FakeApiError(422, "Invalid", str(exc)) from exc
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json",
                       "application/apply-patch+yaml"):
            if not isinstance(patch, dict):
                raise FakeApiError(400, "BadRequest", "merge patch must be a JSON object")
            new = merge_patch(old, patch)
        else:
            raise FakeApiError(415, "UnsupportedMediaType",
                               f'the body of the request was in an unknown format - accepted media types '
                               f'include: application/json-patch+json, application/merge-patch+json, '
                               f'application/apply-patch+yaml (got "{ctype}")')
        patch_rv = ((patch.get("metadata") or {}) if isinstance(patch, dict) else {}).get("resourceVersion")
        if patch_rv not in (None, "") and str(patch_rv) != old["metadata"]["resourceVersion"]:
            raise _conflict(rtype, name)
        new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
        mode = force_mode or ("status" if subresource == "status" else "main")
        return self._update(rtype, namespace, name, new, mode=mode, check_rv=False, dry_run=dry_run)

    def _delete(self, rtype: ResourceType, namespace: str | None, name: str,
                options: JSON | None = None, dry_run: bool = False) -> JSON:
        namespace = namespace or ""
        old = self._get(rtype, namespace, name)
        pre = (options or {}).get("preconditions") or {}
        if pre.get("resourceVersion") and str(pre["resourceVersion"]) != old["metadata"]["resourceVersion"]:
            raise _conflict(rtype, name, f"Precondition failed: ResourceVersion in precondition: "
                                         f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                         f"{old['metadata']['resourceVersion']}")
        if pre.get("uid") and pre["uid"] != old["metadata"].get("uid"):
            raise _conflict(rtype, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in "
                                         f"object meta: {old['metadata'].get('uid')}")
        if dry_run:
            return old
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return old
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            self._bump(new)
            self._store(rtype).objects[(namespace, name)] = new
            self._record(rtype, "MODIFIED", new, old)
            return new
        if rtype.plural == "namespaces" and rtype.group == "":
            for t in {t.store_key: t for t in self._types.values() if t.namespaced and not t.virtual}.values():
                for (ns, n) in [k for k in self._stores[t.store_key].objects if k[0] == name]:
                    self._remove(t, ns, n)
        return self._remove(rtype, namespace, name)

    def _remove(self, rtype: ResourceType, namespace: str, name: str) -> JSON:
        store = self._store(rtype)
        if rtype.store_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            # Like kube: the custom objects go (DELETED events, watches end) before the CRD does.
            self._crd_removed(store.objects[(namespace, name)])
        old = store.objects.pop((namespace, name))
        final = copy.deepcopy(old)
        self._bump(final)
        self._record(rtype, "DELETED", final, old)
        return final

    # --------------------------------------------------- Python test helpers

    def create(self, obj: JSON, *, namespace: str | None = None, resource: str | None = None,
               keep_status: bool = True) -> JSON:
        """Create ``obj`` (type from apiVersion/kind, or ``resource``). Unlike HTTP POST, ``status``
        is kept by default so tests can seed e.g. pod IPs. Raises FakeApiError (409 AlreadyExists)."""
        rtype = self.resolve(resource or obj)
        ns = namespace or (obj.get("metadata") or {}).get("namespace") or ("default" if rtype.namespaced else None)
        return copy.deepcopy(self._create(rtype, ns, obj, keep_status=keep_status))

    def update(self, obj: JSON, *, subresource: str | None = None, resource: str | None = None) -> JSON:
        """Replace ``obj``. ``subresource=None`` replaces spec *and* status (test convenience);
        ``"status"`` behaves like PUT /status. A set metadata.resourceVersion is checked (409)."""
        rtype = self.resolve(resource or obj)
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or ("default" if rtype.namespaced else None)
        mode = "status" if subresource == "status" else "all"
        return copy.deepcopy(self._update(rtype, ns, meta["name"], obj, mode=mode))

    def update_status(self, obj: JSON, *, resource: str | None = None) -> JSON:
        return self.update(obj, subresource="status", resource=resource)

    def apply(self, obj: JSON, *, resource: str | None = None) -> JSON:
        """Upsert: create, or replace everything ignoring resourceVersion."""
        rtype = self.resolve(resource or obj)
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or ("default" if rtype.namespaced else None)
        if (ns or "", meta.get("name")) in self._store(rtype).objects:
            return copy.deepcopy(self._update(rtype, ns, meta["name"], obj, mode="all", check_rv=False))
        return self.create(obj, namespace=ns, resource=resource)

    def patch(self, resource: str | JSON, name: str, patch: Any, *, namespace: str | None = None,
              patch_type: str = "merge", subresource: str | None = None) -> JSON:
        """patch_type: "merge" / "strategic" (both JSON merge patch) / "json" (RFC 6902).
        ``subresource=None`` patches spec and status alike (test convenience)."""
        rtype = self.resolve(resource)
        ns = namespace or ("default" if rtype.namespaced else None)
        ctype = {"merge": "application/merge-patch+json",
                 "strategic": "application/strategic-merge-patch+json",
                 "json": "application/json-patch+json"}[patch_type]
        force = None if subresource == "status" else "all"
        return copy.deepcopy(self._patch(rtype, ns, name, patch, ctype, subresource=subresource,
                                         force_mode=force))

    def delete(self, resource: str | JSON, name: str | None = None, *, namespace: str | None = None) -> JSON:
        """Delete by (resource, name[, namespace]) or by object dict. Finalizers are honoured."""
        if isinstance(resource, dict):
            meta = resource.get("metadata") or {}
            name = name or meta["name"]
            namespace = namespace or meta.get("namespace")
        rtype = self.resolve(resource)
        ns = namespace or ("default" if rtype.namespaced else None)
        assert name is not None
        return copy.deepcopy(self._delete(rtype, ns, name))

    def get(self, resource: str | JSON, name: str, *, namespace: str | None = None) -> JSON | None:
        """The stored object (deep copy), or None if missing."""
        rtype = self.resolve(resource)
        ns = namespace or ("default" if rtype.namespaced else None)
        obj = self._store(rtype).objects.get((ns or "", name))
        return _present(obj, rtype) if obj is not None else None

    def list(self, resource: str | JSON, *, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[JSON]:
        rtype = self.resolve(resource)
        match = self._matcher(namespace, label_selector, field_selector)
        return [_present(o, rtype) for o in self._select(rtype, match)]

    # ----------------------------------------------------------- watches

    def open_watches(self, resource: str | None = None) -> int:
        """Number of open watch streams (optionally for one resource)."""
        if resource is None:
            return len(self._watchers)
        key = self.resolve(resource).store_key
        return sum(1 for w in self._watchers if w.rtype.store_key == key)

    async def wait_for_watches(self, count: int = 1, resource: str | None = None, timeout: float = 10.0) -> None:
        """Wait (deadline-bounded, event-driven) until at least ``count`` watches are open."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.open_watches(resource) < count:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise AssertionError(f"expected {count} open watches on {resource or 'any'}, "
                                     f"have {self.open_watches(resource)}")
            try:
                await asyncio.wait_for(self._changed_event().wait(), remaining)
            except TimeoutError:
                pass

    def _changed_event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify_changed(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def drop_watches(self, resource: str | None = None, *, abort: bool = True) -> int:
        """End open watch streams mid-stream. ``abort=True`` cuts the TCP connection (the client
        sees a truncated chunked body); ``abort=False`` ends the response cleanly (client sees EOF).
        Returns the number of streams ended."""
        key = self.resolve(resource).store_key if resource else None
        n = 0
        for w in list(self._watchers):
            if key is None or w.rtype.store_key == key:
                w.queue.put_nowait(_Marker(_ABORT if abort else _CLOSE))
                n += 1
        return n

    def _end_watches(self, how: str) -> None:
        for w in list(self._watchers):
            w.queue.put_nowait(_Marker(how))

    def send_bookmarks(self, resource: str | None = None) -> int:
        """Send a BOOKMARK now on every open watch that allowed bookmarks."""
        key = self.resolve(resource).store_key if resource else None
        n = 0
        for w in list(self._watchers):
            if key is None or w.rtype.store_key == key:
                w.queue.put_nowait(_Marker(_BOOKMARK, self._rv))
                n += 1
        return n

    # -------------------------------------------------------- fault injection

    def fail_next(self, n: int = 1, status: int = 500, body: str | bytes | dict = "",
                  match: Callable[[RequestInfo], bool] | None = None) -> Fault:
        """The next ``n`` requests (matching ``match`` if given) get ``status`` with ``body``
        (default: empty body; a dict is sent as JSON)."""
        fault = Fault(match, status, body, remaining=n, _owner=self)
        self._faults.append(fault)
        return fault

    def fail_when(self, match: Callable[[RequestInfo], bool], status: int = 500,
                  body: str | bytes | dict = "") -> Fault:
        """Every request matching ``match`` fails until ``fault.remove()``/``clear_faults()``."""
        fault = Fault(match, status, body, remaining=None, _owner=self)
        self._faults.append(fault)
        return fault

    def hang_when(self, match: Callable[[RequestInfo], bool]) -> Fault:
        """Matching requests hang (no response) until ``fault.release()``."""
        fault = Fault(match, 0, "", remaining=None, hang=asyncio.Event(), _owner=self)
        self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        for fault in list(self._faults):
            if fault.hang is not None:
                fault.hang.set()
        self._faults.clear()

    # ------------------------------------------------------------ request log

    @property
    def requests(self) -> list[RequestRecord]:
        return [info.record for info in self.request_log]

    def mark(self) -> int:
        """A position in the request log, for ``count(since=...)``/``requests_since``."""
        return len(self.request_log)

    def requests_since(self, mark: int = 0) -> list[RequestInfo]:
        return self.request_log[mark:]

    def count(self, verb: str | None = None, resource: str | None = None, *, since: int = 0,
              method: str | None = None, path: str | None = None) -> int:
        """Requests since ``since`` matching verb (list/watch/get/create/update/patch/delete/...),
        resource plural, HTTP method and/or path regex."""
        n = 0
        for info in self.request_log[since:]:
            if verb is not None and info.verb != verb:
                continue
            if resource is not None and info.resource != resource:
                continue
            if method is not None and info.method != method.upper():
                continue
            if path is not None and not re.search(path, info.path):
                continue
            n += 1
        return n

    def request_rate(self, verb: str | None = None, resource: str | None = None, *,
                     window: float = 1.0) -> float:
        """Matching requests per second over the last ``window`` seconds."""
        cutoff = time.monotonic() - window
        n = sum(1 for i in self.request_log
                if i.at >= cutoff and (verb is None or i.verb == verb)
                and (resource is None or i.resource == resource))
        return n / window

    # ------------------------------------------------------------ HTTP layer

    def _route(self, path: str) -> _Route:
        segs = [s for s in path.split("/") if s]
        if not segs:
            return _Route("root")
        head = segs[0]
        if head in ("version",) and len(segs) == 1:
            return _Route("version")
        if head in ("healthz", "livez", "readyz"):
            return _Route("health")
        if head == "api":
            if len(segs) == 1:
                return _Route("api_versions")
            group, version, rest = "", segs[1], segs[2:]
        elif head == "apis":
            if len(segs) == 1:
                return _Route("group_list")
            group = segs[1]
            if len(segs) == 2:
                if not any(t.group == group for t in self._types.values()):
                    raise _unknown_resource()
                return _Route("group", group=group)
            version, rest = segs[2], segs[3:]
        else:
            raise _unknown_resource()
        if not any(t.group == group and t.version == version for t in self._types.values()):
            raise _unknown_resource()
        if not rest:
            return _Route("resource_list", group=group, version=version)
        watch_path = False
        if rest[0] == "watch":
            watch_path, rest = True, rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise _unknown_resource()
        rtype = self._types.get((group, version, rest[0]))
        if rtype is None:
            raise _unknown_resource()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if rtype.namespaced and namespace is None and name is not None:
            raise _unknown_resource()
        if not rtype.namespaced and namespace is not None:
            raise _unknown_resource()
        if rtype.virtual:
            return _Route("tokenreview", group, version, rtype, namespace, name, sub)
        return _Route("resource", group, version, rtype, namespace, name, sub, watch_path)

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

    @staticmethod
    def _classify(info: RequestInfo, route: _Route | None, method: str, query: dict[str, str]) -> None:
        if route is None:
            info.verb = "unknown"
            return
        if route.kind in ("root", "api_versions", "group_list", "group", "resource_list", "version"):
            info.verb = "discovery"
            return
        if route.kind == "health":
            info.verb = "health"
            return
        info.resource = route.rtype.plural if route.rtype else None
        info.group = route.group
        info.namespace = route.namespace
        info.name = route.name
        info.subresource = route.subresource
        if route.kind == "tokenreview":
            info.verb = "create"
            return
        watch = route.watch_path
        try:
            watch = watch or parse_bool(query.get("watch", "false"))
        except ValueError:
            pass
        collection = route.name is None
        info.verb = {
            ("GET", True): "watch" if watch else "list",
            ("GET", False): "watch" if watch else "get",
            ("POST", True): "create",
            ("PUT", False): "update",
            ("PATCH", False): "patch",
            ("DELETE", False): "delete",
            ("DELETE", True): "deletecollection",
        }.get((method, collection), "unknown")

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
            return await self._token_review(await self._read_body(request))

        rtype = route.rtype
        assert rtype is not None
        dry_run = bool(query.get("dryRun"))
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
            obj = self._update(rtype, route.namespace, name, body, mode="main", dry_run=dry_run)
            return _json_response(_present(obj, rtype))
        if method == "PATCH":
            body = await self._read_body(request)
            existed = (route.namespace or "", name) in self._store(rtype).objects
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

    def _group_doc(self, group: str) -> JSON:
        versions = sorted({t.version for t in self._types.values() if t.group == group}, key=_version_priority)
        docs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": docs, "preferredVersion": docs[0]}

    def _resource_list(self, group: str, version: str) -> JSON:
        resources = []
        for t in sorted((t for t in self._types.values() if t.group == group and t.version == version),
                        key=lambda t: t.plural):
            entry: JSON = {"name": t.plural, "singularName": t.kind.lower(), "namespaced": t.namespaced,
                           "kind": t.kind, "verbs": list(t.verbs)}
            if t.short_names:
                entry["shortNames"] = list(t.short_names)
            resources.append(entry)
            if t.status_subresource:
                resources.append({"name": f"{t.plural}/status", "singularName": "", "namespaced": t.namespaced,
                                  "kind": t.kind, "verbs": ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}

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

    async def _watch(self, request: web.Request, rtype: ResourceType, namespace: str | None,
                     query: dict[str, str], info: RequestInfo) -> web.StreamResponse:
        try:
            bookmarks = parse_bool(query.get("allowWatchBookmarks", "false"))
            send_initial = query.get("sendInitialEvents")
            send_initial_b = parse_bool(send_initial) if send_initial is not None else None
            match = self._matcher(namespace, query.get("labelSelector"), query.get("fieldSelector"))
            timeout_s = query.get("timeoutSeconds")
            timeout = float(timeout_s) if timeout_s not in (None, "") else self.default_watch_timeout
        except ValueError as exc:
            raise FakeApiError(400, "BadRequest", str(exc)) from exc
        rv_param = query.get("resourceVersion", "")
        if rv_param and not rv_param.isdigit():
            raise FakeApiError(400, "BadRequest", f'invalid resource version "{rv_param}"')
        self._store(rtype)  # 404 if the resource went away

        # Everything up to registering the watcher is synchronous, so no event can slip between
        # the snapshot/replay and the live queue.
        watcher = _Watcher(rtype, namespace, match, asyncio.Queue(), self._rv)
        initial: list[tuple[str, JSON]] = []
        expired: JSON | None = None
        if send_initial_b or rv_param in ("", "0"):
            # Synthetic ADDED for the current state (RV "" / "0", or sendInitialEvents=true).
            initial = [("ADDED", o) for o in self._select(rtype, match)]
        else:
            n = int(rv_param)
            if n < self._compacted_rv:
                expired = make_status(410, "Expired",
                                      f"too old resource version: {n} ({self._compacted_rv})")
            else:
                watcher.start_rv = n
                for e in self._history:
                    if e.rv > n and e.key == rtype.store_key:
                        delivered = self._filter_event(watcher, e.type, e.obj, e.old)
                        if delivered is not None:
                            initial.append(delivered)

        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Cache-Control": "no-cache, private"})
        resp.enable_chunked_encoding()
        if expired is not None:
            await resp.prepare(request)
            await resp.write((_dumps({"type": "ERROR", "object": expired}) + "\n").encode())
            await resp.write_eof()
            info.status = 200
            return resp

        for item in initial:
            watcher.queue.put_nowait(item)
        if send_initial_b and bookmarks:
            watcher.queue.put_nowait(_Marker("initial-end", self._rv))
        self._watchers.add(watcher)
        self._notify_changed()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        interval = self.bookmark_interval if bookmarks else None
        next_bookmark = loop.time() + interval if interval else None
        aborted = False
        try:
            await resp.prepare(request)
            info.status = 200
            while True:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    break
                # A periodic bookmark carries the current RV, which is only truthful once every
                # queued event has been written: postpone it while the queue is non-empty.
                if next_bookmark is not None and now >= next_bookmark and watcher.queue.empty():
                    await resp.write(self._bookmark_line(rtype, max(self._rv, watcher.start_rv)))
                    next_bookmark = now + interval
                    continue
                if not watcher.queue.empty():
                    item = watcher.queue.get_nowait()
                else:
                    waits = [t - now for t in (deadline, next_bookmark) if t is not None]
                    try:
                        if waits:
                            item = await asyncio.wait_for(watcher.queue.get(), max(min(waits), 0))
                        else:
                            item = await watcher.queue.get()
                    except TimeoutError:
                        continue
                if isinstance(item, _Marker):
                    if item.name == _CLOSE:
                        break
                    if item.name == _ABORT:
                        aborted = True
                        break
                    if item.name == _BOOKMARK:
                        if bookmarks:
                            await resp.write(self._bookmark_line(rtype, max(item.rv, watcher.start_rv)))
                        continue
                    if item.name == "initial-end":
                        await resp.write(self._bookmark_line(rtype, item.rv, initial_end=True))
                        continue
                etype, obj = item
                await resp.write((_dumps({"type": etype, "object": _present(obj, rtype, copy_=False)})
                                  + "\n").encode())
            if aborted:
                if request.transport is not None:
                    request.transport.abort()
                return resp
            await resp.write_eof()
            return resp
        finally:  # also on client disconnect (handler_cancellation) or a broken connection
            self._watchers.discard(watcher)
            self._notify_changed()

    @staticmethod
    def _bookmark_line(rtype: ResourceType, rv: int, initial_end: bool = False) -> bytes:
        meta: JSON = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: "true"}
        obj = {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": meta}
        return (_dumps({"type": "BOOKMARK", "object": obj}) + "\n").encode()


# ------------------------------------------------------------------- util


def _present(obj: JSON, rtype: ResourceType, *, in_list: bool = False, copy_: bool = True) -> JSON:
    """The object as served through ``rtype``'s version (built-in list items omit kind/apiVersion)."""
    out = copy.deepcopy(obj) if copy_ else dict(obj)
    if in_list and rtype.builtin:
        out.pop("apiVersion", None)
        out.pop("kind", None)
    else:
        out["apiVersion"] = rtype.api_version
        out["kind"] = rtype.kind
    return out


def _spec_part(obj: JSON) -> JSON:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _comparable(obj: JSON) -> JSON:
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out


def _and_selector(existing: str | None, extra: str) -> str:
    return f"{existing},{extra}" if existing else extra


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=_dumps(body).encode(), content_type="application/json")
