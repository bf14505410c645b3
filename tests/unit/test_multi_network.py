"""Split-horizon EDS (one cluster, several networks), as istiod's EndpointsByNetworkFilter: what a
client on each network is sent, where the gateways come from, and which bytes are shared."""

from __future__ import annotations

import pytest
import yaml
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from pilot.config.validation import parse_object
from pilot.features import Features
from pilot.model.events import push_request_for
from pilot.model.proxy import Proxy
from pilot.xds import typeurls as T
from pilot.xds.connection import Connection
from pilot.xds.discovery import DiscoveryServer
from tests.support.scoping import pushed, subscribe

from .helpers import SYSTEM_NS, World, endpoint_slice, proxy, service

REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"
SNI_DNAT = "outbound_.9080_._.reviews.default.svc.cluster.local"
GW_A, GW_B = "192.0.2.10", "192.0.2.11"


def reviews_pod(name: str, ip: str, network: str | None, mtls: bool = True) -> dict:
    labels = {"app": "reviews"}
    if mtls:
        labels["security.istio.io/tlsMode"] = "istio"
    if network:
        labels["topology.istio.io/network"] = network
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"serviceAccountName": "reviews"}, "status": {"podIP": ip, "phase": "Running"}}


def reviews_slice(*pods: tuple[str, str]) -> dict:
    doc = endpoint_slice("reviews-1", "reviews", addresses=(), port=9080)
    doc["endpoints"] = [{"addresses": [ip], "conditions": {"ready": True},
                         "targetRef": {"kind": "Pod", "name": name, "namespace": "default"}} for name, ip in pods]
    return doc


def workload_entry(name: str, address: str, network: str = "", mtls: bool = True, **spec) -> dict:
    labels = {"app": "reviews", **({"security.istio.io/tlsMode": "istio"} if mtls else {})}
    body = {"labels": labels, "serviceAccount": "reviews", **spec}
    if address:
        body["address"] = address
    if network:
        body["network"] = network
    return {"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
            "metadata": {"name": name, "namespace": "default"}, "spec": body}


def mesh_networks(networks: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": SYSTEM_NS},
            "data": {"mesh": "", "meshNetworks": yaml.safe_dump({"networks": networks})}}


def gateways(**by_network: list[str]) -> dict:
    return mesh_networks({net: {"endpoints": [{"fromRegistry": "Kubernetes"}] if net == "net-a" else [],
                                "gateways": [{"address": a, "port": 15443} for a in addrs]}
                          for net, addrs in by_network.items()})


def client(network: str | None, namespace: str = "default", name: str = "client-1") -> Proxy:
    p = proxy(namespace, pod_name=name)
    p.identity = f"spiffe://cluster.local/ns/{namespace}/sa/client"  # has certificates: sends mesh mTLS
    if network:
        p.metadata["NETWORK"] = network
    return p


def endpoints(world: World, p: Proxy, name: str = REVIEWS) -> list[tuple[str, int, int, str]]:
    """(address, port, weight, tlsMode) of every endpoint sent, in order."""
    cla = world.eds(p, {name})[name].message(endpoint_pb2.ClusterLoadAssignment)
    out = []
    for g in cla.endpoints:
        assert g.load_balancing_weight.value == sum(e.load_balancing_weight.value for e in g.lb_endpoints)
        for e in g.lb_endpoints:
            meta = e.metadata.filter_metadata["envoy.transport_socket_match"].fields
            out.append((e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value,
                        e.load_balancing_weight.value, meta["tlsMode"].string_value if "tlsMode" in meta else ""))
    return out


@pytest.fixture
def world() -> World:
    """reviews: a Pod on net-a and a WorkloadEntry (selected by the Service) on net-b."""
    w = World()
    w.apply(modified_service(), reviews_pod("reviews-a", "10.1.0.1", "net-a"), reviews_slice(("reviews-a", "10.1.0.1")),
            workload_entry("reviews-b", "10.2.0.1", "net-b"))
    return w


def modified_service() -> dict:
    svc = service("reviews")
    svc["spec"]["selector"] = {"app": "reviews"}
    return svc


