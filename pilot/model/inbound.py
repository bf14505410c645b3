"""What a sidecar serves inbound: the ports its own workload listens on, and how each is secured.

Where the ports come from, as in istiod:
- a Sidecar that selects the proxy and has `ingress` listeners: exactly those (port, bind,
  captureMode, defaultEndpoint);
- otherwise the Services in the proxy's namespace whose selector matches its labels: each service
  port's target port (named target ports are resolved through the proxy's own endpoints).
Without a Sidecar ingress, only proxies with a mesh identity get inbound listeners: a proxy on
plaintext 15010 is a local/dev Envoy with no certificates, and binding its workload's ports could
collide with the app it runs next to.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pilot.config.core import EndpointSlice
from pilot.config.networking import ConnectionPoolSettings, Sidecar
from pilot.model.labels import selects
from pilot.model.protocol import Protocol, select_protocol
from pilot.model.proxy import Proxy
from pilot.model.security_policies import NO_POLICIES, WorkloadPolicies
from pilot.model.services import MeshService, ServicePort
from pilot.model.store import Entry

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class InboundPort:
    port: int  # where traffic for the workload arrives (the pod's port)
    protocol: Protocol
    endpoint: str  # where the app listens: "127.0.0.1:8080", "10.1.2.3:8080" or "unix:///path"
    bind: str  # address a NONE-mode listener binds; "" when it is reached through virtualInbound
    mtls: str  # STRICT, PERMISSIVE or DISABLE (what PeerAuthentication says for this port)
    origin: str  # Service/ns/name or Sidecar/ns/name, for debug views
    # The connection pool of this port's inbound cluster, as istiod's buildInboundCluster picks
    # it: the Sidecar's (its ingress listener's, else its inboundConnectionPool) over the one of
    # the DestinationRule for the service behind the port; None for none.
    pool: ConnectionPoolSettings | None = None
    # (host, name, namespace) of every Service that targets this port: the inbound cluster's
    # `istio.services` metadata, as istiod's (telemetry and istioctl read it).
    services: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class InboundPlan:
    ports: tuple[InboundPort, ...]
    mesh_tls: bool  # the proxy has certificates: TLS chains can be built
    policies: WorkloadPolicies = NO_POLICIES  # authn/authz filters in front of the app
    problems: tuple[str, ...] = ()  # ports that could not be served, and why


NO_INBOUND = InboundPlan((), False)


def _named_target(svc_port: ServicePort, slices: tuple[Entry[EndpointSlice], ...], ips: tuple[str, ...]) -> int | None:
    """A named targetPort is the port the proxy's own endpoint advertises under that name."""
    for entry in slices:
        s = entry.obj
        port = next((p.port for p in s.ports or () if p.name == svc_port.name and p.port), None)
        if port is not None and any(a in ips for ep in s.endpoints for a in ep.addresses):
            return port
    return None


def _endpoint_for(default_endpoint: str, port: int, proxy_ip: str) -> str:
    if not default_endpoint:
        return f"{LOCALHOST}:{port}"
    if default_endpoint.startswith("unix://"):
        return default_endpoint
    host, _, p = default_endpoint.rpartition(":")
    host = host.strip("[]")
    # 0.0.0.0 / :: mean "the workload's own address" (the app listens on the pod IP).
    if host in ("0.0.0.0", "::"):
        host = proxy_ip
    return f"{host}:{p}"


def _selecting(services: tuple[MeshService, ...], proxy: Proxy) -> list[MeshService]:
    return [svc for svc in services if svc.kind == "Service" and svc.namespace == proxy.namespace
            and svc.selector and selects(svc.selector, proxy.labels)]


def _service_on(services: list[MeshService], target: int) -> MeshService | None:
    """istiod's findOrCreateService: the first service selecting the workload whose port targets
    this port (its DestinationRule shapes a Sidecar ingress listener's cluster)."""
    for svc in services:
        for sp in svc.ports:
            t = sp.target_port if sp.target_port is not None else sp.port
            if t == target or (isinstance(t, str) and t.isdigit() and int(t) == target):
                return svc
    return None


