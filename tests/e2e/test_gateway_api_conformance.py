"""A fast subset of the upstream Gateway API conformance tests (`make conformance` runs them all),
through the same runner and data: real router Envoys on the manifests' own listener ports, local
echo-basic stand-ins, status from /debug/gatewayz. Also: the committed report and the README's
statement agree, and the report is counted the way upstream's suite counts it."""

from __future__ import annotations

import socket

import pytest
import yaml

from tests.conformance import report, runner

pytestmark = pytest.mark.timeout(240)

# One of each kind of check: routing by path and header, a cross-namespace backend behind a
# ReferenceGrant that is then deleted (500), route status reasons, HTTPS with a Secret, gRPC,
# TLS passthrough by SNI, a mesh route seen from a sidecar, TLS to backends (BackendTLSPolicy
# subjectAltNames matched and not), and client certificates checked by the Gateway's frontend CAs.
FAST = ["HTTPRouteMatching", "HTTPRouteReferenceGrant", "HTTPRouteInvalidCrossNamespaceParentRef",
        "HTTPRouteHTTPSListener", "GRPCExactMethodMatching", "TLSRouteHostnameIntersection",
        "MeshHTTPRouteSimpleSameNamespace", "BackendTLSPolicySANValidation",
        "GatewayFrontendClientCertificateValidation"]


def _can_bind_low_ports() -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 80))
        except OSError:
            return False
    return True


@pytest.mark.skipif(not _can_bind_low_ports(), reason="the upstream manifests' listeners need ports 80/443")
async def test_fast_subset_of_upstream_conformance(tmp_path):
    results, data = await runner.run(FAST, tmp_path, verbose=False)
    assert [r.name for r in results] == sorted(FAST)
    failed = {r.name: r.detail for r in results if r.result != report.SUCCEEDED}
    assert not failed, failed
    assert not runner.unexpected(results, data)


def test_cases_name_every_upstream_test_once_with_known_steps():
    data = runner.load_cases()
    for name, case in data["tests"].items():
        assert sum(k in case for k in ("steps", "stepsOf", "untranslated")) == 1, name
        assert "stepsOf" not in case or "steps" in data["tests"][case["stepsOf"]], name
        for m in case.get("manifests", []):
            assert (runner.UPSTREAM / m).is_file(), (name, m)
        for step in case.get("steps", []):
            for item in step.get("requests", []):
                runner.expand(item)  # raises on a misspelt key


def test_report_counts_as_upstream_does():
    results = [report.Result("A", ["Gateway", "HTTPRoute"], False, report.SUCCEEDED),
               report.Result("B", ["Gateway", "HTTPRoute", "HTTPRouteMethodMatching"], False, report.FAILED, "x"),
               report.Result("C", ["Gateway"], False, report.SKIPPED),
               report.Result("D", ["Gateway", "HTTPRoute", "HTTPRouteCORS"], False, report.NOT_SUPPORTED),
               report.Result("E", ["Gateway", "TLSRoute"], True, report.SUCCEEDED)]
    rep = report.build(results, profiles=["GATEWAY-HTTP", "GATEWAY-TLS"],
                       supported={"Gateway", "HTTPRoute", "TLSRoute", "HTTPRouteMethodMatching"},
                       gateway_api_version="v1.5.1", implementation_version="0", date="2026-01-01T00:00:00Z")
    http, tls = rep["profiles"]
    assert http["core"] == {"result": "partial", "statistics": {"Failed": 0, "Passed": 1, "Skipped": 1},
                            "skippedTests": ["C"]}
    assert http["extended"]["statistics"] == {"Failed": 1, "Passed": 0, "Skipped": 0}
    assert http["extended"]["failedTests"] == ["B"]
    assert http["extended"]["supportedFeatures"] == ["HTTPRouteMethodMatching"]
    assert "HTTPRouteCORS" in http["extended"]["unsupportedFeatures"]
    assert http["summary"] == "Core tests partially succeeded with 1 test skips. Extended tests failed with 1 test failures."
    assert tls["core"]["statistics"] == {"Failed": 0, "Passed": 1, "Skipped": 1}  # E and the Gateway-only C
    assert rep["succeededProvisionalTests"] == ["E"]
    assert (rep["apiVersion"], rep["kind"]) == ("gateway.networking.k8s.io/v1", "ConformanceReport")


def test_readme_states_the_committed_report():
    rep = yaml.safe_load(runner.REPORT_PATH.read_text())
    assert report.readme_block(rep) in runner.README.read_text(), "run `make conformance` to regenerate"