def test_without_gateways_every_endpoint_is_direct_and_bytes_are_shared(world: World) -> None:
    a, b, none = client("net-a"), client("net-b", name="client-2"), client(None, name="client-3")
    ctx = world.ctx()
    sent = [world.eds(p, {REVIEWS}, ctx)[REVIEWS] for p in (a, b, none)]
    assert endpoints(world, a) == [("10.1.0.1", 9080, 1, "istio"), ("10.2.0.1", 9080, 1, "istio")]
    assert sent[0] is sent[1] is sent[2], "no gateway: the client's network is not an input"


def test_a_remote_network_is_reached_through_its_gateway(world: World) -> None:
    world.apply(gateways(**{"net-b": [GW_B]}))
    # net-a: its own Pod directly, the net-b entry replaced by net-b's gateway (mTLS metadata).
    assert endpoints(world, client("net-a")) == [("10.1.0.1", 9080, 1, "istio"), (GW_B, 15443, 1, "istio")]
    # net-b: its own entry; net-a has no gateway, so its Pod is sent as it is (istiod's sidecar rule).
    assert endpoints(world, client("net-b")) == [("10.1.0.1", 9080, 1, "istio"), ("10.2.0.1", 9080, 1, "istio")]
    # No network: an endpoint whose network has a gateway goes through it (istiod's forceGateway).
    assert endpoints(world, client(None)) == [("10.1.0.1", 9080, 1, "istio"), (GW_B, 15443, 1, "istio")]


def test_the_client_network_is_a_cache_input_only_with_gateways(world: World) -> None:
    world.apply(gateways(**{"net-b": [GW_B]}))
    ctx = world.ctx()
    a1 = world.eds(client("net-a"), {REVIEWS}, ctx)[REVIEWS]
    a2 = world.eds(client("net-a", namespace="other", name="c-9"), {REVIEWS}, ctx)[REVIEWS]
    b = world.eds(client("net-b"), {REVIEWS}, ctx)[REVIEWS]
    assert a1 is a2, "clients of one network share bytes"
    assert a1.any_bytes != b.any_bytes


def test_weights_add_up_per_gateway_and_split_evenly_over_several(world: World) -> None:
    world.apply(workload_entry("reviews-b2", "10.2.0.2", "net-b"), workload_entry("reviews-b3", "10.2.0.3", "net-b",
                                                                                   weight=3))
    world.apply(gateways(**{"net-b": [GW_A, GW_B]}))
    # lcm of gateways per network (2) scales every weight: net-a's Pod 2; net-b's 2+2+6 over two gateways.
    assert endpoints(world, client("net-a")) == [("10.1.0.1", 9080, 2, "istio"), (GW_A, 15443, 5, "istio"),
                                                  (GW_B, 15443, 5, "istio")]


def test_only_mtls_endpoints_cross_a_gateway(world: World) -> None:
    world.apply(workload_entry("reviews-b", "10.2.0.1", "net-b", mtls=False), gateways(**{"net-b": [GW_B]}))
    assert endpoints(world, client("net-a")) == [("10.1.0.1", 9080, 1, "istio")]
    # A DestinationRule that sends ISTIO_MUTUAL makes it mTLS whatever its label says ...
    dr = {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
          "metadata": {"name": "reviews", "namespace": "default"},
          "spec": {"host": "reviews.default.svc.cluster.local", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}}}
    world.apply(dr)
    assert endpoints(world, client("net-a")) == [("10.1.0.1", 9080, 1, "istio"), (GW_B, 15443, 1, "istio")]
    # ... and one that sends plain TLS (or nothing) keeps every endpoint off the gateway.
    dr["spec"]["trafficPolicy"]["tls"] = {"mode": "DISABLE"}
    world.apply(dr, workload_entry("reviews-b", "10.2.0.1", "net-b"))
    assert endpoints(world, client("net-a")) == [("10.1.0.1", 9080, 1, "istio")]


