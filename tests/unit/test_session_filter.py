"""Envoy's stateful session filter is on an HCM only where a route it serves sets a session (an
HTTPRoute rule's sessionPersistence), not on every HCM (istiod adds its empty one only with
PILOT_ENABLE_PERSISTENT_SESSION_FILTER); adding the first mesh session pushes the sidecars'
listeners, as the recorded dependency says."""

from __future__ import annotations

from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from pilot.networking.filters import STATEFUL_SESSION_FILTER
from pilot.xds import typeurls as T
from tests.support.scoping import pushed
from tests.unit.test_dependencies import _change, _server

from .helpers import World, endpoint_slice, proxy, service

API = "gateway.networking.k8s.io"


def mesh_route(session: bool) -> dict:
    rule: dict = {"backendRefs": [{"name": "reviews", "port": 9080}]}
    if session:
        rule["sessionPersistence"] = {"sessionName": "sid"}
    return {"apiVersion": f"{API}/v1", "kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "default"},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "reviews", "port": 9080}],
                     "rules": [rule]}}


def http_filters(world: World, p) -> set[tuple[str, ...]]:
    """The HTTP filter names of every HCM in the proxy's listeners."""
    out = set()
    for r in world.lds(p).values():
        for chain in r.message(listener_pb2.Listener).filter_chains:
            for f in chain.filters:
                if f.typed_config.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
                    hcm = hcm_pb2.HttpConnectionManager()
                    f.typed_config.Unpack(hcm)
                    out.add(tuple(h.name for h in hcm.http_filters))
    return out


async def test_the_filter_comes_with_the_first_mesh_session_and_pushes_listeners() -> None:
    world = World()
    world.apply(service("reviews"), service("ratings", cluster_ip="10.96.0.21"),
                endpoint_slice("reviews-1", "reviews"), endpoint_slice("ratings-1", "ratings", addresses=("10.1.0.2",)),
                mesh_route(session=False))
    client = proxy(pod_name="client-1")
    filters = http_filters(world, client)
    assert filters and not any(STATEFUL_SESSION_FILTER in f for f in filters)

    server, (conn,) = await _server(world, [client])
    _change(world, server, mesh_route(session=True))
    assert T.LISTENER in pushed(server, conn)  # the listeners read whether any mesh route sets a session
    filters = http_filters(world, client)
    assert all(STATEFUL_SESSION_FILTER in f for f in filters), filters
