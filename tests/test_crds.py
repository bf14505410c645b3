"""deploy/crds/ is what `make crds` generates from the models, every schema is structural by
Kubernetes' rules, and the apiserver's schema check never refuses an object the control plane
accepts (every manifest in the tests and examples), while it refuses unknown fields of strict
models and keeps fields marked unsupported for the webhook to refuse by name."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import Field

from pilot.config import crd_schema
from pilot.config.base import K8sObject, Model, StrictModel, Unsupported
from pilot.config.kinds import KINDS, Kind
from pilot.config.validation import InvalidObject, parse_object

ROOT = Path(__file__).resolve().parent.parent
CRDS = ROOT / "deploy" / "crds"

# Kubernetes' structural schema rules (apiextensions validation): the keywords a node may use.
ALLOWED = {"type", "properties", "additionalProperties", "items", "required", "enum", "minimum", "maximum",
           "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems",
           "minProperties", "maxProperties", "description", "x-kubernetes-preserve-unknown-fields",
           "x-kubernetes-int-or-string", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
           "x-kubernetes-map-type", "nullable", "format", "pattern", "x-kubernetes-validations"}
TYPES = {"object", "array", "string", "integer", "number", "boolean"}


def structural_errors(schema: Any, where: str = "", root: bool = True) -> list[str]:
    """Why `schema` is not a structural schema (empty: it is)."""
    if not isinstance(schema, dict):
        return [f"{where or '.'}: not a schema object"]
    errors = [f"{where or '.'}: keyword {k} not allowed" for k in schema if k not in ALLOWED]
    t = schema.get("type")
    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    if t is None and not (int_or_string or preserve):
        errors.append(f"{where or '.'}: no type")
    if t is not None and t not in TYPES:
        errors.append(f"{where or '.'}: unknown type {t!r}")
    if int_or_string and t is not None:
        errors.append(f"{where or '.'}: x-kubernetes-int-or-string with a type")
    if root and t != "object":
        errors.append(".: the root must be an object")
    if "properties" in schema and "additionalProperties" in schema:
        errors.append(f"{where or '.'}: properties and additionalProperties are mutually exclusive")
    if isinstance(schema.get("additionalProperties"), bool):
        errors.append(f"{where or '.'}: additionalProperties must be a schema, not a boolean")
    if ("properties" in schema or "additionalProperties" in schema) and t != "object":
        errors.append(f"{where or '.'}: properties on a non-object")
    if t == "array" and not isinstance(schema.get("items"), dict):
        errors.append(f"{where or '.'}: an array needs one items schema")
    if "items" in schema and t != "array":
        errors.append(f"{where or '.'}: items on a non-array")
    if schema.get("x-kubernetes-list-type") == "set" and (schema.get("items") or {}).get("type") not in (
            "string", "integer", "number", "boolean"):
        errors.append(f"{where or '.'}: list-type set needs scalar items")
    for excl in ("exclusiveMinimum", "exclusiveMaximum"):
        if excl in schema and not isinstance(schema[excl], bool):
            errors.append(f"{where or '.'}: {excl} must be a boolean (OpenAPI v3.0)")
    for name, sub in (schema.get("properties") or {}).items():
        errors += structural_errors(sub, f"{where}.{name}", False)
    if isinstance(schema.get("items"), dict):
        errors += structural_errors(schema["items"], f"{where}[]", False)
    if isinstance(schema.get("additionalProperties"), dict):
        errors += structural_errors(schema["additionalProperties"], f"{where}{{}}", False)
    if root:
        meta = (schema.get("properties") or {}).get("metadata")
        if meta is not None and set(meta) - {"type"}:
            errors.append(".metadata: only `type: object` may be given for metadata")
    return errors


def schema_errors(value: Any, schema: dict, where: str = "") -> list[str]:
    """What the apiserver's schema validation (with strict field validation) refuses in `value`."""
    if value is None:  # nulls of non-nullable fields are pruned before validation
        return []
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return [] if ok else [f"{where}: must be an integer or a string"]
    t = schema.get("type")
    if t is None:
        return []
    ok = {"object": isinstance(value, dict), "array": isinstance(value, list),
          "string": isinstance(value, str),
          "integer": isinstance(value, int) and not isinstance(value, bool),
          "number": isinstance(value, (int, float)) and not isinstance(value, bool),
          "boolean": isinstance(value, bool)}[t]
    if not ok:
        return [f"{where}: must be of type {t}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: Unsupported value: {value!r}")
    for bound, fails in (("minimum", lambda b: value < b), ("maximum", lambda b: value > b),
                         ("minLength", lambda b: len(value) < b), ("maxLength", lambda b: len(value) > b),
                         ("minItems", lambda b: len(value) < b), ("maxItems", lambda b: len(value) > b)):
        if bound in schema and fails(schema[bound]):
            errors.append(f"{where}: {bound} {schema[bound]}")
    if t == "object":
        props = schema.get("properties") or {}
        for k, v in value.items():
            if not where and k == "metadata":  # ObjectMeta is validated by the apiserver itself
                continue
            if k in props:
                errors += schema_errors(v, props[k], f"{where}.{k}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += schema_errors(v, schema["additionalProperties"], f"{where}.{k}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f'unknown field "{(where + "." + k).lstrip(".")}"')
        errors += [f"{where}.{r}: Required value" for r in schema.get("required") or []
                   if value.get(r) is None]
    if t == "array":
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{where}[{i}]")
    return errors


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _crd_of(kind: Kind) -> dict:
    return yaml.load((CRDS / f"{kind.plural}.{kind.group}.yaml").read_text(), Loader=_LOADER)


