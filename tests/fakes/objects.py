"""The object store: one global resourceVersion, the watch-event history, reads with
selectors, the write verbs (create/update/patch/delete with their kube semantics, built-in
defaulting, CRD objects installing their types), and the synchronous test helpers.

``ObjectStore`` is a mixin of ``FakeApiServer``; the state it uses is created in
``FakeApiServer.__init__``.
"""

from __future__ import annotations

import copy
import random
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .common import JSON, FakeApiError, _now
from .patches import json_patch, merge_patch
from .resources import ResourceType, _conflict, _not_found, _present, _Store, _unknown_resource
from .selectors import parse_field_selector, parse_label_selector
from .watches import _CLOSE, _Marker, _Watcher

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


@dataclass
class _Event:
    rv: int
    key: tuple[str, str]
    type: str
    obj: JSON
    old: JSON | None


class ObjectStore:
    """Stored objects, resourceVersions and history (a FakeApiServer mixin)."""

    require_namespaces: bool
    history_limit: int
    _types: dict[tuple[str, str, str], ResourceType]
    _stores: dict[tuple[str, str], _Store]
    _rv: int
    _compacted_rv: int
    _history: deque[_Event]
    _watchers: set[_Watcher]
    _next_cluster_ip: int

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

    # ------------------------------------------------------------- CRD objects

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
        self._collect_dependents(old)
        return final

    def _collect_dependents(self, owner: JSON) -> None:
        """The garbage collector's background propagation, done at once: objects whose every
        ownerReference names a uid that no longer exists are deleted (finalizers honoured).
        Namespaced dependents are looked for in the owner's namespace, as the GC resolves them."""
        uid = owner["metadata"].get("uid")
        if not uid:
            return
        live = {o["metadata"].get("uid") for st in self._stores.values() for o in st.objects.values()}
        for t in {t.store_key: t for t in self._types.values() if not t.virtual}.values():
            for (ns, n), obj in list(self._stores[t.store_key].objects.items()):
                refs = obj["metadata"].get("ownerReferences") or []
                if (refs and any(r.get("uid") == uid for r in refs)
                        and not any(r.get("uid") in live for r in refs)
                        and (not t.namespaced or ns == owner["metadata"].get("namespace", ns))):
                    self._delete(t, ns, n)

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


def _spec_part(obj: JSON) -> JSON:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _comparable(obj: JSON) -> JSON:
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out
