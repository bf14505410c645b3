"""networking.istio.io Gateway through a real Envoy running as the ingress gateway (a router).

The gateway Envoy's node is `router~127.0.0.1~ingress-1.istio-system~...` with metadata
LABELS {istio: ingressgateway}; Gateways select it by those labels and its listeners bind
0.0.0.0:SERVER_PORT (free ports). Two HTTP backends stand behind Services `alpha` and `beta`.
TLS credentials are Secrets in the gateway's namespace, served over SDS on the ADS stream only
to a router that proved its identity on the secure port: those tests run the gateway under
pilot-agent (`verified=True`), as real gateways run. The test PKI is made with `cryptography`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
import textwrap
from pathlib import Path

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from pilot.config.mesh import MeshConfig
from pilot.model.mesh import MeshHolder
from pilot.model.proxy import Proxy, parse_node_id
from pilot.model.push_context import PushContext
from pilot.model.store import Store
from pilot.sources.files import FileSource
from tests.e2e.mesh_config import endpoint_slice_yaml, fqdn, service_yaml
from tests.e2e.test_ca_server import channel as secure_channel
from tests.e2e.test_ca_server import create, csr, key_pem
from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend
from tests.support.certs import Issued, issue, make_ca, serial_of_der, tls_secret_yaml
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy, envoy_validate
from tests.support.ports import free_ports
from tests.support.static_config import static_bootstrap
from tests.support.verified_router import start_verified_router
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)

GW_NS = "istio-system"
ROUTER = f"router~127.0.0.1~ingress-1.{GW_NS}~{GW_NS}.svc.cluster.local"
GATEWAY_SA = "istio-ingressgateway-service-account"
LABELS = {"istio": "ingressgateway"}
SERVICE_PORT = 8000
SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


def gateway_yaml(name: str, servers: str, namespace: str = GW_NS, selector: str = "{istio: ingressgateway}") -> str:
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: Gateway
        metadata: {{name: {name}, namespace: {namespace}}}
        spec:
          selector: {selector}
          servers:
        """) + textwrap.indent(textwrap.dedent(servers), "  ")


def gateway_service_yaml(*ports: tuple[str, int, int]) -> str:
    """The istio-ingressgateway Service, (name, port, targetPort) each: istiod maps a server's
    port to the targetPort its gateway pod listens on."""
    entries = "".join(f"\n  - {{name: {n}, port: {p}, targetPort: {t}}}" for n, p, t in ports)
    return (f"apiVersion: v1\nkind: Service\nmetadata: {{name: istio-ingressgateway, namespace: {GW_NS}}}\n"
            f"spec:\n  selector: {{istio: ingressgateway}}\n  ports:{entries}\n")


def virtual_service_yaml(name: str, spec: str, namespace: str = "default") -> str:
    return (f"apiVersion: networking.istio.io/v1\nkind: VirtualService\n"
            f"metadata: {{name: {name}, namespace: {namespace}}}\nspec:\n"
            + textwrap.indent(textwrap.dedent(spec), "  "))


class GatewayEnv:
    def __init__(self, tmp_path: Path, backends: dict[str, HttpBackend]) -> None:
        self.tmp_path = tmp_path
        self.issuer = Issuer("ES256")  # signs the service-account tokens verified routers present
        self.cp = ControlPlane(tmp_path, secure_grpc=True, env={"JWT_RULE": self.issuer.rule()})
        self.envoy = Envoy()
        self.agent: PilotAgent | None = None
        self.backends = backends
        for name, b in backends.items():
            self.cp.write(f"svc-{name}.yaml", service_yaml(name, SERVICE_PORT) + "---\n"
                          + endpoint_slice_yaml(name, b.port))

    async def start(self, envoy: bool = True, delta: bool = False, verified: bool = False) -> GatewayEnv:
        """`verified`: the gateway runs under pilot-agent on the secure port (it may get credentials)."""
        await self.cp.start()
        if envoy and verified:
            self.agent, self.envoy = await start_verified_router(
                self.cp, self.tmp_path / "router", self.issuer, namespace=GW_NS, service_account=GATEWAY_SA,
                pod="ingress-1", labels=LABELS, delta=delta)
        elif envoy:
            metadata = {"NAMESPACE": GW_NS, "LABELS": LABELS}
            await self.envoy.start(Envoy.bootstrap(ROUTER, self.cp.xds_port, metadata=metadata, delta=delta,
                                                   cluster="istio-ingressgateway.istio-system"), self.tmp_path)
            await self.envoy.wait_ready()
        return self

    async def until(self, check, message: str, timeout: float = 15):
        return await wait_for(check, timeout, message=f"{message}\n{self.cp.log_tail(15)}\n{self.envoy.log_tail(15)}")


