"""The resource cache: serialised Any bytes per resource, keyed by every input the resource depends on.

Each test changes exactly one input through the Store (or the proxy), builds a new PushContext as a
push would, and checks that the generated resource changed in the way a user would see in a config
dump. Unrelated changes must leave bytes identical and be served from the cache without a rebuild.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from pilot.model.store import ConfigKey
from pilot.xds.cache import CachedResource
from pilot.xds.typeurls import CLUSTER, ENDPOINT, LISTENER, ROUTE

from .helpers import World, endpoint_slice, mesh_configmap, modified, pod, proxy, service

REVIEWS = "reviews.default.svc.cluster.local"
RATINGS = "ratings.default.svc.cluster.local"
DATABASE = "database.default.svc.cluster.local"
REVIEWS_CLUSTER = f"outbound|9080||{REVIEWS}"
RATINGS_CLUSTER = f"outbound|9080||{RATINGS}"
DATABASE_CLUSTER = f"outbound|9300||{DATABASE}"

REVIEWS_SVC = service("reviews", cluster_ip="10.96.0.20")
RATINGS_SVC = service("ratings", cluster_ip="10.96.0.21")
DATABASE_SVC = service("database", cluster_ip="10.96.0.30",
                       ports=[{"name": "tcp-db", "port": 9300, "targetPort": 9300}])
REVIEWS_EPS = endpoint_slice("reviews-1", "reviews", addresses=("10.1.0.1",), port=19081)
RATINGS_EPS = endpoint_slice("ratings-1", "ratings", addresses=("10.1.0.2",), port=19082)
DATABASE_EPS = endpoint_slice("database-1", "database", addresses=("10.1.0.3",), port=19083, port_name="tcp-db")


@pytest.fixture
def world() -> World:
    w = World()
    w.apply(REVIEWS_SVC, RATINGS_SVC, DATABASE_SVC, REVIEWS_EPS, RATINGS_EPS, DATABASE_EPS)
    return w


def changed(get: Callable[[], CachedResource], mutate: Callable[[], None]) -> tuple[CachedResource, CachedResource]:
    """The resource before and after `mutate`; fails unless its bytes and version changed."""
    before = get()
    again = get()
    assert again.any_bytes == before.any_bytes, "output is not stable without a change"
    mutate()
    after = get()
    assert after.any_bytes != before.any_bytes, "the input changed but the resource did not"
    assert after.version != before.version
    return before, after


def cluster(r: CachedResource) -> cluster_pb2.Cluster:
    return r.message(cluster_pb2.Cluster)


def cla(r: CachedResource) -> endpoint_pb2.ClusterLoadAssignment:
    return r.message(endpoint_pb2.ClusterLoadAssignment)


def listener(r: CachedResource) -> listener_pb2.Listener:
    return r.message(listener_pb2.Listener)


def route(r: CachedResource) -> route_pb2.RouteConfiguration:
    return r.message(route_pb2.RouteConfiguration)


def hcm_of(lis: listener_pb2.Listener) -> hcm_pb2.HttpConnectionManager:
    m = hcm_pb2.HttpConnectionManager()
    assert lis.filter_chains[0].filters[0].typed_config.Unpack(m)
    return m


def tcp_proxy_of(chain) -> tcp_proxy_pb2.TcpProxy:
    m = tcp_proxy_pb2.TcpProxy()
    assert chain.filters[0].typed_config.Unpack(m)
    return m


def endpoints_of(r: CachedResource) -> list[tuple[str, str, int]]:
    return [(g.locality.zone, e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
            for g in cla(r).endpoints for e in g.lb_endpoints]


def vhost(rc: route_pb2.RouteConfiguration, name: str):
    for vh in rc.virtual_hosts:
        if vh.name == name:
            return vh
    return None


# --- CDS --------------------------------------------------------------------------------------

def test_cds_mesh_connect_timeout(world: World) -> None:
    p = proxy()
    before, after = changed(lambda: world.cds(p)[REVIEWS_CLUSTER],
                            lambda: world.apply(mesh_configmap({"connectTimeout": "3s"})))
    assert cluster(before).connect_timeout.seconds == 10
    assert cluster(after).connect_timeout.seconds == 3
    # The catch-all clusters use the same timeout.
    assert cluster(world.cds(p)["PassthroughCluster"]).connect_timeout.seconds == 3


@pytest.mark.parametrize("port_change", [{"appProtocol": "grpc"}, {"name": "grpc-api"}, {"appProtocol": "kubernetes.io/h2c"}],
                         ids=["appProtocol", "port-name", "appProtocol-h2c"])
def test_cds_protocol_from_app_protocol_or_port_name(world: World, port_change: dict) -> None:
    p = proxy()
    new_port = {**REVIEWS_SVC["spec"]["ports"][0], **port_change}
    before, after = changed(lambda: world.cds(p)[REVIEWS_CLUSTER],
                            lambda: world.apply(modified(REVIEWS_SVC, **{"spec.ports": [new_port]})))
    key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    assert key not in cluster(before).typed_extension_protocol_options
    assert key in cluster(after).typed_extension_protocol_options  # HTTP/2 upstream for gRPC / h2c


def test_cds_service_port_number(world: World) -> None:
    p = proxy()
    before = world.cds(p)
    world.apply(modified(REVIEWS_SVC, **{"spec.ports.0.port": 9081}))
    after = world.cds(p)
    assert REVIEWS_CLUSTER in before and REVIEWS_CLUSTER not in after
    new = after[f"outbound|9081||{REVIEWS}"]
    assert cluster(new).eds_cluster_config.service_name == f"outbound|9081||{REVIEWS}"


def test_cds_grpc_gets_its_own_named_clusters(world: World) -> None:
    """istiod's grpcgen: only the clusters grpc names, plain EDS ones (no catch-alls, none of
    Envoy's connection settings, round robin where Envoy gets istiod's least request), cached
    apart from Envoy's under the same name; two gRPC clients share one."""
    ctx = world.ctx()
    envoy_out = world.cds(proxy(), ctx)
    names = {REVIEWS_CLUSTER, "BlackHoleCluster", "PassthroughCluster"}
    grpc_out = world.cds(proxy(generator="grpc", interception=None), ctx, names)
    assert {"BlackHoleCluster", "PassthroughCluster"} <= set(envoy_out)
    assert set(grpc_out) == {REVIEWS_CLUSTER}
    assert grpc_out[REVIEWS_CLUSTER].any_bytes != envoy_out[REVIEWS_CLUSTER].any_bytes
    c = cluster(grpc_out[REVIEWS_CLUSTER])
    assert (c.type, c.lb_policy, c.eds_cluster_config.service_name) == (
        cluster_pb2.Cluster.EDS, cluster_pb2.Cluster.ROUND_ROBIN, REVIEWS_CLUSTER)
    assert not c.HasField("connect_timeout") and not c.HasField("transport_socket")
    other = world.cds(proxy(pod_name="grpc-2", generator="grpc", interception=None), ctx, names)
    assert other[REVIEWS_CLUSTER] is grpc_out[REVIEWS_CLUSTER]


