"""ListenerSet through a real gateway Envoy: a team namespace adds an HTTP and an HTTPS listener
(its own certificate) to a Gateway that allows it; routes naming the ListenerSet are served on
those ports and only there; the status on the ListenerSet, the Gateway and the route; a
ListenerSet the Gateway stops allowing is no longer served."""

from __future__ import annotations

import ssl
import textwrap

import pytest

from tests.e2e.gateway_api_env import (
    API,
    GW_NAME,
    GW_NS,
    SERVICE_PORT,
    GatewayApiEnv,
    conditions,
    gateway_service_yaml,
    gateway_yaml,
    namespace_yaml,
    parent_status,
    request,
    route_yaml,
    running_env,
)
from tests.support.certs import issue, make_ca, tls_secret_yaml
from tests.support.ports import free_ports

pytestmark = pytest.mark.timeout(90)
TEAM = "team"


@pytest.fixture
async def env(tmp_path):
    async with running_env(tmp_path, ("alpha", "beta")) as e:
        yield e


def gateway(port: int, allowed: str) -> str:
    return gateway_yaml(f"""\
        - name: http
          port: {port}
          protocol: HTTP
          allowedRoutes: {{namespaces: {{from: All}}}}
        """).replace("  listeners:\n", f"  allowedListeners: {{namespaces: {allowed}}}\n  listeners:\n")


def listener_set(http_port: int, https_port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: {API}/v1
        kind: ListenerSet
        metadata: {{name: team-listeners, namespace: {TEAM}, generation: 1}}
        spec:
          parentRef: {{name: {GW_NAME}, namespace: {GW_NS}}}
          listeners:
          - name: extra
            port: {http_port}
            protocol: HTTP
            hostname: team.example.com
            allowedRoutes: {{namespaces: {{from: All}}}}
          - name: secure
            port: {https_port}
            protocol: HTTPS
            hostname: team.example.com
            tls: {{certificateRefs: [{{name: team-cert}}]}}
            allowedRoutes: {{namespaces: {{from: All}}}}
        """)


async def closed(port: int) -> bool:
    """Nothing listens on `port` (any more)."""
    try:
        await request(port, "team.example.com", "/", timeout=2)
    except (OSError, TimeoutError):
        return True
    return False


async def test_a_listener_set_adds_served_listeners_to_its_gateway(env: GatewayApiEnv):
    ca = make_ca()
    gw_port, http_port, https_port = free_ports(3)
    selector = "{from: Selector, selector: {matchLabels: {gateway-access: granted}}}"
    env.cp.write("ns.yaml", namespace_yaml(TEAM, {"gateway-access": "granted"}))
    env.cp.write("gateway.yaml", gateway(gw_port, selector) + "---\n"
                 + gateway_service_yaml(gw_port, http_port, https_port))
    env.cp.write("cert.yaml", tls_secret_yaml("team-cert", TEAM, issue(ca, ["team.example.com"])))
    env.cp.write("listenerset.yaml", listener_set(http_port, https_port))
    env.cp.write("routes.yaml", route_yaml("HTTPRoute", "team-route", f"""\
        parentRefs: [{{group: {API}, kind: ListenerSet, name: team-listeners, namespace: {TEAM}}}]
        rules: [{{backendRefs: [{{name: beta, port: {SERVICE_PORT}}}]}}]
        """) + "---\n" + route_yaml("HTTPRoute", "gw-route", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        rules: [{{backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]}}]
        """))
    await env.start(verified=True)  # the certificate lives in the team namespace: served over SDS

    await env.served(http_port, "team.example.com", "/", "beta")
    tls = ssl.create_default_context(cadata=ca.cert_pem.decode())

    async def https_served():
        r = await request(https_port, "team.example.com", "/", tls=tls)
        return r if r.backend == "beta" else None

    await env.until(https_served, "HTTPS on the ListenerSet's listener with its own certificate")
    # The Gateway's route stays on the Gateway's listener; the ListenerSet's only on its own.
    assert (await request(gw_port, "team.example.com", "/")).backend == "alpha"
    assert (await request(http_port, "other.example.com", "/")).status == 404

    ls = await env.status("ListenerSet", "team-listeners", TEAM)
    assert conditions(ls) == {"Accepted": ("True", "Accepted"), "Programmed": ("True", "Programmed")}
    assert {entry["name"]: entry["attachedRoutes"] for entry in ls["listeners"]} == {"extra": 1, "secure": 1}
    assert all(conditions(entry)["Programmed"] == ("True", "Programmed") for entry in ls["listeners"])
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    assert gw["attachedListenerSets"] == 1
    assert conditions(gw)["Programmed"] == ("True", "Programmed")
    route = await env.status("HTTPRoute", "team-route")
    assert conditions(parent_status(route, "team-listeners")) == {"Accepted": ("True", "Accepted"),
                                                                  "ResolvedRefs": ("True", "ResolvedRefs")}

    async def refused(port: int):
        s = await env.status("ListenerSet", "team-listeners", TEAM)
        if s is None or conditions(s)["Accepted"] != ("False", "NotAllowed"):
            return None
        return s if await closed(port) else None

    # The ListenerSet itself changes (its HTTP listener moves port): the router follows it.
    (moved,) = free_ports(1)
    env.cp.write("gateway.yaml", gateway(gw_port, selector) + "---\n"
                 + gateway_service_yaml(gw_port, moved, https_port))
    env.cp.write("listenerset.yaml", listener_set(moved, https_port))
    await env.served(moved, "team.example.com", "/", "beta")
    await env.until(lambda: closed(http_port), "the ListenerSet's old port closed")

    # Its namespace loses the label the Gateway selects: NotAllowed, its port closes; back again.
    env.cp.write("ns.yaml", namespace_yaml(TEAM, {"gateway-access": "revoked"}))
    await env.until(lambda: refused(moved), "the ListenerSet refused once its namespace is not selected")
    env.cp.write("ns.yaml", namespace_yaml(TEAM, {"gateway-access": "granted"}))
    await env.served(moved, "team.example.com", "/", "beta")

    # The Gateway stops allowing the namespace: the ListenerSet is NotAllowed and its port closes.
    env.cp.write("gateway.yaml", gateway(gw_port, "{from: Same}") + "---\n"
                 + gateway_service_yaml(gw_port, moved, https_port))
    await env.until(lambda: refused(moved), "the ListenerSet refused and its listener gone")
    assert (await request(gw_port, "team.example.com", "/")).backend == "alpha"
    assert "attachedListenerSets" not in (await env.status("Gateway", GW_NAME, GW_NS))
