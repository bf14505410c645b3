"""EDS generator: a ClusterLoadAssignment for each requested outbound cluster."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import replace

from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.config.core import EndpointSlice, Node, Pod
from pilot.config.networking import DestinationRule, ServiceEntry, WorkloadEntry
from pilot.model.locality import LocalityLb, in_force
from pilot.model.mtls import MeshTls, client_mesh_tls
from pilot.model.networks import NetworkView
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.services import (
    MeshService,
    ServicePort,
    endpoints_for_port,
    merge_endpoints,
    service_entry_endpoints,
    workload_entry_endpoints,
)
from pilot.model.store import Entry
from pilot.networking import endpoints, names
from pilot.networking.traffic_policy import effective_policy
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators import waypoint
from pilot.xds.identity_memo import IdentityMemo
from pilot.xds.typeurls import ENDPOINT


def build_cla(cluster_name: str, port: ServicePort, slices: tuple[Entry[EndpointSlice], ...],
              subset_labels: tuple[tuple[str, str], ...] = (), pods: tuple[Entry[Pod], ...] = (),
              nodes: tuple[Entry[Node], ...] = (), lb: LocalityLb | None = None,
              workload_entries: tuple[Entry[WorkloadEntry], ...] = (),
              unhealthy: bool = False, dual_stack: bool = False, view: NetworkView | None = None,
              sni_dnat: str = "") -> endpoint_pb2.ClusterLoadAssignment:
    eps = endpoints_for_port(slices, port, subset_labels, pods, nodes, unhealthy, dual_stack)
    if workload_entries:  # a Kubernetes Service selecting WorkloadEntries (PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES)
        eps = merge_endpoints(eps, workload_entry_endpoints(port, workload_entries, subset_labels))
    return endpoints.cluster_load_assignment(cluster_name, eps, lb, view, sni_dnat)


def build_service_entry_cla(cluster_name: str, port: ServicePort, service_entry: Entry[ServiceEntry],
                            workload_entries: tuple[Entry[WorkloadEntry], ...], subset_labels: tuple[tuple[str, str], ...] = (),
                            lb: LocalityLb | None = None, pods: tuple[Entry[Pod], ...] = (),
                            nodes: tuple[Entry[Node], ...] = (), dual_stack: bool = False,
                            view: NetworkView | None = None, sni_dnat: str = "",
                            ) -> endpoint_pb2.ClusterLoadAssignment:
    return endpoints.cluster_load_assignment(cluster_name, service_entry_endpoints(
        service_entry, port, workload_entries, subset_labels, pods, nodes, dual_stack), lb, view, sni_dnat)


def proxy_inputs(ctx: PushContext, proxy: Proxy) -> Hashable | None:
    """What of a proxy EDS reads beyond its traits: its locality (and where it came from: the
    reads recorded are those of the proxy that generated a shared output) and labels, only
    while locality load balancing can apply somewhere; its network, only while the mesh has
    network gateways (otherwise every proxy shares one output)."""
    network = ctx.network_view(proxy) is not None
    if not ctx.locality_lb_in_use():
        return ("network", proxy.network) if network else None
    return (ctx.proxy_locality_source(proxy), tuple(sorted(proxy.labels.items())) if ctx.locality_reads_labels() else None,
            proxy.network if network else None)


def cds_proxy_inputs(ctx: PushContext, proxy: Proxy) -> Hashable | None:
    """CDS reads the client's locality only for DNS clusters whose endpoints have localities,
    and its network only for DNS clusters with endpoints on a network (split horizon)."""
    local = ctx.proxy_locality_source(proxy) if ctx.dns_locality_in_use() else None
    network = proxy.network if ctx.dns_networks_in_use() else None
    if network is None:
        return local
    return (local, ("network", network))


def locality_lb(ctx: PushContext, proxy: Proxy, dr: Entry[DestinationRule] | None, subset: str,
                port: int, labels: bool = True) -> LocalityLb | None:
    """The locality load balancing this client gets for one cluster, None for none (then the
    bytes are shared by every client: the proxy's locality is not in the cache key)."""
    policy = effective_policy(dr.obj.spec, subset, port) if dr is not None else None
    setting = in_force(ctx.settings.clusters.locality, policy["load_balancer"] if policy else None,
                       policy["outlier_detection"] if policy else None)
    if setting is None:
        return None
    client = ctx.proxy_locality(proxy)
    client_labels = tuple(sorted({**proxy.labels, **dict(client.topology_labels())}.items())) \
        if labels and setting.failover_priority else ()
    return LocalityLb(setting, client, client_labels)


_NO_SUBSETS: IdentityMemo[frozenset[str], bool] = IdentityMemo()


def reads_no_proxy(requested: frozenset[str] | None) -> bool:
    """Whether generate() leaves `proxy` unread for these names, so every proxy asking for them
    can share one output: only a subset reads it (which DestinationRule defines a subset depends
    on the client's namespace). Keep this in step with generate(). Remembered per name set:
    subscriptions are shared frozensets (see xds.connection.shared_names)."""
    if not requested:
        return True
    found = _NO_SUBSETS.get(requested)
    if found is None:
        found = _NO_SUBSETS.put(requested, not any(
            ((p := names.parse_cluster_name(n)) is not None and p[0] == "outbound" and p[2])
            or n.startswith(names.SNI_DNAT_PREFIX) for n in requested))
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
    # Read once for every name (it reads every DestinationRule): a rule change that turns
    # locality load balancing on or off regenerates the whole output.
    local = bool(requested) and ctx.locality_lb_in_use()
    for name in sorted(requested or ()):
        recording = ctx.begin_resource(name)
        try:
            res = _load_assignment(ctx, proxy, name, cache, local)
        finally:
            if recording:
                ctx.end_resource()
        if res is not None:
            yield res


def _load_assignment(ctx: PushContext, proxy: Proxy, name: str, cache: XdsCache,
                     local: bool = False) -> CachedResource | None:
    parsed = names.parse_cluster_name(name)
    sni_dnat = parsed is None and name.startswith(names.SNI_DNAT_PREFIX)
    if sni_dnat:
        parsed = names.parse_sni_dnat_name(name)
    if parsed is None or parsed[0] != "outbound":
        return waypoint.load_assignment(ctx, name, cache)  # a waypoint's inbound-vip cluster
    _, port_number, subset, host = parsed
    svc = ctx.service(host)
    port = svc.port(port_number) if svc else None
    if port is None or svc is None:
        return None
    # A subset's members are the endpoints whose Pods carry its labels; which subset
    # definition applies depends on the client's namespace (DestinationRule precedence). The
    # rule's locality settings too: read for every cluster while any could apply.
    dr = None
    labels: tuple[tuple[str, str], ...] = ()
    # Split-horizon EDS (the mesh has network gateways): the client's network, and whether the
    # cluster sends mTLS (the DestinationRule's tls, else auto mTLS): only mTLS crosses a gateway.
    view = ctx.network_view(proxy)
    if subset or local or view is not None or sni_dnat:
        dr = ctx.destination_rule(host, proxy.namespace, svc.namespace, proxy.labels)
    mtls = _mtls_mode(ctx, proxy, svc, port_number, dr, subset, sni_dnat) if view is not None or sni_dnat else ""
    if view is not None:
        view = replace(view, mtls=mtls)
    if subset:
        spec = next((s for s in dr.obj.spec.subsets if s.name == subset), None) if dr else None
        if spec is None or dr is None:
            return None
        labels = tuple(sorted(spec.labels.items()))
    lb = locality_lb(ctx, proxy, dr, subset, port_number) if local else None
    dr_origin = (f"DestinationRule/{dr.key.namespace}/{dr.key.name}",) if dr is not None else ()
    if svc.kind == "ServiceEntry":
        if svc.resolution != "STATIC":
            return None  # DNS and NONE clusters carry no EDS
        se = ctx.service_entry(svc)
        wes = ctx.selected_workload_entries(svc, se)  # from the namespace's label index
        se_pods = ctx.service_entry_pods(svc, se)
        origins = (svc.origin, *(f"WorkloadEntry/{w.key.namespace}/{w.key.name}" for w in wes),
                   *(f"Pod/{p.key.namespace}/{p.key.name}" for p in se_pods), *dr_origin)
        return cache.resource(ENDPOINT, name, build_service_entry_cla, name, port, se, wes, labels, lb,
                              se_pods, ctx.nodes_of(se_pods), ctx.settings.knobs.dual_stack, view,
                              mtls if sni_dnat else "", origins=origins)
    slices = ctx.service_slices(svc)
    # PILOT_SEND_UNHEALTHY_ENDPOINTS (not-ready endpoints too, marked UNHEALTHY) and ISTIO_DUAL_STACK
    # (one endpoint per Pod with both families' addresses): arguments, so part of the cache key.
    knobs = ctx.settings.knobs
    # Pods decide subset membership and each endpoint's tlsMode (auto mTLS); their Nodes the locality.
    pods = ctx.service_pods(svc)
    nodes = ctx.service_nodes(svc)
    wes = ctx.service_workload_entries(svc)
    origins = (svc.origin, *(f"EndpointSlice/{e.key.namespace}/{e.key.name}" for e in slices),
               *(f"Pod/{p.key.namespace}/{p.key.name}" for p in pods),
               *(f"WorkloadEntry/{w.key.namespace}/{w.key.name}" for w in wes), *dr_origin)
    return cache.resource(ENDPOINT, name, build_cla, name, port, slices, labels, pods, nodes, lb, wes,
                          knobs.send_unhealthy_endpoints, knobs.dual_stack, view, mtls if sni_dnat else "",
                          origins=origins)


def _mtls_mode(ctx: PushContext, proxy: Proxy, svc: MeshService, port: int, dr: Entry[DestinationRule] | None,
               subset: str, sni_dnat: bool = False) -> str:
    """How the client's cluster sends to these endpoints (what cds builds; istiod's mtlsChecker
    asks the same of the DestinationRule and PeerAuthentication): "always" (ISTIO_MUTUAL),
    "auto" (auto mTLS: endpoints whose tlsMode is istio), "never" (plaintext or other TLS, or a
    client without a mesh identity; for a router's sni-dnat cluster, what the mesh's clients send)."""
    if (not sni_dnat and not proxy.traits.mesh_tls) or svc.external_name:
        return "never"
    tls = effective_policy(dr.obj.spec, subset, port)["tls"] if dr is not None else None
    if svc.kind == "ServiceEntry":
        entry = ctx.service_entry(svc)
        eds = svc.resolution == "STATIC" and entry is not None and entry.obj.spec.location == "MESH_INTERNAL"
    else:
        eds = True
    return mode_of(client_mesh_tls(dr_tls_mode=tls.mode if tls is not None else None,
                                   auto_mtls=ctx.mesh.enable_auto_mtls, eds_cluster=eds,
                                   destination_mtls_disabled=ctx.destination_mtls_disabled(svc, port), sans=()))


def mode_of(mesh_tls: MeshTls | None) -> str:
    """A cluster's mesh TLS as NetworkView.mtls."""
    return "never" if mesh_tls is None else "auto" if mesh_tls.auto else "always"
