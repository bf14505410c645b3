"""Turn one decoded YAML document into a typed object, or a precise reason why not."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from pilot.config.base import K8sObject
from pilot.config.kinds import by_wire_kind, lookup

# Kinds istiod serves that this control plane does not build: refused by name, with what
# configuring them would otherwise have meant, rather than as an unknown kind.
UNBUILT_KINDS = {
    "XListenerSet": "the experimental predecessor of ListenerSet; istiod reads ListenerSet "
                    "(gateway.networking.k8s.io/v1), as this control plane does",
    "InferencePool": "an inference backend pool (istiod: ENABLE_GATEWAY_API_INFERENCE_EXTENSION)",
}


@dataclass(frozen=True)
class Rejection:
    """Why a document was not accepted. Shown in logs and /debug/configz, so it names the place."""

    source: str  # file path (or "kube"), with the document index when known
    kind: str
    namespace: str
    name: str
    reason: str

    def as_dict(self) -> dict:
        return {"source": self.source, "kind": self.kind, "namespace": self.namespace,
                "name": self.name, "reason": self.reason}


class InvalidObject(ValueError):
    def __init__(self, kind: str, namespace: str, name: str, reason: str):
        super().__init__(reason)
        self.kind, self.namespace, self.name, self.reason = kind, namespace, name, reason


def parse_object(doc: object, default_namespace: str = "default") -> K8sObject:
    """Validate a document. Namespaced kinds without a namespace land in `default_namespace`,
    as `kubectl apply` would put them."""
    if not isinstance(doc, dict):
        raise InvalidObject("", "", "", f"document is a {type(doc).__name__}, not a mapping")
    kind = str(doc.get("kind") or "")
    api_version = str(doc.get("apiVersion") or "")
    meta = md if isinstance(md := doc.get("metadata"), dict) else {}
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or "")
    if not kind:
        raise InvalidObject("", namespace, name, "missing kind")
    k = lookup(api_version, kind)
    if k is None:
        if wanted := by_wire_kind(kind):
            versions = ", ".join(f"{w.group + '/' if w.group else ''}{v}" for w in wanted for v in w.versions)
            reason = f"unsupported apiVersion {api_version!r} for {kind} (want {versions})"
        elif kind in UNBUILT_KINDS:
            reason = f"{kind} is not supported by this control plane: {UNBUILT_KINDS[kind]}"
        else:
            reason = f"unknown kind {kind!r} (apiVersion {api_version!r})"
        raise InvalidObject(kind, namespace, name, reason)
    if k.namespaced and not namespace:
        doc = {**doc, "metadata": {**meta, "namespace": default_namespace}}
        namespace = default_namespace
    elif not k.namespaced and namespace:
        doc = {**doc, "metadata": {k2: v for k2, v in meta.items() if k2 != "namespace"}}
        namespace = ""
    try:
        return k.model.model_validate(doc)
    except ValidationError as e:
        # The Store's name for the kind, so a rejection lines up with the object's ConfigKey.
        raise InvalidObject(k.config_kind, namespace, name, format_validation_error(e)) from None


def field_path(loc: tuple) -> str:
    """pydantic's location as users write it: ('spec', 'http', 0, 'retrys') -> spec.http[0].retrys."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def format_validation_error(e: ValidationError, limit: int = 5) -> str:
    parts = []
    # An unknown field first: a misspelling is the cause, and the complaints it provokes
    # (a required field "missing") only follow from it.
    errors = sorted(e.errors(), key=lambda err: err["type"] != "extra_forbidden")
    for err in errors[:limit]:
        loc = field_path(err["loc"])
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}" if loc else msg)
    more = len(e.errors()) - limit
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts)
