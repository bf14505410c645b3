"""Gateways for router proxies: selection, VirtualService binding, merging, SDS, and cache keys.

Every input of a gateway resource is changed through the Store and must change the resource;
unrelated changes must leave its bytes alone (served from the cache).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2, tls_pb2

from pilot.config.validation import InvalidObject, parse_object
from pilot.features import Features
from pilot.model import credentials
from pilot.model.events import push_request_for
from pilot.model.proxy import Proxy, parse_node_id
from pilot.xds.connection import Connection
from pilot.xds.discovery import GENERATORS, DiscoveryServer
from pilot.xds.generated import GenerationMemo
from pilot.xds.generators import lds, sds
from pilot.xds.typeurls import LISTENER, ROUTE, SECRET
from tests.support.scoping import pushed, subscribe

from .helpers import DOMAIN, World, endpoint_slice, mesh_configmap, service

GW_NS = "istio-system"
PEM_CERT = b"-----BEGIN CERTIFICATE-----\nMAo=\n-----END CERTIFICATE-----\n"
PEM_KEY = b"-----BEGIN PRIVATE KEY-----\nMAo=\n-----END PRIVATE KEY-----\n"


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def router(namespace: str = GW_NS, labels: dict | None = None, ptype: str = "router", pod: str = "gw-1",
           verified: bool = False) -> Proxy:
    """`verified`: connected on the secure port, as its namespace's `gw` service account."""
    node_id = f"{ptype}~10.0.0.9~{pod}.{namespace}~{namespace}.svc.{DOMAIN}"
    t, ips, p, ns, domain = parse_node_id(node_id)
    return Proxy(node_id, t, ips, p, ns, domain, "gw", {"NAMESPACE": namespace,
                                                       "LABELS": labels if labels is not None else
                                                       {"istio": "ingressgateway"}},
                 identity=f"spiffe://{DOMAIN}/ns/{namespace}/sa/gw" if verified else "")


def verified_router(**kw) -> Proxy:
    return router(verified=True, **kw)


def gateway(name: str = "gw", servers: list[dict] | None = None, namespace: str = GW_NS,
            selector: dict | None = None) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"istio": "ingressgateway"} if selector is None else selector,
                     "servers": servers or [http_server()]}}


def http_server(port: int = 8080, hosts: list[str] | None = None, name: str = "http") -> dict:
    return {"port": {"number": port, "name": name, "protocol": "HTTP"}, "hosts": hosts or ["*"]}


def https_server(port: int = 8443, hosts: list[str] | None = None, name: str = "https", mode: str = "SIMPLE",
                 credential: str = "cert") -> dict:
    return {"port": {"number": port, "name": name, "protocol": "HTTPS"}, "hosts": hosts or ["a.example.com"],
            "tls": {"mode": mode, "credentialName": credential}}


def virtual_service(name: str = "vs", hosts: list[str] | None = None, gateways: list[str] | None = None,
                    dest: str = "a", namespace: str = "default", **extra: Any) -> dict:
    spec: dict[str, Any] = {"hosts": hosts or ["a.example.com"],
                            "gateways": gateways if gateways is not None else [f"{GW_NS}/gw"],
                            "http": [{"route": [{"destination": {"host": dest}}]}]}
    spec.update(extra)
    return {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def secret(name: str = "cert", namespace: str = GW_NS, cert: bytes = PEM_CERT, key: bytes = PEM_KEY,
           ca: bytes | None = None, raw: dict | None = None) -> dict:
    data = raw if raw is not None else {"tls.crt": b64(cert), "tls.key": b64(key)}
    if ca is not None:
        data["ca.crt"] = b64(ca)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "type": "kubernetes.io/tls", "data": data}


@pytest.fixture
def world() -> World:
    w = World()
    w.apply(service("a"), service("b", cluster_ip="10.96.0.21"), endpoint_slice("a-1", "a"),
            endpoint_slice("b-1", "b", addresses=("10.1.0.2",)))
    return w


