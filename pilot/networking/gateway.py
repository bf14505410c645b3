"""Router (ingress/egress gateway) listeners and routes, as istiod builds them for Gateways.

Two steps, both pure:
1. `listener_plan` turns a merged port (model/gateways.py) and the VirtualServices bound to its
   servers into a `ListenerPlan`: hashable data naming every filter chain, its SNI names, TLS
   settings, and its route configuration or TCP destinations. The plan is the whole input of
   step 2, so it is the cache key.
2. `gateway_listener(plan, settings)` and `gateway_route_config(...)` build the protos.

Listener shape (istiod's): `0.0.0.0_PORT` bound on 0.0.0.0:PORT (or the server's `bind`), where
PORT is the server's port, or the targetPort a Service selecting the router maps it to (80 ->
8080: gateways run without root), whatever the router's INTERCEPTION_MODE: a gateway binds its
ports itself, so 0.0.0.0 also serves tests that connect to 127.0.0.1 without root.
- HTTP servers: one chain, HCM with RDS `http.PORT`.
- HTTPS servers with tls SIMPLE/MUTUAL/OPTIONAL_MUTUAL: a chain per server matching the
  server's hosts as SNI (`*` matches any), a DownstreamTlsContext whose certificate comes over
  SDS from ADS (`kubernetes://CREDENTIAL`; for MUTUAL also `kubernetes://CREDENTIAL-cacert`), and
  an HCM with RDS `https.PORT.PORTNAME.GATEWAY.NAMESPACE`.
- HTTPS/TLS servers with ISTIO_MUTUAL: as SIMPLE, but with the router's own workload certificate
  and the mesh root from pilot-agent's SDS (`default`, `ROOTCA`), client certificate required;
  only for routers with a mesh identity.
- TLS servers in PASSTHROUGH: a chain per SNI of the bound VirtualServices' `tls` routes, to a
  tcp_proxy (with tls_inspector to read the SNI). TLS servers that terminate route `tcp` rules
  (or, for VirtualServices made from TLSRoutes, their `tls` rules, as istiod does).
- TLS servers in AUTO_PASSTHROUGH: a chain per `outbound_.PORT_.SUBSET_.HOST` SNI of the services
  the server's hosts match, to that cluster (istiod's sni-dnat for multi-network meshes).
- TCP servers: the first matching `tcp` route of the bound VirtualServices.
Chains with SNI names another chain already claimed keep only the unclaimed names (Envoy
rejects two chains with one match).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import wrappers_pb2

from pilot.config.mesh import HttpRetryPolicy
from pilot.config.networking import VirtualService
from pilot.config.networking.virtual_service import TCPRoute, TLSRoute
from pilot.model import credentials
from pilot.model.gateway_api.internal import PARENTS, SEMANTICS
from pilot.model.gateways import (
    Binding,
    PortView,
    ServerRef,
    config_origins,
    host_matches,
    http_route_name,
    https_route_name,
    more_specific,
    resolve_gateway_name,
)
from pilot.model.mesh_settings import ListenerSettings
from pilot.model.security_policies import NO_POLICIES, WorkloadPolicies
from pilot.model.services import MeshService
from pilot.model.store import Entry
from pilot.model.traffic import resolve_host
from pilot.networking import tls as istio_tls
from pilot.networking.filters import (
    TCP_PROXY_FILTER,
    access_logs,
    hcm_network_filter,
    http_connection_manager,
)
from pilot.networking.http_routes import RouteInputs, destination_cluster, virtual_service_routes
from pilot.networking.listeners import WILDCARD, add_ipv6_wildcard
from pilot.networking.metadata import config_path
from pilot.networking.policy_filters import TrustDomains, inbound_http_filters, inbound_network_filters
from pilot.networking.protos import ads_config_source, pack
from pilot.networking.routes import HashKey, _apply_hash_policies

TLS_INSPECTOR = "envoy.filters.listener.tls_inspector"
TLS_TRANSPORT_SOCKET = "envoy.transport_sockets.tls"
SDS_PREFIX, CA_SUFFIX = credentials.SDS_PREFIX, credentials.CA_SUFFIX
ALPN_HTTP = ("h2", "http/1.1")
AUTO_PASSTHROUGH_CHAIN = "sni-dnat|"  # chain-name prefix of AUTO_PASSTHROUGH servers' chains
_TLS_VERSIONS = {"TLS_AUTO": common_pb2.TlsParameters.TLS_AUTO, "TLSV1_0": common_pb2.TlsParameters.TLSv1_0,
                 "TLSV1_1": common_pb2.TlsParameters.TLSv1_1, "TLSV1_2": common_pb2.TlsParameters.TLSv1_2,
                 "TLSV1_3": common_pb2.TlsParameters.TLSv1_3}


def credential_resource_name(credential_name: str) -> str:
    return SDS_PREFIX + credential_name


# --- plans ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TlsPlan:
    mode: str  # SIMPLE, MUTUAL or OPTIONAL_MUTUAL
    credential: str  # SDS resource name of the certificate and key
    subject_alt_names: tuple[str, ...] = ()
    min_version: str = ""
    max_version: str = ""
    cipher_suites: tuple[str, ...] = ()
    alpn: tuple[str, ...] = ()
    verify_spki: tuple[str, ...] = ()  # client certificate pins (MUTUAL, OPTIONAL_MUTUAL)
    verify_hash: tuple[str, ...] = ()
    more_credentials: tuple[str, ...] = ()  # SDS names of further certificates (credentialNames)
    # The CA checking clients when not the credential's own (Gateway API spec.tls.frontend), and
    # whether untrusted client certificates are accepted (its AllowInsecureFallback).
    client_ca: str = ""
    accept_untrusted: bool = False


@dataclass(frozen=True, slots=True)
class ChainPlan:
    name: str
    server_names: tuple[str, ...]  # SNI; empty: any
    tls: TlsPlan | None = None
    route_name: str = ""  # an HCM fetching this route configuration, or:
    tcp: tuple[tuple[str, int], ...] = ()  # tcp_proxy to these (cluster, weight)


@dataclass(frozen=True, slots=True)
class ListenerPlan:
    name: str
    bind: str
    port: int
    chains: tuple[ChainPlan, ...]
    tls_inspector: bool
    origins: tuple[str, ...] = ()  # config objects the plan was made from (debugging only)


def _tls_plan(ref: ServerRef, alpn: tuple[str, ...]) -> TlsPlan:
    t = ref.server.tls
    names = list(t.credential_names) or [t.credential_name or ""]
    credential = "" if t.mode == "ISTIO_MUTUAL" else credential_resource_name(names[0])
    more = () if t.mode == "ISTIO_MUTUAL" else tuple(credential_resource_name(n) for n in names[1:])
    return TlsPlan(t.mode, credential, tuple(t.subject_alt_names),
                   t.min_protocol_version or "", t.max_protocol_version or "", tuple(t.cipher_suites), alpn,
                   tuple(t.verify_certificate_spki), tuple(t.verify_certificate_hash), more,
                   t.ca_cert_credential_name or "", getattr(t, "insecure_skip_verify", False))


def _rules_for_gateway(rules, gateway: str, namespace: str, port: int) -> list:
    """Rules whose matches apply on this gateway (a match's own `gateways` may narrow it)."""
    out = []
    for rule in rules:
        if not rule.match:
            out.append(rule)
            continue
        keep = [m for m in rule.match if _match_applies(m, gateway, namespace, port)]
        if len(keep) == len(rule.match):
            out.append(rule)
        elif keep:
            out.append(rule.model_copy(update={"match": keep}))
    return out


def _match_applies(m, gateway: str, namespace: str, port: int) -> bool:
    if getattr(m, "port", None) and m.port != port:
        return False
    gws = getattr(m, "gateways", None)
    if not gws:
        return True
    return any((r := resolve_gateway_name(g, namespace)) is not None and f"{r[0]}/{r[1]}" == gateway for g in gws)


_NO_RETRY_READ = HttpRetryPolicy()  # tcp/tls destinations read no retry policy (RouteInputs needs one)


def _targets(route, vs: Entry[VirtualService], port: int, domain: str,
             services: Mapping[str, MeshService]) -> tuple[tuple[str, int], ...]:
    inputs = RouteInputs(vs.key.namespace, domain, port, services, _NO_RETRY_READ)
    dests = list(route.route)
    if len(dests) == 1:
        return ((destination_cluster(dests[0].destination, inputs), 100),)
    return tuple((destination_cluster(d.destination, inputs), d.weight) for d in dests if d.weight > 0)


def _tcp_targets(ref: ServerRef, bindings: tuple[Binding, ...], domain: str,
                 services: Mapping[str, MeshService]) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]]:
    """The first `tcp` rule of the bound VirtualServices that applies to this server; for a
    VirtualService made from a TLSRoute (on a TLS listener that terminates: istiod's fallback),
    its first `tls` rule whose match applies by port and gateway (the SNI was the listener's to
    check when it chose the certificate)."""
    for b in bindings:
        vs = b.virtual_service
        spec = vs.obj.spec
        for rule in spec.tcp:
            if not rule.match or any(_match_applies(m, ref.gateway_name, vs.key.namespace, ref.port)
                                     for m in rule.match):
                return _targets(rule, vs, ref.port, domain, services), config_origins(vs)
        if vs.obj.metadata.annotations.get(PARENTS, "").startswith("TLSRoute/"):
            for rule in spec.tls:
                if any(_match_applies(m, ref.gateway_name, vs.key.namespace, ref.port) for m in rule.match):
                    return _targets(rule, vs, ref.port, domain, services), config_origins(vs)
    return (), ()


