"""Two networks, one cluster, as istiod's multi-network mesh: real Envoys run by pilot-agent, mesh
mTLS with certificates from our CA, an east-west gateway in between.

    client --HTTP--> 127.0.0.1:SVC_PORT  sidecar A (productpage, network net-a)
      --mTLS, SNI outbound_.SVC_PORT_._.reviews...--> 127.0.0.4:GW_PORT  east-west gateway (net-b,
      AUTO_PASSTHROUGH; found from its Service labelled topology.istio.io/network: net-b)
      --the same TLS, untouched--> 127.0.0.2:APP_PORT  sidecar B (reviews, a WorkloadEntry on net-b)
      --HTTP--> 127.0.0.1:APP_PORT  the reviews app

Sidecar A is sent the gateway's address as reviews' endpoint (its /clusters shows it); the
gateway's sni-dnat cluster counts the connections that crossed it. Loopback reaches every
address, so "only through the gateway" is shown by A's endpoints and the gateway's counters.
Sidecars (NONE interception) bind their outbound ports on 127.0.0.1: their Sidecars keep the
gateway's Service out of their egress, and the gateway's address is another loopback one.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.ports import free_ports
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(150)
NS, SYSTEM = "default", "istio-system"
REVIEWS = "reviews.default.svc.cluster.local"
CLIENT_IP, SERVER_IP, GATEWAY_IP = "127.0.0.3", "127.0.0.2", "127.0.0.4"


def mesh_yaml(svc_port: int, app_port: int, gw_port: int, gateway_network: str = "net-b") -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: reviews, namespace: {NS}}}
        spec:
          selector: {{app: reviews}}
          ports: [{{name: http, port: {svc_port}, targetPort: {app_port}}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: WorkloadEntry
        metadata: {{name: reviews-vm, namespace: {NS}}}
        spec:
          address: {SERVER_IP}
          network: net-b
          serviceAccount: reviews
          labels: {{app: reviews, security.istio.io/tlsMode: istio}}
        ---
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: reviews, namespace: {NS}}}
        spec:
          workloadSelector: {{labels: {{app: reviews}}}}
          egress: [{{hosts: ["nowhere/*"]}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: Sidecar
        metadata: {{name: productpage, namespace: {NS}}}
        spec:
          workloadSelector: {{labels: {{app: productpage}}}}
          egress: [{{hosts: ["./*"]}}]
        ---
        apiVersion: v1
        kind: Service
        metadata:
          name: eastwest
          namespace: {SYSTEM}
          labels: {{topology.istio.io/network: {gateway_network}, networking.istio.io/gatewayPort: "{gw_port}"}}
        spec:
          selector: {{istio: eastwestgateway}}
          externalIPs: [{GATEWAY_IP}]
          ports: [{{name: tls, port: {gw_port}, targetPort: {gw_port}}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: Gateway
        metadata: {{name: cross-network, namespace: {SYSTEM}}}
        spec:
          selector: {{istio: eastwestgateway}}
          servers:
          - port: {{number: {gw_port}, name: tls, protocol: TLS}}
            hosts: ["*.local"]
            tls: {{mode: AUTO_PASSTHROUGH}}
        """)


class TwoNetworks:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.issuer = Issuer("ES256")
        self.cp = ControlPlane(tmp / "cp", secure_grpc=True, env={"JWT_RULE": self.issuer.rule()})
        self.svc_port, self.app_port, self.gw_port = free_ports(3)
        self.app = HttpBackend("reviews", self.app_port)
        self.agents: list[PilotAgent] = []

    def agent(self, name: str, ip: str, sa: str, labels: dict, network: str, ns: str = NS,
              proxy_type: str = "sidecar") -> PilotAgent:
        env = {"POD_NAME": f"{name}-1", "POD_NAMESPACE": ns, "SERVICE_ACCOUNT": sa, "INSTANCE_IP": ip,
               "ISTIO_META_NETWORK": network, "ISTIO_METAJSON_LABELS": json.dumps(labels),
               "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{self.cp.secure_port}",
                                           "proxyAdminPort": 0, "statusPort": 0, "concurrency": 1})}
        if proxy_type == "sidecar":
            env["ISTIO_META_INTERCEPTION_MODE"] = "NONE"
        a = PilotAgent(self.tmp / name, env=env, proxy_type=proxy_type)
        a.write_root_cert(self.cp.root_cert())
        a.write_token(self.issuer.token(namespace=ns, sa=sa))
        self.agents.append(a)
        return a

    async def start(self, gateway_network: str = "net-b") -> None:
        await self.app.start()
        self.cp.write("mesh.yaml", mesh_yaml(self.svc_port, self.app_port, self.gw_port, gateway_network))
        await self.cp.start()
        self.server = await self.agent("reviews", SERVER_IP, "reviews", {"app": "reviews"}, "net-b").start()
        self.gateway = await self.agent("eastwest", GATEWAY_IP, "eastwest", {"istio": "eastwestgateway"}, "net-b",
                                        ns=SYSTEM, proxy_type="router").start()
        self.client = await self.agent("productpage", CLIENT_IP, "productpage", {"app": "productpage"},
                                       "net-a").start()
        for a in self.agents:
            await a.wait_ready()

    async def stop(self) -> None:
        for a in self.agents:
            await a.stop()
        await self.cp.stop()
        await self.app.stop()

    async def call(self) -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.svc_port}/hello",
                                                       headers={"Host": REVIEWS},
                                                       timeout=aiohttp.ClientTimeout(total=5)) as r:
            body = await r.text()
            try:
                return r.status, json.loads(body)
            except ValueError:
                return r.status, {"body": body}

    async def hosts(self, agent: PilotAgent, cluster: str) -> list[str]:
        """host:port of every endpoint the proxy's Envoy has for `cluster` (its /clusters)."""
        clusters = await agent.admin_json("/clusters?format=json")
        for c in clusters.get("cluster_statuses", []):
            if c["name"] == cluster:
                return sorted(f"{h['address']['socket_address']['address']}:{h['address']['socket_address']['port_value']}"
                              for h in c.get("host_statuses", []))
        return []

    async def counter(self, agent: PilotAgent, name: str) -> int:
        _, text = await agent.get("admin", f"/stats?filter=^{name.replace('.', '[.]')}$")
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0

    def logs(self) -> str:
        return "\n".join([self.cp.log_tail(), *(a.log_tail(15) for a in self.agents)])


