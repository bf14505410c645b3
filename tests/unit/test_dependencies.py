"""Dependency recording: once per generated result, shared by the proxies given it, and endpoint
changes that reach only the ClusterLoadAssignments that read them (the EDS fast path)."""

from __future__ import annotations

from pilot.config.validation import parse_object
from pilot.features import Features
from pilot.model import dependencies as dep
from pilot.model.events import push_request_for
from pilot.model.proxy import Proxy
from pilot.xds import typeurls as T
from pilot.xds.connection import Connection
from pilot.xds.discovery import DiscoveryServer
from tests.support.scoping import pushed, subscribe

from .helpers import World, endpoint_slice, pod, proxy, service

REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"
RATINGS = "outbound|9080||ratings.default.svc.cluster.local"


def _with_identity(p: Proxy) -> Proxy:
    p.identity = f"spiffe://cluster.local/ns/{p.namespace}/sa/default"
    return p


def _slice(name: str, svc: str, ip: str, pod_name: str) -> dict:
    doc = endpoint_slice(name, svc, addresses=(ip,))
    doc["endpoints"][0]["targetRef"] = {"kind": "Pod", "name": pod_name, "namespace": "default"}
    return doc


async def _server(world: World, proxies: list[Proxy]) -> tuple[DiscoveryServer, list[Connection]]:
    server = DiscoveryServer(world.store, world.mesh, Features.from_env({}))
    server.rebuild()
    conns = [Connection(p, "test", False) for p in proxies]
    for c in conns:
        server.register(c)
        watch = {T.CLUSTER: None, T.ENDPOINT: frozenset({REVIEWS, RATINGS}), T.LISTENER: None}
        await subscribe(server, c, watch)
    return server, conns


def _change(world: World, server: DiscoveryServer, doc: dict) -> None:
    ev = world.store.apply(parse_object(doc), source="test")
    server.push(push_request_for([ev], world.mesh.configmap_key))


async def test_recorded_once_per_generated_result_and_shared_by_its_proxies() -> None:
    world = World()
    world.apply(service("reviews"), service("ratings", cluster_ip="10.96.0.21"),
                endpoint_slice("reviews-1", "reviews"),
                endpoint_slice("ratings-1", "ratings", addresses=("10.1.0.2",)))
    replicas = [proxy(pod_name=f"app-{i}", ip=f"10.0.0.{i + 1}") for i in range(20)]
    server, conns = await _server(world, replicas)
    assert server.generated.misses == 3  # one CDS, one EDS, one LDS for twenty proxies
    for t in (T.CLUSTER, T.ENDPOINT, T.LISTENER):
        held = {id(server.held_deps(c, t)) for c in conns}
        assert len(held) == 1, f"{T.SHORT[t]}: one Deps object for every replica"


async def test_an_endpoint_change_pushes_only_the_load_assignments_that_read_it() -> None:
    world = World()
    world.apply(service("reviews"), service("ratings", cluster_ip="10.96.0.21"),
                _slice("reviews-1", "reviews", "10.1.0.1", "reviews-1"),
                _slice("ratings-1", "ratings", "10.1.0.2", "ratings-1"),
                pod("reviews-1", ip="10.1.0.1"), pod("ratings-1", ip="10.1.0.2"))
    plain, mtls = proxy(pod_name="plain-1"), _with_identity(proxy(pod_name="mtls-1", ip="10.0.0.2"))
    server, (c_plain, c_mtls) = await _server(world, [plain, mtls])
    _change(world, server, _slice("ratings-1", "ratings", "10.1.0.3", "ratings-1"))
    # Same Pod (so the same identities): EDS of ratings only, for the mTLS client too.
    assert pushed(server, c_plain) == {T.ENDPOINT: frozenset({RATINGS})}
    assert pushed(server, c_mtls) == {T.ENDPOINT: frozenset({RATINGS})}
    for c in (c_plain, c_mtls):
        await server.push_connection(c, c.take_push(), _discard)
    # A Pod with another service account behind ratings: the mTLS client's CDS (SANs) too.
    other = pod("ratings-2", ip="10.1.0.4")
    other["spec"]["serviceAccountName"] = "ratings-v2"
    world.apply(other)
    _change(world, server, _slice("ratings-1", "ratings", "10.1.0.4", "ratings-2"))
    assert pushed(server, c_plain) == {T.ENDPOINT: frozenset({RATINGS})}
    assert pushed(server, c_mtls) == {T.CLUSTER: None, T.ENDPOINT: None}


async def _discard(body: bytes) -> None:
    return None


def test_a_changed_service_meets_a_sidecar_scope_only_when_its_egress_names_it() -> None:
    world = World()
    world.apply({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                 "metadata": {"name": "s", "namespace": "default"},
                 "spec": {"egress": [{"hosts": ["./ratings.default.svc.cluster.local"]}]}})
    sidecar = world.ctx().sidecar_for("default", {})
    d = dep.Deps()
    d.scopes = [sidecar]
    seen = dep.Matcher(dep.Change(services=(("default", "ratings.default.svc.cluster.local"),)))
    hidden = dep.Matcher(dep.Change(services=(("default", "reviews.default.svc.cluster.local"),)))
    assert seen.meets(d) and not hidden.meets(d)


def test_push_scope_takes_the_whole_eds_along_with_cds() -> None:
    cds, eds = dep.Deps(), dep.Deps()
    cds.facets.add(dep.host("a"))
    eds.named = {"x": dep.Deps(), "y": dep.Deps()}
    eds.named["y"].facets.add(dep.slices("default", "y"))
    m = dep.Matcher(dep.Change(facets=frozenset({dep.slices("default", "y")})))
    held = {T.CLUSTER: cds, T.ENDPOINT: eds}
    assert dep.push_scope(m, held, T.CLUSTER, T.ENDPOINT) == {T.ENDPOINT: frozenset({"y"})}
    m = dep.Matcher(dep.Change(facets=frozenset({dep.host("a")})))
    assert dep.push_scope(m, held, T.CLUSTER, T.ENDPOINT) == {T.CLUSTER: None, T.ENDPOINT: None}
    # Nothing held yet for a watched type: it is pushed (its answer may still be on the way).
    assert dep.push_scope(m, {T.LISTENER: None}, T.CLUSTER, T.ENDPOINT) == {T.LISTENER: None}
    x, y = {T.ENDPOINT: frozenset({"x"})}, {T.ENDPOINT: frozenset({"y"}), T.LISTENER: None}
    merged = dep.merge_scopes(x, y)
    assert merged == {T.ENDPOINT: frozenset({"x", "y"}), T.LISTENER: None}
    assert dep.merge_scopes(None, {T.LISTENER: None}) is None