# --- EDS --------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, expect", [
    ({"endpoints.0.addresses": ["10.1.0.99"]}, [("zone-a", "10.1.0.99", 19081)]),
    ({"ports.0.port": 19999}, [("zone-a", "10.1.0.1", 19999)]),
    ({"endpoints.0.conditions": {"ready": False}}, []),
    ({"endpoints.0.zone": "zone-b"}, [("zone-b", "10.1.0.1", 19081)]),
], ids=["address", "port", "ready", "zone"])
def test_eds_endpoint_slice_inputs(world: World, change: dict, expect: list) -> None:
    p = proxy()
    before, after = changed(lambda: world.eds(p, {REVIEWS_CLUSTER})[REVIEWS_CLUSTER],
                            lambda: world.apply(modified(REVIEWS_EPS, **change)))
    assert endpoints_of(before) == [("zone-a", "10.1.0.1", 19081)]
    assert endpoints_of(after) == expect


def test_eds_endpoint_change_through_endpoint_only_context(world: World) -> None:
    """The EDS push path derives the context with `with_endpoints` instead of a full rebuild."""
    p = proxy()
    ctx = world.ctx()
    before = world.eds(p, {REVIEWS_CLUSTER}, ctx)[REVIEWS_CLUSTER]
    world.apply(modified(REVIEWS_EPS, **{"endpoints.0.addresses": ["10.1.0.50"]}))
    after = world.eds(p, {REVIEWS_CLUSTER}, ctx.with_endpoints(world.store, "v-eds"))[REVIEWS_CLUSTER]
    assert after.version != before.version
    assert endpoints_of(after) == [("zone-a", "10.1.0.50", 19081)]


