"""The ConformanceReport, in upstream's format (conformance/apis/v1 of kubernetes-sigs/gateway-api),
and the README's conformance statement rendered from it.

How results are counted follows upstream's suite (conformance/utils/suite/reports.go): a test
belongs to every profile whose core and extended features cover all of its features; it counts as
extended there when any of its features is not one of the profile's core features; a test needing
a feature the implementation does not claim is "not supported" and counted nowhere; provisional
tests that pass are listed in succeededProvisionalTests.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import yaml

# Feature sets of gateway-api v1.5.1 (pkg/features, conformance/utils/suite/profiles.go).
GATEWAY_EXTENDED = {"GatewayPort8080", "GatewayStaticAddresses", "GatewayHTTPListenerIsolation",
                    "GatewayHTTPSListenerDetectMisdirectedRequests", "GatewayInfrastructurePropagation",
                    "GatewayAddressEmpty", "GatewayBackendClientCertificate",
                    "GatewayFrontendClientCertificateValidation",
                    "GatewayFrontendClientCertificateValidationInsecureFallback", "ListenerSet"}
HTTPROUTE_EXTENDED = {"HTTPRouteDestinationPortMatching", "HTTPRouteBackendRequestHeaderModification",
                      "HTTPRouteQueryParamMatching", "HTTPRouteMethodMatching",
                      "HTTPRouteResponseHeaderModification", "HTTPRoutePortRedirect", "HTTPRouteSchemeRedirect",
                      "HTTPRoutePathRedirect", "HTTPRouteHostRewrite", "HTTPRoutePathRewrite",
                      "HTTPRouteRequestMirror", "HTTPRouteRequestMultipleMirrors",
                      "HTTPRouteRequestPercentageMirror", "HTTPRouteRequestTimeout", "HTTPRouteBackendTimeout",
                      "HTTPRouteParentRefPort", "HTTPRouteBackendProtocolH2C", "HTTPRouteBackendProtocolWebSocket",
                      "HTTPRouteNamedRouteRule", "HTTPRouteCORS", "HTTPRoute303RedirectStatusCode",
                      "HTTPRoute307RedirectStatusCode", "HTTPRoute308RedirectStatusCode"}
BACKEND_TLS = {"BackendTLSPolicy", "BackendTLSPolicySANValidation"}
TLSROUTE_EXTENDED = {"TLSRouteModeTerminate", "TLSRouteModeMixed"}
MESH_EXTENDED = {"MeshClusterIPMatching", "MeshConsumerRoute", "MeshHTTPRouteRewritePath",
                 "MeshHTTPRouteSchemeRedirect", "MeshHTTPRouteRedirectPort", "MeshHTTPRouteRedirectPath",
                 "MeshHTTPRouteBackendRequestHeaderModification", "MeshHTTPRouteQueryParamMatching",
                 "MeshHTTPRouteNamedRouteRule"}

PROFILES: dict[str, tuple[set[str], set[str]]] = {
    "GATEWAY-HTTP": ({"Gateway", "ReferenceGrant", "HTTPRoute"}, GATEWAY_EXTENDED | HTTPROUTE_EXTENDED | BACKEND_TLS),
    "GATEWAY-TLS": ({"Gateway", "ReferenceGrant", "TLSRoute"}, GATEWAY_EXTENDED | TLSROUTE_EXTENDED),
    "GATEWAY-GRPC": ({"Gateway", "ReferenceGrant", "GRPCRoute"}, set(GATEWAY_EXTENDED)),
    "MESH-HTTP": ({"Mesh", "HTTPRoute"}, set(MESH_EXTENDED)),
    "MESH-GRPC": ({"Mesh", "GRPCRoute"}, set(MESH_EXTENDED)),
}

SUCCEEDED, FAILED, SKIPPED, NOT_SUPPORTED = "SUCCEEDED", "FAILED", "SKIPPED", "NOT_SUPPORTED"


@dataclass
class Result:
    name: str
    features: list[str]
    provisional: bool
    result: str
    detail: str = ""


def _status(passed: int, failed: int, skipped: int, failed_tests: list[str], skipped_tests: list[str]) -> dict:
    result = "failure" if failed else "partial" if skipped else "success"
    out: dict = {"result": result, "statistics": {"Failed": failed, "Passed": passed, "Skipped": skipped}}
    if skipped_tests:
        out["skippedTests"] = sorted(skipped_tests)
    if failed_tests:
        out["failedTests"] = sorted(failed_tests)
    return out


def _summary(status: dict) -> str:
    r = status["result"]
    if r == "success":
        return "succeeded"
    if r == "partial":
        return f"partially succeeded with {status['statistics']['Skipped']} test skips"
    return f"failed with {status['statistics']['Failed']} test failures"


def build(results: list[Result], *, profiles: list[str], supported: set[str], gateway_api_version: str,
          implementation_version: str, date: str | None = None) -> dict:
    reports = []
    for pname in profiles:
        core, extended = PROFILES[pname]
        counts = {"core": {SUCCEEDED: [], FAILED: [], SKIPPED: []}, "extended": {SUCCEEDED: [], FAILED: [], SKIPPED: []}}
        for r in results:
            if r.result == NOT_SUPPORTED or not set(r.features) <= core | extended:
                continue
            level = "core" if set(r.features) <= core else "extended"
            counts[level][r.result].append(r.name)
        report: dict = {"name": pname}
        c = counts["core"]
        report["core"] = _status(len(c[SUCCEEDED]), len(c[FAILED]), len(c[SKIPPED]), c[FAILED], c[SKIPPED])
        summary = f"Core tests {_summary(report['core'])}"
        e = counts["extended"]
        if any(e.values()):
            ext = _status(len(e[SUCCEEDED]), len(e[FAILED]), len(e[SKIPPED]), e[FAILED], e[SKIPPED])
            ext["supportedFeatures"] = sorted(supported & extended)
            ext["unsupportedFeatures"] = sorted(extended - supported)
            report["extended"] = ext
            summary += f". Extended tests {_summary(ext)}"
        report["summary"] = summary + "."
        reports.append(report)
    provisional = sorted(r.name for r in results if r.provisional and r.result == SUCCEEDED)
    out = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "ConformanceReport",
        # This project has no public address of its own: the report points at its README rather
        # than at istio's repository, which is not this implementation.
        "implementation": {"organization": "istio-python", "project": "pilot-discovery",
                           "url": "README.md", "version": implementation_version,
                           "contact": ["the pilot-discovery maintainers"]},
        "date": date or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gatewayAPIVersion": gateway_api_version,
        "gatewayAPIChannel": "experimental",
        "mode": "default",
        "profiles": reports,
    }
    if provisional:
        out["succeededProvisionalTests"] = provisional
    return out


def dump(report: dict) -> str:
    return yaml.safe_dump(report, sort_keys=False)


README_BEGIN = "<!-- conformance-report:begin (generated by `make conformance` from docs/gateway-api-conformance.yaml) -->"
README_END = "<!-- conformance-report:end -->"


def readme_block(report: dict) -> str:
    """The README's statement of the result, from the report alone."""
    lines = [README_BEGIN,
             (f"Gateway API conformance: upstream suite **{report['gatewayAPIVersion']}** "
              f"({report['gatewayAPIChannel']} channel, mode `{report['mode']}`), run by `make conformance` "
              "against the file-mode control plane and real router Envoys "
              f"(report: `docs/gateway-api-conformance.yaml`, {report['date'][:10]})."),
             "",
             "| Profile | Core (passed / failed / skipped) | Extended (passed / failed / skipped) |",
             "|---|---|---|"]
    for p in report["profiles"]:
        def cell(s: dict | None) -> str:
            if s is None:
                return "-"
            st = s["statistics"]
            return f"{s['result']}: {st['Passed']} / {st['Failed']} / {st['Skipped']}"
        lines.append(f"| {p['name']} | {cell(p['core'])} | {cell(p.get('extended'))} |")
    lines.append("")
    features = sorted({f for p in report["profiles"] for f in p.get("extended", {}).get("supportedFeatures", [])})
    lines.append("Extended features claimed: " + (", ".join(f"`{f}`" for f in features) or "none") + ".")
    failed = sorted({t for p in report["profiles"] for s in (p["core"], p.get("extended") or {})
                     for t in s.get("failedTests", [])})
    skipped = sorted({t for p in report["profiles"] for s in (p["core"], p.get("extended") or {})
                      for t in s.get("skippedTests", [])})
    lines.append("Failing: " + (", ".join(failed) or "none") + ".")
    lines.append("Skipped (not translated into the runner's data yet; why, test by test, in "
                 "tests/data/gateway-api-conformance/cases.yaml): " + (", ".join(skipped) or "none") + ".")
    lines.append(README_END)
    return "\n".join(lines)


def replace_readme_block(readme: str, block: str) -> str:
    start, end = readme.index(README_BEGIN), readme.index(README_END) + len(README_END)
    return readme[:start] + block + readme[end:]
