"""Gateway API HTTP through a real Envoy standing in for the Gateway's deployment: HTTPRoutes
translated into the gateway's config, and the status of every object checked field by field
against the spec's conditions at /debug/gatewayz (file mode)."""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.gateway_api_env import (
    GW_NAME,
    GW_NS,
    SERVICE_PORT,
    GatewayApiEnv,
    conditions,
    gateway_service_yaml,
    gateway_yaml,
    listener_status,
    namespace_yaml,
    parent_status,
    request,
    route_yaml,
    running_env,
)
from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.support.backends import HttpBackend
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(90)

OK = ("True", "Accepted")
HTTP_KINDS = [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"},
              {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}]


@pytest.fixture
async def env(tmp_path):
    async with running_env(tmp_path) as e:
        yield e


async def test_http_route_by_host_and_path_and_its_status(env: GatewayApiEnv):
    (port,) = free_ports(1)
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: http
          port: {port}
          protocol: HTTP
          allowedRoutes: {{namespaces: {{from: All}}}}
        """) + "---\n" + gateway_service_yaml(port))
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "shop", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        hostnames: [shop.example.com]
        rules:
        - matches: [{{path: {{type: PathPrefix, value: /beta}}}}]
          backendRefs: [{{name: beta, port: {SERVICE_PORT}}}]
        - backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]
        """))
    await env.start()

    await env.served(port, "shop.example.com", "/", "alpha")
    assert (await request(port, "shop.example.com", "/beta")).backend == "beta"
    assert (await request(port, "shop.example.com", "/beta/x")).backend == "beta"
    # PathPrefix matches whole path segments: /betamax is not under /beta.
    assert (await request(port, "shop.example.com", "/betamax")).backend == "alpha"
    assert (await request(port, f"shop.example.com:{port}", "/beta")).backend == "beta"
    assert (await request(port, "other.example.com", "/")).status == 404

    # The status, field by field.
    cls = await env.status("GatewayClass", "istio", namespace="")
    assert [(c["type"], c["status"], c["reason"]) for c in cls["conditions"]] == [("Accepted", "True", "Accepted")]
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    assert conditions(gw) == {"Accepted": OK, "Programmed": ("True", "Programmed")}
    assert all(c["observedGeneration"] == 1 and c["lastTransitionTime"] for c in gw["conditions"])
    assert gw["addresses"] == [{"type": "Hostname", "value": f"{GW_NAME}-istio.{GW_NS}.svc.cluster.local"}]
    listener = listener_status(gw, "http")
    assert listener["attachedRoutes"] == 1
    assert listener["supportedKinds"] == HTTP_KINDS
    assert conditions(listener) == {"Accepted": OK, "Conflicted": ("False", "NoConflicts"),
                                    "Programmed": ("True", "Programmed"), "ResolvedRefs": ("True", "ResolvedRefs")}
    route = await env.status("HTTPRoute", "shop")
    parent = parent_status(route)
    assert parent["parentRef"] == {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": GW_NAME,
                                   "namespace": GW_NS}
    assert parent["controllerName"] == "istio.io/gateway-controller"
    assert conditions(parent) == {"Accepted": OK, "ResolvedRefs": ("True", "ResolvedRefs")}

    # configz shows the same status on the object.
    configz = await env.cp.debug("/debug/configz")
    obj = next(c for c in configz["configs"] if c["kind"] == "HTTPRoute")
    assert obj["object"]["status"] == route

    # Without the deployment's Service the Gateway has no address: not Programmed, still served.
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: http
          port: {port}
          protocol: HTTP
          allowedRoutes: {{namespaces: {{from: All}}}}
        """))

    async def unprogrammed():
        s = await env.status("Gateway", GW_NAME, GW_NS)
        return s if conditions(s)["Programmed"] == ("False", "AddressNotUsable") else None

    gw2 = await env.until(unprogrammed, "the Gateway lost its address")
    assert "addresses" not in gw2
    accepted_before = next(c for c in gw["conditions"] if c["type"] == "Accepted")
    accepted_after = next(c for c in gw2["conditions"] if c["type"] == "Accepted")
    assert accepted_after["lastTransitionTime"] == accepted_before["lastTransitionTime"]  # unchanged condition
    assert (await request(port, "shop.example.com", "/")).backend == "alpha"


async def _gateway(env: GatewayApiEnv, port: int, allowed: str = "{namespaces: {from: All}}",
                   hostname: str = "") -> None:
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: http
          port: {port}
          protocol: HTTP
          {f"hostname: {hostname}" if hostname else ""}
          allowedRoutes: {allowed}
        """) + "---\n" + gateway_service_yaml(port))


