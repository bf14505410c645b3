"""Security policies for tests: the dicts a user writes, and the WorkloadPolicies the real
validation, Store and SecurityIndex make of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pilot.config.validation import parse_object
from pilot.model.security_policies import JwksSnapshot, SecurityIndex, WorkloadPolicies
from pilot.model.store import Store

ROOT_NS = "istio-system"
API = "security.istio.io/v1"


def _doc(kind: str, name: str, namespace: str, spec: dict, annotations: Mapping[str, str] | None = None,
         created: str = "") -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    if created:
        meta["creationTimestamp"] = created
    return {"apiVersion": API, "kind": kind, "metadata": meta, "spec": spec}


def authz(name: str, namespace: str = "default", *, annotations: Mapping[str, str] | None = None,
          created: str = "", **spec: Any) -> dict:
    return _doc("AuthorizationPolicy", name, namespace, spec, annotations, created)


def peer_authn(name: str, namespace: str = "default", *, created: str = "", **spec: Any) -> dict:
    return _doc("PeerAuthentication", name, namespace, spec, None, created)


def request_authn(name: str, namespace: str = "default", *, created: str = "", **spec: Any) -> dict:
    return _doc("RequestAuthentication", name, namespace, spec, None, created)


def store_of(*docs: dict) -> Store:
    store = Store()
    for d in docs:
        store.apply(parse_object(d), source="test")
    return store


def index_of(*docs: dict, jwks: Mapping[str, str] | None = None) -> SecurityIndex:
    return SecurityIndex.build(store_of(*docs), ROOT_NS, JwksSnapshot(keys=dict(jwks or {})))


def workload_policies(*docs: dict, namespace: str = "default", labels: Mapping[str, str] | None = None,
                      jwks: Mapping[str, str] | None = None) -> WorkloadPolicies:
    return index_of(*docs, jwks=jwks).for_workload(namespace, labels or {"app": "web"})