def _schema(kind: Kind, version: str) -> dict:
    [v] = [v for v in _crd_of(kind)["spec"]["versions"] if v["name"] == version]
    return v["schema"]["openAPIV3Schema"]


# --- generated and committed --------------------------------------------------------------------
def test_committed_crds_are_what_make_crds_generates():
    generated = crd_schema.files()
    committed = {p.name: p.read_text() for p in CRDS.glob("*.yaml")}
    stale = sorted(n for n in generated if committed.get(n) != generated[n])
    extra = sorted(set(committed) - set(generated))
    assert (stale, extra) == ([], []), "deploy/crds is out of date with the models: run `make crds`"


def test_every_custom_kind_keeps_upstream_names_versions_and_flags():
    for kind in crd_schema.custom_kinds():
        crd = _crd_of(kind)
        spec = crd["spec"]
        assert crd["metadata"]["name"] == f"{kind.plural}.{kind.group}"
        assert spec["names"]["kind"] == kind.kind and spec["names"]["plural"] == kind.plural
        assert [v["name"] for v in spec["versions"]] == list(kind.versions)
        assert [v["storage"] for v in spec["versions"]] == [True] + [False] * (len(kind.versions) - 1)
        assert all(v["served"] for v in spec["versions"])
    vs = _crd_of(next(k for k in KINDS if k.kind == "VirtualService"))
    assert vs["spec"]["names"]["shortNames"] == ["vs"]
    assert vs["spec"]["names"]["categories"] == ["istio-io", "networking-istio-io"]
    columns = vs["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in columns] == ["Gateways", "Hosts", "Age"]
    refgrant = _crd_of(next(k for k in KINDS if k.kind == "ReferenceGrant"))
    assert "subresources" not in refgrant["spec"]["versions"][0]  # upstream has no status subresource


# --- structural --------------------------------------------------------------------------------
def test_every_schema_is_structural():
    problems = []
    for kind in crd_schema.custom_kinds():
        for v in _crd_of(kind)["spec"]["versions"]:
            errors = structural_errors(v["schema"]["openAPIV3Schema"])
            problems += [f"{kind.kind} {v['name']}: {e}" for e in errors]
    assert problems == []


def test_the_structural_checker_refuses_what_kubernetes_refuses():
    ok = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert structural_errors(ok) == []
    assert structural_errors({"type": "object", "properties": {"a": {}}}) == [".a: no type"]
    assert structural_errors({"type": "object", "properties": {"a": {"$ref": "#/x"}}}) == \
        [".a: keyword $ref not allowed", ".a: no type"]
    assert ".a: keyword anyOf not allowed" in structural_errors(
        {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}})
    assert structural_errors({"type": "object", "additionalProperties": False}) == \
        [".: additionalProperties must be a schema, not a boolean"]
    assert ".: keyword default not allowed" in structural_errors({"type": "object", "default": {}})
    assert ".a: keyword uniqueItems not allowed" in structural_errors(
        {"type": "object",
         "properties": {"a": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}})
    int_or_string = {"type": "object", "properties": {"a": {"x-kubernetes-int-or-string": True}}}
    assert structural_errors(int_or_string) == []