def listener_plan(pv: PortView, bindings: Callable[[ServerRef], tuple[Binding, ...]],
                  services: Mapping[str, MeshService], domain: str, mesh_tls: bool = False,
                  sni_clusters: Callable[[ServerRef], tuple[tuple[str, str], ...]] = lambda _ref: (),
                  ) -> tuple[ListenerPlan | None, list[str]]:
    """The listener for one merged port, or None when nothing can be served on it (Envoy
    rejects a listener without filter chains). Also returns why servers were left out.
    `mesh_tls`: the router has a mesh identity (its certificate serves ISTIO_MUTUAL servers);
    `sni_clusters(ref)`: (cluster, SNI) pairs an AUTO_PASSTHROUGH server forwards to."""
    skipped: list[str] = []
    chains: list[ChainPlan] = []
    origins: dict[str, None] = {ref.origin: None for ref in pv.servers}
    claimed: set[str] = set()
    catch_all = False
    suffix = pv.bind if pv.explicit_bind else ""

    def add(chain: ChainPlan, what: str) -> None:
        nonlocal catch_all
        if chain.server_names:
            names = tuple(n for n in chain.server_names if n not in claimed)
            if not names:
                skipped.append(f"{what}: SNI {', '.join(chain.server_names)} already served on port {pv.port}")
                return
            claimed.update(names)
            chain = ChainPlan(chain.name, names, chain.tls, chain.route_name, chain.tcp)
        else:
            if catch_all:
                skipped.append(f"{what}: port {pv.port} already has a chain for any SNI")
                return
            catch_all = True
        taken = {c.name for c in chains}
        if chain.name in taken:  # one tls rule matching two servers: keep chain names unique
            k = 2
            while f"{chain.name}#{k}" in taken:
                k += 1
            chain = ChainPlan(f"{chain.name}#{k}", chain.server_names, chain.tls, chain.route_name, chain.tcp)
        chains.append(chain)

    if pv.kind == "http":
        chains.append(ChainPlan(f"http.{pv.port}", (), route_name=http_route_name(pv.port, suffix)))
    for ref in pv.servers if pv.kind != "http" else ():
        what = f"Gateway {ref.gateway.key.namespace}/{ref.gateway.key.name} server {ref.server.port.name}"
        sni = () if "*" in ref.dns_hosts else ref.dns_hosts
        if ref.tls_mode == "ISTIO_MUTUAL" and not mesh_tls:
            skipped.append(f"{what}: ISTIO_MUTUAL needs the router's mesh certificate; run it with pilot-agent "
                           "(connected on the secure port 15012)")
            continue
        if pv.kind == "tls" and ref.auto_passthrough:
            # istiod's sni-dnat: mesh mTLS from another network, routed by the SNI sidecars set
            # (outbound_.PORT_.SUBSET_.HOST) to that cluster, without terminating it.
            pairs = sni_clusters(ref)
            if not pairs:
                skipped.append(f"{what}: AUTO_PASSTHROUGH server whose hosts match no service")
            for cluster, name in pairs:
                add(ChainPlan(f"{AUTO_PASSTHROUGH_CHAIN}{cluster}", (name,), tcp=((cluster, 100),)), what)
            continue
        if pv.kind == "tls" and ref.terminates_tls and ref.protocol == "https":
            name = https_route_name(ref, suffix)
            add(ChainPlan(name, sni, _tls_plan(ref, ALPN_HTTP), route_name=name), what)
        elif pv.kind == "tls" and ref.passthrough:
            found = False
            for b in bindings(ref):
                vs = b.virtual_service
                for i, rule in enumerate(vs.obj.spec.tls):
                    names: list[str] = []
                    for m in rule.match:
                        if not _match_applies(m, ref.gateway_name, vs.key.namespace, ref.port):
                            continue
                        for s in m.sni_hosts:
                            for sh in ref.hosts:
                                if sh.namespace in ("*", vs.key.namespace) and host_matches(sh.host, s):
                                    names.append(more_specific(s, sh.host))
                    if not names:
                        continue
                    found = True
                    origins.update(dict.fromkeys(config_origins(vs)))
                    names = list(dict.fromkeys(names))
                    add(ChainPlan(f"{vs.key.namespace}/{vs.key.name}/tls[{i}]", () if "*" in names else tuple(names),
                                  tcp=_targets(rule, vs, ref.port, domain, services)), what)
            if not found:
                skipped.append(f"{what}: PASSTHROUGH server with no VirtualService tls route for its hosts")
        else:  # TCP, or TLS terminated then TCP
            targets, vs_origins = _tcp_targets(ref, bindings(ref), domain, services)
            if not targets:
                skipped.append(f"{what}: no VirtualService tcp route for its hosts")
                continue
            origins.update(dict.fromkeys(vs_origins))
            tls = _tls_plan(ref, ()) if ref.terminates_tls else None
            add(ChainPlan(f"{ref.gateway_name}/{ref.server.port.name}", sni if tls else (), tls, tcp=targets), what)
    if not chains:
        return None, skipped
    inspector = pv.kind == "tls"
    return ListenerPlan(pv.listener_name, pv.bind, pv.port, tuple(chains), inspector, tuple(origins)), skipped


