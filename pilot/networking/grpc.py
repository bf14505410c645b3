"""Proxyless gRPC (istiod's grpcgen): clients' API listeners, per-target route configs and
clusters; xDS-enabled servers' inbound listeners (RBAC, mTLS through certificate providers).

grpcio's xDS client names every resource: LDS/RDS `host:port` (the target, possibly a short
alias), then the clusters those routes name. istiod's grpcgen builds the route config with the
same virtual-host code as a sidecar's (VirtualService matches, weighted destinations, subsets,
fault injection, retries) and relies on grpc to skip what it does not implement. This module
does the same, then adapts each route to what grpcio reads (gRFC A28 routing, A31 timeouts,
A33 fault injection, A44 retries):

- grpc ignores a route's `timeout`: a VirtualService timeout is also written as
  `max_stream_duration`, which grpc applies as the call deadline (istiod's setTimeout does the
  same for proxyless clients);
- `typed_per_filter_config` may only name filters grpc implements (fault, RBAC): anything
  else (CORS) makes grpc NACK the whole route config, so it is not sent; CORS is a browser
  concern with no meaning to a gRPC client.

Everything else stays as istiod sends it. grpc reads of a retry policy only `retry_on`'s gRPC
status conditions (cancelled, deadline-exceeded, internal, resource-exhausted, unavailable),
`num_retries` and `retry_back_off`, and ignores the HTTP conditions and host predicates; it
ignores header rewrites and mirrors, skips routes with query-parameter matches, and fails RPCs
matching a redirect or direct response (as istiod's clients see).
"""

from __future__ import annotations

from collections.abc import Mapping

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_components_pb2, listener_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2 as tls_common_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import wrappers_pb2

from pilot.config.networking import VirtualService
from pilot.model.mesh_settings import RouteSettings
from pilot.model.security_policies import WorkloadPolicies
from pilot.model.services import TLS_MODE_LABEL, MeshService
from pilot.model.store import Entry
from pilot.networking import authz
from pilot.networking.filters import fault_filter, router_filter
from pilot.networking.http_routes import FAULT_FILTER, RouteInputs, virtual_service_routes
from pilot.networking.metadata import config_path
from pilot.networking.protos import ads_config_source, pack
from pilot.networking.routes import HashKey, apply_hash_policies, service_domains, service_virtual_host

# Per-route filter configs grpc accepts; any other makes it NACK the RouteConfiguration.
_GRPC_ROUTE_FILTERS = frozenset({FAULT_FILTER, "envoy.filters.http.rbac"})


def api_listener(name: str, hostname: str, port: int) -> listener_pb2.Listener:
    """An API listener answering under the name the client asked for (possibly a short alias),
    whose HCM fetches the same-named route config. The fault filter is inert until a route
    configures it (istiod's grpcgen sends fault + router)."""
    hcm = hcm_pb2.HttpConnectionManager(
        rds=hcm_pb2.Rds(config_source=ads_config_source(), route_config_name=name),
        http_filters=[fault_filter(), router_filter()],
    )
    del hostname, port  # part of the cache key: the resolved service, not only the name asked for
    return listener_pb2.Listener(name=name, api_listener=api_listener_pb2.ApiListener(api_listener=pack(hcm)))


def route_config(route_name: str, svc: MeshService, port: int, settings: RouteSettings,
                 vs: Entry[VirtualService] | None, all_services: tuple[MeshService, ...], domain: str,
                 client_namespace: str, client_labels: tuple[tuple[str, str], ...],
                 hash_policies: tuple[tuple[str, HashKey], ...] = ()) -> route_pb2.RouteConfiguration:
    """One virtual host matching every name of the service: the VirtualService's routes that
    apply to this port and client, else the default route (with the mesh's default retries,
    as istiod's). `hash_policies`: (cluster, key) of destinations hashing consistently; grpc
    hashes on a header key and ignores the other kinds (gRFC A42)."""
    host = route_name.rpartition(":")[0]
    domains = list(dict.fromkeys([host, route_name, *service_domains(svc, port, svc.namespace)]))
    vs_routes = None
    if vs is not None:
        inputs = RouteInputs(vs.key.namespace, domain, port, {s.hostname: s for s in all_services}, settings.retry,
                             client_namespace, dict(client_labels), sidecar=True,
                             config=config_path(vs.key.kind, vs.key.namespace, vs.key.name))
        vs_routes = virtual_service_routes(vs.obj.spec.http, inputs)
    vh = service_virtual_host(svc, port, domains, settings, vs_routes)
    for route in vh.routes:
        _adapt(route)
    out = route_pb2.RouteConfiguration(name=route_name, virtual_hosts=[vh])
    if hash_policies:
        apply_hash_policies(out, dict(hash_policies))
    return out


