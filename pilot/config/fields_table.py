"""The published table of supported fields (docs/fields.md), generated from the models.

Each field of each kind the control plane reads, with its status:
- `applied`: turned into config (or, for the Kubernetes kinds we only read, read);
- `unsupported`: declared `Unsupported`: an object setting it is refused naming it (MeshConfig:
  ignored with a warning, as istiod tolerates unknown mesh settings);
- `fails closed`: accepted, never applied as written; what happens instead is said (a Gateway
  API filter we lack answers 500, a CUSTOM AuthorizationPolicy denies).
A field's `description` (pydantic Field) is its note, e.g. who applies it.
A field marked inherits to everything under it. Nothing is listed by hand: the marks live on the
models, so the table cannot drift from what parsing does (tests/unit/test_fields_table.py checks
the committed file is the generated one). Regenerate with `make docs`.

Usage: python -m pilot.config.fields_table [--write PATH | --summary]
(`--summary`: per kind, fields applied / unsupported (refused) / failing closed, as JSON.)
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from pilot.config.base import UNSUPPORTED_MARK, StrictModel
from pilot.config.kinds import KINDS, Kind
from pilot.config.mesh import MeshConfig

APPLIED, UNSUPPORTED, FAILS_CLOSED = "applied", "unsupported", "fails closed"
# Fields every Kubernetes object has; they are not configuration of the kind.
ENVELOPE = {"api_version", "kind", "metadata"}
KUBERNETES_GROUPS = ("", "discovery.k8s.io", "networking.k8s.io")
DOC = Path(__file__).resolve().parents[2] / "docs" / "fields.md"


@dataclass(frozen=True)
class Row:
    path: str
    status: str
    note: str = ""


def _mark(info: FieldInfo) -> object:
    extra = info.json_schema_extra
    if isinstance(extra, dict) and UNSUPPORTED_MARK in extra:
        return extra[UNSUPPORTED_MARK]
    for m in info.metadata:  # the mark of an Annotated type (Unsupported)
        extra = getattr(m, "json_schema_extra", None)
        if isinstance(extra, dict) and UNSUPPORTED_MARK in extra:
            return extra[UNSUPPORTED_MARK]
    return None


def _name(name: str, info: FieldInfo) -> str:
    """The name users write: the serialisation alias, else the alias, else camelCase."""
    return info.serialization_alias or info.alias or to_camel(name)


def _models(annotation: object) -> list[tuple[str, type[BaseModel]]]:
    """The models an annotation holds, with the suffix their path takes: `[]` inside a list,
    `{}` inside a map (values)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models(args[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in args for m in _models(a)]
    if origin in (list, tuple, set, frozenset):
        return [("[]" + s, m) for a in args if a is not Ellipsis for s, m in _models(a)]
    if origin is dict:
        return [("{}" + s, m) for s, m in _models(args[1])]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    return []


def _walk(model: type[BaseModel], prefix: str, status: str, note: str, rows: list[Row],
          seen: tuple[type, ...]) -> None:
    for name, info in model.model_fields.items():
        path = f"{prefix}.{_name(name, info)}" if prefix else _name(name, info)
        mark = _mark(info)
        st, nt = status, note or (info.description or "")
        if status == APPLIED and mark is True:
            st, nt = UNSUPPORTED, info.description or ""  # the reason, when it has one
        elif status == APPLIED and isinstance(mark, str):
            st, nt = FAILS_CLOSED, mark
        rows.append(Row(path, st, nt))
        for suffix, sub in _models(info.annotation):
            if sub not in seen:  # recursive types end at their first repetition
                _walk(sub, path + suffix, st, nt, rows, (*seen, sub))


def kind_rows(model: type[BaseModel], skip: set[str] = ENVELOPE) -> list[Row]:
    rows: list[Row] = []
    for name, info in model.model_fields.items():
        if name in skip or (name == "status" and skip is ENVELOPE and not _models(info.annotation)):
            continue  # Gateway API status: written by the controller, never configuration
        top = _name(name, info)
        mark = _mark(info)
        status = UNSUPPORTED if mark is True else FAILS_CLOSED if isinstance(mark, str) else APPLIED
        note = mark if isinstance(mark, str) else (info.description or "")
        rows.append(Row(top, status, note))
        for suffix, m in _models(info.annotation):
            _walk(m, top + suffix, status, note, rows, (model, m))
    return rows


def _strict(model: type[BaseModel]) -> bool:
    """Whether an unknown field under `spec` is refused (the kinds we own the meaning of)."""
    spec = model.model_fields.get("spec")
    subs = _models(spec.annotation) if spec is not None else []
    return any(issubclass(m, StrictModel) for _, m in subs)


def _versions(k: Kind) -> str:
    return ", ".join(f"{k.group}/{v}" if k.group else v for v in k.versions)


def summary(rows: list[Row]) -> tuple[int, int, int]:
    return (sum(r.status == APPLIED for r in rows), sum(r.status == UNSUPPORTED for r in rows),
            sum(r.status == FAILS_CLOSED for r in rows))


def tables() -> list[tuple[str, str, str, list[Row]]]:
    """(title, apiVersions, unknown-field policy, rows) for every kind, then MeshConfig."""
    out = []
    for k in KINDS:
        if k.group in KUBERNETES_GROUPS:
            policy = "ignored (a Kubernetes kind this control plane only reads)"
        else:
            policy = "refused with its path" if _strict(k.model) else "ignored (not yet parsed strictly)"
        out.append((k.config_kind if k.config_kind == k.kind else f"{k.kind} ({k.config_kind})",
                    _versions(k), policy, kind_rows(k.model)))
    out.append(("MeshConfig", "`mesh` key of ConfigMap istio, or --meshConfig", ("ignored with one warning, "
                "listed in /debug/mesh (as istiod tolerates them)"), kind_rows(MeshConfig, set())))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    all_tables = tables()
    lines = [
        "# Supported fields",
        "",
        "Generated by `make docs` (`python -m pilot.config.fields_table --write docs/fields.md`) from",
        "the models in `pilot/config/`; a test fails when this file differs from what they generate.",
        "Do not edit.",
        "",
        "- **applied**: turned into proxy configuration (for Kubernetes kinds: read).",
        "- **unsupported**: an object setting the field is refused with the field's path and",
        "  `FIELD is not supported` (MeshConfig: the field is ignored, logged once at warning and listed",
        "  under `unsupported` in /debug/mesh).",
        "- **fails closed**: accepted but not applied as written; the note says what happens instead.",
        "",
        "Paths are written as users write them; `[]` is an element of a list, `{}` a value of a map.",
        "`apiVersion`, `kind` and `metadata` are accepted on every kind, and so is the top-level `status`",
        "(Gateway API status is written by this control plane).",
        "",
        "## Summary",
        "",
        "| kind | apiVersions | unknown fields | applied | unsupported | fails closed |",
        "|---|---|---|---:|---:|---:|",
    ]
    for title, versions, policy, rows in all_tables:
        applied, unsupported, closed = summary(rows)
        lines.append(f"| {title} | {versions} | {policy} | {applied} | {unsupported} | {closed} |")
    for title, versions, _policy, rows in all_tables:
        lines += ["", f"## {title}", "", f"apiVersions: {versions}", "",
                  "| field | status | note |", "|---|---|---|"]
        lines += [f"| `{_cell(r.path)}` | {r.status} | {_cell(r.note)} |" for r in rows]
    return "\n".join(lines) + "\n"


def summary_figures() -> dict:
    """Per kind: how many fields are applied, refused as unsupported, accepted failing closed."""
    out = {}
    for title, _versions, _policy, rows in tables():
        applied, unsupported, closed = summary(rows)
        out[title] = {"applied": applied, "unsupported": unsupported, "fails_closed": closed}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="PATH", help="write the table here instead of stdout")
    parser.add_argument("--summary", action="store_true", help="print the per-kind counts as JSON")
    args = parser.parse_args(argv)
    if args.summary:
        sys.stdout.write(json.dumps(summary_figures(), indent=1) + "\n")
        return 0
    text = render()
    if args.write:
        Path(args.write).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
