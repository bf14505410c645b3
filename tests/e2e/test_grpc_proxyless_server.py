"""Proxyless gRPC servers: grpcio's xDS-enabled server (in a subprocess) asks for its inbound
listener `xds.istio.io/grpc/lds/inbound/0.0.0.0:PORT` and enforces the AuthorizationPolicies
that select its workload, as RBAC filters the control plane sends.

Calls go from the test over plain channels (the server's listener is plaintext: the
PeerAuthentication default PERMISSIVE on a workload not labelled for auto mTLS).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from pilot.security.ca import CAOptions, CertificateAuthority, key_to_pem
from tests.support.control_plane import ControlPlane
from tests.support.grpc_client_proc import GrpcXdsClientProcess
from tests.support.grpc_echo import METHOD
from tests.support.grpc_server_proc import GrpcXdsServerProcess, certificate_providers
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for
from tests.unit.ca_fixtures import MemoryStorage, make_csr, root_files

pytestmark = pytest.mark.timeout(90)

NODE = sidecar_node_id("echo-server-1")
LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"


def mesh_yaml(port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: echo-server, namespace: default}}
        spec:
          selector: {{app: echo-server}}
          ports: [{{name: grpc, port: 7070, targetPort: {port}}}]
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: echo-server-1
          namespace: default
          labels: {{kubernetes.io/service-name: echo-server}}
        addressType: IPv4
        ports: [{{name: grpc, port: {port}}}]
        endpoints:
        - addresses: ["127.0.0.1"]
          conditions: {{ready: true}}
        """)


def policy(action: str, rules: str) -> str:
    return ("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n"
            "metadata: {name: echo-server, namespace: default}\nspec:\n"
            f"  selector: {{matchLabels: {{app: echo-server}}}}\n  action: {action}\n  rules:\n"
            + textwrap.indent(textwrap.dedent(rules), "  "))


async def call(port: int, metadata: tuple = ()) -> str:
    """One call on a fresh channel (grpc applies a changed listener to new connections)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = await channel.unary_unary(METHOD)(b"hi", timeout=3, metadata=metadata or None)
            return reply.decode()
        except grpc.aio.AioRpcError as e:
            return e.code().name


async def test_xds_server_serves_and_enforces_authorization_policies(tmp_path):
    port = free_port()
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mesh_yaml(port))
    async with cp:
        server = GrpcXdsServerProcess("srv", port, cp.xds_port, tmp_path, node_id=NODE,
                                      labels={"app": "echo-server"})
        await server.start()
        try:
            async def replies(expected: str, metadata: tuple = ()) -> bool:
                return await call(port, metadata) == expected

            await wait_for(lambda: replies("srv:hi"), timeout=30,
                           message=f"the xDS server serves once its listener arrives\n{server.describe()}")
            row = await cp.wait_synced(NODE, types=("listener",))  # a server asks for LDS only
            assert row["listener_nack"] is None, row
            adsz = await cp.debug("/debug/adsz")
            watches = next(c["watches"] for c in adsz["clients"] if c["connectionId"] == row["connection_id"])
            assert watches[LISTENER_TYPE] == [f"xds.istio.io/grpc/lds/inbound/0.0.0.0:{port}"]

            # DENY on a header: requests carrying it are refused, the rest still served.
            cp.write("authz.yaml", policy("DENY", """\
                - to: [{operation: {paths: ["/test.Echo/Echo"]}}]
                  when: [{key: "request.headers[x-block]", values: ["yes"]}]
                """))
            await wait_for(lambda: replies("PERMISSION_DENIED", (("x-block", "yes"),)), timeout=30,
                           message=f"DENY policy enforced\n{server.describe()}")
            assert await call(port) == "srv:hi"
            assert await call(port, (("x-block", "no"),)) == "srv:hi"

            # ALLOW only another method: Echo is now refused for everyone.
            cp.write("authz.yaml", policy("ALLOW", """\
                - to: [{operation: {paths: ["/test.Echo/Other"]}}]
                """))
            await wait_for(lambda: replies("PERMISSION_DENIED"), timeout=30, message="ALLOW policy enforced")

            cp.remove("authz.yaml")
            await wait_for(lambda: replies("srv:hi"), timeout=30, message="served again without policies")
            row = await cp.wait_synced(NODE, types=("listener",))  # a server asks for LDS only
            assert row["listener_nack"] is None, row
        finally:
            await server.stop()


# --- mTLS through xDS credentials -----------------------------------------------------------
SERVER_ID = "spiffe://cluster.local/ns/default/sa/echo-server"
CLIENT_ID = "spiffe://cluster.local/ns/default/sa/client"


def workload_files(tmp_path: Path, ca, identity: str, name: str) -> dict[str, str]:
    """What istio-agent writes for a proxyless workload: its chain, key and the mesh roots,
    here signed by this project's CA for `identity`."""
    key = ec.generate_private_key(ec.SECP256R1())
    chain = ca.sign(make_csr(key=key), [identity])
    out = {"cert": tmp_path / f"{name}-cert-chain.pem", "key": tmp_path / f"{name}-key.pem",
           "ca": tmp_path / f"{name}-root-cert.pem"}
    out["cert"].write_text("".join(chain[:-1]))
    out["key"].write_text(key_to_pem(key))
    out["ca"].write_text(chain[-1])
    return {k: str(v) for k, v in out.items()}


