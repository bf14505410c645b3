"""Every field of istio 1.30's networking API is either modelled (and then generated: see
test_cache_inputs_traffic_fields.py and the builders' tests) or declared `Unsupported`, so
istio-valid YAML using it is refused as "X is not supported", never as "unknown field" and never
silently dropped; and no model invents a field istio does not have.

tests/unit/data/istio_networking_fields.json lists, per message of istio/api v1.30.3, each
field's JSON name and the message it holds (networking v1 and v1beta1 are aliases of v1alpha3).
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from pilot.config import networking as net
from pilot.config.base import UNSUPPORTED_MARK
from pilot.config.validation import InvalidObject, parse_object

API = json.loads((Path(__file__).parent / "data" / "istio_networking_fields.json").read_text())
ROOTS = {"VirtualService": net.VirtualServiceSpec, "DestinationRule": net.DestinationRuleSpec,
         "Gateway": net.GatewaySpec, "ServiceEntry": net.ServiceEntrySpec, "Sidecar": net.SidecarSpec,
         "WorkloadEntry": net.WorkloadEntrySpec, "EnvoyFilter": net.EnvoyFilterSpec}


def _nested_model(annotation) -> type[BaseModel] | None:
    """The model a field holds, through list[...], dict[str, ...], X | None and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _unsupported(field) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and bool(extra.get(UNSUPPORTED_MARK))


def _json_name(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    return field.alias or name


def walk(kind: str) -> tuple[dict[str, list[str]], list[str]]:
    """({"applied": [...], "refused": [...]}, problems) for one kind, field paths as users write them."""
    out: dict[str, list[str]] = {"applied": [], "refused": []}
    problems: list[str] = []
    seen: set[tuple[str, type]] = set()

    def visit(message: str, model: type[BaseModel], path: str) -> None:
        if (message, model) in seen:  # a message reached again (ConnectionPoolSettings in Sidecar): once
            return
        seen.add((message, model))
        fields = API["messages"][message]
        by_json = {_json_name(model, n): n for n in model.model_fields}
        for json_name, spec in fields.items():
            where = f"{path}.{json_name}" if path else json_name
            name = by_json.get(json_name)
            if name is None:
                problems.append(f"{kind} {where}: in istio's API, not modelled (an unknown field here)")
                continue
            field = model.model_fields[name]
            if _unsupported(field):
                out["refused"].append(where)
                continue
            out["applied"].append(where)
            if spec["message"] is not None:
                nested = _nested_model(field.annotation)
                if nested is None:
                    problems.append(f"{kind} {where}: holds {spec['message']} but is modelled as a scalar")
                else:
                    visit(spec["message"], nested, where)
        for json_name in by_json:
            if json_name not in fields:
                problems.append(f"{kind} {path}.{json_name}: modelled but not in istio's API")

    visit(API["roots"][kind], ROOTS[kind], "")
    return out, problems


@pytest.mark.parametrize("kind", sorted(ROOTS))
def test_every_istio_field_is_modelled_or_refused(kind: str) -> None:
    fields, problems = walk(kind)
    assert problems == []
    assert fields["applied"]
    print(f"FIELDS {kind}: applied {len(fields['applied'])}, refused {len(fields['refused'])}: "
          f"{', '.join(fields['refused'])}")


@pytest.mark.parametrize("kind", sorted(ROOTS))
def test_every_unsupported_field_is_refused_by_name(kind: str) -> None:
    """Set each refused field (with any value) in an otherwise valid object: the rejection names it."""
    refused = walk(kind)[0]["refused"]
    for path in refused:
        doc = {"apiVersion": "networking.istio.io/v1alpha3" if kind == "EnvoyFilter" else "networking.istio.io/v1", "kind": kind,
               "metadata": {"name": "x", "namespace": "ns"}, "spec": _spec_with(kind, path)}
        with pytest.raises(InvalidObject) as e:
            parse_object(doc)
        assert f"{path.split('.')[-1]} is not supported" in e.value.reason, (path, e.value.reason)


# A minimal valid spec per kind, and where each list along a path gets its one element.
_BASE = {
    "VirtualService": {"hosts": ["a"], "http": [{"route": [{"destination": {"host": "a"}}]}],
                       "tcp": [{"match": [{}], "route": [{"destination": {"host": "a"}}]}],
                       "tls": [{"match": [{"sniHosts": ["a"]}], "route": [{"destination": {"host": "a"}}]}]},
    "DestinationRule": {"host": "a", "trafficPolicy": {"tls": {"mode": "DISABLE"}}},
    "Gateway": {"servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]},
    "ServiceEntry": {"hosts": ["a.example.com"]},
    "Sidecar": {"egress": [{"hosts": ["*/*"]}], "ingress": [{"port": {"number": 80, "protocol": "HTTP"}}]},
    "WorkloadEntry": {"address": "10.0.0.1"},
    "EnvoyFilter": {"configPatches": [{"applyTo": "CLUSTER", "patch": {"operation": "REMOVE"}}]},
}


def _spec_with(kind: str, path: str) -> dict:
    spec = json.loads(json.dumps(_BASE[kind]))
    if kind == "ServiceEntry" and path.startswith("endpoints"):
        spec.update(resolution="STATIC", endpoints=[{"address": "10.0.0.1"}])
    node = spec
    *parents, leaf = path.split(".")
    for part in parents:
        nxt = node.setdefault(part, {})
        if isinstance(nxt, list):
            nxt = nxt[0]
        node = nxt
    if kind == "Gateway" and leaf in ("caCrl", "credentialNames", "caCertCredentialName", "tlsCertificates",
                                      "verifyCertificateSpki", "verifyCertificateHash"):
        node.update(mode="SIMPLE", credentialName="cert")
        spec["servers"][0]["port"] = {"number": 443, "name": "https", "protocol": "HTTPS"}
    node[leaf] = ["x"] if leaf.endswith(("s", "Names")) else "x"
    return spec


def test_modelled_fields_are_those_istio_has_in_every_model() -> None:
    """Models reachable from no root (helpers) would escape the walk: list them so none is missed."""
    reached: set[type] = set()

    def collect(model: type[BaseModel]) -> None:
        if model in reached:
            return
        reached.add(model)
        for f in model.model_fields.values():
            if (nested := _nested_model(f.annotation)) is not None:
                collect(nested)

    for root in ROOTS.values():
        collect(root)
    exported = {v for v in vars(net).values() if isinstance(v, type) and issubclass(v, BaseModel)
                and v.__module__.startswith(net.__name__ + ".") and not issubclass(v, net.K8sObject)}
    # WorkloadSelector (type.v1beta1) is DestinationRule's; the rest must all be reached.
    assert exported - reached == set(), sorted(m.__name__ for m in exported - reached)