def test_an_entry_known_only_by_its_network_needs_a_gateway(world: World) -> None:
    world.apply(workload_entry("reviews-b", "", "net-b"), workload_entry("reviews-c", "", "net-c"))
    assert endpoints(world, client("net-a")) == [("10.1.0.1", 9080, 1, "istio")]  # no gateways: dropped
    world.apply(gateways(**{"net-b": [GW_B], "net-c": []}))
    # net-b's through its gateway; net-c has none, and without an address nothing reaches it.
    assert endpoints(world, client("net-a")) == [("10.1.0.1", 9080, 1, "istio"), (GW_B, 15443, 1, "istio")]
    assert endpoints(world, client("net-c")) == [("10.1.0.1", 9080, 1, "istio"), (GW_B, 15443, 1, "istio")]


def test_gateways_of_labelled_services(world: World) -> None:
    gw = {"apiVersion": "v1", "kind": "Service",
          "metadata": {"name": "eastwest", "namespace": SYSTEM_NS, "labels": {"topology.istio.io/network": "net-b"}},
          "spec": {"type": "LoadBalancer", "ports": [{"name": "tls", "port": 15443}], "externalIPs": [GW_A]},
          "status": {"loadBalancer": {"ingress": [{"ip": GW_B}, {"hostname": "lb.example.com"}]}}}
    world.apply(gw)
    assert endpoints(world, client("net-a"))[1:] == [(GW_A, 15443, 1, "istio"), (GW_B, 15443, 1, "istio")]
    # networking.istio.io/gatewayPort names another port: the Service must have it to be a gateway.
    gw["metadata"]["labels"]["networking.istio.io/gatewayPort"] = "16443"
    world.apply(gw)
    assert endpoints(world, client("net-a"))[1:] == [("10.2.0.1", 9080, 1, "istio")]
    gw["spec"]["ports"].append({"name": "tls-alt", "port": 16443})
    world.apply(gw)
    assert endpoints(world, client("net-a"))[1:] == [(GW_A, 16443, 1, "istio"), (GW_B, 16443, 1, "istio")]


def test_registry_service_name_gateways_and_default_networks(world: World) -> None:
    gw = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "eastwest", "namespace": SYSTEM_NS},
          "spec": {"type": "LoadBalancer", "ports": [{"name": "tls", "port": 15443}]},
          "status": {"loadBalancer": {"ingress": [{"ip": GW_B}]}}}
    # The WorkloadEntry says no network; fromCidr puts 10.2.0.0/16 on net-b, whose gateway is the
    # Service above (registryServiceName: only for a network whose endpoints come fromRegistry here).
    world.apply(gw, workload_entry("reviews-b", "10.2.0.1", ""), mesh_networks({
        "net-b": {"endpoints": [{"fromCidr": "10.2.0.0/16"}, {"fromRegistry": "Kubernetes"}],
                  "gateways": [{"registryServiceName": f"eastwest.{SYSTEM_NS}.svc.cluster.local", "port": 15443}]}}))
    # fromRegistry names this cluster: every endpoint without a network of its own is on net-b.
    assert endpoints(world, client("net-a")) == [("10.1.0.1", 9080, 1, "istio"), (GW_B, 15443, 1, "istio")]
    assert endpoints(world, client("net-b")) == [("10.1.0.1", 9080, 1, "istio"), ("10.2.0.1", 9080, 1, "istio")]
    # The system namespace's label comes before MeshNetworks.
    world.apply({"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": SYSTEM_NS, "labels": {"topology.istio.io/network": "net-a"}}})
    assert endpoints(world, client("net-a")) == [("10.1.0.1", 9080, 1, "istio"), ("10.2.0.1", 9080, 1, "istio")]


def test_bad_mesh_networks_are_refused_and_the_last_good_stays(world: World) -> None:
    world.apply(gateways(**{"net-b": [GW_B]}))
    world.ctx()
    for bad, reason in (({"net-b": {"endpoints": [{"fromCidr": "10.2.0.0/33"}]}}, "not a CIDR"),
                        ({"net-b": {"gateways": [{"address": GW_B, "port": 15443, "locality": "r1"}]}},
                         "locality is not supported"),
                        ({"net-b": {"gateways": [{"address": GW_B}]}}, "port"),
                        ({"net-b": {"endpoints": [{"fromCidr": "10.0.0.0/8", "fromRegistry": "Kubernetes"}]}},
                         "exactly one of fromCidr or fromRegistry")):
        world.apply(mesh_networks(bad))
        world.ctx()
        rejections = [r for r in world.store.rejections() if r.kind == "ConfigMap"]
        assert rejections and reason in rejections[0].reason, (bad, rejections)
        assert endpoints(world, client("net-a"))[1:] == [(GW_B, 15443, 1, "istio")]