# --- protos -----------------------------------------------------------------------------------
def sds_secret_config(name: str) -> secret_pb2.SdsSecretConfig:
    return secret_pb2.SdsSecretConfig(name=name, sds_config=ads_config_source())


def downstream_tls_context(tls: TlsPlan) -> tls_pb2.DownstreamTlsContext:
    params = common_pb2.TlsParameters(
        tls_minimum_protocol_version=_TLS_VERSIONS.get(tls.min_version, common_pb2.TlsParameters.TLSv1_2))
    if tls.max_version:
        params.tls_maximum_protocol_version = _TLS_VERSIONS[tls.max_version]
    params.cipher_suites.extend(tls.cipher_suites)
    if tls.mode == "ISTIO_MUTUAL":
        # The router's own workload certificate and the mesh root, from pilot-agent's SDS.
        ctx = istio_tls.istio_downstream_tls(bool(tls.alpn), tls.subject_alt_names, tls.alpn)
        ctx.common_tls_context.tls_params.CopyFrom(params)
        return ctx
    certificates = [sds_secret_config(n) for n in (tls.credential, *tls.more_credentials)]
    common = tls_pb2.CommonTlsContext(tls_params=params, alpn_protocols=list(tls.alpn),
                                      tls_certificate_sds_secret_configs=certificates)
    ctx = tls_pb2.DownstreamTlsContext(common_tls_context=common)
    if tls.mode in ("MUTUAL", "OPTIONAL_MUTUAL"):
        default = common_pb2.CertificateValidationContext()
        for san in tls.subject_alt_names:
            default.match_typed_subject_alt_names.add(
                san_type=common_pb2.SubjectAltNameMatcher.URI if "://" in san else common_pb2.SubjectAltNameMatcher.DNS,
                matcher=string_pb2.StringMatcher(exact=san))
        default.verify_certificate_spki.extend(tls.verify_spki)
        default.verify_certificate_hash.extend(tls.verify_hash)
        if tls.accept_untrusted:
            default.trust_chain_verification = common_pb2.CertificateValidationContext.ACCEPT_UNTRUSTED
        ctx.common_tls_context.combined_validation_context.CopyFrom(tls_pb2.CommonTlsContext.CombinedCertificateValidationContext(
            default_validation_context=default,
            validation_context_sds_secret_config=sds_secret_config(tls.client_ca or tls.credential + CA_SUFFIX)))
        ctx.require_client_certificate.CopyFrom(wrappers_pb2.BoolValue(value=tls.mode == "MUTUAL"))
    return ctx


