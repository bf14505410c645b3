"""Mesh mTLS between two real Envoys run by pilot-agent, with certificates from our CA."""

from __future__ import annotations

import asyncio
import json
import ssl
import textwrap
from urllib.parse import unquote

import aiohttp
import pytest
from cryptography import x509

from tests.e2e.mtls_mesh import CLIENT_ID, SERVER_ID, SERVER_IP, MtlsMesh
from tests.e2e.test_ca_server import create, csr, key_pem
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(120)
USERS = "https://users.example.com"


def xfcc(reply: dict) -> dict[str, str]:
    """x-forwarded-client-cert as the app received it: `By=...;Hash=...;URI=...`."""
    raw = {k.lower(): v for k, v in reply.get("headers", {}).items()}.get("x-forwarded-client-cert", "")
    fields = {}
    for part in raw.split(";"):
        k, _, v = part.partition("=")
        fields[k] = unquote(v.strip('"'))
    return fields


async def test_sidecars_talk_mtls_and_the_app_sees_the_callers_identity(tmp_path):
    async with MtlsMesh(tmp_path) as mesh:
        async def served():
            status, reply = await mesh.call("/hello")
            return reply if status == 200 else None

        reply = await mesh.until(served, "A -> mTLS -> B -> app")
        assert reply["name"] == "reviews" and reply["path"] == "/hello"
        cert = xfcc(reply)
        assert cert.get("URI") == CLIENT_ID, reply["headers"]
        assert cert.get("By") == SERVER_ID

        # Any workload with a certificate from our CA is a mesh peer: B presents its own
        # certificate (for B's identity only) and passes the caller's on to the app.
        der, response = await mtls_get(await mesh_client_context(mesh, tmp_path, "tester"), mesh.app_port, "/tls")
        leaf = x509.load_der_x509_certificate(der)
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [SERVER_ID]
        assert response.startswith(b"HTTP/1.1 200")
        assert b"spiffe://cluster.local/ns/default/sa/tester" in response

        # PERMISSIVE (no PeerAuthentication): a plaintext caller still reaches the app, and
        # cannot claim an identity.
        status, reply = await mesh.call("/plain", direct=True)
        assert status == 200 and "URI" not in xfcc(reply)
        assert "x-forwarded-client-cert" not in {k.lower() for k in reply["headers"]}


async def mesh_client_context(mesh: MtlsMesh, tmp_path, sa: str) -> ssl.SSLContext:
    """A TLS client holding a workload certificate our CA issued for `sa` (as a sidecar would)."""
    key, pem = csr()
    chain = await create(mesh.cp, pem, token=mesh.issuer.token(namespace="default", sa=sa))
    (tmp_path / "client.pem").write_text("".join(chain))
    (tmp_path / "client.key").write_bytes(key_pem(key))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # mesh peers are verified by SPIFFE URI, checked below
    ctx.load_verify_locations(cadata=mesh.cp.root_cert())
    ctx.load_cert_chain(tmp_path / "client.pem", tmp_path / "client.key")
    ctx.set_alpn_protocols(["istio-http/1.1", "istio"])
    return ctx


async def mtls_get(ctx: ssl.SSLContext, port: int, path: str) -> tuple[bytes, bytes]:
    """(server leaf DER, raw HTTP response) over one mTLS connection to B's inbound port."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(SERVER_IP, port, ssl=ctx), 5)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: reviews\r\nConnection: close\r\n\r\n".encode())
    response = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return der, response


ONE_REQUEST_PER_CONNECTION = """\
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews.default.svc.cluster.local
  trafficPolicy: {connectionPool: {http: {maxRequestsPerConnection: 1}}}