def test_router_sni_dnat_clusters_forward_mtls_untouched_to_mtls_endpoints_only(world: World) -> None:
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
                 "metadata": {"name": "eastwest", "namespace": SYSTEM_NS},
                 "spec": {"selector": {"istio": "eastwestgateway"},
                          "servers": [{"port": {"number": 15443, "name": "tls", "protocol": "TLS"},
                                       "hosts": ["*.local"], "tls": {"mode": "AUTO_PASSTHROUGH"}}]}},
                workload_entry("reviews-plain", "10.2.0.9", "net-b", mtls=False))
    router = proxy(SYSTEM_NS, pod_name="eastwest-1", ptype="router")
    router.metadata.update({"NETWORK": "net-b", "LABELS": {"istio": "eastwestgateway"}})
    router.identity = f"spiffe://cluster.local/ns/{SYSTEM_NS}/sa/eastwest"
    c = world.cds(router)[SNI_DNAT].message(cluster_pb2.Cluster)
    assert c.type == cluster_pb2.Cluster.EDS and c.eds_cluster_config.service_name == SNI_DNAT
    assert not c.HasField("transport_socket") and not c.transport_socket_matches
    chain = next(ch for lis in world.lds(router).values()
                 for ch in lis.message(listener_pb2.Listener).filter_chains if SNI_DNAT in ch.filter_chain_match.server_names)
    tcp = tcp_proxy_pb2.TcpProxy()
    assert chain.filters[-1].typed_config.Unpack(tcp) and tcp.cluster == SNI_DNAT
    # The AUTO_PASSTHROUGH server cannot tell mTLS from other TLS: the plaintext entry is not offered.
    assert [e[0] for e in endpoints(world, router, SNI_DNAT)] == ["10.1.0.1", "10.2.0.1"]


async def test_a_gateway_change_pushes_the_clients_eds() -> None:
    world = World()
    gw = {"apiVersion": "v1", "kind": "Service",
          "metadata": {"name": "eastwest", "namespace": SYSTEM_NS, "labels": {"topology.istio.io/network": "net-b"}},
          "spec": {"type": "LoadBalancer", "ports": [{"name": "tls", "port": 15443}]},
          "status": {"loadBalancer": {"ingress": [{"ip": GW_B}]}}}
    world.apply(modified_service(), reviews_pod("reviews-a", "10.1.0.1", "net-a"),
                reviews_slice(("reviews-a", "10.1.0.1")), workload_entry("reviews-b", "10.2.0.1", "net-b"), gw)
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))
    server.rebuild()
    conn = Connection(client("net-a"), "test", False)
    server.register(conn)
    await subscribe(server, conn, {T.CLUSTER: None, T.ENDPOINT: frozenset({REVIEWS}), T.LISTENER: None})
    gw["status"]["loadBalancer"]["ingress"] = [{"ip": GW_A}]
    ev = world.store.apply(parse_object(gw), source="test")
    req = push_request_for([ev], world.mesh.configmap_key, server.reads_status_of)
    assert req is not None, "a gateway's status-only update is a change"
    server.push(req)
    assert T.ENDPOINT in pushed(server, conn), "the gateway moved: the client's EDS must follow"


