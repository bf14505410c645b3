"""AdmissionReview in, AdmissionReview out: istiod's validation webhook semantics, decided by
the very validator file mode uses (`parse_object`), so a rejection reads the same everywhere.

Pure: bytes and a content type in, an HTTP status and a body out. No I/O, so the server, the
tests and the benchmark all run exactly this.

What istiod does, and so do we (pkg/webhooks/validation/server):
- only CREATE and UPDATE are validated; every other operation is allowed;
- a denial carries `status.message` "configuration is invalid: <reason>" (the apiserver shows
  it after `admission webhook "validation.istio.io" denied the request:`), and we also set
  `status.code` 400, which is what the apiserver reports for a denial without a code;
- an object with the annotation `internal.istio.io/webhook-always-reject` is refused (any
  value, as istiod checks only its presence): istiod's own readiness probe and istio's
  validation tests rely on it;
- top-level fields other than apiVersion/kind/metadata/spec/status are refused;
- the response echoes the request's `uid` and its AdmissionReview apiVersion (v1 or v1beta1).

Where we differ on purpose: a kind outside the groups we validate is allowed (istiod answers
"unrecognized type" for kinds it has no schema for, but the apiserver only sends what the
webhook configuration's rules name, which are exactly our kinds; see `rules()`). A body that
is not an AdmissionReview at all (not JSON, no `request`, no `uid`) gets HTTP 400 with the
reason rather than istiod's HTTP 200 denial without a uid, which the apiserver would reject
as a broken webhook anyway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from pilot.config.kinds import KINDS, Kind
from pilot.config.validation import InvalidObject, parse_object

# The API groups whose kinds this webhook validates, as istiod's configuration names Istio's
# groups. Gateway API kinds are shared with other controllers and validated by their CRDs'
# schemas; refusing a field we do not support would break another implementation's Gateway.
VALIDATED_GROUPS: tuple[str, ...] = ("networking.istio.io", "security.istio.io", "telemetry.istio.io",
                                      "extensions.istio.io")
ALWAYS_REJECT = "internal.istio.io/webhook-always-reject"
REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
TOP_LEVEL_FIELDS = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
VALIDATED_OPERATIONS = ("CREATE", "UPDATE")


def validated_kinds() -> list[Kind]:
    return [k for k in KINDS if k.group in VALIDATED_GROUPS]


def rules() -> list[dict]:
    """The ValidatingWebhookConfiguration rules for exactly the kinds we validate (deploy/
    ships these; tests/test_deploy.py checks they match)."""
    out: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for k in validated_kinds():
        out.setdefault((k.group, tuple(sorted(k.versions))), []).append(k.plural)
    return [{"operations": list(VALIDATED_OPERATIONS), "apiGroups": [group], "apiVersions": list(versions),
             "resources": sorted(plurals), "scope": "Namespaced"}
            for (group, versions), plurals in sorted(out.items())]


@dataclass(frozen=True)
class Verdict:
    """What one review decided, for the response, the log and the metrics."""

    allowed: bool
    message: str = ""
    reason: str = ""  # istiod's galley_validation_failed reason label, when refused or skipped
    kind: str = ""
    namespace: str = ""
    name: str = ""
    # The request's resource (metric labels).
    group: str = ""
    version: str = ""
    resource: str = ""


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: `body` is JSON (an AdmissionReview) when `verdict` is set, else text."""

    status: int
    body: bytes
    content_type: str
    verdict: Verdict | None = None
    dry_run: bool = False


def _text(status: int, message: str) -> Answer:
    return Answer(status, message.encode(), "text/plain")


def review_bytes(body: bytes, content_type: str) -> Answer:
    """Decide one HTTP request to /validate."""
    if not body:
        return _text(400, "no body found")
    if content_type.split(";")[0].strip().lower() != "application/json":
        return _text(415, "invalid Content-Type, want `application/json`")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        return _text(400, f"could not decode body: {e}")
    if not isinstance(doc, dict):
        return _text(400, "could not decode body: an AdmissionReview is an object, "
                          f"not a {type(doc).__name__}")
    api_version = doc.get("apiVersion")
    if doc.get("kind") != "AdmissionReview" or api_version not in REVIEW_VERSIONS:
        return _text(400, f"could not decode body: want kind AdmissionReview of apiVersion "
                          f"{' or '.join(REVIEW_VERSIONS)}, got {doc.get('kind')!r} {api_version!r}")
    request = doc.get("request")
    if not isinstance(request, dict):
        return _text(400, "could not decode body: the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return _text(400, "could not decode body: the AdmissionReview request has no uid")
    verdict = decide(request)
    res = r if isinstance(r := request.get("resource"), dict) else {}
    verdict = replace(verdict, group=str(res.get("group", "")), version=str(res.get("version", "")),
                      resource=str(res.get("resource", "")))
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 400, "message": verdict.message}
    out = {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}
    return Answer(200, json.dumps(out, separators=(",", ":")).encode(), "application/json", verdict,
                  dry_run=request.get("dryRun") is True)


def decide(request: dict) -> Verdict:
    """The decision for one AdmissionRequest (already known to be a mapping with a uid)."""
    operation = request.get("operation")
    if operation not in VALIDATED_OPERATIONS:
        return Verdict(True, reason="unsupported_operation")
    obj = request.get("object")
    if not isinstance(obj, dict):
        what = "missing" if obj is None else f"a {type(obj).__name__}"
        return Verdict(False, f"cannot decode configuration: the request's object is {what}",
                       "yaml_decode_error")
    kind = str(obj.get("kind") or "")
    api_version = str(obj.get("apiVersion") or "")
    group = api_version.rpartition("/")[0]
    meta = md if isinstance(md := obj.get("metadata"), dict) else {}
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or request.get("namespace") or "")
    if group not in VALIDATED_GROUPS or not any(k.kind == kind for k in validated_kinds()):
        return Verdict(True, reason="unknown_type", kind=kind, namespace=namespace, name=name)
    annotations = a if isinstance(a := meta.get("annotations"), dict) else {}
    if ALWAYS_REJECT in annotations:
        return Verdict(False, f'configuration is invalid: "{ALWAYS_REJECT}" annotation found, rejecting',
                       "invalid_config", kind, namespace, name)
    try:
        parse_object(obj, default_namespace=namespace or "default")
    except InvalidObject as e:
        return Verdict(False, f"configuration is invalid: {e.reason}", "invalid_config", kind, namespace,
                       name)
    for key in obj:
        if key not in TOP_LEVEL_FIELDS:
            return Verdict(False, f'unknown field "{key}" on {kind} resource {namespace}/{name}',
                           "invalid_config", kind, namespace, name)
    return Verdict(True, kind=kind, namespace=namespace, name=name)
