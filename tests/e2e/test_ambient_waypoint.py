"""Waypoints end to end: a Gateway of class istio-waypoint appears, and ztunnel is told to send the
services that use it through its address."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pilot.gen.istio.v1.auth import ca_pb2
from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.policies import authz
from tests.support.ports import free_ports
from tests.support.wait import wait_for
from tests.support.ztunnel import ADDRESS, ZtunnelClient
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(60)

NAMESPACE = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "shop", "labels": {"istio.io/dataplane-mode": "ambient",
                                                     "istio.io/use-waypoint": "waypoint"}}}
CART = [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cart", "namespace": "shop"},
         "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "cart"}, "ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cart-0", "namespace": "shop", "labels": {"app": "cart"}},
         "spec": {"serviceAccountName": "cart"},
         "status": {"podIP": "10.1.0.11", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}]
WAYPOINT = [{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
             "metadata": {"name": "waypoint", "namespace": "shop"},
             "spec": {"gatewayClassName": "istio-waypoint",
                      "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]}},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "waypoint", "namespace": "shop",
                          "labels": {"gateway.istio.io/managed": "istio.io-mesh-controller"}},
             "spec": {"clusterIP": "10.96.0.99", "selector": {"gateway.networking.k8s.io/gateway-name": "waypoint"},
                      "ports": [{"name": "mesh", "port": 15008}]}}]
SVC = "shop/cart.shop.svc.cluster.local"


def dump(*docs: dict) -> str:
    return yaml.safe_dump_all(docs)


async def test_a_new_waypoint_is_assigned_to_the_services_that_use_it(tmp_path):
    cp = ControlPlane(tmp_path, env={"PILOT_ENABLE_AMBIENT": "true"})
    cp.write("mesh.yaml", dump(NAMESPACE, *CART))
    async with cp:
        z = ZtunnelClient(cp.xds_port)
        await z.connect()
        try:
            await z.wait(lambda: SVC in z.services())
            assert not z.services()[SVC].HasField("waypoint")  # named, but no such waypoint yet

            n = len(z.received(ADDRESS))
            cp.write("waypoint.yaml", dump(*WAYPOINT))
            await z.wait(lambda: z.services()[SVC].HasField("waypoint"), message="the waypoint is assigned")
            wp = z.services()[SVC].waypoint
            assert (wp.hostname.namespace, wp.hostname.hostname, wp.hbone_mtls_port) == (
                "shop", "waypoint.shop.svc.cluster.local", 15008)
            assert not z.workloads()["Kubernetes//Pod/shop/cart-0"].HasField("waypoint")  # service traffic only
            changed = {name for r in z.received(ADDRESS)[n:] for name in r.resources}
            # The cart service gets the waypoint; the waypoint's own service is new; nothing else moves.
            assert changed == {SVC, "shop/waypoint.shop.svc.cluster.local"}

            ambientz = await cp.debug("/debug/ambientz")
            assert ambientz["waypoints"] == [{"namespace": "shop", "name": "waypoint", "traffic_type": "service",
                                              "address": "waypoint.shop.svc.cluster.local", "service_accounts": []}]
        finally:
            await z.close()


# --- a real waypoint Envoy terminating HBONE ------------------------------------------------------
class HboneClient:
    """A client Envoy that does what ztunnel does towards a waypoint: mTLS with a mesh identity,
    HTTP/2, and one CONNECT tunnel per connection to the service VIP:port. Each identity gets a
    local listener; what is sent to it arrives at the waypoint inside the tunnel."""

    def __init__(self, cp: ControlPlane, issuer: Issuer, workdir: Path, waypoint_port: int, target: str) -> None:
        self.cp, self.issuer, self.workdir = cp, issuer, workdir
        self.waypoint_port, self.target = waypoint_port, target
        self.envoy = Envoy()
        self.ports: dict[str, int] = {}

    async def start(self, *identities: tuple[str, str]) -> HboneClient:
        listeners, clusters = [], []
        root = self.workdir / "root.pem"
        root.write_text(self.cp.root_cert())
        for ns, sa in identities:
            key, chain = await mesh_certificate(self.cp, self.issuer.token(namespace=ns, sa=sa))
            (self.workdir / f"{sa}.key").write_bytes(key)
            (self.workdir / f"{sa}.pem").write_text("".join(chain))
            listeners.append({"name": sa, "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                              "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                                  "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                                  "stat_prefix": sa, "cluster": f"waypoint-as-{sa}",
                                  "tunneling_config": {"hostname": self.target}}}]}]})
            tls = {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                   "common_tls_context": {
                       "alpn_protocols": ["h2"],
                       "tls_certificates": [{"certificate_chain": {"filename": str(self.workdir / f"{sa}.pem")},
                                             "private_key": {"filename": str(self.workdir / f"{sa}.key")}}],
                       "validation_context": {"trusted_ca": {"filename": str(root)}}}}
            clusters.append({
                "name": f"waypoint-as-{sa}", "type": "STATIC", "connect_timeout": "2s",
                "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}},
                "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": tls},
                "load_assignment": {"cluster_name": f"waypoint-as-{sa}", "endpoints": [{"lb_endpoints": [{
                    "endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                                "port_value": self.waypoint_port}}}}]}]}})
        bootstrap = {"node": {"id": "ztunnel-like-client", "cluster": "client"},
                     "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
                     "static_resources": {"listeners": listeners, "clusters": clusters}}
        await self.envoy.start(bootstrap, self.workdir)
        await self.envoy.wait_ready()
        self.ports = await self.envoy.listener_ports()
        return self

    async def get(self, identity: str, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.ports[identity]}{path}"
        async with aiohttp.ClientSession() as s, s.get(url, headers={"Host": "cart.shop.svc.cluster.local"},
                                                       timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status, await r.text()


async def mesh_certificate(cp: ControlPlane, token: str) -> tuple[bytes, list[str]]:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
           .public_bytes(serialization.Encoding.PEM).decode())
    creds = grpc.ssl_channel_credentials(cp.root_cert().encode())
    async with grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_port}", creds,
                                       options=[("grpc.ssl_target_name_override", "istiod.istio-system.svc")]) as ch:
        call = ch.unary_unary("/istio.v1.auth.IstioCertificateService/CreateCertificate",
                              request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
                              response_deserializer=ca_pb2.IstioCertificateResponse.FromString)
        resp = await call(ca_pb2.IstioCertificateRequest(csr=csr), metadata=[("authorization", f"Bearer {token}")],
                          timeout=10)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return pem, list(resp.cert_chain)


def waypoint_mesh(hbone_port: int, app_port: int) -> str:
    gateway = dict(WAYPOINT[0], spec={"gatewayClassName": "istio-waypoint",
                                      "listeners": [{"name": "mesh", "port": hbone_port, "protocol": "HBONE"}]})
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": "cart-1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "cart"}},
              "addressType": "IPv4", "ports": [{"name": "http", "port": app_port}],
              "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}
    cart = dict(CART[0], spec={"clusterIP": "10.96.0.10", "selector": {"app": "cart"},
                               "ports": [{"name": "http", "port": 80, "targetPort": app_port}]})
    policies = [authz("no-admin", "shop", action="DENY",
                      targetRefs=[{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"}],
                      rules=[{"to": [{"operation": {"paths": ["/admin"]}}]}]),
                authz("front-only", "shop", targetRefs=[{"kind": "Service", "group": "", "name": "cart"}],
                      rules=[{"from": [{"source": {"principals": ["cluster.local/ns/shop/sa/front"]}}]}])]
    # Routing at the waypoint: requests for /old are answered 410 there (a VirtualService fault).
    vs = {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "cart", "namespace": "shop"},
          "spec": {"hosts": ["cart.shop.svc.cluster.local"], "http": [
              {"match": [{"uri": {"prefix": "/old"}}], "fault": {"abort": {"httpStatus": 410, "percentage": {"value": 100}}},
               "route": [{"destination": {"host": "cart"}}]},
              {"route": [{"destination": {"host": "cart"}}]}]}}
    return dump(NAMESPACE, cart, slice_, gateway, WAYPOINT[1], vs, *policies)


async def test_a_waypoint_envoy_terminates_hbone_and_applies_l7_routing_and_policy(tmp_path):
    issuer = Issuer("ES256")
    hbone_port, app_port = free_ports(2)
    app = HttpBackend("cart", app_port)
    await app.start()
    cp = ControlPlane(tmp_path / "cp", secure_grpc=True,
                      env={"PILOT_ENABLE_AMBIENT": "true", "JWT_RULE": issuer.rule(), "CA_KEY_TYPE": "EC"})
    cp.write("mesh.yaml", waypoint_mesh(hbone_port, app_port))
    waypoint = client = None
    try:
        await cp.start()
        env = {"POD_NAME": "waypoint-1", "POD_NAMESPACE": "shop", "SERVICE_ACCOUNT": "waypoint",
               "INSTANCE_IP": "127.0.0.1",
               "ISTIO_METAJSON_LABELS": json.dumps({"gateway.networking.k8s.io/gateway-name": "waypoint"}),
               "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}",
                                           "proxyAdminPort": 0, "statusPort": 0, "concurrency": 1})}
        waypoint = PilotAgent(tmp_path / "waypoint", env=env, proxy_type="router")
        waypoint.write_root_cert(cp.root_cert())
        waypoint.write_token(issuer.token(namespace="shop", sa="waypoint"))
        await waypoint.start()
        await waypoint.wait_ready()
        client = await HboneClient(cp, issuer, tmp_path, hbone_port, "10.96.0.10:80").start(
            ("shop", "front"), ("shop", "other"))

        async def reached() -> tuple[int, str] | None:
            try:
                status, body = await client.get("front", "/hello")
            except (aiohttp.ClientError, TimeoutError):
                return None
            return (status, body) if status == 200 else None

        _, body = await wait_for(reached, timeout=20, message="HBONE through the waypoint\n"
                                 f"{cp.log_tail()}\n{waypoint.log_tail(30)}\n{client.envoy.log_tail(20)}")
        seen = json.loads(body)
        assert seen["name"] == "cart" and seen["path"] == "/hello"
        # L7 policy at the waypoint: the Gateway-attached DENY by path, the Service-attached ALLOW
        # by the caller's mesh identity (from the tunnel's mTLS).
        assert (await client.get("front", "/admin"))[0] == 403
        assert (await client.get("other", "/hello"))[0] == 403
        # Routing at the waypoint, for the allowed caller, right after the refused one: tunnels of
        # different identities never share an internal connection (or its identity).
        assert (await client.get("front", "/old/page"))[0] == 410
        assert app.request_count == 1

        # The service's DestinationRule reaches the waypoint's own cluster for it, live, as with
        # istiod: the pool's connect timeout and limit, outlier detection.
        cp.write("dr.yaml", dump({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                                  "metadata": {"name": "cart", "namespace": "shop"},
                                  "spec": {"host": "cart.shop.svc.cluster.local", "trafficPolicy": {
                                      "connectionPool": {"tcp": {"maxConnections": 7, "connectTimeout": "1.5s"}},
                                      "outlierDetection": {"consecutive5xxErrors": 4}}}}))

        async def vip_cluster() -> dict | None:
            dump_ = await waypoint.admin_json("/config_dump?resource=dynamic_active_clusters")
            for c in dump_["configs"]:
                if c["cluster"]["name"] == "inbound-vip|80|http|cart.shop.svc.cluster.local" \
                        and "outlier_detection" in c["cluster"]:
                    return c["cluster"]
            return None

        vip = await wait_for(vip_cluster, timeout=20, message=f"DR at the waypoint\n{cp.log_tail()}")
        assert vip["connect_timeout"] == "1.500s"
        assert vip["circuit_breakers"]["thresholds"][0]["max_connections"] == 7
        assert vip["outlier_detection"]["consecutive_5xx"] == 4
        assert (await client.get("front", "/hello"))[0] == 200
    finally:
        if client is not None:
            await client.envoy.stop()
        if waypoint is not None:
            await waypoint.stop()
        await cp.stop()
        await app.stop()