# --- what the apiserver then accepts ------------------------------------------------------------
def _manifests() -> list[dict]:
    """Every custom-kind manifest written in the tests and examples: examples/**/*.yaml, YAML
    string and constant dict literals anywhere in tests/**/*.py, and the module-level values
    (example constants, parametrize tables) of the unit test modules."""
    found: list[dict] = []
    custom = {(k.group, k.kind) for k in crd_schema.custom_kinds()}

    def collect(value: Any, depth: int = 0) -> None:
        if depth > 8:
            return
        if isinstance(value, dict):
            api = value.get("apiVersion")
            if (isinstance(api, str) and (api.rpartition("/")[0], value.get("kind")) in custom
                    and isinstance(value.get("metadata") or {}, dict)):  # not a deliberately broken one
                found.append(value)
            for v in value.values():
                collect(v, depth + 1)
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v, depth + 1)
        elif isinstance(value, str) and "apiVersion" in value:
            try:
                for doc in yaml.load_all(textwrap.dedent(value), Loader=_LOADER):
                    collect(doc, depth + 1)
            except yaml.YAMLError:
                pass

    for path in (ROOT / "examples").rglob("*.yaml"):
        collect(path.read_text())
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                collect(node.value)
            elif isinstance(node, ast.Dict):
                with contextlib.suppress(ValueError, SyntaxError, TypeError):  # not a constant
                    collect(ast.literal_eval(node))
        if "unit" not in path.parts:  # the unit modules hold the example tables
            continue
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for name, value in vars(module).items():
            if not name.startswith("__"):
                collect(value)
    unique = {json.dumps(d, sort_keys=True, default=str): d for d in found}
    return list(unique.values())


# Kinds the tests above build mostly in code: typical manifests, written here.
TYPICAL = list(yaml.safe_load_all("""
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec:
  mtls: {mode: STRICT}
---
apiVersion: security.istio.io/v1beta1
kind: PeerAuthentication
metadata: {name: reviews, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  mtls: {mode: PERMISSIVE}
  portLevelMtls:
    9080: {mode: DISABLE}
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  jwtRules:
  - issuer: https://issuer.example.com
    jwksUri: https://issuer.example.com/jwks
    audiences: [reviews]
    forwardOriginalToken: true
    fromHeaders: [{name: x-jwt, prefix: "Bearer "}]
    outputPayloadToHeader: x-payload
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: apps}
spec:
  gatewayClassName: istio
  listeners:
  - name: http
    port: 80
    protocol: HTTP
    hostname: "*.example.com"
    allowedRoutes: {namespaces: {from: All}}
  - name: https
    port: 443
    protocol: HTTPS
    tls:
      mode: Terminate
      certificateRefs: [{kind: Secret, name: web-cert}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: shop, namespace: apps}
spec:
  parentRefs: [{name: web, sectionName: http}]
  hostnames: [shop.example.com]
  rules:
  - matches:
    - path: {type: PathPrefix, value: /cart}
      headers: [{name: x-user, value: jason}]
      method: GET
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        add: [{name: x-added, value: "1"}]
        remove: [x-drop]
    backendRefs:
    - {name: cart, port: 8080, weight: 90}
    - {name: cart-canary, port: 8080, weight: 10}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: echo, namespace: apps}
spec:
  parentRefs: [{name: web}]
  rules:
  - matches: [{method: {service: echo.Echo, method: Ping}}]
    backendRefs: [{name: echo, port: 9090}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: db, namespace: apps}
spec:
  parentRefs: [{name: web, sectionName: tcp}]
  rules:
  - backendRefs: [{name: db, port: 5432}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {name: pass, namespace: apps}
spec:
  parentRefs: [{name: web, sectionName: tls}]
  hostnames: [pass.example.com]
  rules:
  - backendRefs: [{name: pass, port: 443}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio}
spec:
  controllerName: istio.io/gateway-controller
  description: Istio's class
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: lua, namespace: apps}
spec:
  workloadSelector: {labels: {app: cart}}
  priority: 1
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_INBOUND
      listener:
        portNumber: 8080
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {name: envoy.filters.http.router}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          inlineCode: "function envoy_on_response(h) h:headers():add('x-lua', '1') end"
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {service: cart.apps.svc.cluster.local, portNumber: 8080}}
    patch: {operation: MERGE, value: {connect_timeout: 3s}}
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: header, namespace: apps}
spec:
  selector: {matchLabels: {app: cart}}
  url: file:///var/lib/wasm/header.wasm
  pluginName: header
  phase: AUTHZ
  priority: 10
  failStrategy: FAIL_OPEN
  pluginConfig: {header: x-cart, nested: {list: [1, 2]}}
  vmConfig: {env: [{name: POD_NAME, valueFrom: HOST}, {name: MODE, value: strict}]}
  match: [{mode: SERVER, ports: [{number: 8080}]}]
  type: HTTP
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: cart-tls, namespace: apps}
spec:
  targetRefs: [{group: "", kind: Service, name: cart, sectionName: https}]
  validation:
    caCertificateRefs: [{group: "", kind: ConfigMap, name: cart-ca}]
    hostname: cart.example.com
    subjectAltNames: [{type: Hostname, hostname: cart.example.com}, {type: URI, uri: "spiffe://td/ns/apps/sa/cart"}]
"""))