def listeners(w: World, p: Proxy | None = None) -> dict[str, listener_pb2.Listener]:
    return {n: r.message(listener_pb2.Listener) for n, r in w.lds(p or router()).items()}


def route(w: World, name: str, p: Proxy | None = None) -> route_pb2.RouteConfiguration | None:
    got = w.rds(p or router(), {name})
    return got[name].message(route_pb2.RouteConfiguration) if name in got else None


def vhosts(rc: route_pb2.RouteConfiguration) -> dict[str, list[str]]:
    return {vh.name: list(vh.domains) for vh in rc.virtual_hosts}


# --- selection and binding --------------------------------------------------------------------
def test_selector_matches_labels_in_any_namespace(world: World):
    world.apply(gateway("in-default", [http_server(8081)], namespace="default"),
                gateway("egress", [http_server(8082)], selector={"istio": "egressgateway"}),
                gateway("everyone", [http_server(8083)], selector={}))
    assert set(listeners(world)) == {"0.0.0.0_8081", "0.0.0.0_8083"}
    assert set(listeners(world, router(labels={"istio": "egressgateway"}))) == {"0.0.0.0_8082", "0.0.0.0_8083"}
    assert set(listeners(world, router(labels={}))) == {"0.0.0.0_8083"}
    # Sidecars never get gateway listeners.
    assert not any(n.startswith("0.0.0.0_808") for n in world.lds(router(ptype="sidecar")))


def test_virtual_service_binding_forms_and_server_host_namespaces(world: World):
    world.apply(gateway(servers=[http_server(8080, ["default/*.example.com", "./*.internal"])]))
    world.apply(virtual_service("full", ["a.example.com"], [f"{GW_NS}/gw"]),
                virtual_service("legacy", ["b.example.com"], [f"gw.{GW_NS}.svc.cluster.local"], dest="b"),
                virtual_service("bare-other-ns", ["c.example.com"], ["gw"]),  # = default/gw: no such gateway
                virtual_service("wrong-ns", ["d.example.com"], [f"{GW_NS}/gw"], namespace="other"),
                virtual_service("internal", ["x.internal"], ["gw"], namespace=GW_NS),
                virtual_service("private", ["e.example.com"], [f"{GW_NS}/gw"], exportTo=["."]))
    rc = route(world, "http.8080")
    # istiod's domains: the host alone, any port in Host matching it (ignore_port_in_host_matching).
    assert vhosts(rc) == {"a.example.com:8080": ["a.example.com"], "b.example.com:8080": ["b.example.com"],
                          "x.internal:8080": ["x.internal"]}
    assert rc.ignore_port_in_host_matching
    clusters = {vh.name: vh.routes[0].route.cluster for vh in rc.virtual_hosts}
    assert clusters["b.example.com:8080"] == "outbound|9080||b.default.svc.cluster.local"
    # exportTo "." hides it from a router in istio-system, not from one in default.
    assert "e.example.com:8080" in vhosts(route(world, "http.8080", router(namespace="default")))


def test_wildcards_intersect_to_the_more_specific_host(world: World):
    world.apply(gateway(servers=[http_server(8080, ["*.example.com"])]),
                virtual_service("wild", ["*.shop.example.com", "exact.example.com", "elsewhere.org"]))
    assert set(vhosts(route(world, "http.8080"))) == {"*.shop.example.com:8080", "exact.example.com:8080"}


def test_two_virtual_services_for_one_host_merge_oldest_first(world: World):
    world.apply(gateway(), virtual_service("a-first", ["a.example.com"], dest="a",
                                           http=[{"match": [{"uri": {"prefix": "/x"}}],
                                                  "route": [{"destination": {"host": "a"}}]}]),
                virtual_service("b-second", ["a.example.com"], dest="b"))
    rc = route(world, "http.8080")
    assert len(rc.virtual_hosts) == 1
    assert [r.route.cluster.split("|")[3] for r in rc.virtual_hosts[0].routes] == [
        "a.default.svc.cluster.local", "b.default.svc.cluster.local"]


