"""VirtualService and DestinationRule HTTP features through a real Envoy, with real HTTP
(the mesh is described in tests/e2e/traffic_mesh.py)."""

# ruff: noqa: F811 - `mesh` is a pytest fixture imported from traffic_mesh and requested by name
from __future__ import annotations

import asyncio
import json

import pytest

from pilot.pilotctl import resources_of
from tests.e2e.traffic_mesh import NODE, REVIEWS, Mesh, destination_rule, mesh  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(90)


async def test_weighted_split_between_subsets(mesh: Mesh):
    mesh.virtual_service("""
        hosts: [reviews]
        http:
        - route:
          - {destination: {host: reviews, subset: v1}, weight: 80}
          - {destination: {host: reviews, subset: v2}, weight: 20}
        """)

    async def split_acked():
        # The default route already spreads over v1 and v2, so traffic cannot tell whether the
        # split is in force: wait for Envoy's own route table to hold the weighted clusters.
        dump = await mesh.envoy.config_dump(resource="dynamic_route_configs")
        return "weighted_clusters" in json.dumps(dump)

    await mesh.until(split_acked, "split applied in Envoy")
    counts = {"v1": 0, "v2": 0}
    for _ in range(300):
        status, name, *_ = await mesh.get()
        assert status == 200
        counts[name] += 1
    share = counts["v1"] / 300
    # 80% of 300: the binomial standard deviation is 2.3%, so [66%, 93%] is beyond 5 sigma.
    assert 0.66 <= share <= 0.93, counts


async def test_header_match_sends_one_user_to_v2(mesh: Mesh):
    mesh.virtual_service("""
        hosts: [reviews]
        http:
        - match: [{headers: {end-user: {exact: jason}}}]
          route: [{destination: {host: reviews, subset: v2}}]
        - route: [{destination: {host: reviews, subset: v1}}]
        """)

    async def routed():
        # Several requests each: under the default route either backend answers half the time.
        jason = {(await mesh.get(headers={"end-user": "jason"}))[1] for _ in range(8)}
        others = {(await mesh.get())[1] for _ in range(8)}
        return jason == {"v2"} and others == {"v1"}

    await mesh.until(routed, "header routing")
    for _ in range(10):
        assert (await mesh.get(headers={"end-user": "jason"}))[1] == "v2"
        assert (await mesh.get(headers={"end-user": "someone"}))[1] == "v1"


async def test_prefix_and_regex_matches_with_rewrite(mesh: Mesh):
    mesh.virtual_service("""
        hosts: [reviews]
        http:
        - match: [{uri: {prefix: /api/}}]
          rewrite: {uri: /v2/}
          route: [{destination: {host: reviews, subset: v2}}]
        - match: [{uri: {regex: "/items/[0-9]+"}}]
          route: [{destination: {host: reviews, subset: v1}}]
        - directResponse: {status: 404, body: {string: "no such page"}}
        """)

    async def rewritten():
        status, name, _, body = await mesh.get("/api/books")
        return status == 200 and name == "v2" and json.loads(body)["path"] == "/v2/books"

    await mesh.until(rewritten, "prefix rewrite")
    assert (await mesh.get("/items/42"))[1] == "v1"
    status, _name, _, body = await mesh.get("/items/abc")
    assert (status, body) == (404, "no such page")


async def test_redirect(mesh: Mesh):
    mesh.virtual_service("""
        hosts: [reviews]
        http:
        - match: [{uri: {exact: /old}}]
          redirect: {uri: /new, authority: example.com, redirectCode: 308}
        - route: [{destination: {host: reviews}}]
        """)

    async def redirected():
        status, _, headers, _ = await mesh.get("/old")
        return status == 308 and headers.get("location") == "http://example.com/new"

    await mesh.until(redirected, "redirect")


async def test_timeout_gives_504_and_retries_recover(mesh: Mesh):
    mesh.virtual_service("""
        hosts: [reviews]
        http:
        - match: [{uri: {prefix: /slow}}]
          timeout: 300ms
          route: [{destination: {host: reviews, subset: v1}}]
        - route: [{destination: {host: reviews, subset: v1}}]
          retries: {attempts: 3, retryOn: "5xx"}
        """)

    async def times_out():
        return (await mesh.get("/slow?delay=2"))[0] == 504

    await mesh.until(times_out, "per-route timeout")
    v1 = mesh.backends["v1"]
    v1.fail_next = 2
    before = v1.request_count
    status, name, *_ = await mesh.get("/flaky")
    assert (status, name) == (200, "v1")
    assert v1.request_count - before == 3  # two failures retried, then success


async def test_fault_abort_and_delay(mesh: Mesh):
    mesh.virtual_service("""
        hosts: [reviews]
        http:
        - match: [{headers: {x-test: {exact: abort}}}]
          fault: {abort: {httpStatus: 418, percentage: {value: 100}}}
          route: [{destination: {host: reviews}}]
        - match: [{headers: {x-test: {exact: delay}}}]
          fault: {delay: {fixedDelay: 1s, percentage: {value: 100}}}
          route: [{destination: {host: reviews}}]
        - route: [{destination: {host: reviews}}]
        """)

    async def aborted():
        return (await mesh.get(headers={"x-test": "abort"}))[0] == 418

    await mesh.until(aborted, "fault abort")
    before = mesh.backends["v1"].request_count + mesh.backends["v2"].request_count
    assert (await mesh.get(headers={"x-test": "abort"}))[0] == 418
    assert mesh.backends["v1"].request_count + mesh.backends["v2"].request_count == before  # never reached
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert (await mesh.get(headers={"x-test": "delay"}))[0] == 200
    assert loop.time() - t0 >= 0.9, "the injected 1 s delay did not happen"
    t0 = loop.time()
    assert (await mesh.get())[0] == 200
    assert loop.time() - t0 < 0.9


