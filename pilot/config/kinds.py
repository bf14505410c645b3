"""The registry of kinds the control plane understands: API group/version, plural and model."""

from __future__ import annotations

from dataclasses import dataclass

from pilot.config.base import K8sObject
from pilot.config.core import ConfigMap, EndpointSlice, Namespace, Node, Pod, Secret, Service
from pilot.config.extensions import VERSIONS as EXTENSIONS_VERSIONS
from pilot.config.extensions import WasmPlugin
from pilot.config.gateway_api import (
    BackendTLSPolicy,
    GatewayClass,
    GRPCRoute,
    HTTPRoute,
    KubernetesGateway,
    ListenerSet,
    ReferenceGrant,
    TCPRoute,
    TLSRoute,
)
from pilot.config.ingress import Ingress, IngressClass
from pilot.config.networking import (
    DestinationRule,
    EnvoyFilter,
    Gateway,
    ProxyConfig,
    ServiceEntry,
    Sidecar,
    VirtualService,
    WorkloadEntry,
    WorkloadGroup,
)
from pilot.config.security import VERSIONS as SECURITY_VERSIONS
from pilot.config.security import AuthorizationPolicy, PeerAuthentication, RequestAuthentication
from pilot.config.telemetry import VERSIONS as TELEMETRY_VERSIONS
from pilot.config.telemetry import Telemetry


@dataclass(frozen=True)
class Kind:
    group: str
    versions: tuple[str, ...]
    kind: str
    plural: str
    namespaced: bool
    model: type[K8sObject]

    def accepts(self, api_version: str) -> bool:
        group, _, version = api_version.rpartition("/")
        return group == self.group and version in self.versions

    @property
    def config_kind(self) -> str:
        """The Store's name for it (ConfigKey.kind): the wire kind unless that is ambiguous."""
        return self.model.CONFIG_KIND or self.kind

    @property
    def api_version(self) -> str:
        """The version we read and write (the first one listed)."""
        return f"{self.group}/{self.versions[0]}" if self.group else self.versions[0]

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """REST path: the collection across namespaces, in one namespace, or one object."""
        base = f"/apis/{self.group}/{self.versions[0]}" if self.group else f"/api/{self.versions[0]}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


# What istio 1.30's CRDs serve (manifests/charts/base/files/crd-all.gen.yaml).
ISTIO_VERSIONS = ("v1", "v1beta1", "v1alpha3")
GW = "gateway.networking.k8s.io"

