"""AdmissionReview v1 documents as the apiserver sends them for a Pod CREATE, Pods as a
Deployment's ReplicaSet creates them, and the JSONPatch of an answer applied with the real
`jsonpatch` library."""

from __future__ import annotations

import base64
import copy
import json
import uuid
from typing import Any

import jsonpatch


def deployment_pod(
    name: str = "web",
    namespace: str = "shop",
    *,
    labels: dict | None = None,
    annotations: dict | None = None,
    containers: list[dict] | None = None,
    init_containers: list[dict] | None = None,
    service_account: str = "web",
    **spec: Any,
) -> dict[str, Any]:
    """A Pod as the ReplicaSet controller of Deployment `name` creates it (generateName, no name yet,
    the owner reference, pod-template-hash), with one nginx container unless told otherwise."""
    rs = f"{name}-7d9f8b6c4d"
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{rs}-",
            "namespace": namespace,
            "labels": {"app": name, "pod-template-hash": "7d9f8b6c4d", **(labels or {})},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": rs,
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {}},
                }
            ],
        },
        "spec": {
            "serviceAccountName": service_account,
            "containers": containers
            if containers is not None
            else [
                {
                    "name": name,
                    "image": "nginx:1.27",
                    "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                }
            ],
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            **spec,
        },
    }
    if annotations:
        pod["metadata"]["annotations"] = dict(annotations)
    if init_containers is not None:
        pod["spec"]["initContainers"] = init_containers
    return pod


def review_request(pod: dict[str, Any], namespace: str | None = None, *, operation: str = "CREATE") -> dict:
    ns = namespace or pod.get("metadata", {}).get("namespace", "default")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns,
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": copy.deepcopy(pod),
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def patch_ops(response: dict) -> list[dict]:
    r = response["response"]
    assert r["allowed"] is True, r
    assert r.get("patchType") == "JSONPatch", r
    return json.loads(base64.b64decode(r["patch"]))


def apply(response: dict, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod the apiserver stores: the answer's JSONPatch applied to the pod it was sent."""
    return jsonpatch.apply_patch(copy.deepcopy(pod), patch_ops(response))


def container(pod: dict, name: str, field: str = "containers") -> dict:
    (c,) = [c for c in pod["spec"].get(field) or [] if c["name"] == name]
    return c


def env(c: dict) -> dict[str, Any]:
    """name -> value (or the valueFrom mapping)."""
    return {e["name"]: e["value"] if "value" in e else e.get("valueFrom") for e in c.get("env") or []}
