"""Gateway API behaviour the upstream conformance suite (kubernetes-sigs/gateway-api
conformance/tests) and istiod expect, through real Envoys: a Host with any port
(HTTPRouteHostnameIntersection), redirects keeping the listener's port
(HTTPRouteRedirectPortAndScheme), several mirrors on one rule (HTTPRouteRequestMultipleMirrors),
malformed certificates refused before they reach Envoy (GatewayInvalidTLSConfiguration), a
TLSRoute on a terminating TLS listener (also verifying clients, gateway.istio.io/tls-terminate-mode
MUTUAL), and GAMMA TCPRoute/TLSRoute routing sidecar traffic."""

from __future__ import annotations

import base64
import dataclasses
import ssl
import textwrap

import pytest

from tests.e2e.gateway_api_env import (
    GW_NAME,
    GW_NS,
    SERVICE_PORT,
    GatewayApiEnv,
    client_tls,
    conditions,
    gateway_service_yaml,
    gateway_yaml,
    listener_status,
    parent_status,
    presented_serial,
    request,
    route_yaml,
    running_env,
)
from tests.e2e.test_tcp_tls_routes import TcpBackend, client_hello, exchange, service
from tests.support.certs import issue, make_ca, tls_secret_yaml
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_ports
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def env(tmp_path):
    async with running_env(tmp_path) as e:
        yield e


async def test_host_ports_redirect_ports_and_multiple_mirrors(env: GatewayApiEnv):
    (port,) = free_ports(1)
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: http
          port: {port}
          protocol: HTTP
          hostname: very.specific.com
          allowedRoutes: {{namespaces: {{from: All}}}}
        """) + "---\n" + gateway_service_yaml(port))
    b = f"port: {SERVICE_PORT}"
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "specific", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        hostnames: [very.specific.com]
        rules:
        - matches: [{{path: {{value: /nil}}}}]
          filters: [{{type: RequestRedirect, requestRedirect: {{hostname: example.org}}}}]
        - matches: [{{path: {{value: /https}}}}]
          filters: [{{type: RequestRedirect, requestRedirect: {{hostname: example.org, scheme: https}}}}]
        - matches: [{{path: {{value: /https-443}}}}]
          filters: [{{type: RequestRedirect, requestRedirect: {{hostname: example.org, scheme: https, port: 443}}}}]
        - matches: [{{path: {{value: /port-8443}}}}]
          filters: [{{type: RequestRedirect, requestRedirect: {{hostname: example.org, port: 8443}}}}]
        - matches: [{{path: {{value: /mirror}}}}]
          filters:
          - type: RequestMirror
            requestMirror: {{backendRef: {{name: beta, {b}}}}}
          - type: RequestMirror
            requestMirror: {{backendRef: {{name: gamma, {b}}}}}
          backendRefs: [{{name: alpha, {b}}}]
        - backendRefs: [{{name: alpha, {b}}}]
        """))
    await env.start()
    await env.served(port, "very.specific.com", "/", "alpha")

    # The Host's port is not the listener's (a load balancer in front): the route still matches,
    # as istiod's virtual hosts do; a host the listener does not serve stays 404 whatever the port.
    for host in ("very.specific.com:1234", f"very.specific.com:{port}", "very.specific.com:80"):
        assert (await request(port, host, "/")).backend == "alpha", host
    assert (await request(port, "other.specific.com:1234", "/")).status == 404

    # Redirects: neither scheme nor port keeps the listener's port; a scheme alone takes its
    # default port; an explicit port is kept unless it is the scheme's own.
    want = {"/nil": f"http://example.org:{port}/nil", "/https": "https://example.org/https",
            "/https-443": "https://example.org/https-443", "/port-8443": "http://example.org:8443/port-8443"}
    for path, location in want.items():
        r = await request(port, "very.specific.com", path)
        assert (r.status, r.headers.get("location")) == (302, location), path

    # Two mirrors on one rule: both get a copy, the client alpha's answer.
    before = {n: len(env.backends[n].requests) for n in ("beta", "gamma")}
    assert (await request(port, "very.specific.com", "/mirror/7")).backend == "alpha"

    def mirrored():
        got = {n: [q for q in env.backends[n].requests[before[n]:] if q["path"] == "/mirror/7"]
               for n in ("beta", "gamma")}
        return got if all(got.values()) else None

    copies = await env.until(mirrored, "both mirror backends got the copy")
    assert all(c[0]["host"].startswith("very.specific.com-shadow") for c in copies.values())