async def test_matches_weights_and_filters(env: GatewayApiEnv):
    (port,) = free_ports(1)
    await _gateway(env, port)
    b = f"port: {SERVICE_PORT}"
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "features", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        hostnames: [app.example.com]
        rules:
        - matches: [{{headers: [{{name: X-Version, value: v2}}]}}]
          backendRefs: [{{name: gamma, {b}}}]
        - matches: [{{path: {{type: Exact, value: /q}}, queryParams: [{{name: canary, value: "yes"}}]}}]
          backendRefs: [{{name: beta, {b}}}]
        - matches: [{{path: {{type: Exact, value: /q}}}}]
          backendRefs: [{{name: alpha, {b}}}]
        - matches: [{{method: POST, path: {{value: /submit}}}}]
          backendRefs: [{{name: beta, {b}}}]
        - matches: [{{path: {{type: RegularExpression, value: "/re/[0-9]+"}}}}]
          backendRefs: [{{name: gamma, {b}}}]
        - matches: [{{path: {{value: /split}}}}]
          backendRefs: [{{name: alpha, {b}, weight: 3}}, {{name: beta, {b}, weight: 1}}, {{name: gamma, {b}, weight: 0}}]
        - matches: [{{path: {{value: /redirect}}}}]
          filters:
          - type: RequestRedirect
            requestRedirect: {{scheme: https, hostname: secure.example.com, statusCode: 301}}
        - matches: [{{path: {{value: /go}}}}]
          filters:
          - type: RequestRedirect
            requestRedirect: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /went}}}}
        - matches: [{{path: {{value: /old}}}}]
          filters:
          - type: URLRewrite
            urlRewrite: {{hostname: rewritten.example.com, path: {{type: ReplacePrefixMatch, replacePrefixMatch: /new}}}}
          backendRefs: [{{name: alpha, {b}}}]
        - matches: [{{path: {{value: /strip}}}}]
          filters:
          - type: URLRewrite
            urlRewrite: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /}}}}
          backendRefs: [{{name: alpha, {b}}}]
        - matches: [{{path: {{value: /full}}}}]
          filters:
          - type: URLRewrite
            urlRewrite: {{path: {{type: ReplaceFullPath, replaceFullPath: /replaced}}}}
          backendRefs: [{{name: alpha, {b}}}]
        - matches: [{{path: {{value: /headers}}}}]
          filters:
          - type: RequestHeaderModifier
            requestHeaderModifier:
              set: [{{name: x-set, value: one}}]
              add: [{{name: x-add, value: two}}]
              remove: [x-remove]
          - type: ResponseHeaderModifier
            responseHeaderModifier:
              set: [{{name: x-response, value: "yes"}}]
              remove: [x-backend-name]
          backendRefs: [{{name: alpha, {b}}}]
        - matches: [{{path: {{value: /slow}}}}]
          timeouts: {{request: 300ms}}
          backendRefs: [{{name: alpha, {b}}}]
        - matches: [{{path: {{value: /per-backend}}}}]
          backendRefs:
          - name: beta
            {b}
            filters: [{{type: RequestHeaderModifier, requestHeaderModifier: {{set: [{{name: x-to, value: beta}}]}}}}]
        - matches: [{{path: {{value: /mirror}}}}]
          filters:
          - type: RequestMirror
            requestMirror: {{backendRef: {{name: gamma, {b}}}}}
          backendRefs: [{{name: alpha, {b}}}]
        - backendRefs: [{{name: alpha, {b}}}]
        """))
    await env.start()
    host = "app.example.com"
    await env.served(port, host, "/", "alpha")

    # Matches: header, query parameter, method, regular expression.
    assert (await request(port, host, "/anything", headers={"x-version": "v2"})).backend == "gamma"
    assert (await request(port, host, "/q?canary=yes")).backend == "beta"
    assert (await request(port, host, "/q?canary=no")).backend == "alpha"
    assert (await request(port, host, "/submit", method="POST")).backend == "beta"
    assert (await request(port, host, "/submit")).backend == "alpha"
    assert (await request(port, host, "/re/42")).backend == "gamma"
    assert (await request(port, host, "/re/x")).backend == "alpha"

    # Weights 3:1 (and 0: never) over 200 requests; 5 sigma of the binomial either way.
    counts = {"alpha": 0, "beta": 0, "gamma": 0}
    for _ in range(200):
        counts[(await request(port, host, "/split")).backend] += 1
    assert counts["gamma"] == 0 and 120 <= counts["alpha"] <= 180, counts

    # Redirects: scheme+host+code, and the matched prefix replaced (302 by default).
    r = await request(port, host, "/redirect/a?b=c")
    assert (r.status, r.headers["location"]) == (301, "https://secure.example.com/redirect/a?b=c")
    r = await request(port, host, "/go/x")
    # No scheme and no port: the listener's port is kept (HTTPRouteRedirectPortAndScheme).
    assert (r.status, r.headers["location"]) == (302, f"http://{host}:{port}/went/x"), r.headers

    # Rewrites: hostname and prefix, prefix to "/", full path.
    r = await request(port, host, "/old/x")
    assert (r.backend, r.body["path"], r.body["host"]) == ("alpha", "/new/x", "rewritten.example.com")
    assert (await request(port, host, "/strip/y")).body["path"] == "/y"
    assert (await request(port, host, "/strip")).body["path"] == "/"
    assert (await request(port, host, "/full/any/thing")).body["path"] == "/replaced"

    # Header modifiers, both directions.
    r = await request(port, host, "/headers", headers={"x-set": "zero", "x-remove": "gone"})
    sent = {k.lower(): v for k, v in r.body["headers"].items()}
    assert (sent["x-set"], sent["x-add"]) == ("one", "two") and "x-remove" not in sent, sent
    assert r.headers["x-response"] == "yes" and "x-backend-name" not in r.headers

    # The request timeout: a backend slower than it gets the client a 504.
    assert (await request(port, host, "/slow?delay=1")).status == 504
    assert (await request(port, host, "/slow")).backend == "alpha"

    # A backendRef's own filter applies to the requests it gets.
    r = await request(port, host, "/per-backend")
    assert r.backend == "beta" and {k.lower(): v for k, v in r.body["headers"].items()}["x-to"] == "beta"

    # Mirroring: the mirror backend gets a copy (Envoy marks its Host "-shadow"), the client alpha's answer.
    before = len(env.backends["gamma"].requests)
    assert (await request(port, host, "/mirror/1")).backend == "alpha"

    def mirrored():
        return [q for q in env.backends["gamma"].requests[before:] if q["path"] == "/mirror/1"]

    copies = await env.until(mirrored, "the mirror backend got the copy")
    assert copies[0]["host"].startswith(f"{host}-shadow")


async def test_cross_namespace_backend_needs_a_reference_grant(env: GatewayApiEnv, tmp_path):
    remote = await HttpBackend("remote").start()
    try:
        (port,) = free_ports(1)
        await _gateway(env, port)
        env.cp.write("remote.yaml", service_yaml("remote", SERVICE_PORT, namespace="backends") + "---\n"
                     + endpoint_slice_yaml("remote", remote.port, namespace="backends"))
        b = f"port: {SERVICE_PORT}"
        env.cp.write("routes.yaml", route_yaml("HTTPRoute", "cross", f"""\
            parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
            hostnames: [cross.example.com]
            rules:
            - matches: [{{path: {{value: /half}}}}]
              backendRefs: [{{name: alpha, {b}}}, {{name: remote, namespace: backends, {b}}}]
            - backendRefs: [{{name: remote, namespace: backends, {b}}}]
            """) + "---\n" + route_yaml("HTTPRoute", "missing", f"""\
            parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
            hostnames: [missing.example.com]
            rules:
            - backendRefs: [{{name: nonexistent, {b}}}]
            """))
        await env.start()

        # Refused: 500 for the refused backend's share, and the route says why.
        await env.served(port, "cross.example.com", "/", None, status=500)
        halves = [(await request(port, "cross.example.com", "/half")).status for _ in range(60)]
        assert {200, 500} == set(halves) and 10 <= halves.count(500) <= 50, halves
        assert remote.request_count == 0
        parent = parent_status(await env.status("HTTPRoute", "cross"))
        assert conditions(parent) == {"Accepted": OK, "ResolvedRefs": ("False", "RefNotPermitted")}
        assert (await request(port, "missing.example.com", "/")).status == 500
        parent = parent_status(await env.status("HTTPRoute", "missing"))
        assert conditions(parent) == {"Accepted": OK, "ResolvedRefs": ("False", "BackendNotFound")}
        assert "nonexistent.default.svc.cluster.local" in parent["conditions"][1]["message"]

        # A ReferenceGrant in the backend's namespace lets routes from `default` in.
        env.cp.write("grant.yaml", """\
            apiVersion: gateway.networking.k8s.io/v1beta1
            kind: ReferenceGrant
            metadata: {name: from-default, namespace: backends}
            spec:
              from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}]
              to: [{group: "", kind: Service}]
            """)
        await env.served(port, "cross.example.com", "/", "remote")
        assert {(await request(port, "cross.example.com", "/half")).status for _ in range(20)} == {200}
        parent = parent_status(await env.status("HTTPRoute", "cross"))
        assert conditions(parent) == {"Accepted": OK, "ResolvedRefs": ("True", "ResolvedRefs")}
    finally:
        await remote.stop()


async def test_two_routes_competing_for_one_listener(env: GatewayApiEnv):
    (port,) = free_ports(1)
    await _gateway(env, port)
    b = f"port: {SERVICE_PORT}"
    parents = f"parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]\nhostnames: [app.example.com]\n"
    # `zeta` is older than `alpha-route` (creationTimestamp beats the name).
    env.cp.write("older.yaml", route_yaml("HTTPRoute", "zeta", parents + textwrap.dedent(f"""\
        rules:
        - matches: [{{path: {{value: /shared}}}}]
          backendRefs: [{{name: alpha, {b}}}]
        """), created="2024-01-01T00:00:00Z"))
    env.cp.write("newer.yaml", route_yaml("HTTPRoute", "alpha-route", parents + textwrap.dedent(f"""\
        rules:
        - matches: [{{path: {{value: /shared}}}}]
          backendRefs: [{{name: beta, {b}}}]
        - matches: [{{path: {{value: /shared/longer}}}}, {{path: {{type: Exact, value: /shared/exact}}}}]
          backendRefs: [{{name: gamma, {b}}}]
        """), created="2024-06-01T00:00:00Z"))
    await env.start()
    await env.served(port, "app.example.com", "/shared", "alpha")  # same match: the older route
    assert (await request(port, "app.example.com", "/shared/x")).backend == "alpha"
    assert (await request(port, "app.example.com", "/shared/longer/x")).backend == "gamma"  # longer prefix
    assert (await request(port, "app.example.com", "/shared/exact")).backend == "gamma"  # exact path
    assert (await request(port, "app.example.com", "/other")).status == 404
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    assert listener_status(gw, "http")["attachedRoutes"] == 2
    for name in ("zeta", "alpha-route"):
        assert conditions(parent_status(await env.status("HTTPRoute", name)))["Accepted"] == OK

    # The older one goes: the newer one's rule takes over.
    env.cp.remove("older.yaml")
    await env.served(port, "app.example.com", "/shared", "beta")


async def test_allowed_routes_namespaces_kinds_and_hostnames(env: GatewayApiEnv):
    same, selected, grpc_only, named = free_ports(4)
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - {{name: same, port: {same}, protocol: HTTP}}
        - name: selected
          port: {selected}
          protocol: HTTP
          allowedRoutes: {{namespaces: {{from: Selector, selector: {{matchLabels: {{team: shop}}}}}}}}
        - name: grpc-only
          port: {grpc_only}
          protocol: HTTP
          allowedRoutes: {{namespaces: {{from: All}}, kinds: [{{kind: GRPCRoute}}]}}
        - name: named
          port: {named}
          protocol: HTTP
          hostname: "*.example.com"
          allowedRoutes: {{namespaces: {{from: All}}}}
        """) + "---\n" + gateway_service_yaml(same))
    env.cp.write("namespace.yaml", namespace_yaml("default", {"team": "shop"}))
    b = f"port: {SERVICE_PORT}"

    def route(name: str, section: str, hosts: str = "[app.example.com]", namespace: str = "default") -> str:
        return route_yaml("HTTPRoute", name, f"""\
            parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}, sectionName: {section}}}]
            hostnames: {hosts}
            rules:
            - backendRefs: [{{name: alpha, namespace: default, {b}}}]
            """, namespace=namespace)

    env.cp.write("routes.yaml", "---\n".join([
        route("to-same", "same"), route("to-selected", "selected"), route("to-grpc-only", "grpc-only"),
        route("wrong-host", "named", "[app.other.org]"), route("no-section", "nope"),
        route("local", "same", namespace=GW_NS)]))
    env.cp.write("grant.yaml", f"""\
        apiVersion: gateway.networking.k8s.io/v1beta1
        kind: ReferenceGrant
        metadata: {{name: infra-routes, namespace: default}}
        spec:
          from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: {GW_NS}}}]
          to: [{{group: "", kind: Service}}]
        """)
    await env.start()
    await env.served(selected, "app.example.com", "/", "alpha")
    await env.served(same, "app.example.com", "/", "alpha")  # the route in the Gateway's namespace
    assert (await request(grpc_only, "app.example.com", "/")).status == 404
    assert (await request(named, "app.other.org", "/")).status == 404

    def accepted(route_status: dict, section: str) -> tuple[str, str]:
        return conditions(parent_status(route_status, section=section))["Accepted"]

    assert accepted(await env.status("HTTPRoute", "to-same"), "same") == ("False", "NotAllowedByListeners")
    assert accepted(await env.status("HTTPRoute", "local", GW_NS), "same") == OK
    assert accepted(await env.status("HTTPRoute", "to-selected"), "selected") == OK
    assert accepted(await env.status("HTTPRoute", "to-grpc-only"), "grpc-only") == ("False", "NotAllowedByListeners")
    assert accepted(await env.status("HTTPRoute", "wrong-host"), "named") == ("False", "NoMatchingListenerHostname")
    assert accepted(await env.status("HTTPRoute", "no-section"), "nope") == ("False", "NoMatchingParent")
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    assert {ls["name"]: ls["attachedRoutes"] for ls in gw["listeners"]} == {
        "same": 1, "selected": 1, "grpc-only": 0, "named": 0}
    assert listener_status(gw, "grpc-only")["supportedKinds"] == [
        {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}]

    # The namespace loses its label: the route is detached from `selected` at once.
    env.cp.write("namespace.yaml", namespace_yaml("default", {"team": "other"}))
    await env.served(selected, "app.example.com", "/", None, status=404)
    assert accepted(await env.status("HTTPRoute", "to-selected"), "selected") == ("False", "NotAllowedByListeners")


