"""Be the kubelet for one container of a stored Pod: lay out its volumes under a root directory
(the container's `/`), resolve its environment (values, downward API field and resource
references, `$(VAR)` expansion) and its command line, as the kubelet does. The test then runs the
command with that environment in `root/workingDir`."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


@dataclass(frozen=True)
class Materialised:
    command: list[str]
    args: list[str]
    env: dict[str, str]
    cwd: Path


def _expand(text: str, env: dict[str, str]) -> str:
    # Kubernetes: $(VAR) is replaced when VAR is defined, left as written otherwise; $$ is a literal $.
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


def _downward(values: dict[str, str]) -> str:
    return "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(values.items()))


def _field(pod: dict, path: str, status: dict) -> str:
    meta, spec = pod["metadata"], pod["spec"]
    fields = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "status.podIP": status["podIP"],
        "status.hostIP": status["hostIP"],
    }
    if path not in fields:
        raise AssertionError(f"the kubelet would reject fieldRef {path!r}")
    return fields[path]


def _quantity(q: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    for u, f in units.items():
        if q.endswith(u):
            return float(q[: -len(u)]) * f
    return float(q)


def _resource(container: dict, ref: dict, node: dict[str, str]) -> str:
    kind, _, res = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(res) or node[res]
    divisor = _quantity(str(ref.get("divisor", "1")))
    return str(math.ceil(_quantity(str(value)) / divisor))


def run_container(
    pod: dict,
    name: str,
    root: Path,
    *,
    token: str,
    configmaps: dict[str, dict[str, str]],
    pod_ip: str = "127.0.0.1",
    host_ip: str = "127.0.0.1",
    node: dict[str, str] | None = None,
) -> Materialised:
    node = node or {"cpu": "2", "memory": "4Gi"}
    spec = pod["spec"]
    (container,) = [
        c for c in (spec.get("containers") or []) + (spec.get("initContainers") or []) if c["name"] == name
    ]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    labels = pod["metadata"].get("labels") or {}
    annotations = pod["metadata"].get("annotations") or {}
    for mount in container.get("volumeMounts") or []:
        vol = volumes[mount["name"]]  # a mount of an undeclared volume: the pod would not start
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        if "projected" in vol:
            for src in vol["projected"]["sources"]:
                if "serviceAccountToken" in src:
                    (target / src["serviceAccountToken"]["path"]).write_text(token)
        elif "configMap" in vol:
            data = configmaps.get(vol["configMap"]["name"])
            if data is None:
                assert vol["configMap"].get("optional"), f"ConfigMap {vol['configMap']['name']} is missing"
                continue
            for key, text in data.items():
                (target / key).write_text(text)
        elif "downwardAPI" in vol:
            for item in vol["downwardAPI"]["items"]:
                path = item["fieldRef"]["fieldPath"]
                values = {"metadata.labels": labels, "metadata.annotations": annotations}[path]
                (target / item["path"]).write_text(_downward(values))
        else:
            assert "emptyDir" in vol, f"unexpected volume {vol}"
    status = {"podIP": pod_ip, "hostIP": host_ip}
    env: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = _expand(e["value"], env)
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = _field(pod, e["valueFrom"]["fieldRef"]["fieldPath"], status)
        elif "resourceFieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = _resource(container, e["valueFrom"]["resourceFieldRef"], node)
        else:
            raise AssertionError(f"unsupported env source {e}")
    command = [_expand(a, env) for a in container.get("command") or []]
    args = [_expand(a, env) for a in container.get("args") or []]
    cwd = root / (container.get("workingDir") or "/").lstrip("/")
    return Materialised(command, args, env, cwd)
