"""EnvoyFilter `targetRefs` with real Envoys: a filter in namespace `infra` targeting the Gateway
API Gateway `web` (context ANY, so only selection keeps it off other proxies) patches the
gateway's Envoy (a header-mutation filter before the router, and a virtual host matched by
`domainName`), seen in Envoy's /config_dump and on real responses, while a sidecar of the same
namespace is neither patched nor pushed (the push reaches one proxy; the sidecar's xDS nonces do
not move). Retargeted to another
Gateway, the patches leave the gateway again; when that Gateway is a waypoint (which takes no
patches here), /debug/push_status lists the filter."""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.gateway_api_env import (
    GW_NAME,
    GW_NS,
    ROUTER,
    SERVICE_PORT,
    GatewayApiEnv,
    gateway_service_yaml,
    gateway_yaml,
    request,
    route_yaml,
    running_env,
)
from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(120)

HCM = "envoy.filters.network.http_connection_manager"
SIDECAR = sidecar_node_id("client-1", namespace=GW_NS)
TYPES = ("cluster", "listener", "route")


def target_filter(gateway: str) -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1alpha3
        kind: EnvoyFilter
        metadata: {{name: web-headers, namespace: {GW_NS}}}
        spec:
          targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: {gateway}}}]
          configPatches:
          - applyTo: HTTP_FILTER
            match:
              listener:
                filterChain:
                  filter:
                    name: {HCM}
                    subFilter: {{name: envoy.filters.http.router}}
            patch:
              operation: INSERT_BEFORE
              value:
                name: target-ref.header_mutation
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
                  mutations:
                    response_mutations:
                    - append: {{header: {{key: x-target-ref, value: {gateway}}}}}
          - applyTo: VIRTUAL_HOST
            match: {{routeConfiguration: {{vhost: {{domainName: shop.example.com}}}}}}
            patch:
              operation: MERGE
              value: {{response_headers_to_add: [{{header: {{key: x-vhost, value: shop}}}}]}}
        """)


def sidecar_scope(host: str) -> str:
    """Keeps the sidecar's outbound view to one service (no listener on the shared port 8000)."""
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: default, namespace: {GW_NS}}}
        spec:
          egress: [{{hosts: ["default/{host}"]}}]
        """)


async def http_filter_names(envoy: Envoy) -> list[str]:
    dump = await envoy.config_dump(resource="dynamic_listeners")
    return [h["name"] for c in dump.get("configs", [])
            for fc in c.get("active_state", {}).get("listener", {}).get("filter_chains", [])
            for f in fc.get("filters", []) if f.get("name") == HCM
            for h in f["typed_config"].get("http_filters", [])]


@pytest.fixture
async def env(tmp_path):
    async with running_env(tmp_path, ("alpha",)) as e:
        yield e


async def test_a_gateway_target_patches_that_gateways_envoy_and_not_a_sidecar(env: GatewayApiEnv, tmp_path):
    port, side_port = free_ports(2)
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: http
          port: {port}
          protocol: HTTP
          allowedRoutes: {{namespaces: {{from: All}}}}
        """) + "---\n" + gateway_service_yaml(port))
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "shop", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        hostnames: [shop.example.com, other.example.com]
        rules:
        - backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]
        """))
    # The sidecar of namespace infra calls `side` (the same backend) on a port of its own.
    env.cp.write("side.yaml", service_yaml("side", side_port) + "---\n"
                 + endpoint_slice_yaml("side", env.backends["alpha"].port))
    env.cp.write("sidecar.yaml", sidecar_scope(fqdn("side")))
    await env.start()
    sidecar = Envoy()
    try:
        metadata = {"NAMESPACE": GW_NS, "INTERCEPTION_MODE": "NONE", "LABELS": {"app": "client"}}
        await sidecar.start(Envoy.bootstrap(SIDECAR, env.cp.xds_port, metadata=metadata,
                                            cluster=f"client.{GW_NS}"), tmp_path / "sidecar")
        await sidecar.wait_ready()

        async def sidecar_answers():
            r = await request(side_port, fqdn("side"), "/")
            return r if r.status == 200 and r.backend == "alpha" else None

        before = await env.served(port, "shop.example.com", "/", "alpha")
        assert "x-target-ref" not in before.headers and "x-vhost" not in before.headers
        r = await env.until(sidecar_answers, "the sidecar routes to side")
        assert "x-target-ref" not in r.headers
        sidecar_sync = await env.cp.wait_synced(SIDECAR, types=TYPES)

        env.cp.write("ef.yaml", target_filter(GW_NAME))

        async def patched():
            # The filter comes over LDS, the virtual host over RDS: wait for both.
            r = await request(port, "shop.example.com", "/")
            return r if (r.status == 200 and r.headers.get("x-target-ref") == GW_NAME
                         and r.headers.get("x-vhost") == "shop") else None

        await env.until(patched, "the gateway patched")
        await env.cp.wait_synced(ROUTER, types=TYPES)
        # domainName: only the virtual host listing shop.example.com is merged.
        other = await request(port, "other.example.com", "/")
        assert other.backend == "alpha" and other.headers.get("x-target-ref") == GW_NAME
        assert "x-vhost" not in other.headers, other.headers
        names = await http_filter_names(env.envoy)
        assert names.index("target-ref.header_mutation") == names.index("envoy.filters.http.router") - 1, names

        # The sidecar, same namespace, context ANY: no patch, and not even a push.
        assert "target-ref.header_mutation" not in await http_filter_names(sidecar)
        r = await sidecar_answers()
        assert r is not None and "x-target-ref" not in r.headers
        row = await env.cp.sync_status(SIDECAR)
        assert row is not None and all(row[f"{t}_sent"] == sidecar_sync[f"{t}_sent"] for t in TYPES), (
            row, sidecar_sync)
        # The push of the change was scoped to the one proxy the filter selects (the gateway).
        pushes = [p for p in (await env.cp.debug("/debug/push_status"))["pushes"]
                  if any("web-headers" in k for k in p["config_keys"])]
        assert pushes and all(p["proxies"] == 1 for p in pushes), pushes

        # Retargeted to another Gateway: the patches leave this one.
        env.cp.write("ef.yaml", target_filter("elsewhere"))

        async def unpatched():
            r = await request(port, "shop.example.com", "/")
            return r if r.status == 200 and "x-target-ref" not in r.headers and "x-vhost" not in r.headers else None

        await env.until(unpatched, "the gateway unpatched")
        assert "target-ref.header_mutation" not in await http_filter_names(env.envoy)

        # `elsewhere` turns out to be a waypoint: istiod would patch it, waypoints here take no
        # EnvoyFilter patches, so /debug/push_status says the filter has no effect there.
        env.cp.write("waypoint.yaml", gateway_yaml("""\
            - {name: mesh, port: 15008, protocol: HBONE}
            """, name="elsewhere", class_name="istio-waypoint").rstrip("\n")
            + "\n  addresses: [{type: IPAddress, value: 10.96.9.9}]\n")

        async def reported():
            rows = (await env.cp.debug("/debug/push_status"))["envoyFilterProblems"]
            return rows or None

        rows = await env.until(reported, "the waypoint target reported")
        assert [(r["envoyFilter"], r["gateway"]) for r in rows] == [
            (f"EnvoyFilter/{GW_NS}/web-headers", f"{GW_NS}/elsewhere")], rows
    finally:
        await sidecar.stop()