def _tcp_proxy(stat_prefix: str, targets: tuple[tuple[str, int], ...],
               settings: ListenerSettings) -> listener_components_pb2.Filter:
    tp = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix, access_log=access_logs(settings))
    if len(targets) == 1:
        tp.cluster = targets[0][0]
    else:
        for cluster, weight in targets:
            tp.weighted_clusters.clusters.add(name=cluster, weight=weight)
    return listener_components_pb2.Filter(name=TCP_PROXY_FILTER, typed_config=pack(tp))


def gateway_listener(plan: ListenerPlan, settings: ListenerSettings,
                     policies: WorkloadPolicies = NO_POLICIES, trust_domains: TrustDomains = "cluster.local",
                     xff_num_trusted_hops: int = 0) -> listener_pb2.Listener:
    """`policies`: the AuthorizationPolicies and RequestAuthentications selecting the router, put
    on every chain as istiod does (HTTP filters in front of the router, network RBAC in front of
    tcp_proxy for TCP and TLS passthrough), except AUTO_PASSTHROUGH chains: istiod builds those
    without authorization (the mesh mTLS passes through; the destination's sidecar checks it).
    `xff_num_trusted_hops`: ProxyConfig gatewayTopology.numTrustedProxies, which decides the
    address `remoteIpBlocks` (Envoy's remote_ip) sees: the peer, or that many hops back in
    X-Forwarded-For; `ipBlocks` always sees the peer."""
    http_security = tuple(inbound_http_filters(policies, trust_domains)) if not policies.empty else ()
    tcp_security = tuple(inbound_network_filters(policies, trust_domains)) if not policies.empty else ()
    listener = listener_pb2.Listener(
        name=plan.name, traffic_direction=base_pb2.OUTBOUND,
        address=address_pb2.Address(socket_address=address_pb2.SocketAddress(address=plan.bind,
                                                                             port_value=plan.port)))
    if settings.dual_stack and plan.bind == WILDCARD:
        add_ipv6_wildcard(listener)  # ISTIO_DUAL_STACK, dual-stack router: [::]:PORT too, as istiod's extraBind
    if plan.tls_inspector:
        listener.listener_filters.add(name=TLS_INSPECTOR, typed_config=pack(tls_inspector_pb2.TlsInspector()))
    for c in plan.chains:
        chain = listener.filter_chains.add(name=c.name)
        if c.server_names:
            chain.filter_chain_match.server_names.extend(c.server_names)
        if c.tls is not None:
            chain.transport_socket.CopyFrom(base_pb2.TransportSocket(
                name=TLS_TRANSPORT_SOCKET, typed_config=pack(downstream_tls_context(c.tls))))
        if c.route_name:
            hcm = http_connection_manager(f"outbound_{plan.bind}_{plan.port}", c.route_name, settings, plan.port,
                                          http_security)
            hcm.use_remote_address.CopyFrom(wrappers_pb2.BoolValue(value=True))  # the edge: trust no XFF
            hcm.xff_num_trusted_hops = xff_num_trusted_hops  # ... beyond the hops the topology declares
            chain.filters.append(hcm_network_filter(hcm))
        else:
            if not c.name.startswith(AUTO_PASSTHROUGH_CHAIN):
                chain.filters.extend(tcp_security)
            chain.filters.append(_tcp_proxy(f"outbound_{plan.bind}_{plan.port}", c.tcp, settings))
    return listener


