"""Which MeshConfig is in force: the `istio` ConfigMap's `mesh` key (`istio-REV` with a REVISION)
when present, else the file.

An invalid ConfigMap is rejected with its reason and the last good MeshConfig stays in force, so
a typo in the mesh config never takes the whole mesh down. The ConfigMap's `meshNetworks` key
(pilot/config/mesh_networks.py) is held beside it, refused and kept the same way; its version is
part of the mesh version, so a change of the networks regenerates everything, as istiod's forced
push on a networks change. Fields that are not applied (unknown,
or istio fields declared unsupported) are tolerated as istiod tolerates them: logged once at
warning when the MeshConfig in force starts naming them, and listed by `unsupported`.
"""

from __future__ import annotations

import hashlib

from pilot import logging as plog
from pilot.config.core import ConfigMap
from pilot.config.mesh import MeshConfig, MeshConfigError, parse_mesh_config
from pilot.config.mesh_networks import NO_MESH_NETWORKS, MeshNetworks, MeshNetworksError, parse_mesh_networks
from pilot.config.validation import Rejection
from pilot.model.revisions import suffix
from pilot.model.store import ConfigKey, Store

MESH_CONFIGMAP = "istio"
MESH_KEY = "mesh"
NETWORKS_KEY = "meshNetworks"

log = plog.get("mesh")


def mesh_version(mesh: MeshConfig, networks: MeshNetworks = NO_MESH_NETWORKS) -> str:
    text = mesh.model_dump_json() + (networks.model_dump_json() if networks.networks else "")
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


class MeshHolder:
    def __init__(self, file_mesh: MeshConfig, system_namespace: str, revision: str = "") -> None:
        self.file_mesh = file_mesh
        self.system_namespace = system_namespace
        # istiod's name: `istio`, or `istio-REV` for a named revision (bootstrap/mesh.go).
        self.configmap_name = MESH_CONFIGMAP + suffix(revision)
        self.current = file_mesh
        self.networks = NO_MESH_NETWORKS
        self.version = mesh_version(file_mesh)
        self.source = "file"
        self.unsupported: tuple[str, ...] = ()
        self._note_unsupported(file_mesh.unsupported)

    def _note_unsupported(self, paths: tuple[str, ...]) -> None:
        """One warning when the set of ignored fields changes (at start, and on an edit)."""
        if paths and paths != self.unsupported:
            log.warning("MeshConfig fields not supported by this control plane are ignored",
                        source=self.source, fields=list(paths))
        self.unsupported = paths

    @property
    def configmap_key(self) -> ConfigKey:
        return ConfigKey("ConfigMap", self.system_namespace, self.configmap_name)

    def peek(self, store: Store) -> MeshConfig:
        """The MeshConfig the Store holds right now (before the next push applies it)."""
        entry = store.get(self.configmap_key, ConfigMap)
        if entry is None:
            return self.file_mesh
        try:
            return parse_mesh_config(entry.obj.data.get(MESH_KEY, ""))
        except MeshConfigError:
            return self.current

    def refresh(self, store: Store) -> bool:
        """Re-read the ConfigMap; return True when the MeshConfig in force changed."""
        entry = store.get(self.configmap_key, ConfigMap)
        if entry is None:
            mesh, source, networks = self.file_mesh, "file", NO_MESH_NETWORKS
            unsupported = mesh.unsupported
            store.set_rejections("meshconfig", [])
        else:
            data = entry.obj.data
            try:
                mesh = parse_mesh_config(data.get(MESH_KEY, ""))
                networks = parse_mesh_networks(str(data.get(NETWORKS_KEY) or ""))
                source = f"configmap {self.system_namespace}/{MESH_CONFIGMAP}"
                store.set_rejections("meshconfig", [])
            except (MeshConfigError, MeshNetworksError) as e:
                store.set_rejections("meshconfig", [Rejection(
                    entry.source, "ConfigMap", self.system_namespace, MESH_CONFIGMAP, str(e))])
                return False
            unsupported = mesh.unsupported
        version = mesh_version(mesh, networks)
        changed = version != self.version
        self.current, self.networks, self.version, self.source = mesh, networks, version, source
        self._note_unsupported(unsupported)
        return changed