@pytest.fixture
async def env(tmp_path):
    backends = {n: await HttpBackend(n).start() for n in ("alpha", "beta")}
    e = GatewayEnv(tmp_path, backends)
    try:
        yield e
    finally:
        await e.envoy.stop()
        if e.agent is not None:
            await e.agent.stop()
        await e.cp.stop()
        for b in backends.values():
            await b.stop()


# --- clients ----------------------------------------------------------------------------------
async def http_request(port: int, host: str, path: str = "/") -> tuple[int, str | None]:
    """(status, name of the backend that answered) over plain HTTP/1.1, Host header as given."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    try:
        conn = HttpConn(reader, writer)
        return await conn.get(host, path, close=True)
    finally:
        writer.close()


class HttpConn:
    """A minimal HTTP/1.1 client on an open (possibly TLS) stream: keep-alive requests in turn."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def get(self, host: str, path: str = "/", close: bool = False) -> tuple[int, str | None]:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: {'close' if close else 'keep-alive'}"
                          f"\r\n\r\n".encode())
        await self.writer.drain()
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        body = await asyncio.wait_for(self.reader.readexactly(int(headers.get("content-length", "0"))), 5)
        try:
            name = json.loads(body).get("name")
        except ValueError:
            name = None
        return status, name

    def close(self) -> None:
        self.writer.close()


async def tls_connect(port: int, sni: str, ca: Issued) -> tuple[HttpConn, int]:
    """A TLS connection verifying the server against `ca` for `sni`; returns it and the serial
    of the certificate the server presented."""
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=sni), 5)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return HttpConn(reader, writer), serial_of_der(der)


async def tls_request(port: int, sni: str, ca: Issued, path: str = "/") -> tuple[int, str | None, int]:
    conn, serial = await tls_connect(port, sni, ca)
    try:
        status, name = await conn.get(sni, path, close=True)
    finally:
        conn.close()
    return status, name, serial


# --- (1) HTTP ---------------------------------------------------------------------------------
async def test_http_server_routes_by_host_and_path(env: GatewayEnv):
    (port,) = free_ports(1)
    env.cp.write("gateway.yaml", gateway_yaml("web", f"""\
        - port: {{number: {port}, name: http, protocol: HTTP}}
          hosts: ["*/*.example.com"]
        """))
    # Bound by NAMESPACE/NAME; host-and-path routing to the two backends.
    env.cp.write("vs-shop.yaml", virtual_service_yaml("shop", f"""\
        hosts: [shop.example.com]
        gateways: [{GW_NS}/web]
        http:
        - match: [{{uri: {{prefix: /beta}}}}]
          route: [{{destination: {{host: beta}}}}]
        - route: [{{destination: {{host: alpha, port: {{number: {SERVICE_PORT}}}}}}}]
        """))
    # Bound by a bare name: that is a Gateway in the VirtualService's own namespace, which
    # does not exist; this VirtualService must not route on the gateway.
    env.cp.write("vs-unbound.yaml", virtual_service_yaml("unbound", """\
        hosts: [other.example.com]
        gateways: [web]
        http:
        - route: [{destination: {host: alpha}}]
        """))
    # A VirtualService in the gateway's namespace, bound by bare name: routes.
    env.cp.write("vs-admin.yaml", virtual_service_yaml("admin", f"""\
        hosts: [admin.example.com]
        gateways: [web]
        http:
        - route: [{{destination: {{host: {fqdn('beta')}}}}}]
        """, namespace=GW_NS))
    await env.start()

    async def routed():
        return await http_request(port, "shop.example.com", "/") == (200, "alpha")

    await env.until(routed, "gateway routes shop.example.com")
    assert await http_request(port, "shop.example.com", "/beta/x") == (200, "beta")
    assert await http_request(port, f"shop.example.com:{port}", "/") == (200, "alpha")
    assert await http_request(port, "admin.example.com", "/") == (200, "beta")
    assert (await http_request(port, "other.example.com", "/"))[0] == 404
    assert (await http_request(port, "nobody.test", "/"))[0] == 404

    listeners = await env.envoy.listener_ports()
    assert listeners == {f"0.0.0.0_{port}": port}
    dump = await env.envoy.config_dump(resource="dynamic_route_configs")
    names = {c["route_config"]["name"] for c in dump["configs"]}
    assert names == {f"http.{port}"}

    # A Gateway for another workload's labels changes nothing for this one.
    (other_port,) = free_ports(1)
    env.cp.write("gateway-egress.yaml", gateway_yaml("egress", f"""\
        - port: {{number: {other_port}, name: http, protocol: HTTP}}
          hosts: ["*"]
        """, selector="{istio: egressgateway}"))
    version = await env.cp.push_version()

    async def pushed():
        return any("Gateway/istio-system/egress" in p["config_keys"] and p["version"] != version
                   for p in (await env.cp.debug("/debug/push_status"))["pushes"])

    await env.until(pushed, "the egress Gateway was pushed")
    await env.cp.wait_synced(ROUTER)
    assert set(await env.envoy.listener_ports()) == {f"0.0.0.0_{port}"}
    assert await http_request(port, "shop.example.com", "/") == (200, "alpha")


