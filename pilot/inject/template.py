"""Rendering an injection template: the data istiod's templates see (SidecarTemplateData) and the
Jinja2 environment they are rendered in. Pure: (template, pod, inputs) -> partial Pod dict.

istiod's templates are Go text/template with sprig; ours are Jinja2 (a Go template cannot be run
here), with the same variable names so a reader of istiod's template finds their way around. The
output is YAML; values from the pod go through the `j` filter (JSON encoding), so an annotation
cannot inject YAML structure.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

DEFAULT_TEMPLATE_PATH = Path(__file__).with_name("templates") / "sidecar.yaml.j2"


class TemplateError(ValueError):
    """A template that does not compile, or whose output is not a Pod fragment."""


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


ENV = jinja2.Environment(undefined=jinja2.ChainableUndefined, autoescape=False, keep_trailing_newline=True)
ENV.filters["j"] = _j
ENV.filters["tojson_compact"] = _compact


def compile_template(name: str, text: str) -> jinja2.Template:
    try:
        return ENV.from_string(text)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"template {name!r} line {e.lineno}: {e.message}") from None


def default_template_text() -> str:
    return DEFAULT_TEMPLATE_PATH.read_text()


def _ports(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def exclude_inbound_port(status_port: Any, excluded: str) -> str:
    """istiod's excludeInboundPort: the status port joins the excluded inbound ports (once)."""
    port = str(status_port)
    ports = _ports(excluded or "")
    if port == "0" or port in ports:
        return ",".join(ports)
    return ",".join([*ports, port])


def canonical_name(name: str) -> str:
    # sprig `trunc 63 | trimAll "-_."`
    return (name or "")[:63].strip("-_.")


@dataclass(frozen=True)
class RenderInputs:
    """Everything a template reads besides the pod (SidecarTemplateData without the pod)."""

    proxy_config: Mapping[str, Any]  # the effective ProxyConfig (camelCase), as PROXY_CONFIG carries it
    mesh: Mapping[str, Any]
    values: Mapping[str, Any]
    revision: str
    native_sidecars: bool
    proxy_image: str
    proxy_init_image: str
    status_port: int
    interception_mode: str
    deployment: Mapping[str, str]  # name, namespace of the owning workload
    type_meta: Mapping[str, str]  # apiVersion, kind of the owner
    proxy_uid: int = 1337
    proxy_gid: int = 1337


def _resources_fn(annotations: Mapping[str, str], values: Mapping[str, Any]):
    def resources() -> dict[str, Any]:
        keys = {
            "requests": (("cpu", "sidecar.istio.io/proxyCPU"), ("memory", "sidecar.istio.io/proxyMemory")),
            "limits": (
                ("cpu", "sidecar.istio.io/proxyCPULimit"),
                ("memory", "sidecar.istio.io/proxyMemoryLimit"),
            ),
        }
        if any(a in annotations for group in keys.values() for _, a in group):
            out: dict[str, Any] = {}
            for group, pairs in keys.items():
                got = {res: annotations[a] for res, a in pairs if a in annotations}
                if got:
                    out[group] = got
            return out
        res = ((values.get("global") or {}).get("proxy") or {}).get("resources") or {}
        return {k: {rk: rv for rk, rv in v.items() if rv is not None} for k, v in res.items() if v}

    return resources


_BOOLS = {
    "true": True,
    "True": True,
    "TRUE": True,
    "false": False,
    "False": False,
    "FALSE": False,
    "yes": True,
    "Yes": True,
    "YES": True,
    "no": False,
    "No": False,
    "NO": False,
    "on": True,
    "On": True,
    "ON": True,
    "off": False,
    "Off": False,
    "OFF": False,
}