def _adapt(route: rc.Route) -> None:
    for filter_name in list(route.typed_per_filter_config):
        if filter_name not in _GRPC_ROUTE_FILTERS:
            del route.typed_per_filter_config[filter_name]
    if not route.HasField("route"):
        return
    action = route.route
    if action.timeout.seconds or action.timeout.nanos:
        # (the timeout itself stays, as istiod sends it: grpc ignores it)
        action.max_stream_duration.max_stream_duration.CopyFrom(action.timeout)


# --- server side (gRFC A36: xDS-enabled servers) --------------------------------------------
# istio-agent's grpc bootstrap sets server_listener_resource_name_template to this prefix + "%s";
# grpc fills in the address it listens on (`0.0.0.0:PORT`, `[::]:PORT`).
SERVER_LISTENER_PREFIX = "xds.istio.io/grpc/lds/inbound/"
RBAC_DENY_FILTER = "envoy.filters.http.rbac.DENY"  # grpc refuses two filters of one name
TLS_SOCKET = "envoy.transport_sockets.tls"


def server_address(name: str) -> tuple[str, int] | None:
    """(host, port) of a server listener name; None unless it is one. IPv6 hosts come bracketed."""
    if not name.startswith(SERVER_LISTENER_PREFIX):
        return None
    host, sep, port = name[len(SERVER_LISTENER_PREFIX):].rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


def _rbac_filters(policies: WorkloadPolicies, trust_domains: tuple[str, ...]) -> list[hcm_pb2.HttpFilter]:
    """istiod's grpcgen: a DENY filter, then an ALLOW filter (grpc implements only those two
    actions). Differences, each on the closed side: a CUSTOM policy (grpc has no ext_authz) denies
    every request, as istiod's sidecars do for a CUSTOM policy they cannot apply; dry-run
    policies are never enforced and grpc has no shadow rules, so they are not sent; AUDIT policies
    only log (no RBAC LOG action in grpc) and are not sent."""
    deny = tuple(e for e in policies.deny if not authz.is_dry_run(e))
    allow = tuple(e for e in policies.allow if not authz.is_dry_run(e))
    out = []
    deny_rules, _ = authz.rbac_rules(deny, rbac_pb2.RBAC.DENY, False, trust_domains) if deny else (None, None)
    if policies.custom:
        deny_rules = deny_rules or rbac_pb2.RBAC(action=rbac_pb2.RBAC.DENY)
        deny_rules.policies[authz.CUSTOM_DENY_ALL].CopyFrom(authz.MATCH_ALL)
    if deny_rules is not None and deny_rules.policies:
        out.append(hcm_pb2.HttpFilter(name=RBAC_DENY_FILTER, typed_config=pack(http_rbac_pb2.RBAC(rules=deny_rules))))
    if allow:
        allow_rules, _ = authz.rbac_rules(allow, rbac_pb2.RBAC.ALLOW, False, trust_domains)
        out.append(hcm_pb2.HttpFilter(name=authz.HTTP_RBAC_FILTER,
                                      typed_config=pack(http_rbac_pb2.RBAC(rules=allow_rules))))
    return out