def test_no_virtual_service_gives_istiods_blackhole_host(world: World):
    world.apply(gateway())
    rc = route(world, "http.8080")
    assert [(vh.name, list(vh.domains), len(vh.routes)) for vh in rc.virtual_hosts] == [("blackhole:8080", ["*"], 0)]


# --- merging servers --------------------------------------------------------------------------
def test_https_servers_share_a_port_by_sni_and_conflicts_are_skipped(world: World):
    world.apply(gateway("old", [https_server(8443, ["a.example.com"], "https-a"),
                                https_server(8443, ["b.example.com", "a.example.com"], "https-b")]),
                gateway("young", [http_server(8443, ["*"], "plain")]))
    ls = listeners(world)
    chains = ls["0.0.0.0_8443"].filter_chains
    # The second server keeps only the SNI name the first did not claim; the HTTP server on a
    # TLS port is left out.
    assert [list(c.filter_chain_match.server_names) for c in chains] == [["a.example.com"], ["b.example.com"]]
    assert [ls["0.0.0.0_8443"].listener_filters[0].name] == ["envoy.filters.listener.tls_inspector"]
    tls = tls_pb2.DownstreamTlsContext()
    chains[0].transport_socket.typed_config.Unpack(tls)
    sds_config = tls.common_tls_context.tls_certificate_sds_secret_configs[0]
    assert sds_config.name == "kubernetes://cert" and sds_config.sds_config.HasField("ads")
    assert not tls.HasField("require_client_certificate")
    assert route(world, "https.8443.https-a.old.istio-system") is not None
    assert route(world, "http.8443") is None


def test_mutual_tls_validates_clients_with_the_cacert_secret(world: World):
    world.apply(gateway(servers=[https_server(mode="MUTUAL")]))
    chain = listeners(world)["0.0.0.0_8443"].filter_chains[0]
    tls = tls_pb2.DownstreamTlsContext()
    chain.transport_socket.typed_config.Unpack(tls)
    assert tls.require_client_certificate.value is True
    combined = tls.common_tls_context.combined_validation_context
    assert combined.validation_context_sds_secret_config.name == "kubernetes://cert-cacert"


def test_unservable_servers_are_skipped_not_fatal(world: World):
    world.apply(gateway(servers=[
        {"port": {"number": 15443, "name": "mesh", "protocol": "TLS"}, "hosts": ["*"], "tls": {"mode": "ISTIO_MUTUAL"}},
        {"port": {"number": 9443, "name": "pass", "protocol": "TLS"}, "hosts": ["*"], "tls": {"mode": "PASSTHROUGH"}},
        http_server(8080)]))
    assert set(listeners(world)) == {"0.0.0.0_8080"}  # passthrough without a tls route: no chain


@pytest.mark.parametrize(("server", "reason"), [
    ({"port": {"number": 8443, "name": "files", "protocol": "HTTPS"}, "hosts": ["*"],
      "tls": {"mode": "SIMPLE", "serverCertificate": "/etc/c.pem", "privateKey": "/etc/k.pem"}},
     "spec.servers[0].tls.serverCertificate: serverCertificate is not supported"),
    ({"port": {"number": 0, "name": "uds", "protocol": "HTTP"}, "hosts": ["*"], "bind": "unix:///var/run/gw.sock"},
     "spec.servers[0]: bind: a unix domain socket bind is not supported"),
])
def test_servers_istiod_serves_and_this_does_not_are_refused(server: dict, reason: str):
    """Certificates from files (istiod: the gateway agent's SDS) and unix socket binds are valid
    for istiod; not generated here, the Gateway is refused naming them, never accepted unserved."""
    with pytest.raises(InvalidObject) as e:
        parse_object(gateway(servers=[server]))
    assert reason in str(e.value)


