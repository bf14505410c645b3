"""The benchmark mesh as files in the server's --configDir: S services, each with one HTTP port and
an EndpointSlice of 5 endpoints, spread over a few namespaces, plus the `istio` mesh ConfigMap.

One file per object, because the file source re-parses only files whose (mtime, size) changed:
a change to one EndpointSlice then costs the server one small YAML parse, as a Kubernetes watch
event would, instead of a re-parse of the whole mesh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PORT = 8080  # every service on one HTTP port: one listener, one route config per namespace
TARGET_PORT = 9080
ENDPOINTS_PER_SERVICE = 5
SYSTEM_NAMESPACE = "istio-system"


@dataclass(frozen=True)
class Service:
    index: int
    name: str
    namespace: str

    @property
    def host(self) -> str:
        return f"{self.name}.{self.namespace}.svc.cluster.local"

    @property
    def cluster(self) -> str:
        """The outbound cluster name (and EDS resource name) the server gives this service."""
        return f"outbound|{PORT}||{self.host}"


def namespace(i: int) -> str:
    return f"ns{i}"


def _service_yaml(svc: Service, ip_block: int = 96, port_name: str = "http") -> str:
    i = svc.index
    return f"""apiVersion: v1
kind: Service
metadata: {{name: {svc.name}, namespace: {svc.namespace}}}
spec:
  clusterIP: 10.{ip_block}.{i // 250}.{i % 250 + 1}
  selector: {{app: {svc.name}}}
  ports: [{{name: {port_name}, port: {PORT}, targetPort: {TARGET_PORT}}}]
"""


def _slice_yaml(svc: Service, generation: int, port_name: str = "http") -> str:
    # The generation moves the first endpoint, so every change is a real change of the CLA bytes.
    i = svc.index
    addrs = [f"10.{(i // 250) % 250 + 1}.{i % 250}.{(generation + k) % 250 + 1}"
             for k in range(ENDPOINTS_PER_SERVICE)]
    endpoints = "\n".join(f'- addresses: ["{a}"]\n  conditions: {{ready: true}}\n  zone: zone-{k % 3}'
                          for k, a in enumerate(addrs))
    return f"""apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {svc.name}-1
  namespace: {svc.namespace}
  labels: {{kubernetes.io/service-name: {svc.name}}}
addressType: IPv4
ports: [{{name: {port_name}, port: {TARGET_PORT}}}]
endpoints:
{endpoints}
"""


def _mesh_yaml(connect_timeout_ms: int) -> str:
    return f"""apiVersion: v1
kind: ConfigMap
metadata: {{name: istio, namespace: {SYSTEM_NAMESPACE}}}
data:
  mesh: |
    trustDomain: cluster.local
    connectTimeout: {connect_timeout_ms}ms
"""


def _selective_filter(k: int, ns: str, svc: Service) -> str:
    return f"""apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: selective-{k}, namespace: {ns}}}
spec:
  workloadSelector: {{labels: {{bench-workload: w{k}}}}}
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {{name: envoy.filters.http.router}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          inlineCode: "function envoy_on_response(h) h:headers():add('x-bench', '{k}') end"
  - applyTo: CLUSTER
    match: {{context: SIDECAR_OUTBOUND, cluster: {{service: {svc.host}}}}}
    patch: {{operation: MERGE, value: {{per_connection_buffer_limit_bytes: {65536 + k}}}}}
"""


def _mesh_filter(j: int, svc: Service) -> str:
    if j % 2 == 0:
        patch = f"""  - applyTo: CLUSTER
    match: {{context: SIDECAR_OUTBOUND, cluster: {{service: {svc.host}}}}}
    patch: {{operation: MERGE, value: {{per_connection_buffer_limit_bytes: {131072 + j}}}}}
"""
    else:
        patch = f"""  - applyTo: ROUTE_CONFIGURATION
    match: {{context: SIDECAR_OUTBOUND}}
    patch:
      operation: MERGE
      value: {{response_headers_to_add: [{{header: {{key: x-mesh-{j}, value: "1"}}}}]}}
"""
    return f"""apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: mesh-{j}, namespace: {SYSTEM_NAMESPACE}}}
