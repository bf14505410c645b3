"""The Kubernetes source: one informer per kind, all feeding the same Store as the file source.

MeshConfig `discoverySelectors` limit which namespaces' Services, EndpointSlices and Pods reach
the Store, as in istiod; when the selectors (or a namespace's labels) change, the informers
re-apply their cached objects, with no restart and no extra LIST.

With a REVISION, config objects (Istio's kinds and Gateway API's, except Gateways) labelled
`istio.io/rev` for another revision never reach the Store, as istiod's crdclient filters them
(pilot/model/revisions.py); Gateways are read by every revision, as in istiod.
"""

from __future__ import annotations

import asyncio

from pilot import logging as plog
from pilot.config.base import K8sObject
from pilot.config.kinds import BY_NAME, Kind
from pilot.config.mesh import LabelSelector
from pilot.model.revisions import labels_in_revision
from pilot.model.store import ConfigKey, Event, Store
from pilot.sources.kube.client import Kube
from pilot.sources.kube.informer import Informer

log = plog.get("kube")

# Kinds whose objects are limited to selected namespaces.
SELECTED_KINDS = ("Service", "EndpointSlice", "Pod")
# Everything the control plane lists and watches. The RBAC in deploy/ is derived from this.
WATCHED_KINDS = ("Namespace", "Service", "EndpointSlice", "Pod", "Node", "ConfigMap", "Secret",
                 "Ingress", "IngressClass", "VirtualService", "DestinationRule", "ServiceEntry", "WorkloadEntry", "Sidecar", "Gateway",
                 "EnvoyFilter", "ProxyConfig", "WorkloadGroup",
                 "PeerAuthentication", "AuthorizationPolicy", "RequestAuthentication",
                 "GatewayClass", "KubernetesGateway", "ListenerSet", "HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute",
                 "ReferenceGrant", "BackendTLSPolicy", "Telemetry", "WasmPlugin")


# Gateway credentials are kubernetes.io/tls Secrets or generic (Opaque) ones with tls.crt/tls.key.
# As istiod does, the apiserver filters out the two kinds that are numerous and never credentials
# (service-account tokens, Helm release records); the Secret model keeps only TLS keys of the rest.
# Kinds istiod's config store reads (crdclient), filtered by revision; Gateways are not (istiod
# reads every Gateway and decides which are its own by revision and tags), nor ListenerSets
# (istiod emits their config from every revision; status only from their Gateway's).
CONFIG_GROUPS = ("networking.istio.io", "security.istio.io", "gateway.networking.k8s.io")
UNFILTERED_CONFIG_KINDS = ("KubernetesGateway", "ListenerSet")
FIELD_SELECTORS = {"Secret": "type!=kubernetes.io/service-account-token,type!=helm.sh/release.v1"}


def _everything(_obj: K8sObject) -> bool:
    return True


def watched_kinds() -> list[Kind]:
    return [BY_NAME[k] for k in WATCHED_KINDS]


class KubeSource:
    def __init__(self, kube: Kube, store: Store, mesh_key: ConfigKey, selectors_of=lambda: (),
                 revision: str = "") -> None:
        """`selectors_of()` returns the discoverySelectors of the MeshConfig now in the Store;
        `mesh_key` is the mesh ConfigMap, whose changes may change them. `revision` is REVISION
        ("" reads config of every revision)."""
        self.kube = kube
        self.store = store
        self.mesh_key = mesh_key
        self.selectors_of = selectors_of
        self._selectors: tuple[LabelSelector, ...] = tuple(selectors_of())
        self.informers: dict[str, Informer] = {}
        self.revision = revision
        for kind in watched_kinds():
            if kind.kind in SELECTED_KINDS:
                accept = self._in_selected_namespace
            elif kind.group in CONFIG_GROUPS and kind.config_kind not in UNFILTERED_CONFIG_KINDS:
                accept = self._in_revision
            else:
                accept = _everything
            self.informers[kind.config_kind] = Informer(kube, kind, store, accept=accept,
                                                        field_selector=FIELD_SELECTORS.get(kind.kind))
        self._tasks: list[asyncio.Task] = []
        store.subscribe(self._on_events)

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(i.run(), name=f"informer-{k}") for k, i in self.informers.items()]

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers.values()))

    def synced(self) -> tuple[bool, str]:
        pending = [k for k, i in self.informers.items() if not i.synced.is_set()]
        return (not pending, f"waiting for the first list of {', '.join(pending)}" if pending else "ok")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def latest(self, key: ConfigKey) -> K8sObject | None:
        """The latest copy of an object, as its informer last saw it (even a change the Store
        ignored, such as a status write)."""
        informer = self.informers.get(key.kind)
        return informer.objects.get(key) if informer is not None else None

    def objects_of(self, kind: str) -> list[K8sObject]:
        informer = self.informers.get(kind)
        return list(informer.objects.values()) if informer is not None else []

    def _in_revision(self, obj: K8sObject) -> bool:
        return labels_in_revision(obj.metadata.labels, self.revision)

    # --- discovery selectors ------------------------------------------------------------------
    def _in_selected_namespace(self, obj: K8sObject) -> bool:
        if not self._selectors:
            return True
        ns = self.informers["Namespace"].objects.get(ConfigKey("Namespace", "", obj.metadata.namespace))
        labels = ns.metadata.labels if ns is not None else {}
        return any(sel.matches(labels) for sel in self._selectors)

    def _on_events(self, events: list[Event]) -> None:
        """Namespace labels or the selectors themselves changed: re-filter the selected kinds."""
        mesh_changed = any(e.key == self.mesh_key for e in events)
        namespaces_changed = any(e.key.kind == "Namespace" for e in events)
        if not mesh_changed and not (namespaces_changed and self._selectors):
            return
        selectors = tuple(self.selectors_of()) if mesh_changed else self._selectors
        if selectors == self._selectors and not namespaces_changed:
            return
        self._selectors = selectors
        log.info("discovery selectors changed; re-filtering", selectors=len(selectors))
        for kind in SELECTED_KINDS:
            informer = self.informers[kind]
            if informer.synced.is_set():
                # Deferred: this runs inside a Store write, and resync writes to the Store.
                asyncio.get_running_loop().call_soon(informer.resync)