def test_eds_target_port_used_when_slice_has_no_ports(world: World) -> None:
    p = proxy()
    world.apply(modified(REVIEWS_EPS, ports=None))
    before, after = changed(lambda: world.eds(p, {REVIEWS_CLUSTER})[REVIEWS_CLUSTER],
                            lambda: world.apply(modified(REVIEWS_SVC, **{"spec.ports.0.targetPort": 9090})))
    assert endpoints_of(before) == [("zone-a", "10.1.0.1", 9080)]
    assert endpoints_of(after) == [("zone-a", "10.1.0.1", 9090)]


def test_eds_slice_added_and_removed(world: World) -> None:
    p = proxy()
    extra = endpoint_slice("reviews-2", "reviews", addresses=("10.1.0.7",), port=19081, zone="zone-b")
    before, after = changed(lambda: world.eds(p, {REVIEWS_CLUSTER})[REVIEWS_CLUSTER],
                            lambda: world.apply(extra))
    assert endpoints_of(after) == [("zone-a", "10.1.0.1", 19081), ("zone-b", "10.1.0.7", 19081)]
    world.store.delete(ConfigKey("EndpointSlice", "default", "reviews-2"))
    assert world.eds(p, {REVIEWS_CLUSTER})[REVIEWS_CLUSTER].any_bytes == before.any_bytes


# --- LDS --------------------------------------------------------------------------------------

def test_lds_interception_mode_changes_the_listener_shape(world: World) -> None:
    ctx = world.ctx()
    none = world.lds(proxy(interception="NONE"), ctx)
    redirect = world.lds(proxy(interception="REDIRECT"), ctx)
    default = world.lds(proxy(interception=None), ctx)
    assert set(none) == {"127.0.0.1_9080", "127.0.0.1_9300"}
    assert set(redirect) == {"virtualOutbound", "0.0.0.0_9080", "0.0.0.0_9300"}
    assert {n: r.any_bytes for n, r in default.items()} == {n: r.any_bytes for n, r in redirect.items()}
    assert listener(none["127.0.0.1_9080"]).address.socket_address.address == "127.0.0.1"
    assert listener(redirect["0.0.0.0_9080"]).bind_to_port.value is False


@pytest.mark.parametrize("mode, name", [("NONE", "127.0.0.1_9080"), ("REDIRECT", "0.0.0.0_9080")])
def test_lds_mesh_access_log_file(world: World, mode: str, name: str) -> None:
    p = proxy(interception=mode)
    before, after = changed(lambda: world.lds(p)[name],
                            lambda: world.apply(mesh_configmap({"accessLogFile": "/dev/stdout"})))
    assert not hcm_of(listener(before)).access_log
    log = file_pb2.FileAccessLog()
    assert hcm_of(listener(after)).access_log[0].typed_config.Unpack(log)
    assert log.path == "/dev/stdout"


def test_lds_mesh_access_log_file_on_tcp_listener(world: World) -> None:
    p = proxy(interception="NONE")
    before, after = changed(lambda: world.lds(p)["127.0.0.1_9300"],
                            lambda: world.apply(mesh_configmap({"accessLogFile": "/dev/stdout"})))
    assert not tcp_proxy_of(listener(before).filter_chains[0]).access_log
    assert tcp_proxy_of(listener(after).filter_chains[0]).access_log


def test_lds_mesh_outbound_traffic_policy(world: World) -> None:
    p = proxy(interception="REDIRECT")
    before, after = changed(lambda: world.lds(p)["virtualOutbound"],
                            lambda: world.apply(mesh_configmap({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}})))
    assert tcp_proxy_of(listener(before).default_filter_chain).cluster == "PassthroughCluster"
    assert tcp_proxy_of(listener(after).default_filter_chain).cluster == "BlackHoleCluster"