# --- (2) HTTPS with credentialName, and rotation ----------------------------------------------
@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_https_simple_with_credential_and_rotation(env: GatewayEnv, delta: bool):
    host = "secure.example.com"
    ca = make_ca()
    first = issue(ca, [host])
    (port,) = free_ports(1)
    env.cp.write("secret.yaml", tls_secret_yaml("secure-cert", GW_NS, first))
    env.cp.write("gateway.yaml", gateway_yaml("secure", f"""\
        - port: {{number: {port}, name: https, protocol: HTTPS}}
          hosts: [{host}]
          tls: {{mode: SIMPLE, credentialName: secure-cert}}
        """))
    env.cp.write("vs.yaml", virtual_service_yaml("secure", f"""\
        hosts: [{host}]
        gateways: [{GW_NS}/secure]
        http:
        - route: [{{destination: {{host: alpha}}}}]
        """))
    await env.start(delta=delta, verified=True)

    async def served():
        return await tls_request(port, host, ca) == (200, "alpha", first.serial)

    await env.until(served, "HTTPS through the gateway")
    dump = await env.envoy.config_dump(resource="dynamic_route_configs")
    assert {c["route_config"]["name"] for c in dump["configs"]} == {f"https.{port}.https.secure.{GW_NS}"}
    before = await env.envoy.stats()

    # A connection opened before the rotation, kept alive through it.
    kept, kept_serial = await tls_connect(port, host, ca)
    assert kept_serial == first.serial
    assert await kept.get(host) == (200, "alpha")

    results: list[tuple[str, object]] = []
    stop = asyncio.Event()

    async def hammer():
        while not stop.is_set():
            try:
                status, name, serial = await tls_request(port, host, ca)
                results.append(("ok", (status, name, serial)))
            except Exception as e:  # noqa: BLE001 - every failure is what we look for
                results.append(("error", repr(e)))
            try:
                results.append(("kept", await kept.get(host)))
            except Exception as e:  # noqa: BLE001
                results.append(("kept-error", repr(e)))
            await asyncio.sleep(0.02)

    task = asyncio.get_running_loop().create_task(hammer())
    try:
        await asyncio.sleep(0.2)
        second = issue(ca, [host])
        env.cp.write("secret.yaml", tls_secret_yaml("secure-cert", GW_NS, second))

        async def rotated():
            return await tls_request(port, host, ca) == (200, "alpha", second.serial)

        await env.until(rotated, "the new certificate is served")
        await asyncio.sleep(0.2)
    finally:
        stop.set()
        await task
    errors = [r for r in results if r[0] in ("error", "kept-error")]
    assert not errors, errors[:5]
    statuses = {r[1][:2] for r in results}
    assert statuses == {(200, "alpha")}, statuses
    serials = {r[1][2] for r in results if r[0] == "ok"}
    assert serials <= {first.serial, second.serial}
    assert await kept.get(host) == (200, "alpha")  # the old connection lived through it
    kept.close()

    after = await env.envoy.stats()
    for stat in ("listener_manager.listener_modified", "listener_manager.listener_removed",
                 "listener_manager.listener_create_failure"):
        assert after.get(stat, 0) == before.get(stat, 0), (stat, before.get(stat), after.get(stat))
    assert after.get("listener_manager.total_listeners_draining", 0) == 0
    # Envoy spells `kubernetes://secure-cert` as `sds.kubernetes_//secure-cert.*` in stat names.
    sds_updates = [k for k in after if k.startswith("sds.") and "secure-cert" in k and k.endswith(".update_success")]
    assert sds_updates and after[sds_updates[0]] >= 2, {k: v for k, v in after.items() if "secure-cert" in k}


