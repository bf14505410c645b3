"""CustomResourceDefinitions for every custom kind in the registry (kinds.py), with structural
`openAPIV3Schema`s derived from the same pydantic models that validate the objects, so the
apiserver (server-side field validation, pruning) refuses what the control plane would refuse
structurally even before the webhook is asked. `make crds` writes deploy/crds/; a test fails
when the committed files differ from what this produces.

Names, groups, versions (served, storage: the first listed in kinds.py), short names,
categories, printer columns and the status subresource follow upstream (istio's
crd-all.gen.yaml, gateway-api's config/crd); only the schemas are ours.

Translation of pydantic's JSON Schema into Kubernetes' structural subset:
- `$ref`s are inlined (a recursive reference becomes an untyped preserve-unknown node, since
  structural schemas cannot recurse); titles, descriptions, defaults (the apiserver would apply
  them to stored objects), formats and patterns (Python regular expressions, not RE2) are
  dropped; bounds, lengths, item counts and enums are kept;
- `Optional[X]` is X (the apiserver prunes nulls of non-nullable fields); `int | str` is
  `x-kubernetes-int-or-string`; other unions of objects merge their properties; `Literal` and
  enums are `enum`s; `dict[str, X]` is `additionalProperties: X`; sets are
  `x-kubernetes-list-type: set` (uniqueItems is forbidden);
- a model that forbids unknown fields (StrictModel) lists its properties and nothing else; one
  that ignores them (Model) also keeps unknown fields (`x-kubernetes-preserve-unknown-fields`),
  so the apiserver never refuses what the control plane accepts;
- fields marked `x-pilot-unsupported` (base.Unsupported) are untyped preserve-unknown nodes: istio
  accepts them, so the apiserver does; the webhook is what refuses them, by name;
- `status` is an object of any content, with the status subresource where upstream has one.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pilot.config.base import UNSUPPORTED_MARK
from pilot.config.kinds import KINDS, Kind

BUILTIN_GROUPS = frozenset({"", "discovery.k8s.io", "networking.k8s.io"})
ISTIO_CATEGORIES = {"networking.istio.io": ["istio-io", "networking-istio-io"],
                    "security.istio.io": ["istio-io", "security-istio-io"],
                    "telemetry.istio.io": ["istio-io", "telemetry-istio-io"],
                    "extensions.istio.io": ["istio-io", "extensions-istio-io"]}
AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _column(name: str, path: str, description: str = "", priority: int = 0) -> dict:
    col: dict[str, Any] = {"name": name, "type": "string", "jsonPath": path}
    if description:
        col["description"] = description
    if priority:
        col["priority"] = priority
    return col


@dataclass(frozen=True)
class Upstream:
    """What upstream's CRD says besides the schema."""

    short_names: tuple[str, ...] = ()
    columns: tuple[dict, ...] = (AGE,)
    status: bool = True
    channel: str = ""  # gateway-api's release channel annotation
    categories: list[str] = field(default_factory=list)


UPSTREAM: dict[str, Upstream] = {
    "virtualservices.networking.istio.io": Upstream(("vs",), (
        _column("Gateways", ".spec.gateways",
                "The names of gateways and sidecars that should apply these routes"),
        _column("Hosts", ".spec.hosts", "The destination hosts to which traffic is being sent"), AGE)),
    "destinationrules.networking.istio.io": Upstream(("dr",), (
        _column("Host", ".spec.host", "The name of a service from the service registry"), AGE)),
    "serviceentries.networking.istio.io": Upstream(("se",), (
        _column("Hosts", ".spec.hosts", "The hosts associated with the ServiceEntry"),
        _column("Location", ".spec.location",
                "Whether the service is external to the mesh or part of the mesh "
                "(MESH_EXTERNAL or MESH_INTERNAL)"),
        _column("Resolution", ".spec.resolution",
                "Service resolution mode for the hosts (NONE, STATIC, or DNS)"),
        AGE)),
    "workloadentries.networking.istio.io": Upstream(("we",), (
        _column("Address", ".spec.address", "Address associated with the network endpoint"), AGE)),
    "sidecars.networking.istio.io": Upstream(),
    "gateways.networking.istio.io": Upstream(("gw",)),
    "peerauthentications.security.istio.io": Upstream(("pa",), (
        _column("Mode", ".spec.mtls.mode", "Defines the mTLS mode used for peer authentication."), AGE)),
    "authorizationpolicies.security.istio.io": Upstream(("ap",), (
        _column("Action", ".spec.action", "The operation to take."), AGE)),
    "requestauthentications.security.istio.io": Upstream(("ra",)),
    "telemetries.telemetry.istio.io": Upstream(("telemetry",)),
    "wasmplugins.extensions.istio.io": Upstream(),
    "gatewayclasses.gateway.networking.k8s.io": Upstream(("gc",), (
        _column("Controller", ".spec.controllerName"),
        _column("Accepted", '.status.conditions[?(@.type=="Accepted")].status'), AGE,
        _column("Description", ".spec.description", priority=1)), channel="standard"),
    "gateways.gateway.networking.k8s.io": Upstream(("gtw",), (
        _column("Class", ".spec.gatewayClassName"), _column("Address", ".status.addresses[*].value"),
        _column("Programmed", '.status.conditions[?(@.type=="Programmed")].status'), AGE),
        channel="standard"),
    "httproutes.gateway.networking.k8s.io": Upstream((), (_column("Hostnames", ".spec.hostnames"), AGE),
                                                     channel="standard"),
    "grpcroutes.gateway.networking.k8s.io": Upstream((), (_column("Hostnames", ".spec.hostnames"), AGE),
                                                     channel="standard"),
    "tcproutes.gateway.networking.k8s.io": Upstream(channel="experimental"),
    "tlsroutes.gateway.networking.k8s.io": Upstream((), (_column("Hostnames", ".spec.hostnames"), AGE),
                                                    channel="experimental"),
    "referencegrants.gateway.networking.k8s.io": Upstream(("refgrant",), status=False, channel="standard"),
    "backendtlspolicies.gateway.networking.k8s.io": Upstream(("btlspolicy",), channel="standard"),
}