@pytest.mark.parametrize("port_change", [{"name": "http-db"}, {"appProtocol": "http"}], ids=["port-name", "appProtocol"])
def test_lds_port_protocol(world: World, port_change: dict) -> None:
    p = proxy(interception="NONE")
    new_port = {**DATABASE_SVC["spec"]["ports"][0], **port_change}
    before, after = changed(lambda: world.lds(p)["127.0.0.1_9300"],
                            lambda: world.apply(modified(DATABASE_SVC, **{"spec.ports": [new_port]})))
    assert listener(before).filter_chains[0].filters[0].name == "envoy.filters.network.tcp_proxy"
    assert listener(after).filter_chains[0].filters[0].name == "envoy.filters.network.http_connection_manager"


def test_lds_cluster_ip_of_tcp_service(world: World) -> None:
    p = proxy(interception="REDIRECT")
    before, after = changed(lambda: world.lds(p)["0.0.0.0_9300"],
                            lambda: world.apply(modified(DATABASE_SVC, **{"spec.clusterIP": "10.96.0.99"})))
    def prefix(r):
        return listener(r).filter_chains[0].filter_chain_match.prefix_ranges[0].address_prefix
    assert prefix(before) == "10.96.0.30"
    assert prefix(after) == "10.96.0.99"


def test_lds_grpc_proxy_gets_api_listener(world: World) -> None:
    ctx = world.ctx()
    name = f"{REVIEWS}:9080"
    grpc_out = world.lds(proxy(generator="grpc", interception=None), ctx, {name})
    envoy_out = world.lds(proxy(interception="NONE"), ctx)
    assert set(grpc_out) == {name}
    assert listener(grpc_out[name]).HasField("api_listener")
    assert not any(listener(r).HasField("api_listener") for r in envoy_out.values())


# --- RDS --------------------------------------------------------------------------------------

def test_rds_cluster_ip_domain(world: World) -> None:
    p = proxy()
    before, after = changed(lambda: world.rds(p, {"9080"})["9080"],
                            lambda: world.apply(modified(REVIEWS_SVC, **{"spec.clusterIP": "10.96.0.77"})))
    assert "10.96.0.20:9080" in vhost(route(before), f"{REVIEWS}:9080").domains
    domains = vhost(route(after), f"{REVIEWS}:9080").domains
    assert "10.96.0.77:9080" in domains and "10.96.0.20" not in domains


def test_rds_proxy_namespace_decides_short_names(world: World) -> None:
    ctx = world.ctx()
    same = world.rds(proxy("default"), {"9080"}, ctx)["9080"]
    other = world.rds(proxy("other"), {"9080"}, ctx)["9080"]
    assert same.any_bytes != other.any_bytes and same.version != other.version
    assert "reviews" in vhost(route(same), f"{REVIEWS}:9080").domains
    assert "reviews" not in vhost(route(other), f"{REVIEWS}:9080").domains
    assert "reviews.default" in vhost(route(other), f"{REVIEWS}:9080").domains
    # Two proxies of another namespace share the bytes.
    assert world.rds(proxy("other", pod_name="app-2", ip="10.0.0.2"), {"9080"}, ctx)["9080"] is other


def test_rds_mesh_default_http_retry_policy(world: World) -> None:
    p = proxy()
    before, after = changed(lambda: world.rds(p, {"9080"})["9080"],
                            lambda: world.apply(mesh_configmap({"defaultHttpRetryPolicy": {"attempts": 5}})))
    def retries(r):
        return vhost(route(r), f"{REVIEWS}:9080").routes[0].route.retry_policy.num_retries.value
    assert retries(before) == 2
    assert retries(after) == 5


def test_rds_mesh_retry_per_try_timeout(world: World) -> None:
    p = proxy()
    _before, after = changed(lambda: world.rds(p, {"9080"})["9080"],
                            lambda: world.apply(mesh_configmap({"defaultHttpRetryPolicy": {"perTryTimeout": "1.5s"}})))
    rp = vhost(route(after), f"{REVIEWS}:9080").routes[0].route.retry_policy
    assert (rp.per_try_timeout.seconds, rp.per_try_timeout.nanos) == (1, 500_000_000)


def test_rds_mesh_outbound_traffic_policy(world: World) -> None:
    p = proxy()
    before, after = changed(lambda: world.rds(p, {"9080"})["9080"],
                            lambda: world.apply(mesh_configmap({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}})))
    assert vhost(route(before), "allow_any") is not None
    assert vhost(route(after), "block_all").routes[0].direct_response.status == 502


