"""The push oracle: after any single change, every proxy whose generated config changed was pushed.

A mesh with every kind a generator reads (tests/unit/oracle_mesh.py) and connected proxies of
every kind (sidecars with and without a mesh identity, under Sidecars and not, in iptables and
bound-port modes, an Istio Gateway's routers, a Gateway API Gateway's router, an ambient
waypoint, a proxyless gRPC client, a ztunnel) takes hundreds of seeded random
single changes. For each, the config of every proxy is generated before and after directly by
the generators, from a context built afresh and a fresh cache (nothing shared with the server);
the server is asked which proxies and types it pushes for the change (its own scoping decision,
through its real push path). A proxy whose bytes of a type changed but that was not pushed that
type is pushing too little: the user's Envoy keeps stale config. The pushes are then delivered,
and what the server sent each proxy must equal what the generators say it should hold.

Pushes without a change are counted and printed (istiod pushes some too): they cost CPU, not
correctness.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from pilot.config.mesh import MeshConfig
from pilot.config.validation import parse_object
from pilot.features import Features
from pilot.model.mesh import MeshHolder
from pilot.model.proxy import Proxy, parse_node_id
from pilot.model.push_context import PushContext
from pilot.model.services import NO_LOCALITY, Locality
from pilot.model.store import ConfigKey, Store
from pilot.xds import typeurls as T
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.connection import Connection
from pilot.xds.discovery import GENERATORS, DiscoveryServer
from tests.support.scoping import discard as _discard
from tests.support.scoping import pushed, subscribe

from .oracle_mesh import SYSTEM_NS, slots

SEED = 20261201
CHANGES = 600
DOMAIN = "cluster.local"
ENVOY_TYPES = (T.CLUSTER, T.ENDPOINT, T.LISTENER, T.ROUTE)
GRPC_TYPES = (T.LISTENER, T.ROUTE, T.CLUSTER, T.ENDPOINT)  # the order a gRPC client learns names in
ZTUNNEL_TYPES = (T.ADDRESS, T.AUTHORIZATION)
GRPC_TARGETS = frozenset({f"reviews.default.svc.{DOMAIN}:9080", f"ratings.default.svc.{DOMAIN}:9080"})
# A proxyless gRPC server at ratings-1's address (one variant moves that pod away): its inbound
# listeners read the endpoints at its address, its policies and PeerAuthentications.
GRPC_SERVER_NAMES = frozenset({"xds.istio.io/grpc/lds/inbound/0.0.0.0:9080",
                               "xds.istio.io/grpc/lds/inbound/0.0.0.0:9091"})


def _proxy(
    ptype: str,
    ns: str,
    pod: str,
    ip: str,
    labels: dict,
    *,
    interception: str = "NONE",
    generator: str | None = None,
    identity: str = "",
    locality: Locality = NO_LOCALITY,
    network: str = "",
) -> Proxy:
    node_id = f"{ptype}~{ip}~{pod}.{ns}~{ns}.svc.{DOMAIN}"
    t, ips, p, namespace, domain = parse_node_id(node_id)
    meta = {"NAMESPACE": ns, "LABELS": labels, "INTERCEPTION_MODE": interception}
    if network:
        meta["NETWORK"] = network
    if generator:
        meta["GENERATOR"] = generator
    return Proxy(node_id, t, ips, p, namespace, domain, f"{pod}.{ns}", meta, identity=identity, node_locality=locality)


def _sa(ns: str, sa: str) -> str:
    return f"spiffe://cluster.local/ns/{ns}/sa/{sa}"


def proxies() -> list[Proxy]:
    pp = {"app": "productpage"}
    return [
        # Under the productpage Sidecar: bound ports, no identity; two replicas.
        _proxy("sidecar", "default", "productpage-1", "10.1.0.6", pp, locality=Locality("r1", "za")),
        _proxy("sidecar", "default", "productpage-2", "10.1.0.8", pp),
        # Under the same Sidecar, with a mesh identity, iptables mode (inbound from its Service)
        _proxy(
            "sidecar",
            "default",
            "productpage-mtls",
            "10.1.0.6",
            pp,
            interception="REDIRECT",
            identity=_sa("default", "productpage"),
            network="net-a",
        ),
        _proxy(
            "sidecar",
            "default",
            "reviews-v1",
            "10.1.0.1",
            {"app": "reviews", "version": "v1"},
            interception="REDIRECT",
            identity=_sa("default", "reviews"),
        ),
        _proxy("sidecar", "default", "ratings-1", "10.1.0.4", {"app": "ratings"}),
        _proxy(
            "sidecar",
            "shop",
            "details-1",
            "10.1.0.7",
            {"app": "details"},
            interception="REDIRECT",
            identity=_sa("shop", "details"),
            network="net-b",
        ),
        _proxy("sidecar", "shop", "cart-1", "10.1.0.9", {"app": "cart"}),
        _proxy("router", SYSTEM_NS, "ingress-1", "10.1.1.1", {"istio": "ingressgateway"}),
        _proxy(
            "router",
            SYSTEM_NS,
            "ingress-2",
            "10.1.1.2",
            {"istio": "ingressgateway"},
            identity=_sa(SYSTEM_NS, "ingressgateway"),
        ),
        # The Gateway API Gateway's own router, and shop's waypoint
        _proxy("router", SYSTEM_NS, "web-1", "10.1.1.3", {"gateway.networking.k8s.io/gateway-name": "web"}),
        _proxy("router", "shop", "waypoint-1", "10.1.1.4", {"gateway.networking.k8s.io/gateway-name": "waypoint"},
               identity=_sa("shop", "waypoint")),
        _proxy("sidecar", "default", "grpc-client-1", "10.1.0.10", {"app": "ratings"}, generator="grpc"),
        _proxy("sidecar", "default", "grpc-server-1", "10.1.0.4", {"app": "ratings"}, generator="grpc"),
        _proxy("ztunnel", SYSTEM_NS, "ztunnel-1", "10.1.2.1", {"app": "ztunnel"}),
    ]


def types_of(p: Proxy) -> tuple[str, ...]:
    if p.type == "ztunnel":
        return ZTUNNEL_TYPES
    if p.is_grpc:
        return GRPC_TYPES
    return (*ENVOY_TYPES, T.SECRET) if p.type == "router" else ENVOY_TYPES


# --- what a client asks for, read from what it was given ---------------------------------------


def _hcms(lis: listener_pb2.Listener):
    if lis.HasField("api_listener"):
        m = hcm_pb2.HttpConnectionManager()
        lis.api_listener.api_listener.Unpack(m)
        yield m
    for fc in [*lis.filter_chains, lis.default_filter_chain]:
        for f in fc.filters:
            if f.typed_config.type_url.endswith("HttpConnectionManager"):
                m = hcm_pb2.HttpConnectionManager()
                f.typed_config.Unpack(m)
                yield m


def _secret_names(lis: listener_pb2.Listener) -> set[str]:
    out = set()
    for fc in lis.filter_chains:
        if fc.transport_socket.typed_config.type_url.endswith("DownstreamTlsContext"):
            ctx = tls_pb2.DownstreamTlsContext()
            fc.transport_socket.typed_config.Unpack(ctx)
            c = ctx.common_tls_context
            out |= {s.name for s in c.tls_certificate_sds_secret_configs}
            if c.HasField("combined_validation_context"):
                out.add(c.combined_validation_context.validation_context_sds_secret_config.name)
            if c.HasField("validation_context_sds_secret_config"):
                out.add(c.validation_context_sds_secret_config.name)
    return {n for n in out if n.startswith("kubernetes://")}


def requested_after(type_url: str, got: Mapping[str, Mapping[str, CachedResource]]) -> frozenset[str] | None:
    """The names a client subscribes to for `type_url`, given what it holds of the others."""
    if type_url == T.ENDPOINT:
        out = set()
        for r in got.get(T.CLUSTER, {}).values():
            c = r.message(cluster_pb2.Cluster)
            if c.type == cluster_pb2.Cluster.EDS:
                out.add(c.eds_cluster_config.service_name or c.name)
        return frozenset(out)
    if type_url == T.ROUTE:
        return frozenset(
            h.rds.route_config_name
            for r in got.get(T.LISTENER, {}).values()
            for h in _hcms(r.message(listener_pb2.Listener))
            if h.HasField("rds")
        )
    if type_url == T.SECRET:
        return frozenset(
            n
            for r in got.get(T.LISTENER, {}).values()
            for n in _secret_names(r.message(listener_pb2.Listener))
        )
    return None


def grpc_requested(p: Proxy, type_url: str, got) -> frozenset[str] | None:
    if type_url == T.LISTENER:
        return GRPC_SERVER_NAMES if p.pod_name.startswith("grpc-server") else GRPC_TARGETS
    if type_url == T.CLUSTER:
        out = set()
        for r in got.get(T.ROUTE, {}).values():
            for vh in r.message(route_pb2.RouteConfiguration).virtual_hosts:
                for route in vh.routes:
                    if route.route.cluster:
                        out.add(route.route.cluster)
                    out |= {w.name for w in route.route.weighted_clusters.clusters}
        return frozenset(out)
    return requested_after(type_url, got)


def expected_config(store: Store, mesh: MeshHolder, plist: list[Proxy]):
    """Per proxy and type: (requested names, name -> resource), from the generators directly."""
    mesh.refresh(store)
    ctx = PushContext.build(store, mesh.current, mesh.version, DOMAIN, "oracle", mesh_networks=mesh.networks,
                            system_namespace=mesh.system_namespace)
    cache = XdsCache()
    out = []
    for p in plist:
        got: dict[str, dict[str, CachedResource]] = {}
        names: dict[str, frozenset[str] | None] = {}
        for t in types_of(p):
            requested = grpc_requested(p, t, got) if p.is_grpc else requested_after(t, got)
            names[t] = requested
            got[t] = {r.name: r for r in GENERATORS[t](ctx, p, requested, cache)}
        out.append((names, got))
    return out


# --- the server's side ---------------------------------------------------------------------------


def _versions(resources: Mapping[str, CachedResource]) -> dict[str, str]:
    return {n: r.version for n, r in resources.items()}


class Oracle:
    def __init__(self, seed: int, features: Features | None = None,
                 server_class: type[DiscoveryServer] = DiscoveryServer) -> None:
        self.rng = random.Random(seed)
        self.slots = slots()
        self.state = {s: 0 for s in self.slots}
        self.store = Store()
        self.mesh = MeshHolder(MeshConfig(), SYSTEM_NS)
        for variants in self.slots.values():
            if variants[0] is not None:
                self.store.apply(parse_object(variants[0]), source="oracle")
        self.server = server_class(
            self.store, self.mesh, features or Features.from_env({"PILOT_ENABLE_AMBIENT": "true"})
        )
        self.requests = []
        self.server.debouncer.enqueue = self.requests.append  # the push is started by hand below
        self.server.rebuild()
        self.proxies = proxies()
        self.conns = [Connection(p, "oracle", delta=p.type == "ztunnel") for p in self.proxies]
        self.misses: list[str] = []
        self.stats = Counter()
        self.history: list[str] = []
        self.stop_at_miss = False

    async def start(self) -> None:
        for conn in self.conns:
            self.server.register(conn)
        self.expected = expected_config(self.store, self.mesh, self.proxies)
        for conn, (names, _) in zip(self.conns, self.expected, strict=True):
            await subscribe(self.server, conn, names)
        self.requests.clear()

    def change(self, slot: str, variant: int) -> None:
        self.state[slot] = variant
        doc = self.slots[slot][variant]
        if doc is not None:
            self.store.apply(parse_object(doc), source="oracle")
        else:
            first = next(d for d in self.slots[slot] if d is not None)
            meta = first["metadata"]
            self.store.delete(
                ConfigKey(parse_object(first).config_kind, meta.get("namespace", ""), meta["name"])
            )

    def random_change(self) -> tuple[str, int]:
        slot = self.rng.choice(sorted(self.slots))
        variant = self.rng.choice([i for i in range(len(self.slots[slot])) if i != self.state[slot]])
        return slot, variant

    async def step(self, slot: str, variant: int) -> None:
        what = f"{slot} -> variant {variant}"
        self.history.append(what)
        self.change(slot, variant)
        if self.requests:
            req = self.requests[0]
            for r in self.requests[1:]:
                req = req.merge(r)
            self.requests.clear()
            self.server.push(req)
        after = expected_config(self.store, self.mesh, self.proxies)
        for conn, (old_names, before), (new_names, now) in zip(self.conns, self.expected, after, strict=True):
            scope = pushed(self.server, conn)
            changed_any = False
            for t in types_of(conn.proxy):
                old, new = _versions(before[t]), _versions(now[t])
                if old_names[t] is not None:
                    # A name the client starts or stops asking for is its request, answered as
                    # such; the push that changed what it asks for is checked on that type.
                    both = old_names[t] & new_names[t]
                    old = {n: v for n, v in old.items() if n in both}
                    new = {n: v for n, v in new.items() if n in both}
                if old == new:
                    continue
                changed_any = True
                differ = sorted(n for n in old.keys() | new.keys() if old.get(n) != new.get(n))
                if scope is not None and t not in scope:
                    self.misses.append(f"{what}: {conn.proxy.id} not pushed {T.SHORT[t]} ({differ[:4]})")
                    continue
                names = None if scope is None else scope[t]
                if names is not None:
                    stale = {n for n in old.keys() | new.keys() if old.get(n) != new.get(n)} - names
                    if stale:
                        self.misses.append(
                            f"{what}: {conn.proxy.id} pushed {T.SHORT[t]} without {sorted(stale)[:4]}"
                        )
            if changed_any and self.stop_at_miss and self.misses:
                raise AssertionError("\n".join(self.history[-8:] + self.misses))
            if scope != {}:
                self.stats["pushed"] += 1
                self.stats["pushed_unchanged"] += not changed_any
            self.stats["changed"] += changed_any
            self.stats["proxy_changes"] += 1
        # Deliver, as the connections' workers would, then let clients follow new names.
        for conn in self.conns:
            req = conn.take_push()
            if req is not None:
                await self.server.push_connection(conn, req, _discard)
        for conn, (names, _) in zip(self.conns, after, strict=True):
            await subscribe(self.server, conn, names)
        self.expected = after
        self.stats["changes"] += 1

    def check_held(self, what: str) -> None:
        """What each proxy was sent equals what it should hold (SotW: last sent; delta: held)."""
        for conn, (_, want) in zip(self.conns, self.expected, strict=True):
            for t in types_of(conn.proxy):
                sent = conn.watched[t].sent
                wrong = sorted(n for n, r in want[t].items() if sent.get(n) != r.version)
                if wrong:
                    self.misses.append(f"{what}: {conn.proxy.id} holds stale {T.SHORT[t]} {wrong[:4]}")


async def run_oracle(seed: int = SEED, changes: int = CHANGES, scripted=(),
                     server_class: type[DiscoveryServer] = DiscoveryServer) -> Oracle:
    o = Oracle(seed, server_class=server_class)
    await o.start()
    for slot, variant in scripted:
        await o.step(slot, variant)
        o.check_held(f"{slot} -> {variant}")
    for _ in range(changes):
        slot, variant = o.random_change()
        await o.step(slot, variant)
        o.check_held(f"{slot} -> {variant}")
    return o


def _report(o: Oracle) -> None:
    s = o.stats
    figures = {
        "changes": s["changes"],
        "proxy_changes": s["proxy_changes"],
        "changed": s["changed"],
        "pushed": s["pushed"],
        "pushed_unchanged": s["pushed_unchanged"],
        "pushed_unchanged_pct_of_pushed": round(100 * s["pushed_unchanged"] / max(1, s["pushed"]), 1),
        "pushed_unchanged_pct_of_proxy_changes": round(
            100 * s["pushed_unchanged"] / max(1, s["proxy_changes"]), 1
        ),
    }
    print("\nFIGURES " + json.dumps({"push_oracle": figures}))


async def test_every_proxy_whose_config_changed_was_pushed() -> None:
    o = await run_oracle()
    _report(o)
    assert not o.misses, f"{len(o.misses)} pushes too few:\n" + "\n".join(o.misses[:30])
    # Pushes without a change stay a minority of pushes (the figure is printed above).
    assert o.stats["pushed_unchanged"] <= o.stats["pushed"] // 2


async def test_pod_after_its_endpoint_slice_is_pushed() -> None:
    """The user's first report: subset v2's endpoint names a Pod that does not exist yet; when
    it arrives the subset gains a member (and auto mTLS a tlsMode, CDS the SANs)."""
    o = Oracle(SEED)
    await o.start()
    await o.step("pod/reviews-v2", 1)
    o.check_held("pod/reviews-v2 arrives")
    assert not o.misses, "\n".join(o.misses)


async def test_own_service_target_port_pushes_the_scoped_sidecar() -> None:
    """The user's second report: a sidecar under a Sidecar (egress ./ratings), with a mesh
    identity, whose own Service's targetPort moves: its virtualInbound changes."""
    o = Oracle(SEED)
    await o.start()
    await o.step("svc/productpage", 1)
    o.check_held("svc/productpage targetPort 9090")
    assert not o.misses, "\n".join(o.misses)


class _ForgetsScopedSidecars(DiscoveryServer):
    """The single-line slip the issue describes: Service changes stop reaching proxies under a
    Sidecar (whatever their egress can see)."""

    def scope(self, req, previous):
        out = super().scope(req, previous)
        if not any(k.kind == "Service" for k in req.config_keys):
            return out
        ctx = self.push_context
        return {c: s for c, s in out.items() if ctx.sidecar_for(c.proxy.namespace, c.proxy.labels) is None}


async def test_the_oracle_catches_a_server_that_pushes_too_little() -> None:
    """The oracle itself can fail: against a server with that slip it reports the proxies under
    the productpage and shop Sidecars that kept stale config."""
    o = await run_oracle(server_class=_ForgetsScopedSidecars)
    assert o.misses, "the oracle did not notice proxies left with stale config"
    stale = {m.split(": ")[1].split(" ")[0] for m in o.misses if " not pushed " in m or " without " in m}
    assert any("productpage" in p for p in stale) and any(".shop~" in p for p in stale), stale