async def test_cors_filter_answers_preflights_for_allowed_origins(env: GatewayApiEnv):
    """The HTTPRoute CORS filter becomes the route's CORS policy (istiod's translation): Envoy
    answers preflights from an allowed origin (exact or by wildcard) itself, with the filter's
    methods, headers and max age, and gives a disallowed origin no CORS headers."""
    (port,) = free_ports(1)
    await _gateway(env, port)
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "cors", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        hostnames: [app.example.com]
        rules:
        - filters:
          - type: CORS
            cors:
              allowOrigins: ["https://www.foo.com", "https://*.bar.com"]
              allowMethods: [GET, OPTIONS]
              allowHeaders: [x-header-1]
              exposeHeaders: [x-header-3]
              allowCredentials: true
              maxAge: 3600
          backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]
        """))
    await env.start()
    await env.served(port, "app.example.com", "/", "alpha")

    def preflight(origin: str):
        return request(port, "app.example.com", "/", method="OPTIONS", headers={
            "Origin": origin, "Access-Control-Request-Method": "GET"})

    for origin in ("https://www.foo.com", "https://x.www.bar.com"):
        r = await preflight(origin)
        assert r.status in (200, 204) and r.body is None, (origin, r)  # answered by Envoy, not the backend
        assert r.headers["access-control-allow-origin"] == origin
        assert r.headers["access-control-allow-methods"] == "GET,OPTIONS"
        assert r.headers["access-control-allow-headers"] == "x-header-1"
        assert r.headers["access-control-max-age"] == "3600"
        assert r.headers["access-control-allow-credentials"] == "true"
    refused = await preflight("https://bar.com.evil.org")
    # istiod's unmatchedPreflights IGNORE: Envoy answers it, without CORS headers; the backend never sees it
    assert "access-control-allow-origin" not in refused.headers and refused.body is None, refused
    # A simple request from an allowed origin reaches the backend and carries the exposed headers.
    r = await request(port, "app.example.com", "/", headers={"Origin": "https://www.foo.com"})
    assert r.backend == "alpha" and r.headers["access-control-expose-headers"] == "x-header-3"
    parent = parent_status(await env.status("HTTPRoute", "cors"))
    assert conditions(parent) == {"Accepted": OK, "ResolvedRefs": ("True", "ResolvedRefs")}


async def test_retry_repeats_the_listed_status_codes(env: GatewayApiEnv):
    """HTTPRoute `retry`: a 503 the rule lists is retried up to `attempts` times; a route without
    that code in its list answers the 503."""
    (port,) = free_ports(1)
    await _gateway(env, port)
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "retry", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        hostnames: [app.example.com]
        rules:
        - matches: [{{path: {{value: /retried}}}}]
          retry: {{codes: [503], attempts: 2, backoff: 10ms}}
          backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]
        - matches: [{{path: {{value: /other}}}}]
          retry: {{codes: [500], attempts: 2}}
          backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]
        """))
    await env.start()
    await env.served(port, "app.example.com", "/retried", "alpha")
    alpha = env.backends["alpha"]
    before = alpha.request_count
    alpha.fail_next = 2
    r = await request(port, "app.example.com", "/retried")
    assert (r.status, r.backend) == (200, "alpha")
    assert alpha.request_count - before == 3  # two 503s retried, the third try answered
    alpha.fail_next = 1
    assert (await request(port, "app.example.com", "/other")).status == 503  # 503 is not in its codes
    parent = parent_status(await env.status("HTTPRoute", "retry"))
    assert conditions(parent) == {"Accepted": OK, "ResolvedRefs": ("True", "ResolvedRefs")}