PRESERVE: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
_KEPT = ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "minProperties",
         "maxProperties")
_SCALARS = ("string", "integer", "number", "boolean")


class _Translator:
    def __init__(self, defs: dict[str, dict]) -> None:
        self.defs = defs

    def node(self, s: dict, seen: frozenset[str] = frozenset()) -> dict:
        if "$ref" in s:
            name = s["$ref"].rsplit("/", 1)[1]
            if name in seen:  # recursion: structural schemas cannot express it
                return dict(PRESERVE)
            siblings = {k: v for k, v in s.items() if k != "$ref"}
            return self.node({**self.defs[name], **siblings}, seen | {name})
        if s.get(UNSUPPORTED_MARK):
            return dict(PRESERVE)
        for key in ("anyOf", "oneOf"):
            if key in s:
                rest = {k: v for k, v in s.items() if k not in (key, "default")}
                options = [o for o in s[key] if o.get("type") != "null"]
                if len(options) == 1:
                    return self.node({**options[0], **rest}, seen)
                return self._union([self.node(o, seen) for o in options])
        if "allOf" in s and len(s["allOf"]) == 1:
            rest = {k: v for k, v in s.items() if k != "allOf"}
            return self.node({**s["allOf"][0], **rest}, seen)
        if "const" in s:
            s = {**{k: v for k, v in s.items() if k != "const"}, "enum": [s["const"]]}
        t = s.get("type")
        if isinstance(t, list):
            types = [x for x in t if x != "null"]
            t = types[0] if len(types) == 1 else None
            if t is None and set(types) == {"integer", "string"}:
                return {"x-kubernetes-int-or-string": True}
        if t is None and "enum" in s:
            t = _type_of(s["enum"])
        if t is None:  # Any
            return dict(PRESERVE)
        out: dict[str, Any] = {"type": t}
        if t == "object":
            out.update(self._object(s, seen))
        elif t == "array":
            items = s.get("items")
            if items is None and "prefixItems" in s:
                out["items"] = self._union([self.node(i, seen) for i in s["prefixItems"]])
            else:
                out["items"] = self.node(items, seen) if items else dict(PRESERVE)
            if s.get("uniqueItems") and out["items"].get("type") in _SCALARS:
                out["x-kubernetes-list-type"] = "set"
        for k in _KEPT:
            if k in s:
                out[k] = s[k]
        # JSON Schema 2020 exclusive bounds are numbers; OpenAPI v3.0 has booleans beside the bound.
        for excl, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if excl in s and not isinstance(s[excl], bool):
                out[bound], out[excl] = s[excl], True
        if "enum" in s and t in ("string", "integer", "number"):
            out["enum"] = list(s["enum"])
        return out

    def _object(self, s: dict, seen: frozenset[str]) -> dict:
        props = s.get("properties")
        addl = s.get("additionalProperties")
        if props:
            out: dict[str, Any] = {"properties": {k: self.node(v, seen) for k, v in props.items()}}
            required = [r for r in s.get("required") or [] if r in props]
            if required:
                out["required"] = required
            if addl is not False:  # the model ignores unknown fields: the apiserver keeps them
                out.update(PRESERVE)
            return out
        if isinstance(addl, dict) and addl:
            values = self.node(addl, seen)
            return dict(PRESERVE) if values == PRESERVE else {"additionalProperties": values}
        if addl is False:
            return {}  # an empty message ({}): nothing may be set inside
        return dict(PRESERVE)  # dict[str, Any], or an untyped object

    def _union(self, options: list[dict]) -> dict:
        types = {o.get("type") for o in options}
        if any(o.get("x-kubernetes-int-or-string") for o in options):
            types.discard(None)
            types.add("integer")
            types.add("string")
        if types == {"integer", "string"}:
            return {"x-kubernetes-int-or-string": True}
        if None in types or len(types) != 1:
            return dict(PRESERVE)
        t = types.pop()
        if t == "object":
            if any("properties" not in o for o in options):  # a map or an untyped object among them
                return {"type": "object", **PRESERVE}
            props: dict[str, Any] = {}
            for o in options:
                for k, v in o["properties"].items():
                    props[k] = v if k not in props or props[k] == v else self._union([props[k], v])
            merged: dict[str, Any] = {"type": "object", "properties": props}
            if any(o.get("x-kubernetes-preserve-unknown-fields") for o in options):
                merged.update(PRESERVE)
            return merged
        if t == "array":
            return {"type": "array", "items": self._union([o["items"] for o in options])}
        out: dict[str, Any] = {"type": t}
        if all("enum" in o for o in options):
            out["enum"] = list(dict.fromkeys(v for o in options for v in o["enum"]))
        return out