def plan_inbound(proxy: Proxy, services: tuple[MeshService, ...], slices_of, sidecar: Entry[Sidecar] | None,
                 mtls_mode, mesh_tls: bool, policies: WorkloadPolicies = NO_POLICIES,
                 rule_pool=lambda svc, port: None, sniff: bool = True) -> InboundPlan:
    """`slices_of(svc)`: a service's EndpointSlice entries; `mtls_mode(port) -> str` the
    PeerAuthentication mode for one workload port; `rule_pool(svc, service_port)` the
    connection pool of the DestinationRule in force for that service port (inbound: the rule
    without a workloadSelector), or None. `sniff` (PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_INBOUND):
    ports naming no protocol stay UNSUPPORTED (sniffed), else they are TCP."""

    def proto(p: Protocol) -> Protocol:
        return Protocol.TCP if p.is_unsupported and not sniff else p

    ip = proxy.ip_addresses[0] if proxy.ip_addresses else LOCALHOST
    none_mode = proxy.interception_mode == "NONE"
    # The app behind a Service port, as istiod's inbound clusters reach it: its loopback,
    # [::1] for an IPv6-only proxy (actualLocalHosts[0]), else 127.0.0.1.
    loopback = "[::1]" if proxy.ip_families == (False, True) else LOCALHOST
    ports: dict[int, InboundPort] = {}
    problems: list[str] = []
    ingress = sidecar.obj.spec.ingress if sidecar is not None else []
    shared_pool = (sidecar.obj.spec.inbound_connection_pool
                   if sidecar is not None else None)
    if ingress:
        assert sidecar is not None  # ingress listeners come from it
        origin = f"Sidecar/{sidecar.key.namespace}/{sidecar.key.name}"
        mine = _selecting(services, proxy)
        for listener in ingress:
            p = listener.port
            assert p is not None  # required (IstioIngressListener._required)
            capture_none = listener.capture_mode == "NONE" or (listener.capture_mode in (None, "DEFAULT") and none_mode)
            bind = (listener.bind or ip) if capture_none else ""
            pool = listener.connection_pool or shared_pool
            if pool is None and (behind := _service_on(mine, p.number)) is not None:
                pool = rule_pool(behind, p.number)  # port-level settings by the listener's port, as istiod
            ports[p.number] = InboundPort(
                p.number, proto(select_protocol(p.name, p.protocol.lower() or None)),
                _endpoint_for(listener.default_endpoint, p.number, ip), bind, mtls_mode(p.number), origin, pool)
        return InboundPlan(tuple(ports[k] for k in sorted(ports)), mesh_tls, policies)
    if not mesh_tls:
        return NO_INBOUND
    for svc in _selecting(services, proxy):
        for sp in svc.ports:
            target = sp.target_port
            if target is None:
                target = sp.port
            elif isinstance(target, str):
                target = int(target) if target.isdigit() else _named_target(sp, slices_of(svc), proxy.ip_addresses)
                if target is None:
                    problems.append(f"{svc.origin} port {sp.port}: targetPort {sp.target_port!r} "
                                    "is not a port of this workload's endpoints")
                    continue
            here = (svc.hostname, svc.name, svc.namespace)
            if target in ports:
                # Several services may target one workload port: the first (by host) serves it,
                # every one of them is named in its metadata.
                if ports[target].origin.startswith("Service/") and here not in ports[target].services:
                    ports[target] = replace(ports[target], services=(*ports[target].services, here))
                continue
            if none_mode and ip == LOCALHOST:
                problems.append(f"{svc.origin} port {sp.port}: the workload address is {LOCALHOST}, where the app "
                                f"itself listens on {target}; give the proxy its own IP to serve it inbound")
                continue
            ports[target] = InboundPort(target, proto(sp.protocol), f"{loopback}:{target}",
                                        ip if none_mode else "", mtls_mode(target), svc.origin,
                                        shared_pool or rule_pool(svc, sp.port), (here,))
    return InboundPlan(tuple(ports[k] for k in sorted(ports)), mesh_tls, policies, tuple(problems))