# --- cache keys -------------------------------------------------------------------------------
def test_every_input_changes_the_output_and_nothing_else_does(world: World):
    world.apply(gateway(servers=[http_server(), https_server()]), virtual_service(hosts=["a.example.com"]),
                secret())
    p = router()

    def gw_listeners():
        return world.lds(p)

    def rds():
        return world.rds(p, {"http.8080"})["http.8080"]

    l0, r0 = gw_listeners(), rds()
    # An unrelated Service: same bytes, and the very same cached objects.
    world.apply(service("unrelated", cluster_ip="10.96.0.99"))
    assert gw_listeners()["0.0.0.0_8080"] is l0["0.0.0.0_8080"] and rds() is r0
    # A route input: the VirtualService.
    world.apply(virtual_service(hosts=["a.example.com"], dest="b"))
    r1 = rds()
    assert r1.version != r0.version
    assert gw_listeners()["0.0.0.0_8443"] is l0["0.0.0.0_8443"]
    # A destination's Service ports decide the cluster of a portless destination.
    world.apply(service("b", cluster_ip="10.96.0.21", ports=[{"name": "http", "port": 7000}]))
    assert rds().version != r1.version
    # A listener input: the Gateway (the SNI of the HTTPS server).
    world.apply(gateway(servers=[http_server(), https_server(hosts=["z.example.com"])]))
    assert gw_listeners()["0.0.0.0_8443"].version != l0["0.0.0.0_8443"].version
    # A Secret rotation changes the secret, never the listener.
    l2 = gw_listeners()
    s0 = world_sds(world, verified_router(), {"kubernetes://cert"})["kubernetes://cert"]
    world.apply(secret(cert=PEM_CERT + PEM_CERT))
    assert world_sds(world, verified_router(), {"kubernetes://cert"})["kubernetes://cert"].version != s0.version
    assert gw_listeners()["0.0.0.0_8443"] is l2["0.0.0.0_8443"]


def test_generation_memo_tells_routers_apart_by_labels(world: World):
    world.apply(gateway("in", [http_server(8080)]),
                gateway("out", [http_server(9090)], selector={"istio": "egressgateway"}))
    memo = GenerationMemo({LISTENER: lds.generate}, world.cache)
    ctx = world.ctx()
    ingress = memo.generate(ctx, LISTENER, router(), None)
    egress = memo.generate(ctx, LISTENER, router(labels={"istio": "egressgateway"}, pod="eg-1"), None)
    assert [r.name for r in ingress.resources] == ["0.0.0.0_8080"]
    assert [r.name for r in egress.resources] == ["0.0.0.0_9090"]
    assert memo.generate(ctx, LISTENER, router(pod="gw-2"), None) is ingress  # same traits, same bytes


# --- SDS --------------------------------------------------------------------------------------
def world_sds(w: World, p: Proxy, names: set[str]) -> dict:
    return {r.name: r for r in sds.generate(w.ctx(), p, frozenset(names), w.cache)}


def test_sds_serves_verified_gateways_in_the_secrets_namespace_only(world: World):
    world.apply(secret(ca=PEM_CERT))
    names = {"kubernetes://cert", "kubernetes://cert-cacert"}
    # A node id anyone can write (plaintext xDS, no proven identity) gets nothing, CA bundle included.
    assert world_sds(world, router(), names) == {}
    assert sds.refusal(router()) is not None and "15012" in sds.refusal(router())
    assert sds.refusal(verified_router()) is None
    got = world_sds(world, verified_router(), names | {"kubernetes://missing"})
    assert set(got) == {"kubernetes://cert", "kubernetes://cert-cacert"}
    s = got["kubernetes://cert"].message(secret_pb2.Secret)
    assert s.tls_certificate.certificate_chain.inline_bytes == PEM_CERT
    assert s.tls_certificate.private_key.inline_bytes == PEM_KEY
    assert got["kubernetes://cert-cacert"].message(secret_pb2.Secret).validation_context.trusted_ca.inline_bytes \
        == PEM_CERT
    # A sidecar of the namespace may be given them too (DestinationRule tls.credentialName), once proven.
    assert set(world_sds(world, verified_router(ptype="sidecar"), {"kubernetes://cert"})) == {"kubernetes://cert"}
    assert world_sds(world, router(ptype="sidecar"), {"kubernetes://cert"}) == {}
    assert world_sds(world, verified_router(namespace="default"),
                     {"kubernetes://cert", f"kubernetes://{GW_NS}/cert"}) == {}
    assert set(world_sds(world, verified_router(), {f"kubernetes://{GW_NS}/cert"})) == {f"kubernetes://{GW_NS}/cert"}


