"""Cross-namespace references (ReferenceGrant) and backendRef resolution.

A reference from an object to another in its own namespace is always allowed. Across
namespaces it needs a ReferenceGrant in the *target's* namespace whose `from` names the
referrer's group, kind and namespace and whose `to` names the target's group and kind (and, if
given, its name). Core-group kinds are written with group "" (or "core").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from pilot.config.core import Service
from pilot.config.gateway_api import ReferenceGrant
from pilot.config.networking.common import GROUP as ISTIO_GROUP  # networking.istio.io
from pilot.model.export_to import exported_to
from pilot.model.store import Entry

INVALID_BACKEND_HOST = "gateway-api-invalid-backend.invalid"  # never a service: its cluster never exists


def _group(g: str | None) -> str:
    return "" if g in (None, "", "core") else g


@dataclass(frozen=True)
class ReferenceGrants:
    # target namespace -> grants living there
    by_namespace: Mapping[str, tuple[Entry[ReferenceGrant], ...]]

    @classmethod
    def of(cls, grants: list[Entry[ReferenceGrant]]) -> ReferenceGrants:
        idx: dict[str, list[Entry[ReferenceGrant]]] = defaultdict(list)
        for g in grants:
            idx[g.key.namespace].append(g)
        return cls({ns: tuple(v) for ns, v in idx.items()})

    def allowed(self, from_group: str, from_kind: str, from_namespace: str,
                to_group: str, to_kind: str, to_namespace: str, to_name: str) -> bool:
        if from_namespace == to_namespace:
            return True
        for grant in self.by_namespace.get(to_namespace, ()):
            spec = grant.obj.spec
            if not any(_group(f.group) == _group(from_group) and f.kind == from_kind and f.namespace == from_namespace
                       for f in spec.from_):
                continue
            if any(_group(t.group) == _group(to_group) and t.kind == to_kind and t.name in (None, "", to_name)
                   for t in spec.to):
                return True
        return False


class _AllowAll(ReferenceGrants):
    def allowed(self, *_args) -> bool:
        return True


# Mesh (GAMMA) parents: istiod does not enforce ReferenceGrants for them.
NO_GRANTS_NEEDED: ReferenceGrants = _AllowAll({})


@dataclass(frozen=True, slots=True)
class Backend:
    """A resolved backendRef: where traffic goes, or why it cannot (then `host` is the sentinel)."""

    host: str
    port: int
    weight: int
    reason: str = ""  # "" when valid, else BackendNotFound, RefNotPermitted, InvalidKind or InvalidDestination
    message: str = ""

    @property
    def valid(self) -> bool:
        return not self.reason


# backendRef kinds istiod knows besides Service, with istiod's defaults (features.go):
# ServiceImport is the same-named Service (ENABLE_MCS_HOST off: a Service is already
# cross-cluster); InferencePool needs ENABLE_GATEWAY_API_INFERENCE_EXTENSION (off), which this
# control plane does not implement, so it is reported as istiod reports it with that flag off.
MCS_GROUP = "multicluster.x-k8s.io"
INFERENCE_GROUP = "inference.networking.k8s.io"
INFERENCE_POOL_DISABLED = ("InferencePool is not enabled. To enable, set ENABLE_GATEWAY_API_INFERENCE_EXTENSION "
                           "to true in istiod")


def hostname_visible(hostnames: Mapping[str, tuple[tuple[str, tuple[str, ...]], ...]], host: str,
                     namespace: str) -> bool:
    """istiod's LookupHostname: a ServiceEntry host (exact) exported to `namespace` (ServiceEntries
    are exported to every namespace here, exportTo `*` or unset: a narrower one is refused at parsing)."""
    return any(exported_to(export, se_namespace, namespace) for se_namespace, export in hostnames.get(host, ()))


def resolve_backend(ref, route_kind: str, route_namespace: str, services: Mapping[tuple[str, str], Entry[Service]],
                    grants: ReferenceGrants, domain: str,
                    hostnames: Mapping[str, tuple[tuple[str, tuple[str, ...]], ...]] | None = None) -> Backend:
    """`ref` is a BackendRef (or a mirror's BackendObjectReference, which has no weight). In
    istiod's order (buildDestination): the ReferenceGrant first, for whatever kind is named, then
    the kind. `hostnames`: host -> (namespace, exportTo) of the ServiceEntries declaring it, for
    backendRefs of kind Hostname (group networking.istio.io), which name a host of the registry."""
    w = getattr(ref, "weight", 1)
    port = ref.port or 0
    namespace = ref.namespace or route_namespace
    group, kind = _group(ref.group), ref.kind
    if not grants.allowed("gateway.networking.k8s.io", route_kind, route_namespace, group, kind, namespace, ref.name):
        return Backend(INVALID_BACKEND_HOST, port, w, "RefNotPermitted",
                       f"backendRef {ref.name}/{namespace} not accessible to a {route_kind} in namespace "
                       f"{route_namespace!r} (missing a ReferenceGrant?)")
    if (group, kind) == (INFERENCE_GROUP, "InferencePool"):
        return Backend(INVALID_BACKEND_HOST, port, w, "InvalidKind", INFERENCE_POOL_DISABLED)
    if (group, kind) == (ISTIO_GROUP, "Hostname"):
        if ref.namespace is not None:
            return Backend(INVALID_BACKEND_HOST, port, w, "InvalidDestination",
                           "namespace may not be set with Hostname type")
        host = ref.name
        k8s_name, _, rest = host.partition(".")
        in_cluster = rest.endswith(f".svc.{domain}") and (rest[:-len(f".svc.{domain}")], k8s_name) in services
        if not in_cluster and not hostname_visible(hostnames or {}, host, namespace):
            return Backend(INVALID_BACKEND_HOST, port, w, "BackendNotFound", f"backend({host}) not found")
        if not port:
            return Backend(INVALID_BACKEND_HOST, port, w, "InvalidDestination", "port is required in backendRef")
        return Backend(host, port, w)
    if (group, kind) not in (("", "Service"), (MCS_GROUP, "ServiceImport")):
        # XBackend (which istiod builds behind PILOT_ENABLE_ALPHA_GATEWAY_API) and anything else end here
        return Backend(INVALID_BACKEND_HOST, port, w, "InvalidKind",
                       f'referencing unsupported backendRef: group "{ref.group or ""}" kind "{ref.kind}"')
    if kind == "Service" and "." in ref.name:
        return Backend(INVALID_BACKEND_HOST, port, w, "InvalidDestination",
                       "service name invalid; the name of the Service must be used, not the hostname.")
    host = f"{ref.name}.{namespace}.svc.{domain}"
    svc = services.get((namespace, ref.name))
    if svc is None:
        return Backend(INVALID_BACKEND_HOST, port, w, "BackendNotFound", f"backend({host}) not found")
    if not port:  # a Service's port is required by the schema; a ServiceImport's only here (istiod)
        return Backend(INVALID_BACKEND_HOST, port, w, "InvalidDestination", "port is required in backendRef")
    # A port the Service does not expose is not refused (istiod's ResolvedRefs stays True): the
    # route names a cluster that does not exist, which answers 500 (refused, for TCP).
    return Backend(host, port, w)
