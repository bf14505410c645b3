"""URL routing: a request path to a ``_Route`` (discovery, health, a resource collection,
object or subresource), and classifying a request into a kube verb for the request log.

``Router`` is a mixin of ``FakeApiServer``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .common import parse_bool
from .faults import RequestInfo
from .resources import ResourceType, _unknown_resource


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


class Router:
    """Path routing against the served resource types (a FakeApiServer mixin)."""

    _types: dict[tuple[str, str, str], ResourceType]

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
