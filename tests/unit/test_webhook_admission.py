"""The webhook's decisions (pilot/webhook/admission.py) on real AdmissionReview JSON, without a
server: which kinds and operations are judged, and that a refusal carries the reason file mode
gives (the TLS server and the apiserver round trip are in tests/e2e/test_validation_webhook.py)."""

from __future__ import annotations

import json

import pytest

from pilot.config.kinds import KINDS
from pilot.config.validation import InvalidObject, parse_object
from pilot.webhook.admission import VALIDATED_GROUPS, review_bytes, rules, validated_kinds

SECURITY_POLICY = {"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
                   "metadata": {"name": "default", "namespace": "istio-system"},
                   "spec": {"mtls": {"mode": "SOMETIMES"}}}


def vs(api_version: str = "networking.istio.io/v1", weights=(70, 50)) -> dict:
    return {"apiVersion": api_version, "kind": "VirtualService",
            "metadata": {"name": "r", "namespace": "bookinfo"},
            "spec": {"hosts": ["reviews"], "http": [{"route": [
                {"destination": {"host": f"reviews-{i}"}, "weight": w} for i, w in enumerate(weights)]}]}}


def answer(obj, operation: str = "CREATE", review_version: str = "admission.k8s.io/v1") -> dict:
    body = {"apiVersion": review_version, "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": operation, "namespace": "bookinfo", "object": obj}}
    out = review_bytes(json.dumps(body).encode(), "application/json; charset=utf-8")
    assert out.status == 200, out.body
    doc = json.loads(out.body)
    assert doc["apiVersion"] == review_version and doc["response"]["uid"] == "u-1"
    return doc["response"]


def file_reason(obj: dict) -> str:
    with pytest.raises(InvalidObject) as e:
        parse_object(obj)
    return e.value.reason


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1alpha3"])
def test_every_served_version_is_judged_with_the_file_mode_reason(version):
    bad = vs(f"networking.istio.io/{version}")
    message = f"configuration is invalid: {file_reason(bad)}"
    assert answer(bad) == {"uid": "u-1", "allowed": False, "status": {"code": 400, "message": message}}
    assert answer(vs(f"networking.istio.io/{version}", (60, 40)))["allowed"] is True


def test_security_kinds_and_v1beta1_reviews():
    r = answer(SECURITY_POLICY, review_version="admission.k8s.io/v1beta1")
    assert r["allowed"] is False and r["status"]["message"] == \
        f"configuration is invalid: {file_reason(SECURITY_POLICY)}"
    assert "spec.mtls.mode" in r["status"]["message"]


def test_an_unserved_version_of_our_kind_is_refused_with_the_versions_we_serve():
    r = answer(vs("networking.istio.io/v1alpha2", (60, 40)))
    assert r["allowed"] is False
    assert "unsupported apiVersion 'networking.istio.io/v1alpha2'" in r["status"]["message"]


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_operations_other_than_create_and_update_are_allowed(operation):
    assert answer(vs(), operation) == {"uid": "u-1", "allowed": True}


@pytest.mark.parametrize("obj", [
    {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "h"},
     "spec": {"rules": "not a list"}},  # Gateway API: validated by its CRDs, shared with other controllers
    {"apiVersion": "telemetry.istio.io/v1", "kind": "Telemetry", "metadata": {"name": "t"}, "spec": {}},
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": 1}},
])
def test_kinds_outside_the_validated_groups_are_allowed(obj):
    assert answer(obj)["allowed"] is True


def test_the_configuration_rules_name_exactly_the_validated_kinds():
    assert {k.group for k in validated_kinds()} == set(VALIDATED_GROUPS)
    routed = {(g, v, r) for rule in rules() for g in rule["apiGroups"] for v in rule["apiVersions"]
              for r in rule["resources"]}
    expected = {(k.group, v, k.plural) for k in KINDS if k.group in VALIDATED_GROUPS for v in k.versions}
    assert routed == expected
    assert all(rule["operations"] == ["CREATE", "UPDATE"] for rule in rules())


@pytest.mark.parametrize(("body", "content_type", "status", "text"), [
    (b"", "application/json", 400, "no body found"),
    (b"{}", "application/yaml", 415, "invalid Content-Type, want `application/json`"),
    (b"\xff\xfe", "application/json", 400, "could not decode body"),
    (b'{"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview"}', "application/json", 400,
     "could not decode body: want kind AdmissionReview"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}', "application/json",
     400, "could not decode body: the AdmissionReview has no request"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}',
     "application/json", 400, "could not decode body: the AdmissionReview request has no uid"),
])
def test_what_is_not_an_admission_review_gets_a_clear_http_error(body, content_type, status, text):
    out = review_bytes(body, content_type)
    assert out.status == status and out.body.decode().startswith(text) and out.verdict is None


def test_broken_objects_are_refused_not_crashed_on():
    for obj in ("text", [1, 2], {"kind": "VirtualService", "apiVersion": "networking.istio.io/v1",
                                 "metadata": "x", "spec": 3}):
        r = answer(obj)
        assert r["allowed"] is False and r["status"]["code"] == 400, r
