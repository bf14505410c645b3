"""Gateways (networking.istio.io) as router proxies see them: which Gateways select a router,
how their servers merge into listeners per port, and which VirtualServices each server routes.

Pure model code, as istiod's MergeGateways and VirtualServicesForGateway:
- A Gateway applies to a router whose labels include its `selector` (an empty selector applies
  to every router), in any namespace (istiod's default PILOT_SCOPE_GATEWAY_TO_NAMESPACE=false; set,
  only routers of the Gateway's namespace),
  except the Gateways generated from Gateway API Gateways (model/gateway_api), which apply only
  to routers in their own namespace (`select_for`).
- Servers are grouped by (bind, port), oldest Gateway first. Plain-text HTTP servers on a port
  share one route configuration `http.PORT`; TLS-class servers (HTTPS, TLS) share one listener,
  told apart by SNI, each terminating HTTPS server with its own route configuration
  `https.PORT.PORTNAME.GATEWAY.NAMESPACE`. A server that cannot join its port (another protocol
  class got there first) or cannot be served (AUTO_PASSTHROUGH on HTTPS) is skipped with a
  reason. ISTIO_MUTUAL servers need the router's own mesh certificate, which only a router with
  a mesh identity has (decided per router when its listeners are built).
- A VirtualService is bound to a Gateway when its `gateways` name it (`NAMESPACE/NAME`, or a
  bare `NAME` in the VirtualService's namespace, or the legacy `NAME.NAMESPACE.svc...` form);
  it routes for a server when it is exported to the router's namespace and one of its hosts
  intersects one of the server's hosts (`ns/host`: only VirtualServices from `ns`; `*/host`,
  `./host` (the Gateway's namespace) and a bare host as in istiod).

Everything here is hashable and built from Store Entries, so builders can key caches on it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from pilot.config.core import Secret
from pilot.config.networking import Gateway, VirtualService
from pilot.config.networking.common import MESH_GATEWAY
from pilot.config.networking.validation import host_matches  # istio host.Name.Matches
from pilot.model.credentials import CertificateAndKey, CredentialError, ca_bundle, certificate_and_key
from pilot.model.export_to import exported_to
from pilot.model.gateway_api.internal import PARENTS, SCOPE
from pilot.model.labels import selects
from pilot.model.store import Entry, Store
from pilot.model.traffic import resolve_host

WILDCARD_BIND = "0.0.0.0"
_HTTP = {"http", "http2", "grpc", "grpc-web", "http_proxy"}
_TLS = {"https", "tls"}
TERMINATING_MODES = ("SIMPLE", "MUTUAL", "OPTIONAL_MUTUAL", "ISTIO_MUTUAL")

PortKind = Literal["http", "tls", "tcp"]


def _age(e: Entry) -> tuple:
    """Oldest first (creationTimestamp, then namespace/name), as istiod orders configs."""
    return (e.obj.metadata.creation_timestamp, e.key.namespace, e.key.name)


def config_origins(e: Entry) -> tuple[str, ...]:
    """The config objects an Entry stands for, as debug views and NACK reports name them: itself,
    or for one generated from Gateway API objects, those objects."""
    parents = e.obj.metadata.annotations.get(PARENTS)
    if parents:
        return tuple(parents.split(","))
    return (f"{e.key.kind}/{e.key.namespace}/{e.key.name}",)


def more_specific(a: str, b: str) -> str:
    """Of two matching hosts, the one naming fewer hosts (what both match)."""
    if not a.startswith("*"):
        return a
    if not b.startswith("*"):
        return b
    return a if len(a) >= len(b) else b


@dataclass(frozen=True, slots=True)
class ServerHost:
    namespace: str  # "*" (any namespace) or the namespace whose VirtualServices may use it
    host: str  # DNS name, possibly a wildcard


@dataclass(frozen=True, slots=True)
class ServerRef:
    """One server of one Gateway. Hashable by the Gateway Entry (key, revision) and the index."""

    gateway: Entry[Gateway]
    index: int

    @property
    def server(self):
        return self.gateway.obj.spec.servers[self.index]

    @property
    def gateway_name(self) -> str:
        """`NAMESPACE/NAME`, as VirtualServices name their gateways."""
        return f"{self.gateway.key.namespace}/{self.gateway.key.name}"

    @property
    def origin(self) -> str:
        return config_origins(self.gateway)[0]

    @property
    def protocol(self) -> str:
        return self.server.port.protocol.lower()

    @property
    def port(self) -> int:
        return self.server.port.number

    @property
    def tls_mode(self) -> str:
        tls = self.server.tls
        return tls.mode if tls is not None else ""

    @property
    def terminates_tls(self) -> bool:
        return self.protocol in _TLS and self.tls_mode in TERMINATING_MODES

    @property
    def passthrough(self) -> bool:
        return self.protocol in _TLS and self.tls_mode == "PASSTHROUGH"

    @property
    def auto_passthrough(self) -> bool:
        return self.protocol == "tls" and self.tls_mode == "AUTO_PASSTHROUGH"

    @property
    def hosts(self) -> tuple[ServerHost, ...]:
        out = []
        for h in self.server.hosts:
            ns, slash, name = h.partition("/")
            if not slash:
                ns, name = "*", h
            elif ns == ".":
                ns = self.gateway.key.namespace
            out.append(ServerHost(ns, name))
        return tuple(out)

    @property
    def dns_hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h.host for h in self.hosts))


@dataclass(frozen=True, slots=True)
class PortView:
    """One listener: the servers on (bind, port), oldest Gateway first."""

    bind: str
    port: int
    kind: PortKind
    servers: tuple[ServerRef, ...]
    explicit_bind: bool = False

    @property
    def listener_name(self) -> str:
        return f"{self.bind}_{self.port}"


@dataclass(frozen=True, slots=True)
class RouteView:
    """What one gateway RouteConfiguration serves: the servers whose hosts it routes."""

    name: str
    port: int
    servers: tuple[ServerRef, ...]


def http_route_name(port: int, bind: str = "") -> str:
    return f"http.{port}" + (f".{bind}" if bind else "")


def https_route_name(ref: ServerRef, bind: str = "") -> str:
    s = ref.server
    return (f"https.{s.port.number}.{s.port.name}.{ref.gateway.key.name}.{ref.gateway.key.namespace}"
            + (f".{bind}" if bind else ""))


@dataclass(frozen=True)
class GatewayView:
    """The merged servers of the Gateways selecting a router (built once per push per set)."""

    gateways: tuple[Entry[Gateway], ...]
    ports: tuple[PortView, ...]
    routes: Mapping[str, RouteView]
    skipped: tuple[str, ...]  # servers left out, with the reason (shown in logs)

    @classmethod
    def build(cls, gateways: tuple[Entry[Gateway], ...], port_map: tuple[tuple[int, int], ...] = ()) -> GatewayView:
        """`port_map`: (service port, target port) of the Services selecting the router, as
        istiod maps them: a server on port 80 of a Service forwarding 80 to 8080 listens on 8080
        (gateways run without root), while its routes still match the port clients used."""
        target = dict(port_map)
        groups: dict[tuple[str, int], list[ServerRef]] = {}
        kinds: dict[tuple[str, int], PortKind] = {}
        explicit: dict[tuple[str, int], bool] = {}
        skipped: list[str] = []
        for gw in gateways:
            for i, server in enumerate(gw.obj.spec.servers):
                assert server.port is not None  # required (Server._required)
                ref = ServerRef(gw, i)
                where = f"Gateway {gw.key.namespace}/{gw.key.name} server {server.port.name or i}"
                reason = _unservable(ref)
                if reason:
                    skipped.append(f"{where}: {reason}")
                    continue
                kind: PortKind = "http" if ref.protocol in _HTTP else "tls" if ref.protocol in _TLS else "tcp"
                key = (server.bind or WILDCARD_BIND, target.get(server.port.number, server.port.number))
                if key not in groups:
                    groups[key], kinds[key], explicit[key] = [], kind, bool(server.bind)
                elif kinds[key] != kind:
                    skipped.append(f"{where}: port {key[1]} already serves {kinds[key]} from an older server; "
                                   f"a {ref.protocol.upper()} server cannot share it")
                    continue
                elif kind == "tcp":
                    skipped.append(f"{where}: port {key[1]} already has a TCP server (one per port)")
                    continue
                groups[key].append(ref)
        ports = []
        routes: dict[str, RouteView] = {}
        for (bind, port), refs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            pv = PortView(bind, port, kinds[(bind, port)], tuple(refs), explicit[(bind, port)])
            ports.append(pv)
            suffix = bind if pv.explicit_bind else ""
            if pv.kind == "http":
                name = http_route_name(port, suffix)
                routes[name] = RouteView(name, refs[0].port, pv.servers)
            for ref in pv.servers:
                if ref.terminates_tls and ref.protocol == "https":
                    name = https_route_name(ref, suffix)
                    routes[name] = RouteView(name, ref.port, (ref,))
        return cls(gateways, tuple(ports), MappingProxyType(routes), tuple(skipped))


def _unservable(ref: ServerRef) -> str:
    # File-mounted certificates and unix socket binds are refused when the Gateway is parsed
    # (pilot.config.networking.gateway): no server reaching here has them.
    if ref.protocol in _TLS and ref.tls_mode == "AUTO_PASSTHROUGH" and ref.protocol != "tls":
        return "tls mode AUTO_PASSTHROUGH needs protocol TLS"
    return ""


@dataclass(frozen=True, slots=True)
class Binding:
    """A VirtualService routing for a server, with the hosts it serves there."""

    virtual_service: Entry[VirtualService]
    hosts: tuple[str, ...]  # VirtualService host x server host, the more specific of each pair


def gateway_refs(vs: Entry[VirtualService]) -> tuple[tuple[str, str], ...]:
    """(namespace, name) of every Gateway a VirtualService names (not `mesh`)."""
    out = []
    for g in vs.obj.spec.gateways:
        ref = resolve_gateway_name(g, vs.key.namespace)
        if ref is not None:
            out.append(ref)
    return tuple(dict.fromkeys(out))


def resolve_gateway_name(name: str, namespace: str) -> tuple[str, str] | None:
    if name == MESH_GATEWAY:
        return None
    if "/" in name:
        ns, _, gw = name.partition("/")
        return (ns, gw)
    if "." in name:  # legacy `name.namespace.svc.cluster.local`
        parts = name.split(".")
        return (parts[1], parts[0])
    return (namespace, name)


def _exported_to(e: Entry[VirtualService], namespace: str) -> bool:
    return exported_to(e.obj.spec.export_to, e.key.namespace, namespace)


@dataclass(frozen=True)
class GatewayIndex:
    """Gateways, the VirtualServices bound to each, and gateway credentials (Secrets)."""

    gateways: tuple[Entry[Gateway], ...] = ()  # oldest first
    virtual_services: Mapping[tuple[str, str], tuple[Entry[VirtualService], ...]] = field(default_factory=dict)
    secrets: Mapping[tuple[str, str], Entry[Secret]] = field(default_factory=dict)
    domain: str = "cluster.local"
    # PILOT_SCOPE_GATEWAY_TO_NAMESPACE: a router is selected only by Gateways of its own namespace.
    scope_to_namespace: bool = False
    _memo: dict = field(default_factory=dict, compare=False, repr=False)  # per-push memo

    @classmethod
    def build(cls, store: Store, domain: str, extra_gateways: tuple[Entry[Gateway], ...] = (),
              extra_virtual_services: tuple[Entry[VirtualService], ...] = (),
              scope_to_namespace: bool = False) -> GatewayIndex:
        """`extra_*`: generated config (from Gateway API objects) served alongside the Store's."""
        gateways = tuple(sorted([*store.list(Gateway), *extra_gateways], key=_age))
        by_gateway: dict[tuple[str, str], list[Entry[VirtualService]]] = defaultdict(list)
        for vs in (*store.list(VirtualService), *extra_virtual_services):
            for ref in gateway_refs(vs):
                by_gateway[ref].append(vs)
        secrets = {(e.key.namespace, e.key.name): e for e in store.list(Secret)}
        return cls(gateways, MappingProxyType({k: tuple(sorted(v, key=_age)) for k, v in by_gateway.items()}),
                   MappingProxyType(secrets), domain, scope_to_namespace)

    def select(self, labels: Mapping[str, str]) -> tuple[Entry[Gateway], ...]:
        """The Gateways whose selector the router's labels satisfy, oldest first."""
        key = ("select", frozenset(labels.items()))
        hit = self._memo.get(key)
        if hit is None:
            hit = tuple(g for g in self.gateways
                        if selects(g.obj.spec.selector, labels))
            self._memo[key] = hit
        return hit

    def select_for(self, labels: Mapping[str, str], namespace: str) -> tuple[Entry[Gateway], ...]:
        """`select`, less the Gateways that only serve routers of their own namespace (those of
        Gateway API Gateways) when the router is elsewhere; with PILOT_SCOPE_GATEWAY_TO_NAMESPACE,
        every Gateway of another namespace."""
        return tuple(g for g in self.select(labels)
                     if g.key.namespace == namespace
                     or (not self.scope_to_namespace and g.obj.metadata.annotations.get(SCOPE) != "namespace"))

    def view(self, gateways: tuple[Entry[Gateway], ...], port_map: tuple[tuple[int, int], ...] = ()) -> GatewayView:
        key = ("view", gateways, port_map)
        hit = self._memo.get(key)
        if hit is None:
            hit = GatewayView.build(gateways, port_map)
            self._memo[key] = hit
        return hit

    def bindings(self, ref: ServerRef, proxy_namespace: str) -> tuple[Binding, ...]:
        """The VirtualServices routing for a server, oldest first, as a router in
        `proxy_namespace` sees them (exportTo)."""
        key = ("bindings", ref, proxy_namespace)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        out = []
        gw = (ref.gateway.key.namespace, ref.gateway.key.name)
        server_hosts = ref.hosts
        for vs in self.virtual_services.get(gw, ()):
            if not _exported_to(vs, proxy_namespace):
                continue
            hosts: list[str] = []
            for h in vs.obj.spec.hosts:
                vh = resolve_host(h, vs.key.namespace, self.domain)
                for sh in server_hosts:
                    if sh.namespace not in ("*", vs.key.namespace):
                        continue
                    if host_matches(sh.host, vh):
                        hosts.append(more_specific(vh, sh.host))
            if hosts:
                out.append(Binding(vs, tuple(dict.fromkeys(hosts))))
        hit = tuple(out)
        self._memo[key] = hit
        return hit

    def secret(self, namespace: str, name: str) -> Entry[Secret] | None:
        return self.secrets.get((namespace, name))

    def certificate(self, entry: Entry[Secret]) -> CertificateAndKey | CredentialError:
        """The Secret's chain and key, checked; parsed once per push and dropped with this index
        (so with the Secret): private keys are held no longer than they are served."""
        return self._credential("certificate", entry, certificate_and_key)

    def ca_certificates(self, entry: Entry[Secret]) -> bytes | CredentialError:
        return self._credential("ca", entry, ca_bundle)

    def _credential(self, what: str, entry: Entry[Secret], parse):
        key = (what, entry.key)
        hit = self._memo.get(key)
        if hit is None or hit[0] is not entry:
            try:
                value = parse(entry.obj.reveal())
            except CredentialError as e:
                value = e
            hit = self._memo[key] = (entry, value)
        return hit[1]