def test_the_apiserver_accepts_every_manifest_the_control_plane_accepts():
    manifests = _manifests() + TYPICAL
    kinds_seen = set()
    accepted, refused = 0, []
    for doc in manifests:
        doc = {**doc, "metadata": {"name": "x", **(doc.get("metadata") or {})}}
        try:
            parse_object(doc)
        except InvalidObject:
            continue
        group, _, version = doc["apiVersion"].rpartition("/")
        kind = next(k for k in crd_schema.custom_kinds() if (k.group, k.kind) == (group, doc["kind"]))
        errors = schema_errors(doc, _schema(kind, version))
        if errors:
            refused.append((doc["kind"], doc["metadata"]["name"], errors))
        accepted += 1
        kinds_seen.add(kind.kind)
    assert refused == []
    assert accepted >= 40, f"only {accepted} accepted manifests found in the tests"
    assert kinds_seen == {k.kind for k in crd_schema.custom_kinds()}, "every custom kind is exercised"
    assert all(parse_object(d) for d in TYPICAL), "the typical manifests are valid"


# Models of the shape the config models take: a strict message, a lenient one, an unsupported field.
class _Port(StrictModel):
    number: int = Field(ge=1, le=65535)
    target: int | str | None = None


class _Lenient(Model):
    name: str = ""


class _Spec(StrictModel):
    hosts: list[str]
    port: _Port | None = None
    mode: str = Field(default="A", json_schema_extra={"enum": ["A", "B"]})
    labels: dict[str, str] = Field(default_factory=dict)
    lenient: _Lenient | None = None
    future_feature: Unsupported = None


class _Object(K8sObject):
    spec: _Spec


_KIND = Kind("example.istio.io", ("v1",), "Example", "examples", True, _Object)


def test_strict_models_refuse_unknown_fields_and_unsupported_fields_are_kept_for_the_webhook():
    schema = crd_schema.object_schema(_KIND)
    assert structural_errors(schema) == []
    spec = schema["properties"]["spec"]
    assert spec["properties"]["futureFeature"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert spec["properties"]["port"]["properties"]["target"] == {"x-kubernetes-int-or-string": True}
    assert spec["properties"]["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert "default" not in str(spec) and "title" not in str(spec)

    def doc(**spec_fields) -> dict:
        return {"apiVersion": "example.istio.io/v1", "kind": "Example", "metadata": {"name": "e"},
                "spec": {"hosts": ["a"], **spec_fields}}

    assert schema_errors(doc(port={"number": 80, "target": "http"}), schema) == []
    assert schema_errors(doc(port={"number": 80, "targte": 1}), schema) == \
        ['unknown field "spec.port.targte"']
    assert schema_errors(doc(port={"number": 0}), schema) == [".spec.port.number: minimum 1"]
    assert schema_errors(doc(port={"number": "80"}), schema) == [".spec.port.number: must be of type integer"]
    assert schema_errors(doc(retrys=3), schema) == ['unknown field "spec.retrys"']
    assert schema_errors(doc(lenient={"name": "x", "later": True}), schema) == []  # the model ignores it too
    # istio accepts the field, so the apiserver stores it; the webhook refuses it by name.
    assert schema_errors(doc(futureFeature={"anything": [1]}), schema) == []
    with pytest.raises(Exception, match="futureFeature is not supported"):
        _Object.model_validate(doc(futureFeature={"anything": [1]}))
    missing = {**doc(), "spec": {}}
    assert schema_errors(missing, schema) == [".spec.hosts: Required value"]
