"""The secure port (15012): TLS with the CA's server certificate, IstioCertificateService, and
authenticated xDS, against the real server process. File mode trusts a test JWT issuer through
JWT_RULE (inline JWKS); Kubernetes mode reviews tokens through the fake apiserver."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ssl

import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from pilot.gen.istio.v1.auth import ca_pb2
from tests.fakes.apiserver import FakeApiServer
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(60)

CREATE = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
SERVER_NAME = "istiod.istio-system.svc"
TRUST_DOMAIN = "example.org"
MESH = f"trustDomain: {TRUST_DOMAIN}\n"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer("ES256")


def plane(tmp_path, issuer: Issuer, **kw) -> ControlPlane:
    return ControlPlane(tmp_path, secure_grpc=True, mesh_config=MESH,
                        env={"JWT_RULE": issuer.rule(), "CA_KEY_TYPE": "EC"}, **kw)


def csr(*uris: str) -> tuple[ec.EllipticCurvePrivateKey, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    b = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    if uris:
        b = b.add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]), False)
    return key, b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def channel(cp: ControlPlane, root: str, client: tuple[bytes, bytes] | None = None) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(root.encode(), *(client or (None, None)))
    return grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_port}", creds,
                                   options=[("grpc.ssl_target_name_override", SERVER_NAME)])


async def create(cp: ControlPlane, csr_pem: str, *, token: str | None = None, ttl: int = 0,
                 client: tuple[bytes, bytes] | None = None, metadata: dict | None = None) -> list[str]:
    req = ca_pb2.IstioCertificateRequest(csr=csr_pem, validity_duration=ttl)
    if metadata:
        req.metadata.update(metadata)
    async with channel(cp, cp.root_cert(), client) as ch:
        call = ch.unary_unary(CREATE, request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
                              response_deserializer=ca_pb2.IstioCertificateResponse.FromString)
        md = [("authorization", f"Bearer {token}")] if token else None
        resp = await call(req, metadata=md, timeout=10)
    return list(resp.cert_chain)


async def refused(cp: ControlPlane, csr_pem: str, **kw) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await create(cp, csr_pem, **kw)
    return e.value.code(), e.value.details()


def uris(cert: x509.Certificate) -> list[str]:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
        .get_values_for_type(x509.UniformResourceIdentifier)


def verify_chain(chain: list[str], root_pem: str) -> x509.Certificate:
    certs = [x509.load_pem_x509_certificate(c.encode()) for c in chain]
    root = x509.load_pem_x509_certificate(root_pem.encode())
    assert certs[-1] == root, "the chain ends with the root"
    verifier = (verification.PolicyBuilder().store(verification.Store([root]))
                .build_client_verifier())
    verifier.verify(certs[0], certs[1:-1])
    return certs[0]


def pod_doc(name: str, namespace: str, sa: str, node_name: str, uid: str = "") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"serviceAccountName": sa, "nodeName": node_name},
            "status": {"podIP": "10.1.0.9", "phase": "Running"}}


# A ztunnel and the workloads it may (same node) and may not (other node) request identities for.
NODE_PODS = [pod_doc("ztunnel-a", "istio-system", "ztunnel", "node-1", uid="uid-zt"),
             pod_doc("reviews-1", "bookinfo", "reviews", "node-1"),
             pod_doc("ratings-1", "bookinfo", "ratings", "node-2")]


def ztunnel_token(issuer: Issuer, pod: str | None = "ztunnel-a", uid: str = "uid-zt") -> str:
    k8s: dict = {"namespace": "istio-system", "serviceaccount": {"name": "ztunnel", "uid": "u-9"}}
    if pod:
        k8s["pod"] = {"name": pod, "uid": uid}
    return issuer.token({"kubernetes.io": k8s}, namespace="istio-system", sa="ztunnel")


async def test_signs_only_the_callers_identity_and_refuses_bad_requests(tmp_path, issuer):
    cp = plane(tmp_path, issuer)
    cp.write("pods.yaml", yaml.safe_dump_all(NODE_PODS))
    async with cp:
        root = cp.root_cert()
        token = issuer.token(namespace="default", sa="sleep")
        key, pem = csr()
        chain = await create(cp, pem, token=token, ttl=3600)
        assert len(chain) == 2  # leaf, then the (self-signed) root
        leaf = verify_chain(chain, root)
        assert uris(leaf) == [f"spiffe://{TRUST_DOMAIN}/ns/default/sa/sleep"]
        assert leaf.public_key().public_numbers() == key.public_key().public_numbers()
        ttl = (leaf.not_valid_after_utc - dt.datetime.now(dt.UTC)).total_seconds()
        assert 3600 - 30 < ttl <= 3600
        default = verify_chain(await create(cp, pem, token=token), root)
        assert abs((default.not_valid_after_utc - dt.datetime.now(dt.UTC)).total_seconds() - 86400) < 30

        # Whatever the CSR asks for, the certificate names the caller.
        _, greedy = csr(f"spiffe://{TRUST_DOMAIN}/ns/istio-system/sa/istiod", "spiffe://evil/ns/a/sa/b")
        assert uris(verify_chain(await create(cp, greedy, token=token), root)) == [
            f"spiffe://{TRUST_DOMAIN}/ns/default/sa/sleep"]

        # Not authenticated: never a certificate.
        for bad in (issuer.token(aud="someone-else"), issuer.token(lifetime=-3600), None,
                    Issuer("ES256").token(), "not-a-jwt"):
            code, details = await refused(cp, pem, token=bad)
            assert code == grpc.StatusCode.UNAUTHENTICATED, details
        code, details = await refused(cp, pem, token=issuer.token(aud="someone-else"))
        assert "audience" in details and "no client certificate" in details

        # Bad requests from an authenticated caller.
        code, details = await refused(cp, "-----BEGIN CERTIFICATE REQUEST-----\n" + "A" * 20000, token=token)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit" in details
        code, details = await refused(cp, "hello", token=token)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        code, details = await refused(cp, pem, token=token, ttl=100 * 86400)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "MAX_WORKLOAD_CERT_TTL" in details

        # Impersonation: only CA_TRUSTED_NODE_ACCOUNTS (istio-system/ztunnel) may.
        target = f"spiffe://{TRUST_DOMAIN}/ns/bookinfo/sa/reviews"
        code, details = await refused(cp, pem, token=token, metadata={"ImpersonatedIdentity": target})
        assert code == grpc.StatusCode.PERMISSION_DENIED, details
        ztunnel = ztunnel_token(issuer)
        chain = await create(cp, pem, token=ztunnel, metadata={"ImpersonatedIdentity": target})
        assert uris(verify_chain(chain, root)) == [target]
        code, _ = await refused(cp, pem, token=ztunnel,
                                metadata={"ImpersonatedIdentity": "spiffe://elsewhere/ns/a/sa/b"})
        assert code == grpc.StatusCode.PERMISSION_DENIED

        # ...and only for identities of pods on its own node, as its (bound) token says.
        code, details = await refused(cp, pem, token=ztunnel, metadata={
            "ImpersonatedIdentity": f"spiffe://{TRUST_DOMAIN}/ns/bookinfo/sa/ratings"})
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "no instances of bookinfo/ratings found on node node-1" in details
        for bad_token, reason in [(ztunnel_token(issuer, pod=None), "names no pod"),
                                  (ztunnel_token(issuer, uid="uid-old"), "UID does not match"),
                                  (ztunnel_token(issuer, pod="ztunnel-gone"), "failed to look up pod")]:
            code, details = await refused(cp, pem, token=bad_token, metadata={"ImpersonatedIdentity": target})
            assert code == grpc.StatusCode.PERMISSION_DENIED and reason in details, details

        metrics = await cp.metrics()
        assert "citadel_server_csr_count 19.0" in metrics
        assert "citadel_server_success_cert_issuance_count 4.0" in metrics
        assert "citadel_server_authentication_failure_count 6.0" in metrics
        assert 'citadel_server_csr_sign_err_count{type="CSR_ERROR"} 2.0' in metrics
        assert 'citadel_server_csr_sign_err_count{type="TTL_ERROR"} 1.0' in metrics
        assert 'citadel_server_csr_sign_err_count{type="PERMISSION_DENIED"} 6.0' in metrics
        assert "citadel_server_csr_sign_seconds_count 4.0" in metrics
        assert "citadel_server_root_cert_expiry_timestamp" in metrics


async def test_server_certificate_and_renewal_with_the_client_certificate_across_a_restart(tmp_path, issuer):
    cp = plane(tmp_path, issuer)
    async with cp:
        root = cp.root_cert()
        # The 15012 certificate verifies against the CA root for istiod's service name.
        ctx = ssl.create_default_context(cadata=root)
        _, writer = await asyncio.open_connection("127.0.0.1", cp.secure_port, ssl=ctx, server_hostname=SERVER_NAME)
        served = x509.load_der_x509_certificate(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
        writer.close()
        names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.DNSName)
        assert {"istiod.istio-system.svc", "istiod.istio-system.svc.cluster.local", "istiod.istio-system",
                "istiod", "localhost"} <= set(names)
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection("127.0.0.1", cp.secure_port, ssl=ctx, server_hostname="evil.example")

        key, pem = csr()
        chain = await create(cp, pem, token=issuer.token(namespace="apps", sa="web"), ttl=7200)
        client = (key_pem(key), "".join(chain).encode())
        # Renewal: mTLS with the issued certificate, no token.
        _, pem2 = csr()
        renewed = verify_chain(await create(cp, pem2, client=client), root)
        assert uris(renewed) == [f"spiffe://{TRUST_DOMAIN}/ns/apps/sa/web"]
        # A certificate from another CA does not get past the handshake.
        from pilot.security.ca import CAOptions, CertificateAuthority, DirectoryStorage

        other = await CertificateAuthority.create(CAOptions(root_ca_dir=None, key_type="EC"),
                                                  DirectoryStorage(tmp_path / "other-ca"))
        stranger = other.sign(pem, [f"spiffe://{TRUST_DOMAIN}/ns/istio-system/sa/ztunnel"], 3600)
        code, _ = await refused(cp, pem2, client=(key_pem(key), "".join(stranger).encode()))
        assert code == grpc.StatusCode.UNAVAILABLE

    # A restart keeps the root (stored in PILOT_SELF_SIGNED_CA_DIR) and trusts what it issued.
    async with cp:
        assert cp.root_cert() == root
        again = verify_chain(await create(cp, pem2, client=client), root)
        assert uris(again) == [f"spiffe://{TRUST_DOMAIN}/ns/apps/sa/web"]


def node(namespace: str, service_account: str | None = None) -> base_pb2.Node:
    md = struct_pb2.Struct()
    md.update({"NAMESPACE": namespace, **({"SERVICE_ACCOUNT": service_account} if service_account else {})})
    return base_pb2.Node(id=f"sidecar~10.0.0.7~app-1.{namespace}~{namespace}.svc.cluster.local", metadata=md)


async def ads_first_response(cp: ControlPlane, n: base_pb2.Node, *, token: str | None = None,
                             client: tuple[bytes, bytes] | None = None) -> discovery_pb2.DiscoveryResponse:
    async with channel(cp, cp.root_cert(), client) as ch:
        call = ch.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                response_deserializer=discovery_pb2.DiscoveryResponse.FromString)(
            metadata=[("authorization", f"Bearer {token}")] if token else None)
        await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=n))
        try:
            return await asyncio.wait_for(call.read(), 10)
        finally:
            call.cancel()


async def test_secure_xds_admits_only_nodes_of_the_callers_namespace(tmp_path, issuer):
    async with plane(tmp_path, issuer) as cp:
        token = issuer.token(namespace="default", sa="sleep")
        resp = await ads_first_response(cp, node("default"), token=token)
        assert resp.type_url == CDS
        assert (await ads_first_response(cp, node("default", "sleep"), token=token)).type_url == CDS

        for n, tok, code in [(node("bookinfo"), token, grpc.StatusCode.PERMISSION_DENIED),
                             (node("default", "other-sa"), token, grpc.StatusCode.PERMISSION_DENIED),
                             (node("default"), None, grpc.StatusCode.UNAUTHENTICATED),
                             (node("default"), issuer.token(lifetime=-3600), grpc.StatusCode.UNAUTHENTICATED)]:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await ads_first_response(cp, n, token=tok)
            assert e.value.code() == code, e.value.details()

        # A workload certificate authenticates xDS too.
        key, pem = csr()
        chain = await create(cp, pem, token=issuer.token(namespace="bookinfo", sa="reviews"))
        client = (key_pem(key), "".join(chain).encode())
        assert (await ads_first_response(cp, node("bookinfo"), client=client)).type_url == CDS
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await ads_first_response(cp, node("default"), client=client)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED

        # 15010 stays plaintext and unauthenticated.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
            call = ch.stream_stream(SOTW, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                                    response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
            await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node=node("anywhere")))
            assert (await asyncio.wait_for(call.read(), 10)).type_url == CDS
            call.cancel()


async def test_kubernetes_mode_reviews_tokens_and_stores_the_root_in_a_secret(tmp_path):
    reviews: list[tuple[str, list[str]]] = []

    def reviewer(token: str, audiences: list[str]) -> dict:
        reviews.append((token, audiences))
        if token != "good-token":
            return {"authenticated": False, "error": "invalid bearer token"}
        return {"authenticated": True, "audiences": audiences,
                "user": {"username": "system:serviceaccount:bookinfo:reviews",
                         "groups": ["system:serviceaccounts", "system:serviceaccounts:bookinfo"]}}

    async with FakeApiServer() as fake:
        fake.token_reviewer = reviewer
        fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        async with ControlPlane(tmp_path, kubeconfig=kubeconfig, secure_grpc=True,
                                env={"CA_KEY_TYPE": "EC"}) as cp:
            secret = fake.get("secrets", "istio-ca-secret", namespace="istio-system")
            assert secret is not None and secret["type"] == "istio.io/ca-root"
            root = base64.b64decode(secret["data"]["ca-cert.pem"]).decode()
            cp.root_cert = lambda: root  # Kubernetes mode keeps no directory

            _, pem = csr()
            chain = await create(cp, pem, token="good-token")
            assert uris(verify_chain(chain, root)) == ["spiffe://cluster.local/ns/bookinfo/sa/reviews"]
            assert reviews[-1] == ("good-token", ["istio-ca"])
            code, details = await refused(cp, pem, token="bad-token")
            assert code == grpc.StatusCode.UNAUTHENTICATED and "invalid bearer token" in details
            resp = await ads_first_response(cp, node("bookinfo"), token="good-token")
            assert resp.type_url == CDS
            # The istio-ca-root-cert ConfigMaps carry the CA's root.
            await wait_for(lambda: (fake.get("configmaps", "istio-ca-root-cert", namespace="default") or {})
                           .get("data", {}).get("root-cert.pem") == root, message="root cert ConfigMap")


async def test_kubernetes_mode_node_proxy_gets_identities_of_its_own_node_only(tmp_path):
    def reviewer(token: str, audiences: list[str]) -> dict:
        # A bound token of the ztunnel pod: the review names the pod in user.extra.
        return {"authenticated": True, "audiences": audiences,
                "user": {"username": "system:serviceaccount:istio-system:ztunnel",
                         "groups": ["system:serviceaccounts"],
                         "extra": {"authentication.kubernetes.io/pod-name": ["ztunnel-a"],
                                   "authentication.kubernetes.io/pod-uid": [token]}}}

    async with FakeApiServer() as fake:
        fake.token_reviewer = reviewer
        for ns in ("istio-system", "bookinfo"):
            fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for doc in NODE_PODS:
            created = fake.create(dict(doc))
            if doc["metadata"]["name"] == "ztunnel-a":
                zt_uid = created["metadata"]["uid"]
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
        async with ControlPlane(tmp_path, kubeconfig=kubeconfig, secure_grpc=True, env={"CA_KEY_TYPE": "EC"}) as cp:
            root = base64.b64decode(fake.get("secrets", "istio-ca-secret", namespace="istio-system")
                                    ["data"]["ca-cert.pem"]).decode()
            cp.root_cert = lambda: root

            async def pods_known() -> bool:
                configz = await cp.debug("/debug/configz")
                return sum(c["kind"] == "Pod" for c in configz["configs"]) == 3

            await wait_for(pods_known, message="the pods reached the control plane")
            _, pem = csr()
            same_node = "spiffe://cluster.local/ns/bookinfo/sa/reviews"
            chain = await create(cp, pem, token=zt_uid, metadata={"ImpersonatedIdentity": same_node})
            assert uris(verify_chain(chain, root)) == [same_node]
            code, details = await refused(cp, pem, token=zt_uid, metadata={
                "ImpersonatedIdentity": "spiffe://cluster.local/ns/bookinfo/sa/ratings"})
            assert code == grpc.StatusCode.PERMISSION_DENIED and "found on node node-1" in details
            # A token of an earlier pod of the same name (another UID) is refused.
            code, details = await refused(cp, pem, token="uid-of-a-deleted-pod",
                                          metadata={"ImpersonatedIdentity": same_node})
            assert code == grpc.StatusCode.PERMISSION_DENIED and "UID does not match" in details


async def test_the_server_certificate_is_reissued_at_half_life_without_a_restart(tmp_path):
    """In process: the rotator and the TLS front with a 2 s server certificate."""
    from pilot.security.ca import CAOptions, CertificateAuthority, DirectoryStorage
    from pilot.security.ca_server import ServerCertRotator, TlsFront, istiod_dns_names

    ca = await CertificateAuthority.create(CAOptions(root_ca_dir=None, key_type="EC"), DirectoryStorage(tmp_path))
    rotator = ServerCertRotator(ca, istiod_dns_names("istio-system"), ttl=2.0)
    context = await asyncio.to_thread(rotator.issue)
    # Anything listening will do as the relay's upstream: the handshake is what is checked.
    upstream = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    front = TlsFront(upstream.sockets[0].getsockname()[1], context)
    port = await asyncio.to_thread(front.start, "127.0.0.1", 0)
    rotation = asyncio.create_task(rotator.run(front.set_context))
    client = ssl.create_default_context(cadata=ca.root_cert_pem)

    async def served_serial() -> int:
        _, w = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=SERVER_NAME)
        der = w.get_extra_info("ssl_object").getpeercert(binary_form=True)
        w.close()
        return x509.load_der_x509_certificate(der).serial_number

    try:
        first = await served_serial()
        assert first == x509.load_pem_x509_certificate(rotator.current.cert_chain[0].encode()).serial_number
        await wait_for(lambda: front.context is not context, timeout=5, message="re-issued at half life")
        assert rotator.issued == 2
        assert await served_serial() != first
    finally:
        rotation.cancel()
        await asyncio.to_thread(front.stop)
        upstream.close()


async def test_plugged_in_ca_rotation_is_picked_up_without_a_restart(tmp_path, issuer):
    """ROOT_CA_DIR files replaced (a new intermediate under a new root): new workload
    certificates and istiod's own serving certificate chain to the new root."""
    from tests.unit.ca_fixtures import make_intermediate, root_files, write_dir

    cacerts = tmp_path / "cacerts"
    old_root, new_root = root_files("EC"), root_files("RSA")  # two different roots
    write_dir(cacerts, make_intermediate(old_root, cn="intermediate one"))
    token = issuer.token(namespace="default", sa="sleep")

    async def sign(root_pem: str) -> list[str]:
        creds = grpc.ssl_channel_credentials(root_pem.encode())
        async with grpc.aio.secure_channel(f"127.0.0.1:{cp.secure_port}", creds,
                                           options=[("grpc.ssl_target_name_override", SERVER_NAME)]) as ch:
            call = ch.unary_unary(CREATE, request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
                                  response_deserializer=ca_pb2.IstioCertificateResponse.FromString)
            resp = await call(ca_pb2.IstioCertificateRequest(csr=csr()[1]),
                              metadata=[("authorization", f"Bearer {token}")], timeout=10)
        return list(resp.cert_chain)

    cp = ControlPlane(tmp_path / "cp", secure_grpc=True, mesh_config=MESH,
                      env={"JWT_RULE": issuer.rule(), "ROOT_CA_DIR": str(cacerts)})
    async with cp:
        verify_chain(await sign(old_root["ca-cert.pem"]), old_root["ca-cert.pem"])
        write_dir(cacerts, make_intermediate(new_root, cn="intermediate two"))

        async def rotated() -> list[str] | None:
            try:
                # Only a server certificate from the new chain passes this TLS handshake.
                return await sign(new_root["ca-cert.pem"])
            except grpc.aio.AioRpcError:
                return None

        chain = await wait_for(rotated, timeout=20, message=f"rotation picked up\n{cp.log_tail()}")
        leaf = verify_chain(chain, new_root["ca-cert.pem"])
        assert uris(leaf) == [f"spiffe://{TRUST_DOMAIN}/ns/default/sa/sleep"]
        assert "intermediate two" in x509.load_pem_x509_certificate(chain[1].encode()).subject.rfc4514_string()