def test_sds_prefers_a_separate_cacert_secret(world: World):
    other_ca = PEM_CERT.replace(b"MAo=", b"MAs=")
    world.apply(secret(ca=PEM_CERT), secret("cert-cacert", raw={"ca.crt": b64(other_ca)}))
    got = world_sds(world, verified_router(), {"kubernetes://cert-cacert"})
    assert got["kubernetes://cert-cacert"].message(secret_pb2.Secret).validation_context.trusted_ca.inline_bytes \
        == other_ca


@pytest.mark.parametrize("data, reason", [
    ({"tls.crt": "not base64!", "tls.key": b64(PEM_KEY)}, "not valid base64"),
    ({"tls.crt": b64(b"hello"), "tls.key": b64(PEM_KEY)}, "no PEM block"),
    ({"tls.crt": b64(PEM_KEY), "tls.key": b64(PEM_KEY)}, "only CERTIFICATE"),
    ({"tls.crt": b64(PEM_CERT), "tls.key": b64(PEM_CERT)}, "one private key"),
    ({"tls.crt": b64(PEM_CERT.replace(b"MAo=", b"M@o=")), "tls.key": b64(PEM_KEY)}, "not valid base64"),
    ({"tls.crt": b64(PEM_CERT)}, "no certificate and key"),
])
def test_bad_secrets_give_no_resource_and_a_reason(world: World, data: dict, reason: str):
    with pytest.raises(credentials.CredentialError, match=reason):
        credentials.certificate_and_key(data)
    world.apply(secret(raw=data))
    assert world_sds(world, verified_router(), {"kubernetes://cert"}) == {}


async def test_secret_changes_push_but_only_to_gateways(world: World):
    """A rotated credential reaches the router that serves it over SDS, and nothing else: the
    sidecar's config read no Secret. A VirtualService the sidecar routes by pushes the sidecar."""
    world.apply(gateway(servers=[https_server()]), secret())
    assert GENERATORS[SECRET] is sds.generate
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))
    server.rebuild()
    gw, sc = Connection(verified_router(), "", False), Connection(router(ptype="sidecar"), "", False)
    for conn in (gw, sc):
        server.register(conn)
    await subscribe(server, gw, {LISTENER: None, SECRET: frozenset({"kubernetes://cert"})})
    await subscribe(server, sc, {LISTENER: None, ROUTE: frozenset({"9080"})})
    assert gw.watched[SECRET].sent, "the router holds the credential"
    ev = world.store.apply(parse_object(secret(cert=PEM_CERT.replace(b"MAo=", b"MAs="))), source="test")
    req = push_request_for([ev], world.mesh.configmap_key)
    assert req is not None and req.full
    server.push(req)
    assert pushed(server, gw) == {SECRET: None}
    assert pushed(server, sc) == {}
    gw.take_push()
    world.apply(virtual_service(hosts=["a.default.svc.cluster.local"], gateways=["mesh"], name="mesh-vs"))
    server.push(push_request_for([world.store.apply(parse_object(virtual_service(
        hosts=["a.default.svc.cluster.local"], gateways=["mesh"], name="mesh-vs", dest="b")), source="test")],
        world.mesh.configmap_key))
    assert pushed(server, sc) == {ROUTE: None}  # HTTP routing is RDS; the listeners did not read it


