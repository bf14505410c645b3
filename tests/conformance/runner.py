"""Runs the upstream Gateway API conformance tests, as translated into cases.yaml, against the
file-mode control plane with real router Envoys, and writes the ConformanceReport.

cases.yaml (ours) names every upstream test of the vendored release with its features; a test
either has `steps` (the upstream test's checks, in order), or says why it is not translated
(`untranslated`: reported as skipped). `expectedFailure` marks a test known to fail, with why:
it still runs and is reported as it comes out; only an unexpected outcome fails the run.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tests.conformance import checks, report
from tests.conformance.cluster import Cluster, load_manifests

DATA = Path(__file__).resolve().parents[1] / "data" / "gateway-api-conformance"
UPSTREAM = DATA / "upstream"
REPO = Path(__file__).resolve().parents[2]
REPORT_PATH = REPO / "docs" / "gateway-api-conformance.yaml"
README = REPO / "README.md"


def load_cases() -> dict:
    return yaml.safe_load((DATA / "cases.yaml").read_text())


async def run_case(cluster: Cluster, name: str, case: dict) -> tuple[str, str]:
    for echo in cluster.echoes.values():
        echo.requests.clear()
    applied: list = []
    try:
        for m in case.get("manifests", []):
            applied += await cluster.apply(load_manifests(UPSTREAM / m))
        gateway = case.get("gateway", "same-namespace")
        # `stepsOf`: the same checks as another test (upstream reuses a Test func with other manifests)
        steps = case["steps"] if "steps" in case else load_cases()["tests"][case["stepsOf"]]["steps"]
        for step in steps:
            if "accepted" in step:
                await checks.check_accepted(cluster, step["accepted"])
            elif "status" in step:
                await checks.check_status(cluster, step["status"])
            elif "request" in step or "response" in step:
                await checks.check_request(cluster, gateway, step)
            elif "requests" in step:
                for item in step["requests"]:
                    await checks.check_request(cluster, gateway, expand({**step.get("via", {}), **item}))
            elif "apply" in step:
                applied += await cluster.apply(load_manifests(UPSTREAM / step["apply"]))
            elif "grpc" in step:
                for item in step["grpc"]:
                    await checks.check_grpc(cluster, gateway, {**step.get("via", {}), **item})
            elif "grpcDistribution" in step:
                await checks.check_grpc_distribution(cluster, gateway, step["grpcDistribution"])
            elif "tcp" in step:
                for item in step["tcp"]:
                    await checks.check_tcp(cluster, gateway, {**step.get("via", {}), **item})
            elif "mirrorShare" in step:
                await checks.check_mirror_share(cluster, gateway, step["mirrorShare"])
            elif "distribution" in step:
                await checks.check_distribution(cluster, gateway, step["distribution"])
            elif "delete" in step:
                kind, ref = step["delete"]
                cluster.delete([(kind, *checks.split_name(ref))])
            elif "fillEndpointSlices" in step:
                # upstream setupEndpointSlices: the Go test writes the pods' IPs into the manual
                # slices; here a pod is its echo server, 127.0.0.1 on a port of its own
                fill = step["fillEndpointSlices"]
                echo = cluster.echoes[checks.split_name(fill["deployment"])]
                for ref in fill["slices"]:
                    k = ("EndpointSlice", *checks.split_name(ref))
                    doc = copy.deepcopy(cluster.objects[k])
                    doc["endpoints"] = [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]
                    doc["ports"] = [{**p, "port": echo.port} for p in doc.get("ports", [])]
                    await cluster.apply([doc])
            elif "copyConfigMap" in step:  # the Go test's ConfigMap made from another's data
                c = step["copyConfigMap"]
                src = cluster.objects[("ConfigMap", *checks.split_name(c["from"]))]
                ns, name = checks.split_name(c["to"])
                doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
                       "data": dict(src["data"])}
                applied += await cluster.apply([doc])
            elif "patch" in step:  # a change to an applied object, as the Go test's Update does
                p = step["patch"]
                k = (p["kind"], *checks.split_name(p["name"]))
                doc = copy.deepcopy(cluster.objects[k])
                _merge(doc, p["merge"])
                await cluster.apply([doc])
            else:
                raise ValueError(f"{name}: unknown step {step}")
        return report.SUCCEEDED, ""
    except checks.CheckFailed as e:
        return report.FAILED, str(e)
    finally:
        await cluster.stop_router()
        cluster.delete(applied)


REQUEST_KEYS = {"host", "path", "method", "headers", "backendSetResponseHeaders", "sni", "clientCert"}
RESPONSE_KEYS = {"status": "status", "backend": "backend", "namespace": "namespace", "seen": "request",
                 "responseHeaders": "headers", "absentResponseHeaders": "absentHeaders", "redirect": "redirect",
                 "mirroredTo": "mirroredTo", "rejected": "rejected", "validResponseHeaders": "validHeaders",
                 "ignoreWhitespace": "ignoreWhitespace"}
VIA_KEYS = {"gateway", "listener", "port", "client"}


def expand(item: dict) -> dict:
    """A compact request line ({path, headers, backend, status, seen, ...}) as a request step."""
    out: dict = {k: item[k] for k in VIA_KEYS & item.keys()}
    out["request"] = {k: item[k] for k in REQUEST_KEYS & item.keys()}
    out["response"] = {RESPONSE_KEYS[k]: item[k] for k in RESPONSE_KEYS.keys() & item.keys()}
    unknown = item.keys() - REQUEST_KEYS - RESPONSE_KEYS.keys() - VIA_KEYS
    if unknown:
        raise ValueError(f"unknown request keys {sorted(unknown)} in {item}")
    return out


def _merge(doc: dict, patch: dict) -> None:
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(doc.get(k), dict):
            _merge(doc[k], v)
        else:
            doc[k] = v


async def run(names: list[str] | None, workdir: Path, *, verbose: bool = True) -> tuple[list[report.Result], dict]:
    data = load_cases()
    supported = set(data["supportedFeatures"])
    cluster = Cluster(workdir)
    results: list[report.Result] = []
    await cluster.start()
    try:
        await cluster.apply(load_manifests(UPSTREAM / "base" / "manifests.yaml"))
        await cluster.apply(load_manifests(UPSTREAM / "mesh" / "manifests.yaml"))
        for name, case in data["tests"].items():
            if names and name not in names:
                continue
            feats = case["features"]
            if not set(feats) <= supported:
                results.append(report.Result(name, feats, case.get("provisional", False), report.NOT_SUPPORTED))
                continue
            if "untranslated" in case:
                results.append(report.Result(name, feats, case.get("provisional", False), report.SKIPPED,
                                             case["untranslated"]))
                continue
            t0 = time.monotonic()
            outcome, detail = await run_case(cluster, name, case)
            results.append(report.Result(name, feats, case.get("provisional", False), outcome, detail))
            if verbose:
                mark = "expected-fail" if case.get("expectedFailure") and outcome == report.FAILED else outcome
                print(f"{mark:>14} {name} ({time.monotonic() - t0:.1f}s) {detail[:300]}", flush=True)
    finally:
        await cluster.stop()
    return results, data


def unexpected(results: list[report.Result], data: dict) -> list[str]:
    out = []
    for r in results:
        expected_fail = bool(data["tests"][r.name].get("expectedFailure"))
        if r.result == report.FAILED and not expected_fail:
            out.append(f"{r.name} failed: {r.detail}")
        elif r.result == report.SUCCEEDED and expected_fail:
            out.append(f"{r.name} passed although marked expectedFailure: flip it in cases.yaml")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance", description=__doc__)
    ap.add_argument("--run", action="append", help="only this upstream test (repeatable); no report is written")
    ap.add_argument("--report", type=Path, default=REPORT_PATH)
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the README's conformance statement")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gwconf-") as tmp:
        results, data = asyncio.run(run(args.run, Path(tmp)))
    if not args.run:
        from pilot import __version__
        rep = report.build(results, profiles=data["profiles"], supported=set(data["supportedFeatures"]),
                           gateway_api_version=data["upstream"]["tag"], implementation_version=__version__)
        args.report.write_text(report.dump(rep))
        if not args.no_readme:
            README.write_text(report.replace_readme_block(README.read_text(), report.readme_block(rep)))
        for p in rep["profiles"]:
            print(f"{p['name']}: {p['summary']}")
    bad = unexpected(results, data)
    for b in bad:
        print("UNEXPECTED:", b, file=sys.stderr)
    return 1 if bad else 0