async def test_mirroring_and_header_manipulation(mesh: Mesh):
    mesh.virtual_service("""
        hosts: [reviews]
        http:
        - route: [{destination: {host: reviews, subset: v1}}]
          mirror: {host: mirror}
          mirrorPercentage: {value: 100}
          headers:
            request:
              set: {x-added: by-mesh}
              remove: [x-secret]
            response:
              set: {x-served-by: mesh}
        """)
    mirror = mesh.backends["mirror"]

    async def applied():
        status, _name, headers, body = await mesh.get(headers={"x-secret": "s3cr3t"})
        sent = json.loads(body)["headers"] if status == 200 else {}
        return headers.get("x-served-by") == "mesh" and sent.get("x-added") == "by-mesh" and "x-secret" not in {
            k.lower() for k in sent}

    await mesh.until(applied, "header manipulation")
    before = mirror.request_count
    for _ in range(5):
        assert (await mesh.get("/copied"))[1] == "v1"
    await mesh.until(lambda: mirror.request_count - before >= 5, "mirror received copies")
    assert all(r["path"] == "/copied" for r in mirror.requests[before:])


async def test_consistent_hash_keeps_a_user_on_one_backend(mesh: Mesh):
    mesh.cp.write("dr.yaml", destination_rule("""
        host: reviews
        trafficPolicy:
          loadBalancer: {consistentHash: {httpHeaderName: x-user}}
        subsets:
        - {name: v1, labels: {version: v1}}
        - {name: v2, labels: {version: v2}}
        """))

    async def sticky():
        seen = {}
        for user in range(12):
            names = {(await mesh.get(headers={"x-user": f"user-{user}"}))[1] for _ in range(4)}
            if len(names) != 1:
                return False
            seen[user] = names.pop()
        return len(set(seen.values())) == 2  # different users do land on different backends

    await mesh.until(sticky, "consistent hashing on x-user", timeout=20)


async def test_outlier_detection_ejects_a_failing_endpoint(mesh: Mesh):
    mesh.cp.write("dr.yaml", destination_rule("""
        host: reviews
        trafficPolicy:
          outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 60s, maxEjectionPercent: 100}
        subsets:
        - {name: v1, labels: {version: v1}}
        - {name: v2, labels: {version: v2}}
        """))
    dump = {}

    async def applied():
        nonlocal dump
        dump = await mesh.cp.debug(f"/debug/config_dump?proxyID={NODE}")
        clusters = resources_of(dump, "clusters")
        base = next(r for r in clusters if r["name"] == f"outbound|{mesh.port}||{REVIEWS}")
        return "outlierDetection" in base["resource"]

    await mesh.until(applied, "outlier detection in CDS")
    mesh.backends["v2"].status = 500
    statuses = [(await mesh.get())[0] for _ in range(10)]
    assert 500 in statuses or all(s == 200 for s in statuses)

    async def ejected():
        answers = [(await mesh.get())[1] for _ in range(10)]
        return all(a == "v1" for a in answers)

    await mesh.until(ejected, "failing endpoint ejected", timeout=15)


async def test_conflicting_virtual_services_are_reported(mesh: Mesh):
    mesh.virtual_service("""
        hosts: [reviews]
        http: [{route: [{destination: {host: reviews, subset: v1}}]}]
        """)
    mesh.cp.write("vs-other.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\n"
                                   "metadata: {name: zz-reviews-too, namespace: default}\nspec:\n"
                                   "  hosts: [reviews.default.svc.cluster.local]\n"
                                   "  http: [{route: [{destination: {host: reviews, subset: v2}}]}]\n")

    async def reported():
        status = await mesh.cp.debug("/debug/push_status")
        return [c for c in status["conflicts"] if "zz-reviews-too" in c]

    (conflict,) = await mesh.until(reported, "conflict listed")
    assert "default/reviews" in conflict
    assert (await mesh.get())[1] == "v1"  # the older one keeps serving

    # Destinations that go nowhere are listed too.
    mesh.virtual_service("""
        hosts: [reviews]
        http:
        - match: [{uri: {prefix: /a}}]
          route: [{destination: {host: nosuch}}]
        - route: [{destination: {host: reviews, subset: v9}}]
        """)

    async def problems():
        found = [c for c in (await mesh.cp.debug("/debug/push_status"))["conflicts"] if "nosuch" in c or "v9" in c]
        return found if len(found) == 2 else None

    found = await mesh.until(problems, "unknown host and subset reported")
    assert any("nosuch.default.svc.cluster.local is not a known service" in c for c in found)
    assert any("subset 'v9'" in c for c in found)
