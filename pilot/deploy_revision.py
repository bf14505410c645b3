"""The objects of one more control plane revision beside the base install:
`python -m pilot.deploy_revision canary | kubectl apply -f -`.

From deploy/ (the kustomize base, installed first: CRDs, Namespace and the default revision),
renamed and relabelled as istiod's chart does for `revision: canary`:

- ServiceAccount, ClusterRole(+Binding) and Role(+Binding) `istiod-canary[-istio-system]`;
- ConfigMaps `istio-canary` (the mesh config; proxies' discoveryAddress `istiod-canary...`) and
  `istio-sidecar-injector-canary` (pilot/inject/deploy.py);
- Deployment and Service `istiod-canary` selecting `app: istiod, istio.io/rev: canary` (the
  default revision's select `istio: pilot`, which canary pods do not carry), REVISION=canary,
  PodDisruptionBudget and HorizontalPodAutoscaler `istiod-canary`;
- MutatingWebhookConfiguration `istio-sidecar-injector-canary` (the two `rev.` webhooks) and
  ValidatingWebhookConfiguration `istio-validator-canary-istio-system`, which validates objects
  labelled `istio.io/rev: canary` only (as istiod's chart), pointing at `istiod-canary`.

Move namespaces with `kubectl label namespace NS istio.io/rev=canary` or a tag
(`pilotctl tag set ...`).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from pilot.inject.deploy import configmap, mutating_webhook_configuration
from pilot.model.revisions import REV_LABEL, is_default

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
NAMESPACE = "istio-system"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _relabel(labels: dict[str, str], revision: str) -> dict[str, str]:
    out = {k: v for k, v in labels.items() if k != "istio"}
    out[REV_LABEL] = revision
    return out


def revision_objects(revision: str) -> list[dict[str, Any]]:
    if is_default(revision):
        raise ValueError("the default revision is deploy/ itself")
    istiod = f"istiod-{revision}"
    selector = {"app": "istiod", REV_LABEL: revision}
    out: list[dict[str, Any]] = []
    for doc in _docs("serviceaccount.yaml") + _docs("rbac.yaml"):
        doc = copy.deepcopy(doc)
        meta = doc["metadata"]
        meta["name"] = f"{istiod}-{NAMESPACE}" if meta["name"] == f"istiod-{NAMESPACE}" else istiod
        meta["labels"] = _relabel(meta.get("labels") or {}, revision)
        if "roleRef" in doc:
            doc["roleRef"]["name"] = f"{istiod}-{NAMESPACE}" if doc["roleRef"]["kind"] == "ClusterRole" else istiod
            for subject in doc.get("subjects") or []:
                subject["name"] = istiod
        out.append(doc)
    (mesh,) = _docs("configmap-mesh.yaml")
    mesh = copy.deepcopy(mesh)
    mesh["metadata"]["name"] = f"istio-{revision}"
    mesh["metadata"]["labels"] = _relabel(mesh["metadata"].get("labels") or {}, revision)
    text = yaml.safe_load(mesh["data"]["mesh"]) or {}
    text.setdefault("defaultConfig", {})["discoveryAddress"] = f"{istiod}.{NAMESPACE}.svc:15012"
    mesh["data"]["mesh"] = yaml.safe_dump(text, sort_keys=False)
    out += [mesh, _plain(configmap(revision))]
    (deployment,) = copy.deepcopy(_docs("deployment.yaml"))
    deployment["metadata"]["name"] = istiod
    deployment["metadata"]["labels"] = _relabel(deployment["metadata"]["labels"], revision)
    deployment["spec"]["selector"] = {"matchLabels": dict(selector)}
    template = deployment["spec"]["template"]
    template["metadata"]["labels"] = {"app": "istiod", REV_LABEL: revision}
    pod = template["spec"]
    pod["serviceAccountName"] = istiod
    for constraint in pod.get("topologySpreadConstraints") or []:
        constraint["labelSelector"] = {"matchLabels": dict(selector)}
    (container,) = [c for c in pod["containers"] if c["name"] == "discovery"]
    for env in container["env"]:
        if env["name"] == "REVISION":
            env["value"] = revision
    for volume in pod["volumes"]:
        if (volume.get("configMap") or {}).get("name") == "istio":
            volume["configMap"]["name"] = f"istio-{revision}"
    out.append(deployment)
    (service,) = copy.deepcopy(_docs("service.yaml"))
    service["metadata"]["name"] = istiod
    service["metadata"]["labels"] = _relabel(service["metadata"]["labels"], revision)
    service["spec"]["selector"] = dict(selector)
    out.append(service)
    for name in ("pdb.yaml", "hpa.yaml"):
        (doc,) = copy.deepcopy(_docs(name))
        doc["metadata"]["name"] = istiod
        doc["metadata"]["labels"] = _relabel(doc["metadata"]["labels"], revision)
        if "selector" in doc["spec"]:
            doc["spec"]["selector"] = {"matchLabels": dict(selector)}
        if "scaleTargetRef" in doc["spec"]:
            doc["spec"]["scaleTargetRef"]["name"] = istiod
        out.append(doc)
    out.append(mutating_webhook_configuration(revision))
    (validator,) = copy.deepcopy(_docs("webhook.yaml"))
    validator["metadata"]["name"] = f"istio-validator-{revision}-{NAMESPACE}"
    validator["metadata"]["labels"] = {**validator["metadata"]["labels"], REV_LABEL: revision}
    for wh in validator["webhooks"]:
        wh["name"] = "rev.validation.istio.io"
        wh["clientConfig"]["service"]["name"] = istiod
        wh["objectSelector"] = {"matchExpressions": [{"key": REV_LABEL, "operator": "In", "values": [revision]}]}
    out.append(validator)
    return out


def _plain(doc: dict) -> dict:
    """pilot.inject.deploy's literal-block strings as plain ones (safe_dump has no representer)."""
    return yaml.safe_load(yaml.dump(doc, Dumper=_dumper()))


def _dumper():
    from pilot.inject.deploy import _Dumper

    return _Dumper


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pilot.deploy_revision", description=__doc__.split("\n\n")[0])
    p.add_argument("revision", help="the revision's name, e.g. canary or 1-30-0")
    args = p.parse_args(argv)
    try:
        docs = revision_objects(args.revision)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