def test_source_matches_test_the_router_itself(world: World):
    """istiod evaluates sourceLabels/sourceNamespace against the gateway proxy: a match for other
    routers (or another namespace) is left out, not applied on every router."""
    world.apply(gateway(selector={}), virtual_service("a", ["a.example.com"], http=[
        {"match": [{"sourceLabels": {"tier": "edge"}}], "route": [{"destination": {"host": "b"}}]},
        {"match": [{"sourceNamespace": "elsewhere"}], "route": [{"destination": {"host": "b"}}]},
        {"route": [{"destination": {"host": "a"}}]}]))
    def clusters(p: Proxy) -> list[str]:
        rc = route(world, "http.8080", p)
        return [r.route.cluster.split("|")[3].split(".")[0] for r in rc.virtual_hosts[0].routes]
    assert clusters(router(labels={"istio": "ingressgateway", "tier": "edge"})) == ["b", "a"]
    assert clusters(router(labels={"istio": "ingressgateway"}, pod="gw-2")) == ["a"]


def test_mutual_tls_pins_client_certificates(world: World):
    spki = "NvqYIYSbgK2vCJpQhObf77vv+bQWtc5ek5RIOwPiC9A="
    digest = "df6ff72fe9116521268f6f2dd4966f51df479883fe7037b39f75916ac3049d1a"
    server = https_server(mode="MUTUAL")
    server["tls"].update(verifyCertificateSpki=[spki], verifyCertificateHash=[digest])
    world.apply(gateway(servers=[server]))
    tls = tls_pb2.DownstreamTlsContext()
    listeners(world)["0.0.0.0_8443"].filter_chains[0].transport_socket.typed_config.Unpack(tls)
    default = tls.common_tls_context.combined_validation_context.default_validation_context
    assert list(default.verify_certificate_spki) == [spki]
    assert list(default.verify_certificate_hash) == [digest]
    # Without a client certificate to check, a pin would be ignored: refused instead.
    simple = https_server()
    simple["tls"]["verifyCertificateSpki"] = [spki]
    with pytest.raises(Exception, match="verifyCertificateSpki"):
        parse_object(gateway(name="simple", servers=[simple]))


def test_gateway_traffic_fields_pass_envoy_validate(world: World, tmp_path):
    """The gateway shapes of the fields generated beyond the basics: client-certificate pins,
    a redirect keeping the request port, router source matches, cookie attributes."""
    from tests.support.envoy import envoy_validate
    from tests.support.static_config import static_bootstrap

    pem_cert, pem_key = _self_signed("a.example.com")  # Envoy parses them while validating
    server = https_server(mode="MUTUAL")
    server["tls"].pop("credentialName")
    server["tls"].update(verifyCertificateSpki=["NvqYIYSbgK2vCJpQhObf77vv+bQWtc5ek5RIOwPiC9A="],
                         credentialNames=["cert", "second"])
    world.apply(secret(cert=pem_cert, key=pem_key, ca=pem_cert), secret("second", cert=pem_cert, key=pem_key),
                gateway(servers=[http_server(), server]),
                virtual_service(hosts=["a.example.com"], http=[
                    {"match": [{"uri": {"prefix": "/old"}}], "redirect": {"derivePort": "FROM_REQUEST_PORT",
                                                                          "scheme": "https"}},
                    {"match": [{"sourceLabels": {"istio": "ingressgateway"}}],
                     "route": [{"destination": {"host": "b"}}]},
                    {"route": [{"destination": {"host": "a"}}]}]),
                {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                 "metadata": {"name": "a", "namespace": "default"},
                 "spec": {"host": "a", "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpCookie": {
                     "name": "u", "ttl": "5s", "attributes": [{"name": "SameSite", "value": "Lax"}]}}}}}})
    config = static_bootstrap(world.ctx(), verified_router())
    assert {ld["name"] for ld in config["static_resources"]["listeners"]} == {"0.0.0.0_8080", "0.0.0.0_8443"}
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated gateway config:\n{output}"