"""


async def test_certificate_rotation_under_continuous_traffic_drops_no_request(tmp_path):
    """4 s certificates (renewed every ~2 s) on both sidecars; every request opens a new mTLS
    connection, so each one uses whatever certificate is current at that moment."""
    async with MtlsMesh(tmp_path, secret_ttl="4s") as mesh:
        mesh.cp.write("dr.yaml", ONE_REQUEST_PER_CONNECTION)

        async def served():
            status, reply = await mesh.call()
            return status == 200 and xfcc(reply).get("URI") == CLIENT_ID

        await mesh.until(served, "mTLS traffic")
        hashes, failures, sent = set(), [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while loop.time() < deadline and len(hashes) < 4:
            sent += 1
            try:
                status, reply = await mesh.call(timeout=5)
            except Exception as e:  # noqa: BLE001 - any failure is what this test counts
                failures.append(repr(e))
                continue
            if status != 200:
                failures.append(f"{status} {reply}")
                continue
            hashes.add(xfcc(reply)["Hash"])
        assert not failures, f"{len(failures)} of {sent} requests failed during rotation: {failures[:3]}"
        assert len(hashes) >= 4, f"only {len(hashes)} client certificates seen in {sent} requests"


def policy(kind: str, name: str, spec: str) -> str:
    return (f"apiVersion: security.istio.io/v1\nkind: {kind}\nmetadata: {{name: {name}, namespace: default}}\n"
            f"spec:\n{textwrap.indent(textwrap.dedent(spec), '  ')}")


async def test_peer_authentication_and_authorization_policies_with_real_identities(tmp_path):
    async with MtlsMesh(tmp_path) as mesh:
        async def status_is(code: int, path: str = "/", direct: bool = False, identity: str | None = "any"):
            async def check():
                status, reply = await mesh.call(path, direct=direct)
                if status != code:
                    return False
                return identity == "any" or xfcc(reply).get("URI") == identity
            return check

        await mesh.until(await status_is(200, identity=CLIENT_ID), "mTLS traffic")

        # STRICT: plaintext callers are refused at the handshake; the mesh still works.
        mesh.cp.write("pa.yaml", policy("PeerAuthentication", "default", "mtls: {mode: STRICT}"))

        async def plaintext_refused():
            try:
                await mesh.call(direct=True, timeout=2)
            except (aiohttp.ClientError, TimeoutError):
                return True
            return False

        await mesh.until(plaintext_refused, "STRICT refuses plaintext")
        assert (await mesh.call())[0] == 200

        # ALLOW only another namespace: productpage (namespace default) is denied with 403.
        mesh.cp.write("authz.yaml", policy("AuthorizationPolicy", "reviews", """\
            selector: {matchLabels: {app: reviews}}
            action: ALLOW
            rules: [{from: [{source: {namespaces: [payments]}}]}]
            """))
        await mesh.until(await status_is(403), "ALLOW from another namespace only")
        # ALLOW productpage's own principal; DENY /admin for everyone.
        mesh.cp.write("authz.yaml", policy("AuthorizationPolicy", "reviews", """\
            selector: {matchLabels: {app: reviews}}
            action: ALLOW
            rules: [{from: [{source: {principals: [cluster.local/ns/default/sa/productpage]}}]}]
            """) + "---\n" + policy("AuthorizationPolicy", "no-admin", """\
            action: DENY
            rules: [{to: [{operation: {paths: [/admin*]}}]}]
            """))
        await mesh.until(await status_is(200, identity=CLIENT_ID), "ALLOW the client's principal")
        await mesh.until(await status_is(403, "/admin/users"), "DENY /admin")
        assert (await mesh.call("/public"))[0] == 200

        # RequestAuthentication: a valid token passes, a forged one is refused with 401, none passes.
        users, forger = Issuer("ES256", issuer=USERS), Issuer("ES256", issuer=USERS)
        mesh.cp.write("ra.yaml", policy("RequestAuthentication", "users", f"""\
            selector: {{matchLabels: {{app: reviews}}}}
            jwtRules: [{{issuer: "{USERS}", jwks: '{json.dumps(users.jwks)}'}}]
            """))

        async def jwt_checked():
            bearer = {"Authorization": f"Bearer {forger.token()}"}
            return (await mesh.call("/public", headers=bearer))[0] == 401
        await mesh.until(jwt_checked, "RequestAuthentication in force")
        assert (await mesh.call("/public", headers={"Authorization": f"Bearer {users.token()}"}))[0] == 200
        assert (await mesh.call("/public"))[0] == 200

        # DISABLE: auto mTLS follows the destination's policy and sends plaintext.
        mesh.cp.remove("authz.yaml")
        mesh.cp.write("pa.yaml", policy("PeerAuthentication", "default", "mtls: {mode: DISABLE}"))

        async def plaintext_everywhere():
            status, reply = await mesh.call()
            direct, _ = await mesh.call(direct=True)
            return status == 200 and "URI" not in xfcc(reply) and direct == 200

        await mesh.until(plaintext_everywhere, "DISABLE: plaintext from the sidecar and from outside")
