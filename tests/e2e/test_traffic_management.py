"""VirtualService and DestinationRule through a real Envoy, with real HTTP.

The mesh: service `reviews` with two versions (Pods labelled version=v1/v2 behind one
EndpointSlice, each endpoint pointing at its Pod) and a `mirror` service. Each test writes
traffic rules and observes what HTTP clients get.
"""

from __future__ import annotations

import asyncio
import json
import textwrap

import aiohttp
import pytest

from tests.e2e.mesh_config import fqdn
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)
NODE = sidecar_node_id("productpage-1")
REVIEWS = fqdn("reviews")


def mesh_yaml(port: int, v1: int, v2: int, mirror: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: reviews, namespace: default}}
        spec:
          ports: [{{name: http, port: {port}}}]
        ---
        apiVersion: v1
        kind: Pod
        metadata: {{name: reviews-v1, namespace: default, labels: {{app: reviews, version: v1}}}}
        status: {{podIP: 127.0.0.1}}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {{name: reviews-v2, namespace: default, labels: {{app: reviews, version: v2}}}}
        status: {{podIP: 127.0.0.2}}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: reviews-1
          namespace: default
          labels: {{kubernetes.io/service-name: reviews}}
        addressType: IPv4
        ports: [{{name: http, port: {v1}}}]
        endpoints:
        - addresses: ["127.0.0.1"]
          targetRef: {{kind: Pod, name: reviews-v1, namespace: default}}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: reviews-2
          namespace: default
          labels: {{kubernetes.io/service-name: reviews}}
        addressType: IPv4
        ports: [{{name: http, port: {v2}}}]
        endpoints:
        - addresses: ["127.0.0.1"]
          targetRef: {{kind: Pod, name: reviews-v2, namespace: default}}
        ---
        apiVersion: v1
        kind: Service
        metadata: {{name: mirror, namespace: default}}
        spec:
          ports: [{{name: http, port: {port}}}]
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: mirror-1
          namespace: default
          labels: {{kubernetes.io/service-name: mirror}}
        addressType: IPv4
        ports: [{{name: http, port: {mirror}}}]
        endpoints:
        - addresses: ["127.0.0.1"]
        """)


SUBSETS = """
    host: reviews
    subsets:
    - {name: v1, labels: {version: v1}}
    - {name: v2, labels: {version: v2}}
    """


class Mesh:
    def __init__(self, cp: ControlPlane, port: int, backends: dict[str, HttpBackend], envoy: Envoy) -> None:
        self.cp, self.port, self.backends, self.envoy = cp, port, backends, envoy

    async def get(self, path: str = "/", headers: dict | None = None, timeout: float = 5):
        """(status, backend name or None, response headers, body)."""
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{self.port}{path}", headers={"Host": REVIEWS, **(headers or {})},
                             allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                body = await r.text()
                try:
                    name = json.loads(body).get("name")
                except ValueError:
                    name = None
                return r.status, name, r.headers, body

    def virtual_service(self, spec: str) -> None:
        self.cp.write("vs.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\n"
                                 "metadata: {name: reviews, namespace: default}\nspec:\n"
                                 + textwrap.indent(textwrap.dedent(spec), "  "))

    async def until(self, check, message: str, timeout: float = 10):
        return await wait_for(check, timeout, message=f"{message}\n{self.cp.log_tail(10)}")


@pytest.fixture
async def mesh(tmp_path):
    backends = {n: await HttpBackend(n).start() for n in ("v1", "v2", "mirror")}
    port = free_port()
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mesh_yaml(port, backends["v1"].port, backends["v2"].port, backends["mirror"].port))
    cp.write("dr.yaml", destination_rule(SUBSETS))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port), tmp_path)
        await envoy.wait_ready()
        m = Mesh(cp, port, backends, envoy)

        async def up():
            return (await m.get())[0] == 200

        await m.until(up, "reviews reachable")
        yield m
    finally:
        await envoy.stop()
        await cp.stop()
        for b in backends.values():
            await b.stop()


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
    status, name, _, body = await mesh.get("/items/abc")
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
        status, name, headers, body = await mesh.get(headers={"x-secret": "s3cr3t"})
        sent = json.loads(body)["headers"] if status == 200 else {}
        return headers.get("x-served-by") == "mesh" and sent.get("x-added") == "by-mesh" and "x-secret" not in {
            k.lower() for k in sent}

    await mesh.until(applied, "header manipulation")
    before = mirror.request_count
    for _ in range(5):
        assert (await mesh.get("/copied"))[1] == "v1"
    await mesh.until(lambda: mirror.request_count - before >= 5, "mirror received copies")
    assert all(r["path"] == "/copied" for r in mirror.requests[before:])


def destination_rule(spec: str) -> str:
    return ("apiVersion: networking.istio.io/v1\nkind: DestinationRule\n"
            "metadata: {name: reviews, namespace: default}\nspec:\n" + textwrap.indent(textwrap.dedent(spec), "  "))


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
        clusters = next(c for c in dump["configs"] if c["type"].endswith("Cluster"))["resources"]
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


async def test_service_entries_static_dns_and_workload_entries(mesh: Mesh, tmp_path):
    """External hosts: STATIC with an inline endpoint, DNS resolved by Envoy (localhost), and a
    workloadSelector picking a WorkloadEntry."""
    extra = [await HttpBackend(n).start() for n in ("static", "dns", "workload")]
    try:
        mesh.cp.write("se.yaml", textwrap.dedent(f"""\
            apiVersion: networking.istio.io/v1
            kind: ServiceEntry
            metadata: {{name: static-api, namespace: default}}
            spec:
              hosts: [api.static.test]
              ports: [{{number: {mesh.port}, name: http, protocol: HTTP}}]
              resolution: STATIC
              endpoints: [{{address: 127.0.0.1, ports: {{http: {extra[0].port}}}}}]
            ---
            apiVersion: networking.istio.io/v1
            kind: ServiceEntry
            metadata: {{name: dns-api, namespace: default}}
            spec:
              hosts: [api.dns.test]
              ports: [{{number: {mesh.port}, name: http, protocol: HTTP}}]
              resolution: DNS
              endpoints: [{{address: localhost, ports: {{http: {extra[1].port}}}}}]
            ---
            apiVersion: networking.istio.io/v1
            kind: ServiceEntry
            metadata: {{name: vm-api, namespace: default}}
            spec:
              hosts: [api.vm.test]
              ports: [{{number: {mesh.port}, name: http, protocol: HTTP}}]
              resolution: STATIC
              workloadSelector: {{labels: {{app: vm}}}}
            ---
            apiVersion: networking.istio.io/v1
            kind: WorkloadEntry
            metadata: {{name: vm-1, namespace: default}}
            spec:
              address: 127.0.0.1
              ports: {{http: {extra[2].port}}}
              labels: {{app: vm}}
            """))

        async def answered_by(host: str, name: str):
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{mesh.port}/", headers={"Host": host},
                                 timeout=aiohttp.ClientTimeout(total=5)) as r:
                    return r.status == 200 and json.loads(await r.text())["name"] == name

        for host, name in (("api.static.test", "static"), ("api.dns.test", "dns"), ("api.vm.test", "workload")):
            await mesh.until(lambda h=host, n=name: answered_by(h, n), f"{host} -> {name}", timeout=15)
        registry = {s["hostname"] for s in await mesh.cp.debug("/debug/registryz")}
        assert {"api.static.test", "api.dns.test", "api.vm.test"} <= registry
    finally:
        for b in extra:
            await b.stop()


async def test_sidecar_egress_scopes_what_a_proxy_sees_and_pushes(mesh: Mesh):
    """A Sidecar limiting egress to `./reviews...`: mirror disappears from the proxy's config, a
    change to mirror no longer pushes to it, and REGISTRY_ONLY blocks unknown hosts."""
    mirror_cluster = f"outbound|{mesh.port}||{fqdn('mirror')}"

    async def clusters() -> set[str]:
        dump = await mesh.cp.debug(f"/debug/config_dump?proxyID={NODE}")
        return {r["name"] for c in dump["configs"] if c["type"].endswith("Cluster") for r in c["resources"]}

    assert mirror_cluster in await clusters()
    mesh.cp.write("sidecar.yaml", textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: default, namespace: default}}
        spec:
          egress:
          - hosts: ["./{REVIEWS}"]
          outboundTrafficPolicy: {{mode: REGISTRY_ONLY}}
        """))

    async def scoped() -> bool:
        names = await clusters()
        return mirror_cluster not in names and f"outbound|{mesh.port}||{REVIEWS}" in names

    await mesh.until(scoped, "mirror hidden by the Sidecar")
    # Envoy agrees, and a host it does not know now gets the REGISTRY_ONLY 502.
    await mesh.until(lambda: _status_for(mesh, fqdn("mirror"), 502), "unknown host blocked")
    assert (await mesh.get())[0] == 200
    await mesh.cp.wait_synced(NODE)
    before = (await mesh.cp.sync_status(NODE))["cluster_sent"]
    pushes_before = len((await mesh.cp.debug("/debug/push_status"))["pushes"])
    mesh.cp.write("mirror-svc.yaml", textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: mirror2, namespace: default}}
        spec:
          ports: [{{name: http, port: {mesh.port + 1 if mesh.port < 65535 else mesh.port - 1}}}]
        """))

    async def pushed_elsewhere():
        status = await mesh.cp.debug("/debug/push_status")
        return len(status["pushes"]) > pushes_before and status["pushes"][0]

    push = await mesh.until(pushed_elsewhere, "the invisible change was pushed")
    assert push["proxies"] == 0, "a change to a service the Sidecar hides must not push to the proxy"
    assert (await mesh.cp.sync_status(NODE))["cluster_sent"] == before


async def _status_for(mesh: Mesh, host: str, status: int) -> bool:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{mesh.port}/", headers={"Host": host},
                         timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status == status


async def test_source_labels_and_namespace_pick_rules_per_client(mesh: Mesh, tmp_path):
    """Two sidecars in one namespace with different labels get different routes for the same host:
    sourceLabels decides; a sourceNamespace rule for another namespace applies to neither."""
    mesh.virtual_service("""
        hosts: [reviews]
        http:
        - match: [{sourceNamespace: elsewhere}]
          route: [{destination: {host: reviews, subset: v1}}]
        - match: [{sourceLabels: {app: canary-client}}]
          route: [{destination: {host: reviews, subset: v2}}]
        - route: [{destination: {host: reviews, subset: v1}}]
        """)
    canary = Envoy()
    try:
        # The canary sidecar uses istiod's iptables shape (listeners that do not bind), so it does
        # not share the bound 127.0.0.1:PORT listener that the test's HTTP requests go to.
        await canary.start(Envoy.bootstrap(sidecar_node_id("canary-1"), mesh.cp.xds_port, metadata={
            "NAMESPACE": "default", "INTERCEPTION_MODE": "REDIRECT", "LABELS": {"app": "canary-client"}}), tmp_path)
        await canary.wait_ready()

        async def routes_of(envoy: Envoy) -> str:
            return json.dumps(await envoy.config_dump(resource="dynamic_route_configs"))

        async def distinct():
            plain, special = await routes_of(mesh.envoy), await routes_of(canary)
            return "|v2|" in special and "|v2|" not in plain and "|v1|" in plain

        await mesh.until(distinct, "the canary client alone routes to v2")
        for _ in range(5):
            assert (await mesh.get())[1] == "v1"
    finally:
        await canary.stop()


async def test_workload_entries_move_on_the_endpoint_path_and_form_subsets(mesh: Mesh):
    """A VM (WorkloadEntry) joining a ServiceEntry is an endpoint change: EDS only, no CDS/LDS/RDS;
    and a DestinationRule subset on the ServiceEntry picks WorkloadEntries by label."""
    vms = [await HttpBackend(n).start() for n in ("vm-blue", "vm-green")]
    try:
        mesh.cp.write("vm.yaml", textwrap.dedent(f"""\
            apiVersion: networking.istio.io/v1
            kind: ServiceEntry
            metadata: {{name: vms, namespace: default}}
            spec:
              hosts: [app.vm.test]
              ports: [{{number: {mesh.port}, name: http, protocol: HTTP}}]
              resolution: STATIC
              workloadSelector: {{labels: {{app: vm}}}}
            ---
            apiVersion: networking.istio.io/v1
            kind: WorkloadEntry
            metadata: {{name: blue, namespace: default}}
            spec: {{address: 127.0.0.1, ports: {{http: {vms[0].port}}}, labels: {{app: vm, color: blue}}}}
            ---
            apiVersion: networking.istio.io/v1
            kind: DestinationRule
            metadata: {{name: vms, namespace: default}}
            spec:
              host: app.vm.test
              subsets: [{{name: green, labels: {{color: green}}}}]
            ---
            apiVersion: networking.istio.io/v1
            kind: VirtualService
            metadata: {{name: vms, namespace: default}}
            spec:
              hosts: [app.vm.test]
              http:
              - match: [{{headers: {{x-color: {{exact: green}}}}}}]
                route: [{{destination: {{host: app.vm.test, subset: green}}}}]
              - route: [{{destination: {{host: app.vm.test}}}}]
            """))

        async def answered(name: str, headers: dict | None = None) -> bool:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{mesh.port}/", headers={"Host": "app.vm.test", **(headers or {})},
                                 timeout=aiohttp.ClientTimeout(total=5)) as r:
                    return r.status == 200 and json.loads(await r.text())["name"] == name

        await mesh.until(lambda: answered("vm-blue"), "VM reachable")
        await mesh.cp.wait_synced(NODE)
        before = await mesh.cp.sync_status(NODE)
        mesh.cp.write("vm-green.yaml", textwrap.dedent(f"""\
            apiVersion: networking.istio.io/v1
            kind: WorkloadEntry
            metadata: {{name: green, namespace: default}}
            spec: {{address: 127.0.0.1, ports: {{http: {vms[1].port}}}, labels: {{app: vm, color: green}}}}
            """))
        await mesh.until(lambda: answered("vm-green", {"x-color": "green"}), "green subset from the new VM")
        after = await mesh.cp.wait_synced(NODE)
        for t in ("cluster", "listener", "route"):
            assert after[f"{t}_sent"] == before[f"{t}_sent"], f"a WorkloadEntry change pushed {t}"
    finally:
        for b in vms:
            await b.stop()
