"""Two workloads, each with a real Envoy run by the real pilot-agent, talking mesh mTLS.

    client --HTTP--> 127.0.0.1:SVC_PORT  sidecar A (productpage, 127.0.0.3, NONE mode)
                     --mTLS--> 127.0.0.2:APP_PORT  sidecar B (reviews, inbound listener)
                     --HTTP--> 127.0.0.1:APP_PORT  the reviews app (an HttpBackend)

Loopback has all of 127/8 on Linux, so each workload gets its own "pod IP". B's Sidecar limits
its egress to an empty namespace so only A binds the outbound port.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any, Self

import aiohttp

from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.ports import free_ports
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

NS = "default"
REVIEWS = "reviews.default.svc.cluster.local"
CLIENT_IP, SERVER_IP = "127.0.0.3", "127.0.0.2"
CLIENT_ID = "spiffe://cluster.local/ns/default/sa/productpage"
SERVER_ID = "spiffe://cluster.local/ns/default/sa/reviews"


def mesh_yaml(svc_port: int, app_port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: reviews, namespace: {NS}}}
        spec:
          selector: {{app: reviews}}
          ports: [{{name: http, port: {svc_port}, targetPort: {app_port}}}]
        ---
        apiVersion: v1
        kind: Pod
        metadata:
          name: reviews-1
          namespace: {NS}
          labels: {{app: reviews, security.istio.io/tlsMode: istio}}
        spec: {{serviceAccountName: reviews}}
        status: {{podIP: {SERVER_IP}, phase: Running}}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: reviews-1
          namespace: {NS}
          labels: {{kubernetes.io/service-name: reviews}}
        addressType: IPv4
        ports: [{{name: http, port: {app_port}}}]
        endpoints:
        - addresses: [{SERVER_IP}]
          conditions: {{ready: true}}
          targetRef: {{kind: Pod, name: reviews-1, namespace: {NS}}}
        ---
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: reviews, namespace: {NS}}}
        spec:
          workloadSelector: {{labels: {{app: reviews}}}}
          egress: [{{hosts: ["istio-system/*"]}}]
        """)


class MtlsMesh:
    def __init__(self, tmp_path: Path, *, secret_ttl: str | None = None) -> None:
        self.tmp = tmp_path
        self.issuer = Issuer("ES256")
        self.cp = ControlPlane(tmp_path / "cp", secure_grpc=True, env={"JWT_RULE": self.issuer.rule()})
        self.svc_port, self.app_port = free_ports(2)
        self.app = HttpBackend("reviews", self.app_port)
        self.secret_ttl = secret_ttl
        self.agents: list[PilotAgent] = []

    def _agent(self, name: str, ip: str, sa: str, labels: dict) -> PilotAgent:
        env = {"POD_NAME": f"{name}-1", "POD_NAMESPACE": NS, "SERVICE_ACCOUNT": sa, "INSTANCE_IP": ip,
               "ISTIO_META_INTERCEPTION_MODE": "NONE", "ISTIO_METAJSON_LABELS": json.dumps(labels),
               "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{self.cp.secure_port}",
                                           "proxyAdminPort": 0, "statusPort": 0, "concurrency": 1})}
        if self.secret_ttl:
            env["SECRET_TTL"] = self.secret_ttl
        a = PilotAgent(self.tmp / name, env=env)
        a.write_root_cert(self.cp.root_cert())
        a.write_token(self.issuer.token(namespace=NS, sa=sa))
        self.agents.append(a)
        return a

    async def __aenter__(self) -> Self:
        await self.app.start()
        self.cp.write("mesh.yaml", mesh_yaml(self.svc_port, self.app_port))
        await self.cp.start()
        self.server = await self._agent("reviews", SERVER_IP, "reviews", {"app": "reviews"}).start()
        self.client = await self._agent("productpage", CLIENT_IP, "productpage", {"app": "productpage"}).start()
        for a in self.agents:
            await a.wait_ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for a in self.agents:
            await a.stop()
        await self.cp.stop()
        await self.app.stop()

    async def call(self, path: str = "/", *, direct: bool = False, timeout: float = 5,
                   headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        """Through sidecar A (the mesh), or `direct`ly to B's inbound port as a plaintext caller."""
        url = (f"http://{SERVER_IP}:{self.app_port}{path}" if direct
               else f"http://127.0.0.1:{self.svc_port}{path}")
        async with aiohttp.ClientSession() as s, s.get(url, headers={"Host": REVIEWS, **(headers or {})},
                                                       timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            body = await r.text()
            try:
                return r.status, json.loads(body)
            except ValueError:
                return r.status, {"body": body}

    async def until(self, check, message: str, timeout: float = 20) -> Any:
        async def attempt():
            try:
                return await check()
            except (aiohttp.ClientError, TimeoutError):
                return None
        logs = "\n".join(a.log_tail(15) for a in self.agents)
        return await wait_for(attempt, timeout=timeout, message=f"{message}\n{self.cp.log_tail()}\n{logs}")