def _type_of(values: list) -> str | None:
    kinds = {type(v) for v in values}
    if kinds == {str}:
        return "string"
    if kinds <= {int} and kinds:
        return "integer"
    if kinds <= {int, float} and kinds:
        return "number"
    if kinds == {bool}:
        return "boolean"
    return None


def spec_schema(kind: Kind) -> tuple[dict, bool]:
    """The structural schema of the kind's spec, and whether spec is required."""
    full = kind.model.model_json_schema(by_alias=True, mode="validation")
    spec = full["properties"].get("spec")
    if spec is None:
        return dict(PRESERVE, type="object"), False
    return _Translator(full.get("$defs", {})).node(spec), "spec" in (full.get("required") or [])


def object_schema(kind: Kind) -> dict:
    spec, required = spec_schema(kind)
    schema: dict[str, Any] = {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": spec, "status": {"type": "object", **PRESERVE}}}
    if required:
        schema["required"] = ["spec"]
    return schema


def crd(kind: Kind) -> dict:
    name = f"{kind.plural}.{kind.group}"
    up = UPSTREAM.get(name, Upstream())
    schema = object_schema(kind)
    versions = []
    for i, version in enumerate(kind.versions):
        v: dict[str, Any] = {"name": version, "served": True, "storage": i == 0}
        if up.status:
            v["subresources"] = {"status": {}}
        v["additionalPrinterColumns"] = [dict(c) for c in up.columns]
        v["schema"] = {"openAPIV3Schema": schema}
        versions.append(v)
    metadata: dict[str, Any] = {"name": name, "labels": {"app": "istio-pilot"}}
    if up.channel:
        metadata["annotations"] = {"gateway.networking.k8s.io/channel": up.channel}
    names: dict[str, Any] = {"kind": kind.kind, "listKind": f"{kind.kind}List", "plural": kind.plural,
                             "singular": kind.kind.lower()}
    if up.short_names:
        names["shortNames"] = list(up.short_names)
    names["categories"] = up.categories or ISTIO_CATEGORIES.get(kind.group, ["gateway-api"])
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": metadata,
            "spec": {"group": kind.group, "scope": "Namespaced" if kind.namespaced else "Cluster",
                     "names": names, "versions": versions}}


def custom_kinds() -> list[Kind]:
    return [k for k in KINDS if k.group not in BUILTIN_GROUPS]


HEADER = ("# Generated by `make crds` (python -m pilot.config.crd_schema) from {model} in {module};\n"
          "# do not edit. tests/test_crds.py fails when this file differs from the models.\n")


class _Dumper(yaml.SafeDumper):
    # Every node shares one schema dict across versions; write it out in full each time.
    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(kind: Kind) -> str:
    header = HEADER.format(model=kind.model.__name__, module=kind.model.__module__)
    return header + yaml.dump(crd(kind), Dumper=_Dumper, sort_keys=False, width=120)


def files() -> dict[str, str]:
    """File name -> content of everything in deploy/crds/ this module owns."""
    out = {f"{k.plural}.{k.group}.yaml": render(k) for k in custom_kinds()}
    listing = "".join(f"  - {name}\n" for name in out)
    out["kustomization.yaml"] = (
        "# Generated by `make crds` (python -m pilot.config.crd_schema); do not edit.\n"
        "# CustomResourceDefinitions (structural schemas) for every custom kind in pilot/config/kinds.py.\n"
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n" + listing)
    return out


def main(argv: list[str]) -> int:
    # argparse, so `--help` prints usage instead of becoming an output directory named "--help"
    parser = argparse.ArgumentParser(prog="python -m pilot.config.crd_schema",
                                     description="Write the CRDs of every served kind (and their kustomization).")
    parser.add_argument("directory", nargs="?", type=Path,
                        default=Path(__file__).resolve().parents[2] / "deploy" / "crds",
                        help="where to write them (default: deploy/crds of this checkout)")
    directory: Path = parser.parse_args(argv).directory
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (directory / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