def _self_signed(host: str) -> tuple[bytes, bytes]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def test_credential_names_give_one_certificate_each_and_the_first_ones_ca(world: World):
    """credentialNames (an RSA and an ECDSA certificate, say): each is a certificate of the
    listener, fetched like credentialName; MUTUAL checks clients with the first one's CA."""
    server = https_server(mode="MUTUAL")
    server["tls"].pop("credentialName")
    server["tls"]["credentialNames"] = ["rsa", "ecdsa"]
    world.apply(secret("rsa", ca=PEM_CERT), secret("ecdsa"), gateway(servers=[server]))
    tls = tls_pb2.DownstreamTlsContext()
    listeners(world)["0.0.0.0_8443"].filter_chains[0].transport_socket.typed_config.Unpack(tls)
    common = tls.common_tls_context
    names = ["kubernetes://rsa", "kubernetes://ecdsa"]
    assert [c.name for c in common.tls_certificate_sds_secret_configs] == names
    ca = common.combined_validation_context.validation_context_sds_secret_config.name
    assert ca == "kubernetes://rsa-cacert"
    assert set(world_sds(world, verified_router(), {*names, ca})) == {*names, ca}


@pytest.mark.parametrize("tls, reason", [
    ({"mode": "SIMPLE", "credentialName": "a", "credentialNames": ["b"]}, "only one of credentialName"),
    ({"mode": "SIMPLE", "credentialNames": ["a", "b", "c"]}, "credentialNames"),
    ({"mode": "ISTIO_MUTUAL", "credentialNames": ["a"]}, "cannot have associated credentialNames"),
    ({"mode": "MUTUAL", "credentialNames": ["a"], "caCertCredentialName": "ca"},
     "caCertCredentialName is not supported"),
])
def test_credential_names_rules(tls: dict, reason: str):
    server = {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
              "tls": tls}
    with pytest.raises(Exception, match=reason):
        parse_object(gateway(servers=[server]))


# --- authorization on gateway listeners -------------------------------------------------------
def _hcm(listener: listener_pb2.Listener):
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    return hcm


def test_policies_selecting_the_router_reach_its_listeners_and_others_do_not(world: World):
    world.apply(gateway(servers=[http_server(8080), {"port": {"number": 9000, "name": "tcp", "protocol": "TCP"},
                                                     "hosts": ["*"]}]),
                virtual_service(tcp=[{"route": [{"destination": {"host": "a", "port": {"number": 9080}}}]}]))
    before = listeners(world)
    assert _hcm(before["0.0.0.0_8080"]).http_filters[0].name == "envoy.filters.http.fault"
    assert _hcm(before["0.0.0.0_8080"]).xff_num_trusted_hops == 0
    # A policy for other workloads changes nothing (same bytes).
    policy = {"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
              "metadata": {"name": "deny", "namespace": GW_NS},
              "spec": {"selector": {"matchLabels": {"istio": "egressgateway"}}, "action": "DENY", "rules": [{}]}}
    world.apply(policy)
    assert listeners(world) == before
    policy["spec"]["selector"] = {"matchLabels": {"istio": "ingressgateway"}}
    world.apply(policy)
    after = listeners(world)
    assert _hcm(after["0.0.0.0_8080"]).http_filters[0].name == "envoy.filters.http.rbac"
    assert [f.name for f in after["0.0.0.0_9000"].filter_chains[0].filters] == [
        "envoy.filters.network.rbac", "envoy.filters.network.tcp_proxy"]


def test_num_trusted_proxies_from_the_proxy_config_then_the_mesh_default(world: World):
    world.apply(gateway())
    p = router()
    p.metadata["PROXY_CONFIG"] = {"gatewayTopology": {"numTrustedProxies": 2}}
    assert _hcm(listeners(world, p)["0.0.0.0_8080"]).xff_num_trusted_hops == 2
    world.apply(mesh_configmap({"defaultConfig": {"gatewayTopology": {"numTrustedProxies": 1}}}))
    assert _hcm(listeners(world)["0.0.0.0_8080"]).xff_num_trusted_hops == 1
    assert _hcm(listeners(world, p)["0.0.0.0_8080"]).xff_num_trusted_hops == 2  # its own ProxyConfig wins
