"""Shared by the Gateway API e2e tests: YAML builders for the kinds, a control plane in file mode
with HTTP backends behind Services, a real Envoy standing in for the Gateway's deployment, and
an HTTP client that controls Host, SNI, method and headers.

The gateway Envoy's node is `router~127.0.0.1~web-1.infra~...` with LABELS
`gateway.networking.k8s.io/gateway-name: web`, as istiod's automated deployment labels its pods;
the Service `web-istio` in `infra` is the one that deployment would get (the Gateway's address).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import tempfile
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend
from tests.support.certs import Issued, serial_of_der
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.verified_router import start_verified_router
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

GW_NS = "infra"
GW_NAME = "web"
ROUTER = f"router~127.0.0.1~{GW_NAME}-1.{GW_NS}~{GW_NS}.svc.cluster.local"
GW_LABEL = "gateway.networking.k8s.io/gateway-name"
SERVICE_PORT = 8000
API = "gateway.networking.k8s.io"

GATEWAY_CLASS = textwrap.dedent(f"""\
    apiVersion: {API}/v1
    kind: GatewayClass
    metadata: {{name: istio}}
    spec: {{controllerName: istio.io/gateway-controller}}
    """)


def gateway_yaml(listeners: str, name: str = GW_NAME, namespace: str = GW_NS, class_name: str = "istio") -> str:
    return textwrap.dedent(f"""\
        apiVersion: {API}/v1
        kind: Gateway
        metadata: {{name: {name}, namespace: {namespace}, generation: 1}}
        spec:
          gatewayClassName: {class_name}
          listeners:
        """) + textwrap.indent(textwrap.dedent(listeners), "  ")


def route_yaml(kind: str, name: str, spec: str, namespace: str = "default", version: str = "v1",
               generation: int = 1, created: str = "") -> str:
    stamp = f", creationTimestamp: '{created}'" if created else ""
    return (f"apiVersion: {API}/{version}\nkind: {kind}\n"
            f"metadata: {{name: {name}, namespace: {namespace}, generation: {generation}{stamp}}}\nspec:\n"
            + textwrap.indent(textwrap.dedent(spec), "  "))


def gateway_service_yaml(port: int, *more_ports: int, name: str = f"{GW_NAME}-istio", namespace: str = GW_NS) -> str:
    """The Service istiod's automated deployment creates for Gateway `web` of class `istio`,
    exposing every listener port (`more_ports`: those beyond the first, a ListenerSet's too)."""
    return service_yaml(name, port, namespace=namespace) + "".join(
        f"  - {{name: p{p}, port: {p}}}\n" for p in more_ports)


def client_tls(server_ca: Issued, client: Issued | None = None) -> ssl.SSLContext:
    """A client verifying the gateway's certificate against `server_ca`, presenting `client`'s."""
    ctx = ssl.create_default_context(cadata=server_ca.cert_pem.decode())
    if client is not None:
        with tempfile.TemporaryDirectory() as d:
            cert, key = Path(d, "c.pem"), Path(d, "k.pem")
            cert.write_bytes(client.cert_pem)
            key.write_bytes(client.key_pem)
            ctx.load_cert_chain(cert, key)
    return ctx


async def presented_serial(port: int, sni: str, ca: Issued) -> int:
    """Handshake only, verifying the server for `sni`; the serial of the certificate it showed."""
    _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=client_tls(ca),
                                                              server_hostname=sni), 5)
    try:
        return serial_of_der(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
    finally:
        writer.close()


def namespace_yaml(name: str, labels: dict[str, str] | None = None) -> str:
    return (f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n"
            + (f"  labels: {json.dumps(labels)}\n" if labels else ""))


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: dict | None  # the backend's JSON description of the request, when a backend answered

    @property
    def backend(self) -> str | None:
        return (self.body or {}).get("name")


async def request(port: int, host: str, path: str = "/", *, method: str = "GET", headers: dict | None = None,
                  tls: ssl.SSLContext | None = None, timeout: float = 5) -> Response:
    """One request on a fresh connection (no pooling: each one sees Envoy's current config)."""
    scheme = "https" if tls is not None else "http"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s, s.request(
            method, f"{scheme}://127.0.0.1:{port}{path}", headers={"Host": host, **(headers or {})},
            allow_redirects=False, ssl=tls if tls is not None else False,
            server_hostname=host.split(":")[0] if tls is not None else None) as r:
        text = await r.text()
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        return Response(r.status, {k.lower(): v for k, v in r.headers.items()},
                        body if isinstance(body, dict) else None)


class GatewayApiEnv:
    def __init__(self, tmp_path: Path, backends: dict[str, HttpBackend], namespace: str = "default") -> None:
        self.tmp_path = tmp_path
        self.issuer = Issuer("ES256")  # signs the service-account tokens verified routers present
        self.cp = ControlPlane(tmp_path, secure_grpc=True, env={"JWT_RULE": self.issuer.rule()})
        self.envoy = Envoy()
        self.agent: PilotAgent | None = None
        self.backends = backends
        self.cp.write("gatewayclass.yaml", GATEWAY_CLASS)
        for name, b in backends.items():
            self.cp.write(f"svc-{name}.yaml", service_yaml(name, SERVICE_PORT, namespace=namespace) + "---\n"
                          + endpoint_slice_yaml(name, b.port, namespace=namespace))

    async def start(self, envoy: bool = True, verified: bool = False) -> GatewayApiEnv:
        """`verified`: the gateway runs under pilot-agent on the secure port (it may get credentials),
        as the deployment istiod creates for a Gateway runs, with its `NAME-istio` service account."""
        await self.cp.start()
        if envoy and verified:
            self.agent, self.envoy = await start_verified_router(
                self.cp, self.tmp_path / "router", self.issuer, namespace=GW_NS,
                service_account=f"{GW_NAME}-istio", pod=f"{GW_NAME}-1", labels={GW_LABEL: GW_NAME})
        elif envoy:
            metadata = {"NAMESPACE": GW_NS, "LABELS": {GW_LABEL: GW_NAME}}
            await self.envoy.start(Envoy.bootstrap(ROUTER, self.cp.xds_port, metadata=metadata,
                                                   cluster=f"{GW_NAME}-istio.{GW_NS}"), self.tmp_path)
            await self.envoy.wait_ready()
        return self

    async def stop(self) -> None:
        await self.envoy.stop()
        if self.agent is not None:
            await self.agent.stop()
        await self.cp.stop()

    async def until(self, check, message: str, timeout: float = 15):
        return await wait_for(check, timeout,
                              message=f"{message}\n{self.cp.log_tail(15)}\n{self.envoy.log_tail(10)}")

    async def status(self, kind: str, name: str, namespace: str = "default") -> dict | None:
        """An object's status as /debug/gatewayz shows it (file mode: the only place it is)."""
        for o in (await self.cp.debug("/debug/gatewayz"))["objects"]:
            if (o["kind"], o["namespace"], o["name"]) == (kind, namespace, name):
                return o["status"]
        return None

    async def served(self, port: int, host: str, path: str, backend: str | None, status: int = 200) -> Response:
        """Wait until a request is answered with `status` by `backend` (None: by Envoy itself)."""
        async def check():
            r = await request(port, host, path)
            return r if r.status == status and r.backend == backend else None

        return await self.until(check, f"{host}{path} -> {status} from {backend}")


def conditions(status: dict) -> dict[str, tuple[str, str]]:
    """type -> (status, reason) of a conditions list."""
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def listener_status(gw_status: dict, name: str) -> dict:
    return next(ls for ls in gw_status["listeners"] if ls["name"] == name)


def parent_status(route_status: dict, gateway: str = GW_NAME, section: str | None = None) -> dict:
    for p in route_status["parents"]:
        ref = p["parentRef"]
        if ref["name"] == gateway and ref.get("sectionName") == section:
            return p
    raise AssertionError(f"no parent {gateway}/{section} in {route_status}")


@contextlib.asynccontextmanager
async def running_env(tmp_path: Path, names: tuple[str, ...] = ("alpha", "beta", "gamma")
                      ) -> AsyncIterator[GatewayApiEnv]:
    """A GatewayApiEnv with an HTTP echo backend per name, stopped (backends too) on exit: the
    `env` fixture of the Gateway API e2e modules."""
    backends = {n: await HttpBackend(n).start() for n in names}
    e = GatewayApiEnv(tmp_path, backends)
    try:
        yield e
    finally:
        await e.stop()
        for b in backends.values():
            await b.stop()
