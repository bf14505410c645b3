"""Kubernetes Ingress and IngressClass (networking.k8s.io/v1) as istiod reads them: the Ingresses
this control plane processes (MeshConfig ingressClass / ingressControllerMode, or an IngressClass
whose controller is `istio.io/ingress-controller`; pilot/model/ingress.py) become gateway config
for the ingress gateway. Only the fields istiod translates are accepted; a field it cannot honour
is refused by name."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pilot.config.base import K8sObject, Model, Unsupported

CLASS_ANNOTATION = "kubernetes.io/ingress.class"
# An IngressClass naming this controller selects its Ingresses for this control plane (istiod's
# IstioIngressController).
INGRESS_CONTROLLER = "istio.io/ingress-controller"


class ServiceBackendPort(Model):
    number: int | None = Field(default=None, ge=1, le=65535)
    name: str | None = None

    @model_validator(mode="after")
    def _one(self) -> ServiceBackendPort:
        if (self.number is None) == (self.name is None):
            raise ValueError("port: exactly one of number or name is required")
        return self


class IngressServiceBackend(Model):
    name: str = Field(min_length=1)
    port: ServiceBackendPort


class IngressBackend(Model):
    service: IngressServiceBackend | None = None
    # A backend that is not a Service (a CRD object) has no Envoy meaning: refused.
    resource: Unsupported = None

    @model_validator(mode="after")
    def _service(self) -> IngressBackend:
        if self.service is None:
            raise ValueError("backend: service is required")
        return self


class HTTPIngressPath(Model):
    path: str = ""
    path_type: Literal["Exact", "Prefix", "ImplementationSpecific"] = "ImplementationSpecific"
    backend: IngressBackend

    @model_validator(mode="after")
    def _absolute(self) -> HTTPIngressPath:
        if self.path and not self.path.startswith("/"):
            raise ValueError(f"path: {self.path!r} must be absolute")
        return self


class HTTPIngressRuleValue(Model):
    paths: list[HTTPIngressPath] = Field(min_length=1)


class IngressRule(Model):
    host: str = ""
    http: HTTPIngressRuleValue | None = None


class IngressTLS(Model):
    hosts: list[str] = Field(default_factory=list)
    secret_name: str = ""


class IngressSpec(Model):
    ingress_class_name: str | None = None
    default_backend: IngressBackend | None = None
    tls: list[IngressTLS] = Field(default_factory=list)
    rules: list[IngressRule] = Field(default_factory=list)


class Ingress(K8sObject):
    """`status` is what the leader last wrote (status.loadBalancer), kept for the status writer
    to compare against and ignored by `spec_equal`: a status write is never a config change."""

    kind: Literal["Ingress"] = "Ingress"
    spec: IngressSpec = Field(default_factory=IngressSpec)
    status: dict[str, Any] = Field(default_factory=dict,
                                   description="status.loadBalancer written by the leader (MeshConfig ingressService)")

    @property
    def class_annotation(self) -> str | None:
        return self.metadata.annotations.get(CLASS_ANNOTATION)

    def spec_equal(self, other: K8sObject) -> bool:
        # The class annotation decides whether the Ingress is processed at all (the base
        # comparison keeps only istio.io annotations).
        if not isinstance(other, Ingress) or self.class_annotation != other.class_annotation:
            return False
        ignore: dict[str, Any] = {"status": True,
                                  "metadata": {"resource_version", "uid", "generation", "annotations",
                                               "creation_timestamp"}}
        return self.model_dump(exclude=ignore) == other.model_dump(exclude=ignore)


class IngressClassSpec(Model):
    controller: str = ""
    # Read by no part of istiod: refused for our controller's classes (never silently ignored),
    # left alone on other controllers' classes (not ours to judge).
    parameters: dict[str, Any] | None = Field(
        default=None, description="refused on classes of istio.io/ingress-controller (istiod reads none); "
                                  "other controllers' classes are theirs")

    @model_validator(mode="after")
    def _parameters(self) -> IngressClassSpec:
        if self.controller == INGRESS_CONTROLLER and self.parameters is not None:
            raise ValueError(f"parameters: not supported for controller {INGRESS_CONTROLLER} "
                             "(istiod reads no IngressClass parameters)")
        return self


class IngressClass(K8sObject):
    """Cluster-scoped. An Ingress naming it by spec.ingressClassName is processed when its
    controller is `istio.io/ingress-controller` (the annotation, when set, wins)."""

    kind: Literal["IngressClass"] = "IngressClass"
    spec: IngressClassSpec = Field(default_factory=IngressClassSpec)

    @property
    def ours(self) -> bool:
        return self.spec.controller == INGRESS_CONTROLLER
