"""DestinationRule and VirtualService fields this control plane generates: each one, written into
a rule, changes the generated resource (so the cache key holds it) in the way Envoy needs.

Every case starts from a rule without the field, applies the rule with it through the Store, builds
the next PushContext as a push does, and reads the resource a proxy would get.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from pilot.model.proxy import Proxy
from pilot.xds.cache import CachedResource

from .helpers import World, endpoint_slice, proxy, service

REVIEWS = "reviews.default.svc.cluster.local"
CLUSTER = f"outbound|9080||{REVIEWS}"
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def dr(spec: dict, name: str = "reviews", namespace: str = "default") -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"host": REVIEWS, **spec}}


def vs(http: dict) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"hosts": ["reviews"],
                     "http": [{"route": [{"destination": {"host": "reviews"}}], **http}]}}


@pytest.fixture
def world() -> World:
    w = World()
    w.apply(service("reviews"), service("ratings", cluster_ip="10.96.0.21"),
            endpoint_slice("reviews-1", "reviews", addresses=("10.1.0.1",), port=9080))
    return w


def labelled(labels: dict[str, str], pod_name: str = "app-1", ip: str = "10.0.0.1") -> Proxy:
    p = proxy(pod_name=pod_name, ip=ip)
    p.metadata["LABELS"] = labels
    return p


def cluster(r: CachedResource) -> cluster_pb2.Cluster:
    return r.message(cluster_pb2.Cluster)


def http_options(c: cluster_pb2.Cluster) -> http_protocol_options_pb2.HttpProtocolOptions:
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    assert c.typed_extension_protocol_options[HTTP_OPTIONS].Unpack(opts)
    return opts


def with_field(world: World, base: dict, path: str, value: Any, get) -> tuple[Any, Any]:
    """The resource for `base`, and for `base` with `value` set at the dotted `path` of its spec."""
    world.apply(base)
    before = get()
    changed = copy.deepcopy(base)
    node = changed["spec"]
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[leaf] = value
    world.apply(changed)
    after = get()
    assert after.any_bytes != before.any_bytes, f"{path} changed but the resource did not"
    return before, after


POOL = {"trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 10}}}}
LB = {"trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}


@pytest.mark.parametrize("path, value, check", [
    ("trafficPolicy.connectionPool.tcp.tcpKeepalive", {"time": "60s", "interval": "5s", "probes": 3},
     lambda c: (c.upstream_connection_options.tcp_keepalive.keepalive_time.value,
                c.upstream_connection_options.tcp_keepalive.keepalive_interval.value,
                c.upstream_connection_options.tcp_keepalive.keepalive_probes.value) == (60, 5, 3)),
    ("trafficPolicy.connectionPool.tcp.maxConnectionDuration", "30m",
     lambda c: http_options(c).common_http_protocol_options.max_connection_duration.seconds == 1800),
    ("trafficPolicy.connectionPool.tcp.idleTimeout", "90s",
     lambda c: http_options(c).common_http_protocol_options.idle_timeout.seconds == 90),
    ("trafficPolicy.connectionPool.http",
     {"idleTimeout": "20s", "maxRequestsPerConnection": 7, "maxRetries": 4},
     lambda c: (http_options(c).common_http_protocol_options.idle_timeout.seconds,
                http_options(c).common_http_protocol_options.max_requests_per_connection.value,
                c.circuit_breakers.thresholds[0].max_retries.value) == (20, 7, 4)),
    ("trafficPolicy.connectionPool.http", {"h2UpgradePolicy": "UPGRADE"},
     lambda c: http_options(c).explicit_http_config.HasField("http2_protocol_options")),
    ("trafficPolicy.connectionPool.http", {"h2UpgradePolicy": "UPGRADE", "maxConcurrentStreams": 50},
     lambda c: http_options(c).explicit_http_config.http2_protocol_options.max_concurrent_streams.value
     == 50),
    ("trafficPolicy.connectionPool.http", {"useClientProtocol": True},
     lambda c: http_options(c).use_downstream_protocol_config.HasField("http2_protocol_options")
     and http_options(c).use_downstream_protocol_config.HasField("http_protocol_options")),
])
def test_connection_pool_fields(world: World, path: str, value: Any, check) -> None:
    p = proxy()
    _, after = with_field(world, dr(POOL), path, value, lambda: world.cds(p)[CLUSTER])
    assert check(cluster(after))


def test_max_concurrent_streams_needs_an_http2_upstream(world: World) -> None:
    """istiod sets it only on HTTP/2 clusters: an HTTP/1.1 pool has no streams to limit."""
    p = proxy()
    world.apply(dr({"trafficPolicy": {"connectionPool": {"http": {"maxConcurrentStreams": 50}}}}))
    opts = http_options(cluster(world.cds(p)[CLUSTER]))
    assert opts.explicit_http_config.HasField("http_protocol_options")
    assert not opts.explicit_http_config.HasField("http2_protocol_options")


@pytest.mark.parametrize("path, value, check", [
    ("trafficPolicy.loadBalancer.warmup", {"duration": "45s", "minimumPercent": 20, "aggression": 1.5},
     lambda c: (c.round_robin_lb_config.slow_start_config.slow_start_window.seconds,
                c.round_robin_lb_config.slow_start_config.min_weight_percent.value,
                c.round_robin_lb_config.slow_start_config.aggression.default_value) == (45, 20, 1.5)),
    ("trafficPolicy.loadBalancer.warmup", {"duration": "45s"},  # istiod's defaults made explicit
     lambda c: (c.round_robin_lb_config.slow_start_config.min_weight_percent.value,
                c.round_robin_lb_config.slow_start_config.aggression.default_value) == (10, 1)),
    ("trafficPolicy.loadBalancer.warmupDurationSecs", "30s",
     lambda c: c.round_robin_lb_config.slow_start_config.slow_start_window.seconds == 30),
    ("trafficPolicy.loadBalancer.simple", "LEAST_REQUEST",
     lambda c: c.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST),
    ("trafficPolicy.loadBalancer.simple", "PASSTHROUGH",
     lambda c: c.type == cluster_pb2.Cluster.ORIGINAL_DST
     and c.lb_policy == cluster_pb2.Cluster.CLUSTER_PROVIDED
     and not c.HasField("eds_cluster_config")),
])
def test_load_balancer_fields(world: World, path: str, value: Any, check) -> None:
    p = proxy()
    _, after = with_field(world, dr(LB), path, value, lambda: world.cds(p)[CLUSTER])
    assert check(cluster(after))


def test_warmup_on_least_request(world: World) -> None:
    p = proxy()
    world.apply(dr({"trafficPolicy": {"loadBalancer": {"simple": "LEAST_REQUEST",
                                                       "warmup": {"duration": "10s"}}}}))
    c = cluster(world.cds(p)[CLUSTER])
    assert c.least_request_lb_config.slow_start_config.slow_start_window.seconds == 10


@pytest.mark.parametrize("hash_lb, check", [
    ({"httpHeaderName": "x-user", "ringHash": {"minimumRingSize": 2048}},
     lambda c: c.lb_policy == cluster_pb2.Cluster.RING_HASH
     and c.ring_hash_lb_config.minimum_ring_size.value == 2048),
    ({"httpHeaderName": "x-user", "maglev": {"tableSize": 65537}},
     lambda c: c.lb_policy == cluster_pb2.Cluster.MAGLEV and c.maglev_lb_config.table_size.value == 65537),
])
def test_consistent_hash_algorithm(world: World, hash_lb: dict, check) -> None:
    p = proxy()
    _, after = with_field(world, dr(LB), "trafficPolicy.loadBalancer", {"consistentHash": hash_lb},
                          lambda: world.cds(p)[CLUSTER])
    assert check(cluster(after))


def test_ca_crl(world: World) -> None:
    p = proxy()
    tls = {"mode": "SIMPLE", "caCertificates": "/etc/certs/ca.pem"}
    _, after = with_field(world, dr({"trafficPolicy": {"tls": tls}}), "trafficPolicy.tls.caCrl",
                          "/etc/certs/crl.pem", lambda: world.cds(p)[CLUSTER])
    ctx = tls_pb2.UpstreamTlsContext()
    assert cluster(after).transport_socket.typed_config.Unpack(ctx)
    assert ctx.common_tls_context.validation_context.crl.filename == "/etc/certs/crl.pem"


@pytest.mark.parametrize("mode", ["SIMPLE", "MUTUAL"])
def test_credential_name_takes_certificates_from_sds(world: World, mode: str) -> None:
    """istiod's names: MUTUAL's chain and key from kubernetes://NAME, the CA that verifies the
    server from kubernetes://NAME-cacert, both over the ADS stream; SANs still checked."""
    p = proxy()
    tls = {"mode": "SIMPLE", "sni": REVIEWS, "subjectAltNames": [REVIEWS], "credentialName": "reviews-client"}
    get = (lambda: world.cds(p)[CLUSTER])
    if mode == "SIMPLE":
        _before, after = with_field(world, dr({"trafficPolicy": {"tls": {"mode": "DISABLE"}}}), "trafficPolicy.tls",
                                   tls, get)
    else:  # MUTUAL with files needs a client certificate; with a credential, the Secret has it
        _before, after = with_field(world, dr({"trafficPolicy": {"tls": tls}}), "trafficPolicy.tls.mode", mode, get)
    ctx = tls_pb2.UpstreamTlsContext()
    assert cluster(after).transport_socket.typed_config.Unpack(ctx)
    common = ctx.common_tls_context
    certs = [(s.name, s.sds_config.HasField("ads")) for s in common.tls_certificate_sds_secret_configs]
    assert certs == ([("kubernetes://reviews-client", True)] if mode == "MUTUAL" else [])
    combined = common.combined_validation_context
    assert combined.validation_context_sds_secret_config.name == "kubernetes://reviews-client-cacert"
    assert combined.validation_context_sds_secret_config.sds_config.HasField("ads")
    assert [m.matcher.exact for m in combined.default_validation_context.match_typed_subject_alt_names] == [REVIEWS]
    assert not common.tls_certificates and not common.HasField("validation_context")


