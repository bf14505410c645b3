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


def _service_yaml(svc: Service) -> str:
    i = svc.index
    return f"""apiVersion: v1
kind: Service
metadata: {{name: {svc.name}, namespace: {svc.namespace}}}
spec:
  clusterIP: 10.96.{i // 250}.{i % 250 + 1}
  selector: {{app: {svc.name}}}
  ports: [{{name: http, port: {PORT}, targetPort: {TARGET_PORT}}}]
"""


def _slice_yaml(svc: Service, generation: int) -> str:
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
ports: [{{name: http, port: {TARGET_PORT}}}]
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


class MeshFiles:
    """Writes and mutates the mesh; every write is atomic (rename), as kubectl-like tools do."""

    def __init__(self, root: Path, services: int, namespaces: int) -> None:
        self.root = root
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
            self._write(f"services/{svc.name}.yaml", _service_yaml(svc))
            self._write(f"endpoints/{svc.name}.yaml", _slice_yaml(svc, 0))

    def bump_connect_timeout(self) -> None:
        """A mesh-wide change: every outbound cluster's bytes change, so every proxy gets new CDS."""
        self._connect_timeout_ms += 100
        self._write("mesh-config.yaml", _mesh_yaml(self._connect_timeout_ms))

    def move_endpoint(self, svc: Service) -> None:
        """An endpoint-only change of one service: the EDS path, one ClusterLoadAssignment."""
        gen = self._generation.get(svc.index, 0) + 1
        self._generation[svc.index] = gen
        self._write(f"endpoints/{svc.name}.yaml", _slice_yaml(svc, gen))

    def _write(self, name: str, text: str) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        # A dot-file is ignored by the file source, so the half-written temp file is never read.
        tmp = path.parent / f".{path.name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)