async def test_https_mutual_requires_a_client_certificate_from_the_ca(env: GatewayEnv):
    host = "mtls.example.com"
    ca = make_ca()
    (port,) = free_ports(1)
    env.cp.write("secret.yaml", tls_secret_yaml("mtls-cert", GW_NS, issue(ca, [host]), ca))
    env.cp.write("gateway.yaml", gateway_yaml("mtls", f"""\
        - port: {{number: {port}, name: https, protocol: HTTPS}}
          hosts: [{host}]
          tls: {{mode: MUTUAL, credentialName: mtls-cert}}
        """))
    env.cp.write("vs.yaml", virtual_service_yaml("mtls", f"""\
        hosts: [{host}]
        gateways: [{GW_NS}/mtls]
        http:
        - route: [{{destination: {{host: beta}}}}]
        """))
    await env.start(verified=True)
    client = issue(ca, ["client.example.com"], client=True)
    stranger_ca = make_ca("someone else")
    stranger = issue(stranger_ca, ["client.example.com"], client=True)

    async def request(leaf: Issued | None):
        ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
        if leaf is not None:
            d = env.tmp_path / f"client-{leaf.serial}"
            d.mkdir(exist_ok=True)
            (d / "c.pem").write_bytes(leaf.cert_pem)
            (d / "k.pem").write_bytes(leaf.key_pem)
            ctx.load_cert_chain(d / "c.pem", d / "k.pem")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=host), 5)
        try:
            return await HttpConn(reader, writer).get(host, close=True)
        finally:
            writer.close()

    async def served():
        return await request(client) == (200, "beta")

    await env.until(served, "mutual TLS with a client certificate")
    for leaf in (None, stranger):  # TLS 1.3: the refusal shows on the first read, not the handshake
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await request(leaf)


# --- (3) secrets go to gateways in their namespace only ---------------------------------------
def _node(node_id: str, namespace: str, labels: dict | None = None) -> base_pb2.Node:
    md = struct_pb2.Struct()
    md.update({"NAMESPACE": namespace, **({"LABELS": labels} if labels is not None else {})})
    return base_pb2.Node(id=node_id, metadata=md)


