"""ServiceEntry, WorkloadEntry, Sidecar scoping and per-client (sourceLabels) routing through a
real Envoy (the mesh is described in tests/e2e/traffic_mesh.py)."""

# ruff: noqa: F811 - `mesh` is a pytest fixture imported from traffic_mesh and requested by name
from __future__ import annotations

import json
import textwrap

import aiohttp
import pytest

from pilot.pilotctl import resources_of
from tests.e2e.mesh_config import fqdn
from tests.e2e.traffic_mesh import NODE, REVIEWS, Mesh, destination_rule, mesh  # noqa: F401 - fixture
from tests.support.backends import HttpBackend
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id

pytestmark = pytest.mark.timeout(90)


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
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{mesh.port}/", headers={"Host": host},
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
        return {r["name"] for r in resources_of(dump, "clusters")}

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
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{mesh.port}/", headers={"Host": host},
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
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{mesh.port}/", headers={"Host": "app.vm.test", **(headers or {})},
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