def common_tls_context(sans: tuple[str, ...] = ()) -> tls_pb2.CommonTlsContext:
    """Certificates from the bootstrap's `default` certificate provider (istio-agent writes a
    file_watcher one): `default` for the workload's own, `ROOTCA` for the roots (istiod's names)."""
    validation = tls_common_pb2.CertificateValidationContext(
        ca_certificate_provider_instance=tls_common_pb2.CertificateProviderPluginInstance(
            instance_name="default", certificate_name="ROOTCA"))
    # grpc checks match_subject_alt_names (gRFC A29), as istiod sends it; the typed form is Envoy's.
    validation.match_subject_alt_names.extend(string_pb2.StringMatcher(exact=san) for san in sans)
    return tls_pb2.CommonTlsContext(
        tls_certificate_provider_instance=tls_common_pb2.CertificateProviderPluginInstance(
            instance_name="default", certificate_name="default"),
        validation_context=validation)


def server_listener(name: str, host: str, port: int, policies: WorkloadPolicies, trust_domains: tuple[str, ...],
                    mtls: bool) -> listener_pb2.Listener:
    """One filter chain (grpc's filter chain matching cannot tell TLS from plaintext, so PERMISSIVE
    is not expressible: see server_mtls) whose HCM carries an inline route config with a
    non-forwarding route (what a server's HCM must hold), the RBAC filters and the router."""
    suffix = "mtls" if mtls else "plaintext"
    hcm = hcm_pb2.HttpConnectionManager(
        route_config=route_pb2.RouteConfiguration(name="inbound", virtual_hosts=[rc.VirtualHost(
            name="inbound", domains=["*"], routes=[rc.Route(match=rc.RouteMatch(prefix="/"),
                                                            non_forwarding_action=rc.NonForwardingAction())])]),
        http_filters=[*_rbac_filters(policies, trust_domains), router_filter()])
    chain = listener_components_pb2.FilterChain(
        name=f"inbound-{suffix}",
        filters=[listener_components_pb2.Filter(name=f"inbound-hcm{suffix}", typed_config=pack(hcm))])
    if mtls:
        chain.transport_socket.name = TLS_SOCKET
        chain.transport_socket.typed_config.CopyFrom(pack(tls_pb2.DownstreamTlsContext(
            common_tls_context=common_tls_context(), require_client_certificate=wrappers_pb2.BoolValue(value=True))))
    return listener_pb2.Listener(
        name=name, address=address_pb2.Address(socket_address=address_pb2.SocketAddress(address=host, port_value=port)),
        filter_chains=[chain])


def server_mtls(mode: str, labels: Mapping[str, str]) -> bool:
    """istiod's grpcgen: STRICT serves mTLS only; PERMISSIVE serves plaintext, except on a
    workload labelled for auto mTLS (`security.istio.io/tlsMode: istio`), whose clients will
    send mTLS: there it is STRICT. DISABLE (and anything unknown) is plaintext."""
    if mode == "PERMISSIVE" and labels.get(TLS_MODE_LABEL) == "istio":
        return True
    return mode == "STRICT"


# --- clusters ---------------------------------------------------------------------------------
def cluster(name: str, istio_mutual: bool, sans: tuple[str, ...], ring_hash: int | None = None
            ) -> cluster_pb2.Cluster:
    """istiod's grpcgen cluster: EDS over ADS, round robin, and mTLS only where the
    DestinationRule asks for ISTIO_MUTUAL (grpc cannot tell whether a server speaks it: a
    PERMISSIVE server's plaintext side cannot be reached with TLS, so there is no auto mTLS).
    The certificates come from the bootstrap's `default` certificate provider; the server's
    identity must be one of `sans` (the service's accounts, or the rule's subjectAltNames).
    `ring_hash`: the rule's consistent hash (its minimum ring size, 0 for grpc's default) makes
    the cluster RING_HASH (gRFC A42; the route carries the hash policy), None keeps round robin."""
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS, lb_policy=cluster_pb2.Cluster.ROUND_ROBIN)
    if ring_hash is not None:
        c.lb_policy = cluster_pb2.Cluster.RING_HASH
        if ring_hash:
            c.ring_hash_lb_config.minimum_ring_size.value = ring_hash
    c.eds_cluster_config.service_name = name
    c.eds_cluster_config.eds_config.CopyFrom(ads_config_source())
    if istio_mutual:
        c.transport_socket.name = TLS_SOCKET
        c.transport_socket.typed_config.CopyFrom(pack(tls_pb2.UpstreamTlsContext(
            common_tls_context=common_tls_context(sans))))
    return c