def mtls_mesh_yaml(port: int) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: echo-server, namespace: default}}
        spec:
          selector: {{app: echo-server}}
          ports: [{{name: grpc, port: 7070, targetPort: {port}}}]
        ---
        apiVersion: v1
        kind: Pod
        metadata: {{name: echo-server-1, namespace: default, labels: {{app: echo-server}}}}
        spec: {{serviceAccountName: echo-server}}
        status: {{podIP: 127.0.0.1, phase: Running}}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: echo-server-1
          namespace: default
          labels: {{kubernetes.io/service-name: echo-server}}
        addressType: IPv4
        ports: [{{name: grpc, port: {port}}}]
        endpoints:
        - addresses: ["127.0.0.1"]
          conditions: {{ready: true}}
          targetRef: {{kind: Pod, name: echo-server-1, namespace: default}}
        ---
        apiVersion: security.istio.io/v1
        kind: PeerAuthentication
        metadata: {{name: echo-server, namespace: default}}
        spec:
          selector: {{matchLabels: {{app: echo-server}}}}
          mtls: {{mode: STRICT}}
        ---
        apiVersion: networking.istio.io/v1
        kind: DestinationRule
        metadata: {{name: echo-server, namespace: default}}
        spec:
          host: echo-server
          trafficPolicy: {{tls: {{mode: ISTIO_MUTUAL}}}}
        """)


async def test_mtls_between_xds_client_and_server_with_principal_authorization(tmp_path):
    """STRICT PeerAuthentication makes the server's listener require a client certificate;
    ISTIO_MUTUAL makes the client's cluster present one and check the server's identity.
    Both use grpc's xDS credentials with file_watcher certificates from this project's CA.
    A principal-based ALLOW policy then sees the client's SPIFFE identity."""
    port = free_port()
    ca = await CertificateAuthority.create(CAOptions(root_ca_dir=None), MemoryStorage(root_files("EC")))
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mtls_mesh_yaml(port))
    async with cp:
        server = GrpcXdsServerProcess("srv", port, cp.xds_port, tmp_path, node_id=NODE,
                                      labels={"app": "echo-server"},
                                      certs=workload_files(tmp_path, ca, SERVER_ID, "server"))
        client = GrpcXdsClientProcess("xds:///echo-server.default.svc.cluster.local:7070", cp.xds_port, tmp_path,
                                      node_id=sidecar_node_id("client-1", ip="127.0.0.3"), max_seconds=60,
                                      call_timeout=2.0, xds_creds=True)
        client.bootstrap["certificate_providers"] = certificate_providers(
            workload_files(tmp_path, ca, CLIENT_ID, "client"))
        await server.start()
        await client.start()
        try:
            await client.wait_for_reply("srv:", timeout=30, since=0)
            for node in (NODE, client.bootstrap["node"]["id"]):
                row = await cp.sync_status(node)
                assert row and all(row[f"{t}_nack"] is None for t in ("cluster", "listener", "route", "endpoint")), row
            # The server takes no plaintext: a call without a certificate fails.
            assert await call(port) == "UNAVAILABLE"

            cp.write("authz.yaml", policy("ALLOW", """\
                - from: [{source: {principals: ["cluster.local/ns/default/sa/someone-else"]}}]
                """))
            await client.wait_for_error("PERMISSION_DENIED", timeout=30)
            cp.write("authz.yaml", policy("ALLOW", """\
                - from: [{source: {principals: ["cluster.local/ns/default/sa/client"]}}]
                """))
            await client.wait_for_reply("srv:", timeout=30)
        finally:
            await client.stop()
            await server.stop()