@dataclass(frozen=True, slots=True)
class VhostSource:
    """A VirtualService routing for some hosts of a server (in server order, oldest first)."""

    gateway: str  # NAMESPACE/NAME of the server's Gateway (match-level `gateways` filter)
    virtual_service: Entry[VirtualService]
    hosts: tuple[str, ...]
    require_tls: bool  # the server's tls.httpsRedirect


def _domains(host: str) -> list[str]:
    """istiod's gateway domains: the host alone, with the route configuration set to ignore the
    port in Host (`ignore_port_in_host_matching`), so `HOST:ANY-PORT` matches as well: clients
    behind a load balancer or port-forward send ports the router's listener does not have."""
    return [host]


def gateway_route_config(name: str, port: int, sources: tuple[VhostSource, ...], retry: HttpRetryPolicy,
                         services: tuple[MeshService, ...], domain: str,
                         hash_policies: tuple[tuple[str, HashKey], ...] = (), client_namespace: str = "",
                         client_labels: tuple[tuple[str, str], ...] = ()) -> route_pb2.RouteConfiguration:
    """One virtual host per (VirtualService x server) host, `HOST:PORT`. Two VirtualServices
    for one host: the older one's routes first (istiod merges them). No host at all: istiod's
    `blackhole:PORT`, which answers 404 like Envoy does for an unknown host. `client_namespace`
    and `client_labels` are the router's: matches on sourceNamespace/sourceLabels test them."""
    by_host = {s.hostname: s for s in services}
    vhosts: dict[str, route_components_pb2.VirtualHost] = {}
    contributed: set = set()
    for src in sources:
        vs = src.virtual_service
        rules = _rules_for_gateway(vs.obj.spec.http, src.gateway, vs.key.namespace, port)
        if not rules:
            continue
        gateway_api = vs.obj.metadata.annotations.get(SEMANTICS) == "gateway"
        routes = virtual_service_routes(rules, RouteInputs(vs.key.namespace, domain, port, by_host, retry,
                                                           client_namespace, dict(client_labels),
                                                           gateway_semantics=gateway_api,
                                                           tls=name.startswith("https."),
                                                           config=config_path(vs.key.kind, vs.key.namespace,
                                                                              vs.key.name)))
        for host in src.hosts:
            if (host, vs.key) in contributed:
                continue
            contributed.add((host, vs.key))
            vh = vhosts.get(host)
            if vh is None:
                vh = route_components_pb2.VirtualHost(name=f"{host}:{port}", domains=_domains(host))
                if src.require_tls:
                    vh.require_tls = route_components_pb2.VirtualHost.ALL
                vhosts[host] = vh
            vh.routes.extend(routes)
    rc = route_pb2.RouteConfiguration(name=name, validate_clusters=wrappers_pb2.BoolValue(value=False),
                                      ignore_port_in_host_matching=True)
    if not vhosts:
        rc.virtual_hosts.add(name=f"blackhole:{port}", domains=["*"])
    for host in sorted(vhosts):
        rc.virtual_hosts.append(vhosts[host])
    if hash_policies:
        _apply_hash_policies(rc, dict(hash_policies))
    return rc