async def test_malformed_certificates_never_reach_envoy_and_tls_route_on_terminate(env: GatewayApiEnv):
    ca = make_ca()
    good, other = issue(ca, ["good.example.com"]), issue(ca, ["bad.example.com"])
    terminated, mutual = issue(ca, ["t.example.com"]), issue(ca, ["m.example.com"])
    hello = base64.b64encode(b"Hello world").decode()
    https_port, tls_port, mutual_port = free_ports(3)
    env.cp.write("secrets.yaml", tls_secret_yaml("good", GW_NS, good) + "---\n"
                 + tls_secret_yaml("mismatched", GW_NS, dataclasses.replace(other, key_pem=good.key_pem)) + "---\n"
                 + tls_secret_yaml("terminated", GW_NS, terminated) + "---\n"
                 + tls_secret_yaml("mutual", GW_NS, mutual, ca) + "---\n" + textwrap.dedent(f"""\
                     apiVersion: v1
                     kind: Secret
                     metadata: {{name: hello, namespace: {GW_NS}}}
                     type: kubernetes.io/tls
                     data: {{tls.crt: {hello}, tls.key: {hello}}}
                     """))
    # Three listeners on one port (one Envoy listener, a filter chain each): a broken
    # certificate on one must not break the others.
    env.cp.write("gateway.yaml", gateway_yaml(f"""\
        - name: good
          port: {https_port}
          protocol: HTTPS
          hostname: good.example.com
          tls: {{certificateRefs: [{{name: good}}]}}
          allowedRoutes: {{namespaces: {{from: All}}}}
        - name: hello
          port: {https_port}
          protocol: HTTPS
          hostname: hello.example.com
          tls: {{certificateRefs: [{{name: hello}}]}}
          allowedRoutes: {{namespaces: {{from: All}}}}
        - name: mismatched
          port: {https_port}
          protocol: HTTPS
          hostname: bad.example.com
          tls: {{certificateRefs: [{{name: mismatched}}]}}
          allowedRoutes: {{namespaces: {{from: All}}}}
        - name: terminate
          port: {tls_port}
          protocol: TLS
          hostname: t.example.com
          tls: {{mode: Terminate, certificateRefs: [{{name: terminated}}]}}
          allowedRoutes: {{namespaces: {{from: All}}}}
        - name: mutual
          port: {mutual_port}
          protocol: TLS
          hostname: m.example.com
          tls:
            mode: Terminate
            certificateRefs: [{{name: mutual}}]
            options: {{gateway.istio.io/tls-terminate-mode: MUTUAL}}
          allowedRoutes: {{namespaces: {{from: All}}}}
        """) + "---\n" + textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: {GW_NAME}-istio, namespace: {GW_NS}}}
        spec: {{ports: [{{name: https, port: {https_port}}}, {{name: tls, port: {tls_port}}},
                        {{name: mutual, port: {mutual_port}}}]}}
        """))
    env.cp.write("route.yaml", route_yaml("HTTPRoute", "secure", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}}}]
        rules: [{{backendRefs: [{{name: alpha, port: {SERVICE_PORT}}}]}}]
        """) + "---\n" + route_yaml("TLSRoute", "terminated", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}, sectionName: terminate}}]
        hostnames: [t.example.com]
        rules: [{{backendRefs: [{{name: beta, port: {SERVICE_PORT}}}]}}]
        """) + "---\n" + route_yaml("TLSRoute", "mutual", f"""\
        parentRefs: [{{name: {GW_NAME}, namespace: {GW_NS}, sectionName: mutual}}]
        rules: [{{backendRefs: [{{name: gamma, port: {SERVICE_PORT}}}]}}]
        """))
    await env.start(verified=True)

    async def good_served():
        r = await request(https_port, "good.example.com", "/", tls=client_tls(ca))
        return r.backend == "alpha"

    await env.until(good_served, "HTTPS good.example.com")
    assert await presented_serial(https_port, "good.example.com", ca) == good.serial
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    for name in ("hello", "mismatched"):
        ls = listener_status(gw, name)
        assert conditions(ls)["ResolvedRefs"] == ("False", "InvalidCertificateRef"), name
        assert conditions(ls)["Programmed"] == ("False", "Invalid"), name
    for sni in ("hello.example.com", "bad.example.com"):
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            await presented_serial(https_port, sni, ca)

    # TLSRoute on the terminating listener: decrypted here, the plain bytes forwarded to beta.
    async def terminated_served():
        r = await request(tls_port, "t.example.com", "/", tls=client_tls(ca))
        return r.backend == "beta"

    await env.until(terminated_served, "TLSRoute on a Terminate listener")
    assert await presented_serial(tls_port, "t.example.com", ca) == terminated.serial
    gw = await env.status("Gateway", GW_NAME, GW_NS)
    ls = listener_status(gw, "terminate")
    assert [k["kind"] for k in ls["supportedKinds"]] == ["TLSRoute", "TCPRoute"] and ls["attachedRoutes"] == 1
    assert conditions(parent_status(await env.status("TLSRoute", "terminated"), section="terminate")) == {
        "Accepted": ("True", "Accepted"), "ResolvedRefs": ("True", "ResolvedRefs")}

    # gateway.istio.io/tls-terminate-mode MUTUAL: clients must show a certificate of the Secret's CA.
    client = issue(ca, ["client.example.com"], client=True)
    (env.tmp_path / "client.pem").write_bytes(client.cert_pem)
    (env.tmp_path / "client-key.pem").write_bytes(client.key_pem)
    with_cert = client_tls(ca)
    with_cert.load_cert_chain(env.tmp_path / "client.pem", env.tmp_path / "client-key.pem")

    async def mutual_served():
        r = await request(mutual_port, "m.example.com", "/", tls=with_cert)
        return r.backend == "gamma"

    await env.until(mutual_served, "MUTUAL terminate with a client certificate")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        await request(mutual_port, "m.example.com", "/", tls=client_tls(ca))  # no client certificate

    # Every listener served: Envoy holds only the good certificates and has refused nothing.
    dump = await env.envoy.config_dump(resource="dynamic_active_secrets")
    names = {s["name"] for s in dump.get("configs", []) if s["name"].startswith("kubernetes://")}
    assert names == {"kubernetes://good", "kubernetes://terminated", "kubernetes://mutual",
                     "kubernetes://mutual-cacert"}, names
    stats = await env.envoy.stats()
    assert stats["listener_manager.lds.update_rejected"] == 0 and stats["listener_manager.lds.update_success"] > 0


async def test_tcp_and_tls_routes_on_services_route_the_sidecars_connections(tmp_path):
    backends = {n: await TcpBackend(n).start() for n in ("db-v1", "db-v2", "tls-a", "tls-b")}
    db_port, tls_port = free_ports(2)
    cp = ControlPlane(tmp_path)
    # Services sharing a port: without iptables the sidecar's listener on that port belongs to the
    # first by hostname (db, secure); the others are reached only through the routes.
    cp.write("db.yaml", service("db", db_port, "tcp-db", backends["db-v1"].port)
             + "---\n" + service("shadowdb", db_port, "tcp-db", backends["db-v2"].port))
    cp.write("tls.yaml", service("secure", tls_port, "tls", backends["tls-a"].port)
             + "---\n" + service("tlsbackend-b", tls_port, "tls", backends["tls-b"].port))
    envoy = Envoy()
    try:
        await cp.start()
        await envoy.start(Envoy.bootstrap(sidecar_node_id("client-1"), cp.xds_port), tmp_path)
        await envoy.wait_ready()

        async def answers(port: int, payload: bytes, name: str) -> bool:
            try:
                return await exchange(port, payload) == name
            except (TimeoutError, OSError):
                return False

        await wait_for(lambda: answers(db_port, b"ping", "db-v1"), message="plain TCP to db")
        await wait_for(lambda: answers(tls_port, client_hello("secure.default.svc.cluster.local"), "tls-a"),
                       message="plain TLS to secure")
        cp.write("routes.yaml", textwrap.dedent(f"""\
            apiVersion: gateway.networking.k8s.io/v1alpha2
            kind: TCPRoute
            metadata: {{name: db, namespace: default}}
            spec:
              parentRefs: [{{group: "", kind: Service, name: db, port: {db_port}}}]
              rules: [{{backendRefs: [{{name: shadowdb, port: {db_port}}}]}}]
            ---
            apiVersion: gateway.networking.k8s.io/v1
            kind: TLSRoute
            metadata: {{name: secure, namespace: default}}
            spec:
              parentRefs: [{{group: "", kind: Service, name: secure}}]
              hostnames: [b.secure.example.com]
              rules: [{{backendRefs: [{{name: tlsbackend-b, port: {tls_port}}}]}}]
            """))
        # TCPRoute: every connection to db goes to shadowdb now.
        await wait_for(lambda: answers(db_port, b"ping", "db-v2"), message="the TCPRoute moved db to shadowdb")
        for _ in range(5):
            assert await exchange(db_port, b"ping") == "db-v2"
        # TLSRoute: its hostname as SNI goes to tlsbackend-b, without terminating; other SNIs as before.
        await wait_for(lambda: answers(tls_port, client_hello("b.secure.example.com"), "tls-b"),
                       message="the TLSRoute routes its SNI to tlsbackend-b")
        assert await exchange(tls_port, client_hello("secure.default.svc.cluster.local")) == "tls-a"

        statuses = {(o["kind"], o["name"]): o["status"] for o in (await cp.debug("/debug/gatewayz"))["objects"]}
        for key in (("TCPRoute", "db"), ("TLSRoute", "secure")):
            [parent] = statuses[key]["parents"]
            assert conditions(parent) == {"Accepted": ("True", "Accepted"),
                                          "ResolvedRefs": ("True", "ResolvedRefs")}, key
    finally:
        await envoy.stop()
        await cp.stop()
        for b in backends.values():
            await b.stop()