async def test_a_workload_on_another_network_is_reached_through_the_east_west_gateway(tmp_path):
    mesh = TwoNetworks(tmp_path)
    cluster = f"outbound|{mesh.svc_port}||{REVIEWS}"
    sni_dnat = f"outbound_.{mesh.svc_port}_._.{REVIEWS}"
    try:
        await mesh.start()
        gateway = f"{GATEWAY_IP}:{mesh.gw_port}"

        async def client_sees_the_gateway():
            return await mesh.hosts(mesh.client, cluster) == [gateway]
        await wait_for(client_sees_the_gateway, timeout=30, message=f"the client's endpoint is the gateway\n{mesh.logs()}")
        # What the control plane found: the gateway of net-b (istiod's /debug/networkz), the entry's network.
        assert await mesh.cp.debug("/debug/networkz") == [
            {"Network": "net-b", "Cluster": "Kubernetes", "Addr": GATEWAY_IP, "Port": mesh.gw_port}]
        rows = [e for row in await mesh.cp.debug("/debug/endpointz") if row["service"] == REVIEWS
                for e in row["endpoints"]]
        assert [(e["address"], e["network"]) for e in rows] == [(SERVER_IP, "net-b")]
        # The gateway (on net-b) reaches the entry directly, through its sni-dnat cluster.
        assert await mesh.hosts(mesh.gateway, sni_dnat) == [f"{SERVER_IP}:{mesh.app_port}"]

        async def served():
            try:
                status, reply = await mesh.call()
            except (aiohttp.ClientError, TimeoutError):
                return None
            return reply if status == 200 else None
        reply = await wait_for(served, timeout=30, message=f"A -> gateway -> B -> app\n{mesh.logs()}")
        assert reply["name"] == "reviews" and reply["path"] == "/hello"
        # B terminated mTLS begun by A (the caller's identity reached the app), across the gateway.
        xfcc = {k.lower(): v for k, v in reply["headers"].items()}.get("x-forwarded-client-cert", "")
        assert "spiffe://cluster.local/ns/default/sa/productpage" in xfcc, reply["headers"]
        crossed = await mesh.counter(mesh.gateway, f"cluster.{sni_dnat}.upstream_cx_total")
        assert crossed >= 1, "the request did not cross the gateway"
        for _ in range(3):
            assert (await mesh.call())[0] == 200
        assert await mesh.counter(mesh.gateway, f"cluster.{sni_dnat}.upstream_cx_total") >= crossed
    finally:
        await mesh.stop()


async def test_a_network_without_a_gateway_gets_no_gateway_endpoint(tmp_path):
    """The gateway Service names another network: net-b has none. Sidecars then get net-b's
    endpoints as they are (istiod's rule for sidecars: they may be routable), and an entry
    known only by its network is dropped."""
    mesh = TwoNetworks(tmp_path)
    cluster = f"outbound|{mesh.svc_port}||{REVIEWS}"
    try:
        await mesh.start(gateway_network="net-c")

        async def direct():
            return await mesh.hosts(mesh.client, cluster) == [f"{SERVER_IP}:{mesh.app_port}"]
        await wait_for(direct, timeout=30, message=f"net-b has no gateway: its entry is sent as it is\n{mesh.logs()}")
        # Without its address the entry can only be reached through a gateway: none, so no endpoint.
        text = mesh_yaml(mesh.svc_port, mesh.app_port, mesh.gw_port, "net-c").replace(f"  address: {SERVER_IP}\n", "")
        mesh.cp.write("mesh.yaml", text)

        async def dropped():
            return await mesh.hosts(mesh.client, cluster) == []
        await wait_for(dropped, timeout=30, message=f"an address-less entry without a gateway is dropped\n{mesh.logs()}")
        # Naming net-b on the gateway Service again brings the gateway in as its endpoint.
        mesh.cp.write("mesh.yaml", text.replace("topology.istio.io/network: net-c", "topology.istio.io/network: net-b"))

        async def via_gateway():
            return await mesh.hosts(mesh.client, cluster) == [f"{GATEWAY_IP}:{mesh.gw_port}"]
        await wait_for(via_gateway, timeout=30, message=f"net-b's gateway stands in for the entry\n{mesh.logs()}")
    finally:
        await mesh.stop()
