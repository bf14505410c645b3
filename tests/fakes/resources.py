"""Resource types: ``ResourceType``, the built-ins, the registry (CRD registration, name
resolution), discovery documents, and how a stored object is presented through a served version.

``ResourceRegistry`` is a mixin of ``FakeApiServer``; the state it uses is created in
``FakeApiServer.__init__``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .common import JSON, FakeApiError

DEFAULT_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _version_priority(version: str) -> tuple:
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, version)
    major = int(m.group(1))
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    minor = int(m.group(3) or 0)
    return (stage, -major, -minor)


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
    ResourceType("networking.k8s.io", "v1", "ingresses", "Ingress", status_subresource=True, short_names=("ing",)),
    ResourceType("networking.k8s.io", "v1", "ingressclasses", "IngressClass", namespaced=False),
    ResourceType("apps", "v1", "deployments", "Deployment", status_subresource=True, short_names=("deploy",)),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                 "MutatingWebhookConfiguration", namespaced=False),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                 "ValidatingWebhookConfiguration", namespaced=False),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                 namespaced=False, status_subresource=True, short_names=("crd", "crds")),
    ResourceType("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False,
                 verbs=("create",), virtual=True),
    ResourceType("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False,
                 verbs=("create",), virtual=True),
)


class ResourceRegistry:
    """Served resource types: registration, CRDs, resolution and discovery (a FakeApiServer mixin)."""

    _types: dict[tuple[str, str, str], ResourceType]
    _stores: dict[tuple[str, str], _Store]

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

    # ------------------------------------------------------- discovery documents

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
