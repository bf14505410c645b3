"""EDS generator: a ClusterLoadAssignment for each requested outbound cluster."""

from __future__ import annotations

import weakref
from collections.abc import Iterator

from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.config.core import EndpointSlice, Pod
from pilot.config.networking import ServiceEntry, WorkloadEntry
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.services import ServicePort, endpoints_for_port, service_entry_endpoints
from pilot.model.store import Entry
from pilot.networking import endpoints, names
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import waypoint
from pilot.xds.typeurls import ENDPOINT


def build_cla(cluster_name: str, port: ServicePort, slices: tuple[Entry[EndpointSlice], ...],
              subset_labels: tuple[tuple[str, str], ...] = (), pods: tuple[Entry[Pod], ...] = ()
              ) -> endpoint_pb2.ClusterLoadAssignment:
    return endpoints.cluster_load_assignment(cluster_name, endpoints_for_port(slices, port, subset_labels, pods))


def build_cla_with_unhealthy(cluster_name: str, port: ServicePort, slices: tuple[Entry[EndpointSlice], ...],
                             subset_labels: tuple[tuple[str, str], ...] = (), pods: tuple[Entry[Pod], ...] = ()
                             ) -> endpoint_pb2.ClusterLoadAssignment:
    """PILOT_SEND_UNHEALTHY_ENDPOINTS: not-ready endpoints too, marked UNHEALTHY."""
    return endpoints.cluster_load_assignment(cluster_name,
                                             endpoints_for_port(slices, port, subset_labels, pods, True))


def build_service_entry_cla(cluster_name: str, port: ServicePort, service_entry: Entry[ServiceEntry],
                            workload_entries: tuple[Entry[WorkloadEntry], ...], subset_labels: tuple[tuple[str, str], ...] = ()
                            ) -> endpoint_pb2.ClusterLoadAssignment:
    return endpoints.cluster_load_assignment(
        cluster_name, service_entry_endpoints(service_entry, port, workload_entries, subset_labels))


_NO_SUBSETS: weakref.WeakKeyDictionary[frozenset[str], bool] = weakref.WeakKeyDictionary()


def reads_no_proxy(requested: frozenset[str] | None) -> bool:
    """Whether generate() leaves `proxy` unread for these names, so every proxy asking for them
    can share one output: only a subset reads it (which DestinationRule defines a subset depends
    on the client's namespace). Keep this in step with generate(). Remembered per name set:
    subscriptions are shared frozensets (see xds.connection.shared_names)."""
    if not requested:
        return True
    found = _NO_SUBSETS.get(requested)
    if found is None:
        found = _NO_SUBSETS[requested] = not any(
            (p := names.parse_cluster_name(n)) is not None and p[0] == "outbound" and p[2] for n in requested)
    return found


def generate(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
             cache: XdsCache) -> list[CachedResource]:
    """Names that are not (or no longer) services are left out: for EDS that means "unknown",
    and CDS removes the cluster itself. What each name read is recorded apart (a push of an
    endpoint change regenerates only the ClusterLoadAssignments that read it)."""
    return list(resources(ctx, proxy, requested, cache))


def resources(ctx: PushContext, proxy: Proxy, requested: frozenset[str] | None,
              cache: XdsCache) -> Iterator[CachedResource]:
    """generate(), one resource at a time: between two, the caller may yield to the event
    loop (GenerationMemo slices a cold generation of a thousand clusters)."""
    for name in sorted(requested or ()):
        recording = ctx.begin_resource(name)
        try:
            res = _load_assignment(ctx, proxy, name, cache)
        finally:
            if recording:
                ctx.end_resource()
        if res is not None:
            yield res


def _load_assignment(ctx: PushContext, proxy: Proxy, name: str, cache: XdsCache) -> CachedResource | None:
    parsed = names.parse_cluster_name(name)
    if parsed is None or parsed[0] != "outbound":
        return waypoint.load_assignment(ctx, name, cache)  # a waypoint's inbound-vip cluster
    _, port_number, subset, host = parsed
    svc = ctx.service(host)
    port = svc.port(port_number) if svc else None
    if port is None or svc is None:
        return None
    if svc.kind == "ServiceEntry":
        if svc.resolution != "STATIC":
            return None  # DNS and NONE clusters carry no EDS
        se = ctx.service_entry(svc)
        wes = ctx.workload_entries(svc)
        labels: tuple[tuple[str, str], ...] = ()
        origins = (svc.origin, *(f"WorkloadEntry/{w.key.namespace}/{w.key.name}" for w in wes))
        if subset:
            dr = ctx.destination_rule(host, proxy.namespace, svc.namespace, proxy.labels)
            spec = next((s for s in dr.obj.spec.subsets if s.name == subset), None) if dr else None
            if spec is None or dr is None:
                return None
            labels = tuple(sorted(spec.labels.items()))
            origins += (f"DestinationRule/{dr.key.namespace}/{dr.key.name}",)
        return cache.resource(ENDPOINT, name, build_service_entry_cla, name, port, se, wes, labels,
                              origins=origins)
    slices = ctx.service_slices(svc)
    # PILOT_SEND_UNHEALTHY_ENDPOINTS: another builder, so another key (the builder is part of it).
    build = build_cla_with_unhealthy if ctx.settings.knobs.send_unhealthy_endpoints else build_cla
    # Pods decide subset membership and each endpoint's tlsMode (auto mTLS).
    pods = ctx.service_pods(svc)
    origins = (svc.origin, *(f"EndpointSlice/{e.key.namespace}/{e.key.name}" for e in slices),
               *(f"Pod/{p.key.namespace}/{p.key.name}" for p in pods))
    if not subset:
        return cache.resource(ENDPOINT, name, build, name, port, slices, (), pods, origins=origins)
    # A subset's members are the endpoints whose Pods carry its labels; which subset
    # definition applies depends on the client's namespace (DestinationRule precedence).
    dr = ctx.destination_rule(host, proxy.namespace, svc.namespace, proxy.labels)
    spec = next((s for s in dr.obj.spec.subsets if s.name == subset), None) if dr else None
    if spec is None or dr is None:
        return None
    labels = tuple(sorted(spec.labels.items()))
    return cache.resource(ENDPOINT, name, build, name, port, slices, labels, pods,
                          origins=(*origins, f"DestinationRule/{dr.key.namespace}/{dr.key.name}"))