def test_rds_port_protocol(world: World) -> None:
    p = proxy()
    before, after = changed(lambda: world.rds(p, {"9080"})["9080"],
                            lambda: world.apply(modified(RATINGS_SVC, **{"spec.ports.0.name": "tcp"})))
    assert vhost(route(before), f"{RATINGS}:9080") is not None
    assert vhost(route(after), f"{RATINGS}:9080") is None


def test_rds_service_port_number(world: World) -> None:
    p = proxy()
    _before, after = changed(lambda: world.rds(p, {"9080"})["9080"],
                            lambda: world.apply(modified(RATINGS_SVC, **{"spec.ports.0.port": 9081})))
    assert vhost(route(after), f"{RATINGS}:9080") is None
    assert vhost(route(world.rds(p, {"9081"})["9081"]), f"{RATINGS}:9081") is not None


def test_rds_grpc_proxy_gets_its_own_route_config(world: World) -> None:
    ctx = world.ctx()
    name = f"{REVIEWS}:9080"
    grpc_rc = route(world.rds(proxy(generator="grpc", interception=None), {name}, ctx)[name])
    envoy_rc = route(world.rds(proxy(), {"9080"}, ctx)["9080"])
    assert [vh.name for vh in grpc_rc.virtual_hosts] == [f"{REVIEWS}:9080"]
    assert [vh.name for vh in envoy_rc.virtual_hosts] != [f"{REVIEWS}:9080"]
    # Both carry the mesh's default retries (istiod's grpcgen reuses the sidecar's virtual
    # hosts; grpc acts on the `unavailable`/`cancelled` conditions of retry_on).
    assert grpc_rc.virtual_hosts[0].routes[0].route.retry_policy.retry_on == \
        envoy_rc.virtual_hosts[0].routes[0].route.retry_policy.retry_on


# --- unrelated changes: same bytes, from the cache --------------------------------------------

def everything(world: World, p, ctx) -> dict[tuple[str, str], CachedResource]:
    names = {n for n in world.cds(p, ctx) if n.startswith("outbound|")}
    out = {}
    for t, res in ((CLUSTER, world.cds(p, ctx)), (ENDPOINT, world.eds(p, names, ctx)),
                   (LISTENER, world.lds(p, ctx)), (ROUTE, world.rds(p, {"9080"}, ctx))):
        out.update({(t, n): r for n, r in res.items()})
    return out


@pytest.mark.parametrize("mode", ["NONE", "REDIRECT"])
def test_pod_change_leaves_every_resource_cached(world: World, mode: str) -> None:
    p = proxy(interception=mode)
    before = everything(world, p, world.ctx())
    builds, hits = dict(world.cache.builds_by_type), world.cache.hits
    world.apply(pod("reviews-abc"))
    after = everything(world, p, world.ctx())
    assert set(after) == set(before)
    for k in before:
        assert after[k] is before[k], k
    assert world.cache.builds_by_type == builds
    assert world.cache.hits >= hits + len(before)


def test_other_services_endpoints_leave_cla_cached(world: World) -> None:
    p = proxy()
    ctx = world.ctx()
    before = world.eds(p, {REVIEWS_CLUSTER, RATINGS_CLUSTER}, ctx)
    builds, hits = dict(world.cache.builds_by_type), world.cache.hits
    world.apply(modified(RATINGS_EPS, **{"endpoints.0.addresses": ["10.1.0.42"]}))
    for next_ctx in (ctx.with_endpoints(world.store, "v-eds"), world.ctx()):
        after = world.eds(p, {REVIEWS_CLUSTER, RATINGS_CLUSTER}, next_ctx)
        assert after[REVIEWS_CLUSTER] is before[REVIEWS_CLUSTER]
        assert after[RATINGS_CLUSTER].version != before[RATINGS_CLUSTER].version
    # ratings was rebuilt once (then cached for the second context); reviews never.
    assert world.cache.builds_by_type[ENDPOINT] == builds[ENDPOINT] + 1
    assert world.cache.hits > hits