# --- DestinationRule workloadSelector ----------------------------------------------------------------
def max_connections(world: World, p: Proxy) -> int:
    thresholds = cluster(world.cds(p)[CLUSTER]).circuit_breakers.thresholds
    return thresholds[0].max_connections.value if thresholds else 0


def test_workload_selector_applies_only_to_the_selected_proxies(world: World) -> None:
    selected, other = labelled({"app": "productpage"}), labelled({"app": "details"}, "app-2", "10.0.0.2")
    world.apply(dr({"trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 5}}}}, name="everyone"))
    assert max_connections(world, selected) == max_connections(world, other) == 5
    world.apply(dr({"workloadSelector": {"matchLabels": {"app": "productpage"}}, "exportTo": ["."],
                    "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 1}}}},
                   name="productpage-only"))
    # One context for both: the selector is evaluated per proxy, not per namespace.
    ctx = world.ctx()
    assert max_connections_in(world, selected, ctx) == 1
    assert max_connections_in(world, other, ctx) == 5  # the rule without a selector applies otherwise


def max_connections_in(world: World, p: Proxy, ctx) -> int:
    return cluster(world.cds(p, ctx)[CLUSTER]).circuit_breakers.thresholds[0].max_connections.value


def test_workload_selector_never_applies_in_another_namespace(world: World) -> None:
    """istiod: a selector rule exists only for proxies of its own namespace, even if they match."""
    world.apply(dr({"workloadSelector": {"matchLabels": {"app": "productpage"}},
                    "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 1}}}},
                   namespace="default"))
    elsewhere = proxy("other")
    elsewhere.metadata["LABELS"] = {"app": "productpage"}
    assert cluster(world.cds(elsewhere)[CLUSTER]).circuit_breakers.thresholds[0].max_connections.value == 2**32 - 1
    assert max_connections(world, labelled({"app": "productpage"})) == 1


def test_workload_selector_splits_the_generation_memo() -> None:
    """Two proxies of one namespace that differ only in the labels a selector asks about get
    different cluster bytes through the shared generation memo (what a push uses)."""
    from pilot.xds.generated import GenerationMemo
    from pilot.xds.generators import cds
    from pilot.xds.typeurls import CLUSTER as CDS

    w = World()
    w.apply(service("reviews"), endpoint_slice("reviews-1", "reviews", addresses=("10.1.0.1",), port=9080),
            dr({"workloadSelector": {"matchLabels": {"app": "productpage"}}, "exportTo": ["."],
                "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 1}}}}))
    memo = GenerationMemo({CDS: cds.generate}, w.cache)
    ctx = w.ctx()
    a = memo.generate(ctx, CDS, labelled({"app": "productpage"}), None)
    b = memo.generate(ctx, CDS, labelled({"app": "details"}, "app-2", "10.0.0.2"), None)
    by_name = {r.name: r for r in a.resources}, {r.name: r for r in b.resources}
    assert by_name[0][CLUSTER].any_bytes != by_name[1][CLUSTER].any_bytes


# --- VirtualService ----------------------------------------------------------------------------------
def routes_of(world: World, p: Proxy) -> list:
    rc = world.rds(p, {"9080"})["9080"].message(route_pb2.RouteConfiguration)
    return next(vh for vh in rc.virtual_hosts if vh.name == f"{REVIEWS}:9080").routes


def rds(world: World, p: Proxy):
    return lambda: world.rds(p, {"9080"})["9080"]


def first_route(r: CachedResource):
    rc = r.message(route_pb2.RouteConfiguration)
    return next(vh for vh in rc.virtual_hosts if vh.name == f"{REVIEWS}:9080").routes[0]


RATINGS = "outbound|9080||ratings.default.svc.cluster.local"


@pytest.mark.parametrize("path, value, check", [
    ("http.0.mirrors", [{"destination": {"host": "ratings"}, "percentage": {"value": 25}},
                        {"destination": {"host": "reviews", "subset": "v2"}}],
     lambda r: [(m.cluster, m.runtime_fraction.default_value.numerator,
                 m.runtime_fraction.default_value.denominator) for m in r.route.request_mirror_policies]
     == [(RATINGS, 250_000, 2), (f"outbound|9080|v2|{REVIEWS}", 100, 0)]),
    ("http.0.mirror", {"host": "ratings"},
     lambda r: [m.cluster for m in r.route.request_mirror_policies] == [RATINGS]),
    ("http.0.retries", {"attempts": 3, "backoff": "250ms"},
     lambda r: r.route.retry_policy.retry_back_off.base_interval.nanos == 250_000_000),
    ("http.0.retries", {"attempts": 3, "retryIgnorePreviousHosts": False},
     lambda r: len(r.route.retry_policy.retry_host_predicate) == 0),
    ("http.0.retries", {"attempts": 3, "retryIgnorePreviousHosts": True},
     lambda r: [p.name for p in r.route.retry_policy.retry_host_predicate]
     == ["envoy.retry_host_predicates.previous_hosts"]),
    ("http.0.retries", {"attempts": 3, "retryRemoteLocalities": True},
     lambda r: r.route.retry_policy.retry_priority.name == "envoy.retry_priorities.previous_priorities"),
    ("http.0.match", [{"uri": {"prefix": "/api"}, "statPrefix": "reviews-api"}],
     lambda r: r.stat_prefix == "reviews-api"),
])
def test_virtual_service_fields(world: World, path: str, value: Any, check) -> None:
    p = proxy()
    _, after = with_field(world, vs({}), path, value, rds(world, p))
    assert check(first_route(after))


def test_mirror_of_zero_percent_is_no_mirror(world: World) -> None:
    world.apply(vs({"mirrors": [{"destination": {"host": "ratings"}, "percentage": {"value": 0}}],
                    "mirrorPercent": 0}))
    assert len(routes_of(world, proxy())[0].route.request_mirror_policies) == 0


def test_retry_keeps_previous_hosts_by_default(world: World) -> None:
    world.apply(vs({"retries": {"attempts": 3}}))
    rp = routes_of(world, proxy())[0].route.retry_policy
    assert [h.name for h in rp.retry_host_predicate] == ["envoy.retry_host_predicates.previous_hosts"]


def test_cors_deprecated_origins_and_unmatched_preflights(world: World) -> None:
    p = proxy()
    _, after = with_field(world, vs({"corsPolicy": {"allowOrigin": ["https://a.example"]}}),
                          "http.0.corsPolicy.unmatchedPreflights", "IGNORE", rds(world, p))
    cors = cors_pb2.CorsPolicy()
    assert first_route(after).typed_per_filter_config["envoy.filters.http.cors"].Unpack(cors)
    assert [m.exact for m in cors.allow_origin_string_match] == ["https://a.example"]
    assert cors.HasField("forward_not_matching_preflights")
    assert cors.forward_not_matching_preflights.value is False


def test_match_for_another_gateway_does_not_apply_to_sidecars(world: World) -> None:
    doc = vs({"match": [{"uri": {"prefix": "/edge"}, "gateways": ["istio-system/edge"]}]})
    doc["spec"]["gateways"] = ["mesh", "istio-system/edge"]
    doc["spec"]["http"].append({"route": [{"destination": {"host": "ratings"}}]})
    world.apply(doc)
    assert [r.route.cluster for r in routes_of(world, proxy())] == [RATINGS]


# --- fields that were read only in part ---------------------------------------------------------------
def test_virtual_service_export_to_limits_the_sidecars_it_applies_to(world: World) -> None:
    """exportTo: ["."] keeps a VirtualService to its own namespace: a client elsewhere keeps the
    service's default route."""
    doc = vs({"route": [{"destination": {"host": "ratings"}}]})
    doc["spec"]["exportTo"] = ["."]
    world.apply(doc)
    assert [r.route.cluster for r in routes_of(world, proxy())] == [RATINGS]
    elsewhere = world.rds(proxy("other"), {"9080"})["9080"].message(route_pb2.RouteConfiguration)
    vh = next(vh for vh in elsewhere.virtual_hosts if vh.name == f"{REVIEWS}:9080")
    assert [r.route.cluster for r in vh.routes] == [CLUSTER]


def test_direct_response_bytes_are_decoded(world: World) -> None:
    world.apply(vs({"route": [], "directResponse": {"status": 200, "body": {"bytes": "aGVsbG8="}}}))
    body = routes_of(world, proxy())[0].direct_response.body
    assert body.inline_bytes == b"hello"


def test_match_name_is_part_of_the_route_name(world: World) -> None:
    world.apply(vs({"name": "api", "match": [{"name": "v1", "uri": {"prefix": "/v1"}}]}))
    assert routes_of(world, proxy())[0].name == "api.v1"


def test_cookie_path_reaches_the_hash_policy(world: World) -> None:
    p = proxy()
    cookie = {"consistentHash": {"httpCookie": {"name": "user", "ttl": "10s"}}}
    _, after = with_field(world, dr({"trafficPolicy": {"loadBalancer": cookie}}),
                          "trafficPolicy.loadBalancer.consistentHash.httpCookie.path", "/shop", rds(world, p))
    assert first_route(after).route.hash_policy[0].cookie.path == "/shop"


def test_istio_mutual_sni_from_the_destination_rule(world: World) -> None:
    p = proxy()
    p.identity = "spiffe://cluster.local/ns/default/sa/app"
    _, after = with_field(world, dr({"trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}}),
                          "trafficPolicy.tls.sni", "reviews.custom", lambda: world.cds(p)[CLUSTER])
    ctx = tls_pb2.UpstreamTlsContext()
    assert cluster(after).transport_socket.typed_config.Unpack(ctx)
    assert ctx.sni == "reviews.custom"


def test_port_and_subset_consistent_hash_reach_the_routes(world: World) -> None:
    """A port-level or subset-level consistentHash makes that cluster RING_HASH, and the routes to
    that cluster carry the key (the cluster alone hashes nothing)."""
    p = proxy()
    world.apply(dr({"subsets": [{"name": "v1", "labels": {"version": "v1"}, "trafficPolicy": {
        "loadBalancer": {"consistentHash": {"httpHeaderName": "x-subset"}}}}],
        "trafficPolicy": {"portLevelSettings": [{"port": {"number": 9080}, "loadBalancer": {
            "consistentHash": {"httpHeaderName": "x-port"}}}]}}))
    world.apply(vs({"route": [{"destination": {"host": "reviews", "subset": "v1"}}]}))
    doc = vs({"match": [{"uri": {"prefix": "/all"}}]})
    doc["spec"]["http"].append({"route": [{"destination": {"host": "reviews", "subset": "v1"}}]})
    world.apply(doc)
    first, second = routes_of(world, p)
    assert [h.header.header_name for h in first.route.hash_policy] == ["x-port"]
    assert [h.header.header_name for h in second.route.hash_policy] == ["x-subset"]
    assert cluster(world.cds(p)[CLUSTER]).lb_policy == cluster_pb2.Cluster.RING_HASH


@pytest.mark.parametrize("budget, expect", [({}, (20.0, 3)),
                                            ({"percent": 35.5, "minRetryConcurrency": 7}, (35.5, 7))])
def test_retry_budget(world: World, budget: dict, expect: tuple) -> None:
    p = proxy()
    _, after = with_field(world, dr(POOL), "trafficPolicy.retryBudget", budget, lambda: world.cds(p)[CLUSTER])
    thresholds = cluster(after).circuit_breakers.thresholds
    assert len(thresholds) == 1 and thresholds[0].max_connections.value == 10  # one set: the pool's
    rb = thresholds[0].retry_budget
    assert (rb.budget_percent.value, rb.min_retry_concurrency.value) == expect


def test_retry_budget_of_a_subset_without_a_pool(world: World) -> None:
    p = proxy()
    world.apply(dr({"subsets": [{"name": "v1", "labels": {"version": "v1"},
                                 "trafficPolicy": {"retryBudget": {"percent": 50}}}]}))
    c = cluster(world.cds(p)[f"outbound|9080|v1|{REVIEWS}"])
    assert c.circuit_breakers.thresholds[0].retry_budget.budget_percent.value == 50


def test_tcp_idle_timeout_and_max_duration_reach_the_tcp_proxy() -> None:
    """For a TCP service the pool's idleTimeout / maxConnectionDuration are the tcp_proxy's (istiod
    reads them from the rule's top-level connectionPool.tcp); the cluster options alone do nothing."""
    from envoy.config.listener.v3 import listener_pb2
    from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

    w = World()
    w.apply(service("database", cluster_ip="10.96.0.30", ports=[{"name": "tcp-db", "port": 9300}]))
    host = "database.default.svc.cluster.local"
    base = {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": "database", "namespace": "default"},
            "spec": {"host": host, "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 5}}}}}
    p = proxy()
    _, after = with_field(w, base, "trafficPolicy.connectionPool.tcp",
                          {"maxConnections": 5, "idleTimeout": "90s", "maxConnectionDuration": "2h"},
                          lambda: w.lds(p)["127.0.0.1_9300"])
    tp = tcp_proxy_pb2.TcpProxy()
    assert after.message(listener_pb2.Listener).filter_chains[-1].filters[0].typed_config.Unpack(tp)
    assert (tp.idle_timeout.seconds, tp.max_downstream_connection_duration.seconds) == (90, 7200)


# --- Sidecar inbound connection pools ------------------------------------------------------------------
def sidecar_doc(spec: dict) -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
            "metadata": {"name": "default", "namespace": "default"}, "spec": spec}


INGRESS = [{"port": {"number": 9080, "protocol": "HTTP", "name": "http"},
            "defaultEndpoint": "127.0.0.1:8080"},
           {"port": {"number": 9090, "protocol": "TCP", "name": "tcp"},
            "defaultEndpoint": "127.0.0.1:8090"}]


def test_sidecar_inbound_connection_pools(world: World) -> None:
    p = proxy()
    base = sidecar_doc({"ingress": INGRESS})
    _, after = with_field(world, base, "inboundConnectionPool", {"tcp": {"maxConnections": 11}},
                          lambda: world.cds(p)["inbound|9090||"])
    assert cluster(after).circuit_breakers.thresholds[0].max_connections.value == 11
    # A listener's own pool wins for its port; the others keep the Sidecar-wide one.
    per_port = copy.deepcopy(INGRESS)
    per_port[0]["connectionPool"] = {"http": {"http1MaxPendingRequests": 3, "idleTimeout": "15s"}}
    world.apply(sidecar_doc({"ingress": per_port, "inboundConnectionPool": {"tcp": {"maxConnections": 11}}}))
    http, tcp = cluster(world.cds(p)["inbound|9080||"]), cluster(world.cds(p)["inbound|9090||"])
    assert http.circuit_breakers.thresholds[0].max_pending_requests.value == 3
    assert http.circuit_breakers.thresholds[0].max_connections.value == 2**32 - 1  # istiod's default
    assert http_options(http).common_http_protocol_options.idle_timeout.seconds == 15
    assert tcp.circuit_breakers.thresholds[0].max_connections.value == 11


def test_cookie_attributes_reach_the_hash_policy(world: World) -> None:
    p = proxy()
    cookie = {"consistentHash": {"httpCookie": {"name": "user", "ttl": "10s"}}}
    _, after = with_field(world, dr({"trafficPolicy": {"loadBalancer": cookie}}),
                          "trafficPolicy.loadBalancer.consistentHash.httpCookie.attributes",
                          [{"name": "SameSite", "value": "Strict"}, {"name": "Secure"}], rds(world, p))
    attrs = first_route(after).route.hash_policy[0].cookie.attributes
    assert [(a.name, a.value) for a in attrs] == [("SameSite", "Strict"), ("Secure", "")]


def test_redirect_port_from_the_request(world: World) -> None:
    p = proxy()
    _, after = with_field(world, vs({"route": [], "redirect": {"scheme": "https"}}),
                          "http.0.redirect.derivePort", "FROM_REQUEST_PORT", rds(world, p))
    assert first_route(after).redirect.port_redirect == 9080


def test_tcp_source_matches_pick_the_rule_per_client() -> None:
    """A tcp rule for clients with some labels (or in some namespace) goes to those clients only;
    the others keep the next rule. Through the memo, as a push serves them."""
    from envoy.config.listener.v3 import listener_pb2
    from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

    from pilot.xds.generated import GenerationMemo
    from pilot.xds.generators import lds
    from pilot.xds.typeurls import LISTENER

    w = World()
    w.apply(service("database", cluster_ip="10.96.0.30", ports=[{"name": "tcp-db", "port": 9300}]),
            service("replica", cluster_ip="10.96.0.31", ports=[{"name": "tcp-db", "port": 9301}]),
            service("audit", cluster_ip="10.96.0.32", ports=[{"name": "tcp-db", "port": 9302}]),
            {"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
             "metadata": {"name": "database", "namespace": "default"},
             "spec": {"hosts": ["database"], "tcp": [
                 {"match": [{"sourceLabels": {"app": "reports"}}],
                  "route": [{"destination": {"host": "replica"}}]},
                 {"match": [{"sourceNamespace": "other"}], "route": [{"destination": {"host": "audit"}}]},
                 {"route": [{"destination": {"host": "database"}}]}]}})
    memo = GenerationMemo({LISTENER: lds.generate}, w.cache)
    ctx = w.ctx()

    def target(p: Proxy) -> str:
        out = {r.name: r for r in memo.generate(ctx, LISTENER, p, None).resources}
        tp = tcp_proxy_pb2.TcpProxy()
        listener = out["127.0.0.1_9300"].message(listener_pb2.Listener)
        assert listener.filter_chains[-1].filters[0].typed_config.Unpack(tp)
        return tp.cluster.split("|")[3].split(".")[0]

    elsewhere = proxy("other", pod_name="app-3", ip="10.0.0.3")
    assert target(labelled({"app": "reports"})) == "replica"
    assert target(labelled({"app": "web"}, "app-2", "10.0.0.2")) == "database"
    assert target(elsewhere) == "audit"


def test_proxy_protocol_wraps_the_transport_sockets(world: World) -> None:
    from envoy.extensions.transport_sockets.proxy_protocol.v3 import upstream_proxy_protocol_pb2

    def wrapped(socket) -> upstream_proxy_protocol_pb2.ProxyProtocolUpstreamTransport:
        assert socket.name == "envoy.transport_sockets.upstream_proxy_protocol"
        t = upstream_proxy_protocol_pb2.ProxyProtocolUpstreamTransport()
        assert socket.typed_config.Unpack(t)
        return t

    plain = proxy()
    _, after = with_field(world, dr(POOL), "trafficPolicy.proxyProtocol", {"version": "V2"},
                          lambda: world.cds(plain)[CLUSTER])
    t = wrapped(cluster(after).transport_socket)
    assert t.config.version == 1 and t.transport_socket.name == "envoy.transport_sockets.raw_buffer"
    meshed = proxy(pod_name="app-2", ip="10.0.0.2")
    meshed.identity = "spiffe://cluster.local/ns/default/sa/app"
    matches = cluster(world.cds(meshed)[CLUSTER]).transport_socket_matches  # auto mTLS: both wrapped
    assert [wrapped(m.transport_socket).transport_socket.name for m in matches] == [
        "envoy.transport_sockets.tls", "envoy.transport_sockets.raw_buffer"]
