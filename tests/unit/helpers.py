"""Builders shared by the unit tests: real config objects, a Store-backed world, proxies.

Objects are made from the same dicts a user writes in YAML and go through the real validation
(`parse_object`), so the tests exercise the paths a user's config takes.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from pilot.config.mesh import MeshConfig
from pilot.config.validation import parse_object
from pilot.model.mesh import MeshHolder
from pilot.model.proxy import Proxy, parse_node_id
from pilot.model.push_context import PushContext
from pilot.model.store import Store
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import cds, eds, lds, rds

DOMAIN = "cluster.local"
SYSTEM_NS = "istio-system"


def service(name: str, namespace: str = "default", *, cluster_ip: str | None = "10.96.0.20",
            ports: list[dict] | None = None) -> dict:
    spec: dict[str, Any] = {"ports": ports if ports is not None else
                            [{"name": "http", "port": 9080, "targetPort": 9080}]}
    if cluster_ip is not None:
        spec["clusterIP"] = cluster_ip
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def endpoint_slice(name: str, service_name: str, namespace: str = "default", *,
                   addresses: tuple[str, ...] = ("10.1.0.1",), port: int | None = 19080,
                   port_name: str = "http", ready: bool | None = True, zone: str | None = "zone-a") -> dict:
    ep: dict[str, Any] = {"addresses": list(addresses)}
    if ready is not None:
        ep["conditions"] = {"ready": ready}
    if zone is not None:
        ep["zone"] = zone
    doc: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": service_name}},
        "addressType": "IPv4", "endpoints": [ep]}
    if port is not None:
        doc["ports"] = [{"name": port_name, "port": port}]
    return doc


def pod(name: str, namespace: str = "default", ip: str = "10.1.0.9") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"serviceAccountName": "default"}, "status": {"podIP": ip, "phase": "Running"}}


def mesh_configmap(mesh: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": SYSTEM_NS},
            "data": {"mesh": yaml.safe_dump(mesh)}}


def modified(doc: dict, **path_values: Any) -> dict:
    """A deep copy of `doc` with dotted paths set, e.g. modified(d, **{"spec.clusterIP": "1.2.3.4"})."""
    out = copy.deepcopy(doc)
    for path, value in path_values.items():
        target = out
        parts = path.split(".")
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        last = parts[-1]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return out


def proxy(namespace: str = "default", *, pod_name: str = "app-1", ip: str = "10.0.0.1",
          interception: str | None = "NONE", generator: str | None = None, ptype: str = "sidecar") -> Proxy:
    node_id = f"{ptype}~{ip}~{pod_name}.{namespace}~{namespace}.svc.{DOMAIN}"
    t, ips, pod_, ns, domain = parse_node_id(node_id)
    meta: dict[str, Any] = {"NAMESPACE": namespace}
    if interception is not None:
        meta["INTERCEPTION_MODE"] = interception
    if generator is not None:
        meta["GENERATOR"] = generator
    return Proxy(node_id, t, ips, pod_, ns, domain, f"app.{namespace}", meta)


class World:
    """A Store, a MeshHolder and one XdsCache; `ctx()` builds the next PushContext, as a push does."""

    def __init__(self, file_mesh: MeshConfig | None = None) -> None:
        self.store = Store()
        self.mesh = MeshHolder(file_mesh or MeshConfig(), SYSTEM_NS)
        self.cache = XdsCache()
        self._seq = 0

    def apply(self, *docs: dict) -> None:
        for d in docs:
            self.store.apply(parse_object(d), source="test")

    def ctx(self) -> PushContext:
        self._seq += 1
        self.mesh.refresh(self.store)
        return PushContext.build(self.store, self.mesh.current, self.mesh.version, DOMAIN, f"v{self._seq}",
                                 mesh_networks=self.mesh.networks, system_namespace=SYSTEM_NS)

    # One call per xDS type, returning name -> CachedResource.
    def cds(self, p: Proxy, ctx: PushContext | None = None, names: set[str] | None = None) -> dict[str, CachedResource]:
        return _by_name(cds.generate(ctx or self.ctx(), p, frozenset(names) if names else None, self.cache))

    def eds(self, p: Proxy, names: set[str], ctx: PushContext | None = None) -> dict[str, CachedResource]:
        return _by_name(eds.generate(ctx or self.ctx(), p, frozenset(names), self.cache))

    def lds(self, p: Proxy, ctx: PushContext | None = None, names: set[str] | None = None) -> dict[str, CachedResource]:
        return _by_name(lds.generate(ctx or self.ctx(), p, frozenset(names) if names else None, self.cache))

    def rds(self, p: Proxy, names: set[str], ctx: PushContext | None = None) -> dict[str, CachedResource]:
        return _by_name(rds.generate(ctx or self.ctx(), p, frozenset(names), self.cache))


def _by_name(resources: list[CachedResource]) -> dict[str, CachedResource]:
    out = {r.name: r for r in resources}
    assert len(out) == len(resources), f"duplicate resource names: {[r.name for r in resources]}"
    return out