def _build(node: yaml.Node) -> Any:
    """Nodes to plain data. SafeConstructor does the same at twice the cost, and would turn a
    timestamp-looking string into a datetime that cannot be sent back as JSON: those stay strings."""
    if isinstance(node, yaml.MappingNode):
        return {_build(k): _build(v) for k, v in node.value}
    if isinstance(node, yaml.SequenceNode):
        return [_build(v) for v in node.value]
    tag, value = node.tag, node.value
    if tag == "tag:yaml.org,2002:str":
        return value
    if tag == "tag:yaml.org,2002:int":
        text = value.replace("_", "")
        if text.startswith(("0x", "-0x", "+0x")):
            return int(text, 16)
        if text.startswith(("0o", "-0o", "+0o")):
            return int(text, 8)
        return int(text)
    if tag == "tag:yaml.org,2002:bool":
        return _BOOLS[value]
    if tag == "tag:yaml.org,2002:null":
        return None
    if tag == "tag:yaml.org,2002:float":
        return float(
            value.replace("_", "").replace(".inf", "inf").replace(".Inf", "inf").replace(".nan", "nan")
        )
    if tag in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:binary"):
        return value
    raise yaml.YAMLError(f"unsupported YAML tag {tag!r} at line {node.start_mark.line + 1}")


@functools.lru_cache(maxsize=512)
def _parse(text: str) -> Any:
    # Parsing the YAML costs several times the rendering; a Deployment's replicas render the same
    # text, so they share one parse. Callers must not mutate what is returned.
    node = yaml.compose(text, Loader=_Loader)
    return None if node is None else _build(node)


def render(
    template: jinja2.Template, name: str, pod: Mapping[str, Any], inputs: RenderInputs
) -> dict[str, Any]:
    """Render one template for `pod`; returns the partial Pod (metadata/spec) it describes, shared
    with other renders of the same text: read it, do not change it."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = dict(meta.get("annotations") or {})
    labels = dict(meta.get("labels") or {})
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    app = [c.get("name", "") for c in containers if c.get("name") != "istio-proxy"]
    pod_ports = [p for c in containers for p in (c.get("ports") or []) if isinstance(p, dict) and p]

    def annotation(key: str, default: Any = "") -> Any:
        v = annotations.get(key)
        return v if v not in (None, "") else ("" if default is None else default)

    data = {
        "ObjectMeta": {**meta, "labels": labels, "annotations": annotations},
        "Spec": spec,
        "ProxyConfig": inputs.proxy_config,
        "MeshConfig": inputs.mesh,
        "Values": inputs.values,
        "Revision": "" if inputs.revision == "default" else inputs.revision,
        "NativeSidecars": inputs.native_sidecars,
        "ProxyImage": inputs.proxy_image,
        "ProxyInitImage": inputs.proxy_init_image,
        "ProxyUID": inputs.proxy_uid,
        "ProxyGID": inputs.proxy_gid,
        "DeploymentMeta": inputs.deployment,
        "TypeMeta": inputs.type_meta,
        "StatusPort": inputs.status_port,
        "InterceptionMode": inputs.interception_mode,
        "AppContainers": app,
        "PodPorts": pod_ports,
        "annotation": annotation,
        "isset": lambda key: key in annotations,
        "exclude_inbound_port": exclude_inbound_port,
        "canonical_name": canonical_name,
        "resources": _resources_fn(annotations, inputs.values),
    }
    try:
        text = template.render(data)
    except jinja2.TemplateError as e:
        raise TemplateError(f"template {name!r}: {e}") from None
    except (
        TypeError,
        ValueError,
        KeyError,
        AttributeError,
    ) as e:  # a filter applied to the wrong kind of value
        raise TemplateError(f"template {name!r}: {type(e).__name__}: {e}") from None
    try:
        doc = _parse(text)
    except yaml.YAMLError as e:
        raise TemplateError(f"template {name!r} rendered invalid YAML: {e}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not set(doc) <= {"metadata", "spec"}:
        raise TemplateError(
            f"template {name!r} must render a Pod fragment (metadata and spec), "
            f"got {type(doc).__name__ if not isinstance(doc, dict) else sorted(doc)}"
        )
    return doc