def test_other_service_change_leaves_unrelated_resources_cached(world: World) -> None:
    p = proxy(interception="NONE")
    before = everything(world, p, world.ctx())
    world.apply(modified(DATABASE_SVC, **{"spec.clusterIP": "10.96.0.31"}))
    builds = dict(world.cache.builds_by_type)
    after = everything(world, p, world.ctx())
    for k in [(CLUSTER, REVIEWS_CLUSTER), (ENDPOINT, REVIEWS_CLUSTER), (LISTENER, "127.0.0.1_9080"),
              (ROUTE, "9080")]:
        assert after[k] is before[k], k
    # Only what depends on the database Service was rebuilt (its bytes are equal: NONE-mode
    # listeners do not match on the cluster IP).
    assert after[(LISTENER, "127.0.0.1_9300")].any_bytes == before[(LISTENER, "127.0.0.1_9300")].any_bytes
    assert world.cache.builds_by_type[ROUTE] == builds[ROUTE]


def test_new_push_without_changes_serves_identical_objects(world: World) -> None:
    p = proxy()
    first = everything(world, p, world.ctx())
    builds = dict(world.cache.builds_by_type)
    second = everything(world, p, world.ctx())
    assert all(second[k] is first[k] for k in first)
    assert world.cache.builds_by_type == builds


# --- sharing between proxies ------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["NONE", "REDIRECT"])
def test_proxies_with_same_traits_share_cached_objects(world: World, mode: str) -> None:
    ctx = world.ctx()
    a = everything(world, proxy(interception=mode, pod_name="app-1", ip="10.0.0.1"), ctx)
    builds = dict(world.cache.builds_by_type)
    b = everything(world, proxy(interception=mode, pod_name="app-2", ip="10.0.0.2"), ctx)
    assert set(a) == set(b)
    for k in a:
        assert b[k] is a[k], k
    assert world.cache.builds_by_type == builds


def test_sharing_survives_the_per_push_memo_being_reset(world: World) -> None:
    """The second proxy asks in a later push: served from the long-lived cache, not rebuilt."""
    a = everything(world, proxy(pod_name="app-1"), world.ctx())
    builds = dict(world.cache.builds_by_type)
    b = everything(world, proxy(pod_name="app-2", ip="10.0.0.2"), world.ctx())
    assert all(b[k] is a[k] for k in a)
    assert world.cache.builds_by_type == builds


# --- determinism: equal inputs, equal versions, whatever the order they arrived in ------------

def test_versions_do_not_depend_on_arrival_order() -> None:
    """Two replicas that received the same config in a different order serve identical versions."""
    grpc_svc = service("grpc", cluster_ip="10.96.0.40",
                       ports=[{"name": "grpc", "port": 7070}, {"name": "http2-x", "port": 7071}])
    extra = endpoint_slice("reviews-2", "reviews", addresses=("10.1.0.8", "10.1.0.5"), port=19081, zone="zone-b")
    docs = [REVIEWS_SVC, RATINGS_SVC, DATABASE_SVC, grpc_svc, REVIEWS_EPS, RATINGS_EPS, DATABASE_EPS, extra]
    a, b = World(), World()
    a.apply(*docs)
    b.apply(*reversed(docs))
    for mode in ("NONE", "REDIRECT"):
        p = proxy(interception=mode)
        ra, rb = everything(a, p, a.ctx()), everything(b, p, b.ctx())
        assert {k: r.version for k, r in ra.items()} == {k: r.version for k, r in rb.items()}
        assert all(ra[k].any_bytes == rb[k].any_bytes for k in ra)


@pytest.mark.parametrize("mode", ["NONE", "REDIRECT"])
def test_a_mesh_setting_rebuilds_only_what_reads_it(world: World, mode: str) -> None:
    """connectTimeout is read by clusters alone: routes, listeners and endpoints stay cached."""
    p = proxy(interception=mode)
    before = everything(world, p, world.ctx())
    world.apply(mesh_configmap({"connectTimeout": "7s"}))
    builds = dict(world.cache.builds_by_type)
    after = everything(world, p, world.ctx())
    for (t, name), res in before.items():
        if t == CLUSTER:
            assert after[(t, name)].version != res.version, name
        else:
            assert after[(t, name)] is res, (t, name)
    assert world.cache.builds_by_type[ROUTE] == builds.get(ROUTE, 0)
    assert world.cache.builds_by_type[LISTENER] == builds.get(LISTENER, 0)