async def test_session_persistence_sticks_to_the_backend_of_the_first_response(env: GatewayApiEnv):
    """HTTPRoute sessionPersistence (Cookie): the first response sets the session cookie naming
    the host that answered, and every request carrying it reaches that same host of the two
    behind the Service; without the cookie both hosts answer (round robin)."""
    (port,) = free_ports(1)
    await _gateway(env, port)
    alpha, beta = env.backends["alpha"], env.backends["beta"]
    env.cp.write("svc-pair.yaml", service_yaml("pair", SERVICE_PORT) + "---\n"
                 + endpoint_slice_yaml("pair", alpha.port, name="pair-a") + "---\n"
                 + endpoint_slice_yaml("pair", beta.port, name="pair-b"))

    def sticky(session: str) -> str:
        return route_yaml("HTTPRoute", "sticky", f"""\
            parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
            hostnames: [app.example.com]
            rules:
            - {session}backendRefs: [{{name: pair, port: {SERVICE_PORT}}}]
            """)

    # First without a session: the running router must take the session filter on when one comes.
    env.cp.write("route.yaml", sticky(""))
    await env.start()

    async def both_serve():
        seen = {(await request(port, "app.example.com", "/")).backend for _ in range(6)}
        return seen == {"alpha", "beta"} or None
    await env.until(both_serve, "both endpoints of the Service answer")
    assert "set-cookie" not in (await request(port, "app.example.com", "/")).headers
    env.cp.write("route.yaml", sticky("sessionPersistence: {sessionName: my-session}\n              "))

    async def session_set():
        r = await request(port, "app.example.com", "/")
        return r if "set-cookie" in r.headers else None
    first = await env.until(session_set, "the route's sessionPersistence reaches the running router")
    assert first.backend in ("alpha", "beta"), first
    cookie = first.headers["set-cookie"]
    assert cookie.startswith("my-session=") and "Max-Age" not in cookie, cookie  # a Session cookie
    value = cookie.split(";")[0]
    answered = {(await request(port, "app.example.com", "/", headers={"Cookie": value})).backend
                for _ in range(8)}
    assert answered == {first.backend}
    parent = parent_status(await env.status("HTTPRoute", "sticky"))
    assert conditions(parent) == {"Accepted": OK, "ResolvedRefs": ("True", "ResolvedRefs")}