spec:
  priority: {j}
  configPatches:
{patch}"""


class MeshFiles:
    """Writes and mutates the mesh; every write is atomic (rename), as kubectl-like tools do."""

    def __init__(self, root: Path, services: int, namespaces: int, port_name: str = "http") -> None:
        self.root = root
        # `http` (HTTP by its name) or a name without a protocol prefix (`web`: sniffed, istiod's
        # ListenerProtocolAuto), on the Service port and its EndpointSlice port alike.
        self.port_name = port_name
        self.namespaces = max(1, namespaces)
        self.services = [Service(i, f"svc-{i}", namespace(i % self.namespaces)) for i in range(services)]
        self._generation: dict[int, int] = {}
        self._connect_timeout_ms = 5000

    def write_all(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._write("mesh-config.yaml", _mesh_yaml(self._connect_timeout_ms))
        namespaces = [SYSTEM_NAMESPACE] + [namespace(n) for n in range(self.namespaces)]
        self._write("namespaces.yaml", "\n---\n".join(
            f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n" for ns in namespaces))
        for svc in self.services:
            self._write(f"services/{svc.name}.yaml", _service_yaml(svc, port_name=self.port_name))
            self._write(f"endpoints/{svc.name}.yaml", _slice_yaml(svc, 0, self.port_name))

    def write_envoy_filters(self, selective: int, mesh_wide: int) -> list[str]:
        """EnvoyFilters: `selective` ones each selecting one `bench-workload` label in its
        namespace (a few proxies: see benchmarks/proxy.py), inserting a Lua HTTP filter before the
        router and merging a field into one service's cluster; `mesh_wide` ones in the root
        namespace without a selector, alternately merging into one service's cluster and adding
        a response header to every route configuration. Returns the files written."""
        names = []
        services = self.services or [Service(0, "svc-0", namespace(0))]
        for k in range(selective):
            svc = services[k % len(services)]
            ns = namespace(k % self.namespaces)
            names.append(self._write(f"envoyfilters/selective-{k}.yaml", _selective_filter(k, ns, svc)))
        for j in range(mesh_wide):
            svc = services[(j * 7 + 3) % len(services)]
            names.append(self._write(f"envoyfilters/mesh-{j}.yaml", _mesh_filter(j, svc)))
        return names

    def bump_connect_timeout(self) -> None:
        """A mesh-wide change: every outbound cluster's bytes change, so every proxy gets new CDS."""
        self._connect_timeout_ms += 100
        self._write("mesh-config.yaml", _mesh_yaml(self._connect_timeout_ms))

    def move_endpoint(self, svc: Service) -> None:
        """An endpoint-only change of one service: the EDS path, one ClusterLoadAssignment."""
        gen = self._generation.get(svc.index, 0) + 1
        self._generation[svc.index] = gen
        self._write(f"endpoints/{svc.name}.yaml", _slice_yaml(svc, gen, self.port_name))

    def add_service(self) -> Service:
        """A new Service with its EndpointSlice: a new cluster, endpoint set and virtual host."""
        svc = Service(len(self.services), f"svc-{len(self.services)}", namespace(len(self.services) % self.namespaces))
        self.services.append(svc)
        self._write(f"services/{svc.name}.yaml", _service_yaml(svc, port_name=self.port_name))
        self._write(f"endpoints/{svc.name}.yaml", _slice_yaml(svc, 0, self.port_name))
        return svc

    def move_cluster_ip(self, svc: Service) -> None:
        """A change of one Service that only its virtual host reads (the cluster IP is one of
        its domains): the route configuration of its port changes, nothing else."""
        self._write(f"services/{svc.name}.yaml", _service_yaml(svc, ip_block=97, port_name=self.port_name))

    def remove_service(self, svc: Service) -> None:
        """The Service and its EndpointSlice deleted: a cluster, an endpoint set and a virtual host go."""
        for name in (f"services/{svc.name}.yaml", f"endpoints/{svc.name}.yaml"):
            (self.root / name).unlink()
        self.services.remove(svc)

    def _write(self, name: str, text: str) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        # A dot-file is ignored by the file source, so the half-written temp file is never read.
        tmp = path.parent / f".{path.name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)
        return name
