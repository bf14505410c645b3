"""A push context built from the previous one keeps its services and full view when no Service
changed (a third of a context build at 1,000 services), and builds them anew when a Service or
the sniffing knob changed: what a proxy is sent is the same as from a context built from scratch."""

from __future__ import annotations

from envoy.config.route.v3 import route_pb2
from google.protobuf import any_pb2

from pilot.model.mesh_settings import DEFAULT_KNOBS, GenerationKnobs
from pilot.model.push_context import PushContext
from pilot.xds.cache import XdsCache
from pilot.xds.generators import lds, rds

from .helpers import DOMAIN, World, endpoint_slice, mesh_configmap, proxy, service

HOST = f"web.default.svc.{DOMAIN}"
WEB = service("web", ports=[{"name": "web", "port": 8000, "targetPort": 8000}])  # names no protocol


def world() -> World:
    w = World()
    w.apply(WEB, endpoint_slice("web-1", "web", port=8000, port_name="web"),
            service("other", cluster_ip="10.96.0.21"))
    return w


def build(w: World, previous: PushContext | None, knobs: GenerationKnobs = DEFAULT_KNOBS) -> PushContext:
    w.mesh.refresh(w.store)
    w._seq += 1
    return PushContext.build(w.store, w.mesh.current, w.mesh.version, DOMAIN, f"v{w._seq}", previous, knobs=knobs)


def routed_hosts(ctx: PushContext, port: str) -> set[str]:
    """The domains of the route configuration `port` a sidecar is sent (a fresh cache: no reuse there)."""
    got = rds.generate(ctx, proxy(), frozenset({port}), XdsCache())
    if not got:
        return set()
    a = any_pb2.Any.FromString(got[0].any_bytes)
    rc = route_pb2.RouteConfiguration()
    assert a.Unpack(rc)
    return {d for vh in rc.virtual_hosts for d in vh.domains}


def output(ctx: PushContext) -> list[bytes]:
    cache = XdsCache()
    return [r.any_bytes for r in (*lds.generate(ctx, proxy(), None, cache),
                                  *rds.generate(ctx, proxy(), frozenset({"8000", "9080"}), cache))]


def test_unchanged_services_keep_the_view_and_the_output() -> None:
    w = world()
    first = build(w, None)
    w.apply(mesh_configmap({"connectTimeout": "7s"}))  # a full push that changes no Service
    second = build(w, first)
    assert second.services is first.services and second.full_view is first.full_view
    assert output(second) == output(build(w, None))  # what a context built from scratch sends


def test_changed_service_builds_a_new_view() -> None:
    w = world()
    first = build(w, None)
    assert HOST in routed_hosts(first, "8000")
    w.apply(service("web", ports=[{"name": "tcp-web", "port": 8000, "targetPort": 8000}]))  # now TCP
    second = build(w, first)
    assert second.full_view is not first.full_view
    assert HOST not in routed_hosts(second, "8000")
    assert output(second) == output(build(w, None))


def test_sniffing_knob_change_builds_a_new_view() -> None:
    w = world()
    first = build(w, None)
    assert HOST in routed_hosts(first, "8000")  # sniffed: HTTP routes too
    second = build(w, first, GenerationKnobs(sniff_outbound=False))
    assert HOST not in routed_hosts(second, "8000")  # plain TCP now, as from scratch