def referenced_hosts(virtual_services: tuple[Entry[VirtualService], ...], domain: str) -> set[str]:
    """Every destination host (resolved) a set of VirtualServices routes to."""
    out: set[str] = set()
    for vs in virtual_services:
        spec = vs.obj.spec
        for rule in spec.http:
            for d in rule.route:
                out.add(resolve_host(d.destination.host, vs.key.namespace, domain))
            if rule.mirror is not None:
                out.add(resolve_host(rule.mirror.host, vs.key.namespace, domain))
            for m in rule.mirrors:
                out.add(resolve_host(m.destination.host, vs.key.namespace, domain))
        l4: list[TCPRoute | TLSRoute] = [*spec.tcp, *spec.tls]
        for rule in l4:
            for d in rule.route:
                out.add(resolve_host(d.destination.host, vs.key.namespace, domain))
    return out


# --- secrets (SDS) ----------------------------------------------------------------------------
def tls_certificate_secret(name: str, cert_chain: bytes, private_key: bytes) -> secret_pb2.Secret:
    s = secret_pb2.Secret(name=name)
    s.tls_certificate.certificate_chain.inline_bytes = cert_chain
    s.tls_certificate.private_key.inline_bytes = private_key
    return s


def validation_context_secret(name: str, ca_bundle: bytes) -> secret_pb2.Secret:
    s = secret_pb2.Secret(name=name)
    s.validation_context.trusted_ca.inline_bytes = ca_bundle
    return s