async def _ask_secret(channel: grpc.aio.Channel, node: base_pb2.Node, names: list[str]) -> list[secret_pb2.Secret]:
    """The Secrets one SDS request over ADS is answered with."""
    async with channel:
        call = channel.stream_stream(ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                     response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
        await call.write(discovery_pb2.DiscoveryRequest(node=node, type_url=SECRET, resource_names=names))
        resp = await asyncio.wait_for(call.read(), 10)
        call.cancel()
    assert resp.type_url == SECRET
    out = []
    for a in resp.resources:
        s = secret_pb2.Secret()
        a.Unpack(s)
        out.append(s)
    return out


async def _proven(env: GatewayEnv, namespace: str, sa: str) -> grpc.aio.Channel:
    """A channel to the secure port authenticated by a workload certificate for ns/sa."""
    key, pem = csr()
    chain = await create(env.cp, pem, token=env.issuer.token(namespace=namespace, sa=sa))
    return secure_channel(env.cp, env.cp.root_cert(), (key_pem(key), "".join(chain).encode()))


async def test_credentials_only_for_proven_proxies_of_the_secrets_namespace(env: GatewayEnv):
    ca = make_ca()
    leaf = issue(ca, ["secure.example.com"])
    env.cp.write("secret.yaml", tls_secret_yaml("secure-cert", GW_NS, leaf, ca))
    await env.start(envoy=False)
    names = ["kubernetes://secure-cert", "kubernetes://secure-cert-cacert"]
    router = _node(ROUTER, GW_NS, LABELS)

    # Plaintext xDS: the node id says "router in the Secret's namespace", but anyone can write
    # that. Nothing is served, not even the CA bundle; the refusal is logged and counted.
    plain = grpc.aio.insecure_channel(f"127.0.0.1:{env.cp.xds_port}")
    assert await _ask_secret(plain, router, names) == []
    await env.until(lambda: "credentials refused" in env.cp.log_tail(200), "refusal logged")
    metrics = await env.cp.metrics()
    assert "pilot_sds_certificate_errors_total 1.0" in metrics, metrics

    # The same node over the secure port, proven as a service account of that namespace: both.
    got = {s.name: s for s in await _ask_secret(await _proven(env, GW_NS, GATEWAY_SA), router, names)}
    assert set(got) == set(names)
    assert got["kubernetes://secure-cert"].tls_certificate.certificate_chain.inline_bytes == leaf.cert_pem
    assert got["kubernetes://secure-cert-cacert"].validation_context.trusted_ca.inline_bytes == ca.cert_pem

    # A proven sidecar of that namespace may be given them too (DestinationRule credentialName;
    # file mode has no RBAC to narrow it further, Kubernetes mode asks a SubjectAccessReview).
    sidecar = f"sidecar~127.0.0.1~app-1.{GW_NS}~{GW_NS}.svc.cluster.local"
    got = await _ask_secret(await _proven(env, GW_NS, "app"), _node(sidecar, GW_NS, LABELS), names)
    assert {s.name for s in got} == set(names)
    # ... but never over plaintext.
    plain = grpc.aio.insecure_channel(f"127.0.0.1:{env.cp.xds_port}")
    assert await _ask_secret(plain, _node(sidecar, GW_NS, LABELS), names) == []

    # A proven router of another namespace: nothing, whichever way it names the Secret.
    other = "router~127.0.0.1~ingress-1.default~default.svc.cluster.local"
    assert await _ask_secret(await _proven(env, "default", GATEWAY_SA), _node(other, "default", LABELS),
                             names + [f"kubernetes://{GW_NS}/secure-cert"]) == []

    # An identity of another namespace cannot pose as the Secret's namespace's router.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _ask_secret(await _proven(env, "default", GATEWAY_SA), router, names)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # Nothing leaks through the debug view either.
    configz = await env.cp.debug("/debug/configz")
    secret = next(c for c in configz["configs"] if c["kind"] == "Secret")
    assert "redacted" in secret["object"]["data"]["tls.key"]


# --- (4) envoy --mode validate ----------------------------------------------------------------


def _static_bootstrap(config_dir: Path) -> dict:
    """Every resource the router gets, as static_resources (tests/support/static_config.py)."""
    store = Store()
    FileSource(config_dir, store).load()
    assert store.rejections() == [], store.rejections()
    mesh = MeshHolder(MeshConfig(), GW_NS)
    mesh.refresh(store)
    ctx = PushContext.build(store, mesh.current, mesh.version, "cluster.local", "v1")
    t, ips, pod, ns, domain = parse_node_id(ROUTER)
    proxy = Proxy(ROUTER, t, ips, pod, ns, domain, "istio-ingressgateway.istio-system",
                  {"NAMESPACE": GW_NS, "LABELS": LABELS},
                  identity=f"spiffe://cluster.local/ns/{GW_NS}/sa/{GATEWAY_SA}")  # proven: it may get credentials
    return static_bootstrap(ctx, proxy)


def test_generated_gateway_config_passes_envoy_validate(tmp_path: Path):
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    ca = make_ca()
    (config_dir / "services.yaml").write_text(
        service_yaml("alpha", SERVICE_PORT) + "---\n" + endpoint_slice_yaml("alpha", 9001) + "---\n"
        + service_yaml("beta", SERVICE_PORT) + "---\n" + endpoint_slice_yaml("beta", 9002))
    (config_dir / "secrets.yaml").write_text(
        tls_secret_yaml("simple-cert", GW_NS, issue(ca, ["a.example.com"])) + "---\n"
        + tls_secret_yaml("mutual-cert", GW_NS, issue(ca, ["m.example.com"]), ca))
    (config_dir / "gateway.yaml").write_text(gateway_yaml("edge", """\
        - port: {number: 8080, name: http, protocol: HTTP}
          hosts: ["*/*.example.com"]
          tls: {httpsRedirect: true}
        - port: {number: 8443, name: https-simple, protocol: HTTPS}
          hosts: [a.example.com]
          tls: {mode: SIMPLE, credentialName: simple-cert, minProtocolVersion: TLSV1_2, maxProtocolVersion: TLSV1_3}
        - port: {number: 8443, name: https-mutual, protocol: HTTPS}
          hosts: [m.example.com]
          tls: {mode: MUTUAL, credentialName: mutual-cert, subjectAltNames: [client.example.com]}
        - port: {number: 9443, name: tls-pass, protocol: TLS}
          hosts: ["*.pass.example.com"]
          tls: {mode: PASSTHROUGH}
        - port: {number: 9444, name: tls-mesh, protocol: TLS}
          hosts: ["*"]
          tls: {mode: ISTIO_MUTUAL}
        - port: {number: 9000, name: tcp, protocol: TCP}
          hosts: ["*"]
        """))
    (config_dir / "vs.yaml").write_text(virtual_service_yaml("web", f"""\
        hosts: [a.example.com, m.example.com, "*.wild.example.com"]
        gateways: [{GW_NS}/edge]
        http:
        - match: [{{uri: {{prefix: /beta}}}}]
          route: [{{destination: {{host: beta}}}}]
        - route:
          - {{destination: {{host: alpha}}, weight: 90}}
          - {{destination: {{host: beta}}, weight: 10}}
        """) + "---\n" + virtual_service_yaml("pass", f"""\
        hosts: [x.pass.example.com, y.pass.example.com]
        gateways: [{GW_NS}/edge]
        tls:
        - match: [{{sniHosts: [x.pass.example.com]}}]
          route: [{{destination: {{host: alpha, port: {{number: {SERVICE_PORT}}}}}}}]
        - match: [{{sniHosts: [y.pass.example.com]}}]
          route:
          - {{destination: {{host: alpha, port: {{number: {SERVICE_PORT}}}}}, weight: 50}}
          - {{destination: {{host: beta, port: {{number: {SERVICE_PORT}}}}}, weight: 50}}
        tcp:
        - route: [{{destination: {{host: beta, port: {{number: {SERVICE_PORT}}}}}}}]
        """))
    config = _static_bootstrap(config_dir)
    listeners = {ld["name"]: ld for ld in config["static_resources"]["listeners"]}
    # A proven router serves its ISTIO_MUTUAL server too (with the mesh certificate from its agent).
    assert set(listeners) == {"0.0.0.0_8080", "0.0.0.0_8443", "0.0.0.0_9443", "0.0.0.0_9444", "0.0.0.0_9000"}
    assert len(listeners["0.0.0.0_8443"]["filter_chains"]) == 2
    assert len(listeners["0.0.0.0_9443"]["filter_chains"]) == 2
    assert {s["name"] for s in config["static_resources"]["secrets"]} == {
        "kubernetes://simple-cert", "kubernetes://mutual-cert", "kubernetes://mutual-cert-cacert"}
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated gateway config:\n{output}"

    # The negative control: two chains with one match must be rejected, or this test proves nothing.
    broken = copy.deepcopy(config)
    chains = next(ld for ld in broken["static_resources"]["listeners"] if ld["name"] == "0.0.0.0_8443")["filter_chains"]
    chains[1]["filter_chain_match"] = copy.deepcopy(chains[0]["filter_chain_match"])
    ok, output = envoy_validate(broken, tmp_path)
    assert not ok, "envoy accepted two filter chains with the same match"


async def test_server_port_follows_the_gateway_services_target_port(env: GatewayEnv):
    """istiod's mapping: Service istio-ingressgateway 80 -> 8080 selects the router, so a server
    on port 80 listens on 8080 (no root needed); clients' Host `host:80` still matches."""
    service_port, target = free_ports(2)
    env.cp.write("gw-svc.yaml", gateway_service_yaml(("http2", service_port, target)))
    env.cp.write("gateway.yaml", gateway_yaml("web", f"""\
        - port: {{number: {service_port}, name: http, protocol: HTTP}}
          hosts: [shop.example.com]
        """))
    env.cp.write("vs.yaml", virtual_service_yaml("shop", f"""\
        hosts: [shop.example.com]
        gateways: [{GW_NS}/web]
        http: [{{route: [{{destination: {{host: alpha}}}}]}}]
        """))
    await env.start()

    async def routed():
        return await http_request(target, f"shop.example.com:{service_port}") == (200, "alpha")

    await env.until(routed, "listener on the target port")
    listeners = await env.envoy.listener_ports()
    assert f"0.0.0.0_{target}" in listeners and f"0.0.0.0_{service_port}" not in listeners
    routes = await env.envoy.config_dump(resource="dynamic_route_configs")
    assert f"http.{target}" in json.dumps(routes)