KINDS: tuple[Kind, ...] = (
    Kind("", ("v1",), "Service", "services", True, Service),
    Kind("discovery.k8s.io", ("v1",), "EndpointSlice", "endpointslices", True, EndpointSlice),
    Kind("", ("v1",), "Pod", "pods", True, Pod),
    Kind("", ("v1",), "Namespace", "namespaces", False, Namespace),
    Kind("", ("v1",), "ConfigMap", "configmaps", True, ConfigMap),
    Kind("", ("v1",), "Node", "nodes", False, Node),
    Kind("", ("v1",), "Secret", "secrets", True, Secret),
    # Ingress of class `istio`, translated to gateway config (pilot/model/ingress.py).
    Kind("networking.k8s.io", ("v1",), "Ingress", "ingresses", True, Ingress),
    Kind("networking.k8s.io", ("v1",), "IngressClass", "ingressclasses", False, IngressClass),
    # networking.istio.io: v1 is read and written; v1beta1 and v1alpha3 serve the same schema.
    Kind("networking.istio.io", ISTIO_VERSIONS, "VirtualService", "virtualservices", True, VirtualService),
    Kind("networking.istio.io", ISTIO_VERSIONS, "DestinationRule", "destinationrules", True, DestinationRule),
    Kind("networking.istio.io", ISTIO_VERSIONS, "ServiceEntry", "serviceentries", True, ServiceEntry),
    Kind("networking.istio.io", ISTIO_VERSIONS, "WorkloadEntry", "workloadentries", True, WorkloadEntry),
    Kind("networking.istio.io", ISTIO_VERSIONS, "WorkloadGroup", "workloadgroups", True, WorkloadGroup),
    Kind("networking.istio.io", ISTIO_VERSIONS, "Sidecar", "sidecars", True, Sidecar),
    Kind("networking.istio.io", ISTIO_VERSIONS, "Gateway", "gateways", True, Gateway),
    # EnvoyFilter is served as v1alpha3 only (istio never promoted it).
    Kind("networking.istio.io", ("v1alpha3",), "EnvoyFilter", "envoyfilters", True, EnvoyFilter),
    # ProxyConfig is served as v1beta1 only.
    Kind("networking.istio.io", ("v1beta1",), "ProxyConfig", "proxyconfigs", True, ProxyConfig),
    # security.istio.io: v1 is read and written; v1beta1 serves the same schema.
    Kind("security.istio.io", SECURITY_VERSIONS, "PeerAuthentication", "peerauthentications", True,
         PeerAuthentication),
    Kind("security.istio.io", SECURITY_VERSIONS, "AuthorizationPolicy", "authorizationpolicies", True,
         AuthorizationPolicy),
    Kind("security.istio.io", SECURITY_VERSIONS, "RequestAuthentication", "requestauthentications", True,
         RequestAuthentication),
    # telemetry.istio.io: v1 is read and written; v1alpha1 serves the same schema.
    Kind("telemetry.istio.io", TELEMETRY_VERSIONS, "Telemetry", "telemetries", True, Telemetry),
    # extensions.istio.io: v1alpha1 is the only version istio serves.
    Kind("extensions.istio.io", EXTENSIONS_VERSIONS, "WasmPlugin", "wasmplugins", True, WasmPlugin),
    # gateway.networking.k8s.io: every version Gateway API v1.5 and v1.6 serve (standard and
    # experimental channels; the schemas agree for what is modelled), plus GRPCRoute v1alpha2 that
    # older releases served. The first one listed is watched and written. The Gateway is filed as
    # `KubernetesGateway` (Kind.config_kind), apart from Istio's Gateway.
    Kind(GW, ("v1", "v1beta1"), "GatewayClass", "gatewayclasses", False, GatewayClass),
    Kind(GW, ("v1", "v1beta1"), "Gateway", "gateways", True, KubernetesGateway),
    # Standard (v1) since v1.5; istiod reads only this version (not the older XListenerSet).
    Kind(GW, ("v1",), "ListenerSet", "listenersets", True, ListenerSet),
    Kind(GW, ("v1", "v1beta1"), "HTTPRoute", "httproutes", True, HTTPRoute),
    Kind(GW, ("v1", "v1alpha2"), "GRPCRoute", "grpcroutes", True, GRPCRoute),
    # v1alpha2 is what v1.5 (experimental) serves; v1.6 adds v1.
    Kind(GW, ("v1alpha2", "v1"), "TCPRoute", "tcproutes", True, TCPRoute),
    # v1.5 and v1.6 serve v1 in both channels, v1alpha2/v1alpha3 in experimental only.
    Kind(GW, ("v1alpha2", "v1", "v1alpha3"), "TLSRoute", "tlsroutes", True, TLSRoute),
    Kind(GW, ("v1beta1", "v1"), "ReferenceGrant", "referencegrants", True, ReferenceGrant),
    # v1 only, as istiod reads it (v1.5's experimental channel also serves v1alpha3, which istio
    # does not watch).
    Kind(GW, ("v1",), "BackendTLSPolicy", "backendtlspolicies", True, BackendTLSPolicy),
)

# By Store name (Kind.config_kind): one wire kind may be served by two groups (Gateway).
BY_NAME: dict[str, Kind] = {k.config_kind: k for k in KINDS}


def lookup(api_version: str, kind: str) -> Kind | None:
    for k in KINDS:
        if k.kind == kind and k.accepts(api_version):
            return k
    return None


def by_wire_kind(kind: str) -> list[Kind]:
    return [k for k in KINDS if k.kind == kind]