def test_only_a_gateways_status_update_is_a_push(world: World) -> None:
    """A load balancer address changes generated config only for a network gateway: other
    Services' status-only updates are kept by the Store but push nothing (istiod's
    serviceUpdateNeedsPush); a gateway's, labelled or named by meshNetworks, is a full push."""
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))

    def status_update(name: str, labels: dict, ip: str) -> list:
        svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": SYSTEM_NS, "labels": labels},
               "spec": {"type": "LoadBalancer", "ports": [{"name": "tls", "port": 15443}]},
               "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}
        ev = world.store.apply(parse_object(svc), source="test")
        assert ev is not None, "the Store keeps a status-only update"
        return [ev]

    def request(name: str, labels: dict):
        status_update(name, labels, GW_A)
        return push_request_for(status_update(name, labels, GW_B), world.mesh.configmap_key, server.reads_status_of)

    assert request("web-lb", {"app": "web"}) is None
    labelled = request("eastwest", {"topology.istio.io/network": "net-b"})
    assert labelled is not None and labelled.full
    world.apply(mesh_networks({"net-b": {"endpoints": [{"fromRegistry": "Kubernetes"}], "gateways": [
        {"registryServiceName": f"named.{SYSTEM_NS}.svc.cluster.local", "port": 15443}]}}))
    world.mesh.refresh(world.store)
    named = request("named", {})
    assert named is not None and named.full
    # A spec change of any Service is still a push.
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-lb", "namespace": SYSTEM_NS},
           "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80}]}}
    ev = world.store.apply(parse_object(svc), source="test")
    assert ev is not None
    assert push_request_for([ev], world.mesh.configmap_key, server.reads_status_of) is not None


def test_a_client_without_a_mesh_identity_cannot_cross(world: World) -> None:
    """A proxy on plaintext 15010 has no certificates: its clusters send no mTLS, so nothing it
    sends could be routed by a gateway."""
    world.apply(gateways(**{"net-b": [GW_B]}))
    plain = proxy(pod_name="plain-1")
    plain.metadata["NETWORK"] = "net-a"
    assert endpoints(world, plain) == [("10.1.0.1", 9080, 1, "istio")]


def test_dns_service_entry_endpoints_are_split_in_cds(world: World) -> None:
    """istiod filters a DNS cluster's own endpoints by network too: the CDS load assignment."""
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
                 "metadata": {"name": "db", "namespace": "default"},
                 "spec": {"hosts": ["db.example.internal"], "location": "MESH_INTERNAL", "resolution": "DNS",
                          "ports": [{"number": 5432, "name": "tcp", "protocol": "TCP"}],
                          "endpoints": [{"address": "db-a.example.internal"},
                                        {"address": "db-b.example.internal", "network": "net-b"}]}},
                {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                 "metadata": {"name": "db", "namespace": "default"},
                 "spec": {"host": "db.example.internal", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}}})
    name = "outbound|5432||db.example.internal"

    def hosts(p: Proxy) -> list[tuple[str, int]]:
        c = world.cds(p)[name].message(cluster_pb2.Cluster)
        return [(e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
                for g in c.load_assignment.endpoints for e in g.lb_endpoints]

    assert hosts(client("net-a")) == [("db-a.example.internal", 5432), ("db-b.example.internal", 5432)]
    world.apply(gateways(**{"net-b": [GW_B]}))
    assert hosts(client("net-a")) == [("db-a.example.internal", 5432), (GW_B, 15443)]
    assert hosts(client("net-b")) == [("db-a.example.internal", 5432), ("db-b.example.internal", 5432)]


async def test_the_system_namespace_network_reaches_the_clients_eds() -> None:
    """Only the networks index changes (the system namespace's label gives unlabelled endpoints a
    network that has a gateway): the push still reaches the client's EDS."""
    world = World()
    world.apply(modified_service(), reviews_pod("reviews-a", "10.1.0.1", None), reviews_slice(("reviews-a", "10.1.0.1")),
                mesh_networks({"net-a": {"gateways": [{"address": GW_A, "port": 15443}]}}))
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))
    server.rebuild()
    conn = Connection(client("net-b"), "test", False)
    server.register(conn)
    await subscribe(server, conn, {T.CLUSTER: None, T.ENDPOINT: frozenset({REVIEWS}), T.LISTENER: None})
    assert endpoints(world, client("net-b")) == [("10.1.0.1", 9080, 1, "istio")]
    ev = world.store.apply(parse_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": SYSTEM_NS, "labels": {"topology.istio.io/network": "net-a"}}}), source="test")
    server.push(push_request_for([ev], world.mesh.configmap_key))
    assert T.ENDPOINT in pushed(server, conn)
    assert endpoints(world, client("net-b")) == [(GW_A, 15443, 1, "istio")]
