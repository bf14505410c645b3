"""Kubernetes Ingress (networking.k8s.io/v1) as istiod reads it: the Ingresses of class `istio`
become gateway config for the ingress gateway (pilot/model/ingress.py). Only the fields istiod
translates are accepted; a field it cannot honour is refused by name."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pilot.config.base import K8sObject, Model, Unsupported

# The class that names this control plane (istiod's default MeshConfig ingressClass).
INGRESS_CLASS = "istio"
CLASS_ANNOTATION = "kubernetes.io/ingress.class"


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
    kind: Literal["Ingress"] = "Ingress"
    spec: IngressSpec = Field(default_factory=IngressSpec)

    @property
    def ours(self) -> bool:
        """Of class `istio` (spec.ingressClassName or the older annotation), as istiod's
        default strict mode reads it: an Ingress naming no class is not ours."""
        if self.spec.ingress_class_name is not None:
            return self.spec.ingress_class_name == INGRESS_CLASS
        return self.metadata.annotations.get(CLASS_ANNOTATION) == INGRESS_CLASS
