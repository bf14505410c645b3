"""DiscoveryServer: turns Store changes into pushes and pushes into per-proxy responses.

It owns the current PushContext, the resource cache, the debouncer and the connections. The
two wire protocols (xds/ads.py) call `respond` for requests and `push_connection` for pushes;
both go through `_send`, which is where SotW and delta differ. What proxies answer (ACK, NACK)
is recorded by its base AckNack (pilot/xds/ack_nack.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Protocol

from pilot import logging as plog
from pilot.config.core import Service
from pilot.features import Features
from pilot.loop_lag import LagSamples
from pilot.metrics import Metrics
from pilot.model import dependencies
from pilot.model.ambient.index import AMBIENT_INPUT_KINDS
from pilot.model.dependencies import Deps, Matcher, Scope
from pilot.model.events import SERVICE_ENDPOINTS, push_request_for
from pilot.model.mesh import MeshHolder
from pilot.model.networks import may_be_gateway
from pilot.model.proxy import Proxy, shown
from pilot.model.push_context import PushContext
from pilot.model.push_request import PushRequest
from pilot.model.security_policies import JwksSnapshot
from pilot.model.store import ConfigKey, Event, Store
from pilot.xds import typeurls, wire
from pilot.xds.ack_nack import AckNack
from pilot.xds.cache import XdsCache
from pilot.xds.connection import Connection, WatchedResource
from pilot.xds.debounce import Debouncer
from pilot.xds.envoy_filter_status import EnvoyFilterStatus
from pilot.xds.generated import Generated, GenerationMemo, Generator, Plan
from pilot.xds.generators import authorization, bootstrap, cds, ecds, eds, lds, rds, sds, wds
from pilot.xds.pace import Pace, Slots
from pilot.xds.pushstatus import PushHistory, PushRecord

log = plog.get("ads")

# Kinds istiod's service registry watches, by the type label of its pilot_k8s_reg_events; config
# kinds count in pilot_k8s_cfg_events.
REGISTRY_EVENT_TYPES = {"Service": "Services", "EndpointSlice": "EndpointSlice", "Pod": "Pods",
                        "Node": "Nodes", "Namespace": "Namespaces"}


SLOW_WRITE = 1.0  # seconds a write may keep its push throttle slot before giving it up


class ConnectionListener(Protocol):
    def connected(self, proxy: Proxy) -> None: ...
    def disconnected(self, proxy: Proxy) -> None: ...


class _Slot:
    """One PILOT_PUSH_THROTTLE slot, released at most once (by the write's timer or at the end)."""

    __slots__ = ("_held", "_sem")

    def __init__(self, sem: Slots) -> None:
        self._sem, self._held = sem, False

    async def acquire(self) -> None:
        await self._sem.acquire()
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._sem.release()


GENERATORS: dict[str, Generator] = {
    typeurls.CLUSTER: cds.generate,
    typeurls.ENDPOINT: eds.generate,
    typeurls.LISTENER: lds.generate,
    typeurls.ROUTE: rds.generate,
    typeurls.SECRET: sds.generate,
    typeurls.EXTENSION_CONFIG: ecds.generate,
    typeurls.ADDRESS: wds.generate,
    typeurls.AUTHORIZATION: authorization.generate,
    typeurls.BOOTSTRAP: bootstrap.generate,
}

# Types whose cold generation runs long enough to stall the loop (15-100 ms at 1,000 services),
# generated a resource at a time so that GenerationMemo.agenerate can yield between slices.
SLICED = {typeurls.CLUSTER: cds.sliced, typeurls.ENDPOINT: eds.resources, typeurls.ROUTE: rds.sliced}


class DiscoveryServer(AckNack):
    def __init__(self, store: Store, mesh: MeshHolder, features: Features, domain: str = "cluster.local",
                 metrics: Metrics | None = None) -> None:
        self.store = store
        self.mesh = mesh
        self.features = features
        self.domain = domain
        self.metrics = metrics or Metrics()
        self.cache = XdsCache(features.xds_cache_size)
        self.pace = Pace()  # stream work per loop iteration, bounded (pilot/xds/pace.py)
        self.generated = GenerationMemo(GENERATORS, self.cache, {typeurls.ENDPOINT: eds.reads_no_proxy},
                                        record=features.record_dependencies, sliced=SLICED,
                                        proxy_inputs={typeurls.ENDPOINT: eds.proxy_inputs,
                                                      typeurls.BOOTSTRAP: bootstrap.proxy_inputs,
                                                      typeurls.CLUSTER: eds.cds_proxy_inputs},
                                        turn=self.pace.turn)
        self.connections: dict[str, Connection] = {}
        self.throttle = Slots(features.push_throttle)
        self.debouncer = Debouncer(features.debounce_after, features.debounce_max,
                                   features.enable_eds_debounce, self._debounced_push)
        self.history = PushHistory()
        self.loop_lag = LagSamples()  # filled by pilot.loop_lag.sample_lag, read by /debug/loop_lag
        self._busy: set[str] = set()  # connections with a push queued or being sent
        self._idle = asyncio.Event()
        self._idle.set()
        self.cache.on_build = self._note_build
        self._seq = 0
        # Keys fetched for RequestAuthentication jwksUris (pilot/security/jwks.py), read per push.
        self.jwks: Callable[[], JwksSnapshot | None] = lambda: None
        self.context_listeners: list[Callable[[PushContext], None]] = []  # told of every new full context
        # Told of each registered and unregistered connection's proxy (auto-registration).
        self.connection_listeners: list[ConnectionListener] = []
        # Told of each istio.io/health report (proxy, healthy, message); None: reports are ignored.
        self.health_listener: Callable[[Proxy, bool, str], None] | None = None
        # Whether a proven proxy may read its namespace's Secrets (Kubernetes RBAC; see
        # pilot/security/secret_access.py): the refusal, or None. Unset: only the proof counts.
        self.credential_access: Callable[[Proxy], Awaitable[str | None]] | None = None
        self._shared_seq = 0  # responses built once for every proxy in the same state
        # Per connection and watched type: the Deps of what it was last given (what that config
        # read), against which each change is matched (pilot/model/dependencies.py).
        self._deps: dict[str, dict[str, Deps]] = {}
        self._merged: dict[tuple[int, int], tuple[Deps, Deps, Deps]] = {}  # partial EDS pushes
        self._subsets: dict[tuple[int, int], tuple[frozenset, frozenset, frozenset[str]]] = {}
        self._type_metrics: dict[str, tuple] = {}
        # EnvoyFilter revisions whose output a proxy NACKed: left out of every context until the
        # object changes (see _reject_envoy_filters), so a bad patch never NACK-loops.
        self.rejected_envoy_filters: dict[tuple[ConfigKey, int], dict] = {}
        self.envoy_filter_status = EnvoyFilterStatus(self.metrics.envoy_filter_status,
                                                     lambda k, r: (k, r) in self.rejected_envoy_filters)
        self.cache.on_patch = self.envoy_filter_status.applied
        self.push_context = self._build_context(self._next_version(), previous=None)
        self._tasks: list[asyncio.Task] = []
        store.subscribe(self.on_store_events)

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(self.debouncer.run(), name="debounce"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    # --- config changes -> pushes -----------------------------------------------------------
    def on_store_events(self, events: list[Event]) -> None:
        for ev in events:
            registry_type = REGISTRY_EVENT_TYPES.get(ev.key.kind)
            if registry_type is not None:
                self.metrics.registry_events.labels(registry_type, ev.op).inc()
            else:
                self.metrics.config_events.labels(ev.key.kind, ev.op).inc()
        req = push_request_for(events, self.mesh.configmap_key, self.reads_status_of)
        if req is not None:
            self.debouncer.enqueue(req)

    def reads_status_of(self, svc: Service) -> bool:
        """Whether generated config reads this Service's status: only a network gateway's."""
        return may_be_gateway(svc, self.mesh.networks, self.domain)

    def _next_version(self) -> str:
        self._seq += 1
        return f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}/{self._seq}"

    def rebuild(self) -> None:
        """Rebuild the PushContext from the Store now, without a push (startup, after the first load)."""
        self.push_context = self._build_context(self._next_version(), self.push_context)

    def _build_context(self, version: str, previous: PushContext | None) -> PushContext:
        """`previous` lends its unchanged services, so cache keys compare by identity."""
        self.mesh.refresh(self.store)
        rejected = self.rejected_envoy_filters
        for key, revision in list(rejected):  # a changed or deleted object gets a fresh chance
            e = self.store.get(key)
            if e is None or e.revision != revision:
                del rejected[(key, revision)]
        self.envoy_filter_status.prune(lambda k: self.store.get(k) is not None)
        ctx = PushContext.build(self.store, self.mesh.current, self.mesh.version, self.domain, version, previous,
                                self.jwks(), disabled_envoy_filters=frozenset(rejected),
                                knobs=self.features.generation_knobs(),
                                k8s_select_workload_entries=self.features.k8s_select_workload_entries,
                                mesh_networks=self.mesh.networks, system_namespace=self.mesh.system_namespace)
        self._log_policy_problems(ctx, previous)
        for listener in self.context_listeners:
            listener(ctx)
        _log_telemetry_problems(previous, ctx)
        return ctx

    @staticmethod
    def _log_policy_problems(ctx: PushContext, previous: PushContext | None) -> None:
        """Once per new problem: a policy applied differently from what it asks (a CUSTOM policy
        failing closed, keys not fetched) is worth a warning, not one per push."""
        seen = set() if previous is None else {tuple(p.values()) for p in previous.security.problems}
        for p in ctx.security.problems:
            if tuple(p.values()) not in seen:
                log.warning("policy not applied as written", kind=p["kind"], namespace=p["namespace"],
                            name=p["name"], reason=p["reason"])

    async def _debounced_push(self, req: PushRequest, debounce_s: float) -> None:
        self.metrics.debounce_time.observe(debounce_s)
        self.push(req, debounce_s)
        # Start the next push once this one's work is done: every affected proxy had its
        # responses built and handed to its stream. Changes that arrive meanwhile merge into one
        # push, so batch size follows how fast the server works. A proxy that is slow to *read*
        # holds nobody back: a connection waiting on its client's window is not "busy" (and it
        # has at most one response in flight; later pushes merge into its pending one).
        try:
            await asyncio.wait_for(self._idle.wait(), self.features.debounce_max)
        except TimeoutError:
            log.warning("push still in flight after PILOT_DEBOUNCE_MAX; starting the next one",
                        proxies_busy=len(self._busy))

    def push(self, req: PushRequest, debounce_s: float = 0.0) -> None:
        """Build the next PushContext (fully, or endpoints only) and queue every affected proxy."""
        t0 = time.perf_counter()
        req.version = self._next_version()
        previous = self.push_context
        if req.full:
            self.push_context = self._build_context(req.version, previous)
        else:
            self.push_context = previous.with_endpoints(self.store, req.version)
        build_s = time.perf_counter() - t0
        self._merged.clear()
        self._subsets.clear()
        self.metrics.pushcontext_init_seconds.observe(build_s)
        for reason, n in req.reasons.items():
            self.metrics.push_triggers.labels(reason).inc(n)
        queued = 0
        scoped: dict[int, PushRequest] = {}  # one request per distinct scope (shared, never mutated)
        for conn, scope in self.scope(req, previous).items():
            one = scoped.get(id(scope))
            if one is None:
                one = scoped[id(scope)] = req.scoped(scope)
            conn.enqueue_push(one)
            if not conn.writing:  # one waiting for its proxy to read is not our work yet
                self._busy.add(conn.id)
            queued += 1
        if self._busy:
            self._idle.clear()
        self.history.add(PushRecord(req.version, req.full, dict(req.reasons),
                                    sorted(str(k) for k in req.config_keys), debounce_s, build_s, queued, req.start))
        log.info("push", version=req.version, full=req.full, reasons=req.reason_text(), proxies=queued,
                 context_build_ms=round(build_s * 1000, 2))

    def _note_build(self, type_url: str, name: str, resource_version: str) -> None:
        self.history.note_build(type_url, name, resource_version, self.push_context.version)

    def scope(self, req: PushRequest, previous: PushContext | None) -> dict[Connection, Scope | None]:
        """Which connections a change reaches, and per connection which types (for EDS, which
        resources) to regenerate: the changed keys (and what the rebuilt indexes made of them,
        `previous` against the current context) met against what each connection's config read.
        The decision is dependencies.push_scope's; this only gathers its inputs."""
        conns = list(self.connections.values())
        if not self.generated.record:
            return {conn: None for conn in conns}
        ctx = self.push_context
        mesh_changed = previous is None or previous.mesh_version != ctx.mesh_version \
            or self.mesh.configmap_key in req.config_keys
        change = dependencies.change_of(req.config_keys, previous, ctx, mesh_changed=mesh_changed,
                                        service_endpoints_kind=SERVICE_ENDPOINTS,
                                        ambient_kinds=AMBIENT_INPUT_KINDS)
        if change.everything:
            return {conn: None for conn in conns}
        matcher = Matcher(change)
        out: dict[Connection, Scope | None] = {}
        # Connections given the same results hold the same Deps objects: scoped once per state.
        by_state: dict[tuple, tuple[list, Scope]] = {}
        for conn in conns:
            held = self._deps.get(conn.id, {})
            state = tuple((t, id(held.get(t))) for t in conn.watched if t in GENERATORS)
            hit = by_state.get(state)
            if hit is None:
                watched = {t: held.get(t) for t in conn.watched if t in GENERATORS}
                found = dependencies.push_scope(matcher, watched, typeurls.CLUSTER, typeurls.ENDPOINT)
                hit = by_state[state] = ([held.get(t) for t in watched], found)  # keeps the ids alive
            if hit[1]:
                out[conn] = hit[1]
        return out

    def _subset(self, names: frozenset[str], watched: frozenset[str]) -> frozenset[str]:
        """The scoped names a stream watches: one frozenset per (scope, subscription) in a push,
        shared by the streams with both, so generation memo keys hit by identity."""
        key = (id(names), id(watched))
        hit = self._subsets.get(key)
        if hit is None or hit[0] is not names or hit[1] is not watched:
            hit = self._subsets[key] = (names, watched, names & watched)
        return hit[2]

    def held_deps(self, conn: Connection, type_url: str) -> Deps | None:
        """What the config this connection was last given of this type read (for /debug/explain)."""
        return self._deps.get(conn.id, {}).get(type_url)

    def _hold(self, conn: Connection, type_url: str, deps: Deps | None, partial: bool) -> None:
        if deps is None:
            return
        held = self._deps.setdefault(conn.id, {})
        old = held.get(type_url)
        if partial and old is not None:
            key = (id(old), id(deps))
            hit = self._merged.get(key)
            if hit is None or hit[0] is not old or hit[1] is not deps:
                hit = self._merged[key] = (old, deps, dependencies.merged_named(old, deps))
            deps = hit[2]
        held[type_url] = deps

    # --- connections ------------------------------------------------------------------------
    def register(self, conn: Connection) -> None:
        self.connections[conn.id] = conn
        self.metrics.xds_clients.labels(conn.proxy.istio_version or "unknown").inc()
        for listener in self.connection_listeners:
            listener.connected(conn.proxy)

    def _done_pushing(self, conn: Connection) -> None:
        if conn.pending_push is None:
            self._busy.discard(conn.id)
            if not self._busy:
                self._idle.set()

    def unregister(self, conn: Connection) -> None:
        conn.pending_push = None
        self._done_pushing(conn)
        self._deps.pop(conn.id, None)
        if self.connections.pop(conn.id, None) is None:
            return
        self.metrics.xds_clients.labels(conn.proxy.istio_version or "unknown").dec()
        for w in conn.watched.values():
            self._clear_reject_gauge(conn, w)
        for listener in self.connection_listeners:
            listener.disconnected(conn.proxy)

    async def push_connection(self, conn: Connection, req: PushRequest, send) -> None:
        """Send every watched type this push changes, in CDS, EDS, LDS, RDS order."""
        conn.pushing = True
        try:
            await self._push_types(conn, req, send)
        finally:
            conn.pushing = False
            self._done_pushing(conn)

    async def _write(self, conn: Connection, send, body: bytes) -> None:
        """Hand one response to the stream. While it waits for the proxy to read, the connection
        is not busy (no push waits for it, even one queued for it meanwhile) and holds no
        throttle slot."""
        self._busy.discard(conn.id)
        if not self._busy:
            self._idle.set()
        t0 = time.perf_counter()
        try:
            await send(body)
            self.metrics.xds_send_time.observe(time.perf_counter() - t0)
        finally:
            if (conn.pushing or conn.pending_push is not None) and not conn.closed:
                self._busy.add(conn.id)  # server work again: the rest of this push, or the next
                self._idle.clear()

    async def _push_types(self, conn: Connection, req: PushRequest, send) -> None:
        queued_at = time.monotonic()
        record = self.history.get(req.version)
        changed_clusters: frozenset[str] = frozenset()
        first = True
        for type_url in typeurls.PUSH_ORDER:
            w = conn.watched.get(type_url)
            if w is None or type_url not in GENERATORS:
                continue
            subset = None
            if req.scope is not None:
                if type_url not in req.scope:
                    continue
                names = req.scope[type_url]
                if names is not None:
                    subset = names if w.wildcard else self._subset(names, w.names)
                    if not subset:
                        continue
            # The throttle is taken per type, not per proxy: waiting proxies queue FIFO behind
            # each step, so every proxy gets its CDS before anyone's EDS, LDS and RDS. Order
            # per proxy is unchanged (CDS, EDS, LDS, RDS). The slot covers the write too (fewer
            # writes in flight measured ~30% less server CPU per push), but only for
            # SLOW_WRITE: a proxy slow to read must not hold a slot others need.
            slot = _Slot(self.throttle)
            await slot.acquire()
            try:
                await self.pace.turn()
                if first:
                    queued = time.monotonic() - queued_at
                    self.metrics.proxy_queue_time.observe(queued)
                    if record is not None:
                        record.queue_max_s = max(record.queue_max_s, queued)
                    first = False
                t0 = time.perf_counter()
                # The newest context, not the one of when this push was queued: a change scoped
                # while this proxy waited was matched against what it held then, so its config
                # must be made from a context that includes that change.
                ctx = self.push_context
                requested = self._requested(conn, w) if subset is None else subset
                resources = await self.generated.agenerate(ctx, type_url, conn.proxy, requested)
                self._hold(conn, type_url, resources.deps, partial=subset is not None)
                t1 = time.perf_counter()
                force = changed_clusters if type_url == typeurls.ENDPOINT else frozenset()
                body, sent = self._stage(conn, w, ctx, resources, partial=subset is not None,
                                         force=force, push=req)
                if type_url == typeurls.CLUSTER:
                    changed_clusters = sent
                if body is not None:
                    timer = asyncio.get_running_loop().call_later(SLOW_WRITE, slot.release)
                    try:
                        await self._write(conn, send, body)
                    finally:
                        timer.cancel()
            finally:
                slot.release()
            t2 = time.perf_counter()
            self._metrics_for(type_url)[2].observe(t2 - t0)
            if record is not None:
                record.generate_s[typeurls.SHORT[type_url]] += t1 - t0
                record.send_s += t2 - t1

    async def respond(self, conn: Connection, w: WatchedResource, send) -> None:
        """Answer a request: always send, even if empty, so the proxy's subscription settles."""
        if w.type_url == typeurls.SECRET:
            await self._check_credentials(conn, w)
        ctx = self.push_context
        if w.type_url in GENERATORS:
            resources = await self.generated.agenerate(ctx, w.type_url, conn.proxy, self._requested(conn, w))
            self._hold(conn, w.type_url, resources.deps, partial=False)
        else:
            resources = Generated(())
        body, _ = self._stage(conn, w, ctx, resources, partial=False, force=frozenset(), push=None,
                              always=True)
        if body is not None:
            await self._write(conn, send, body)

    @staticmethod
    def _requested(conn: Connection, w: WatchedResource) -> frozenset[str] | None:
        """What the proxy may be given of what it asks: no credential to a refused proxy."""
        if w.type_url == typeurls.SECRET and conn.credential_refusal is not None:
            return frozenset()
        return w.requested()

    async def _check_credentials(self, conn: Connection, w: WatchedResource) -> None:
        """Decide, on each SDS request, whether this stream may be given credentials (pushes
        follow the last decision). A refused request is counted; logged once per stream (a
        client repeating it cannot flood the log)."""
        why = sds.refusal(conn.proxy)
        if why is None and self.credential_access is not None:
            why = await self.credential_access(conn.proxy)
        conn.credential_refusal = why
        if why is None or not w.names:
            return
        self.metrics.sds_certificate_errors.inc()
        if not conn.credentials_refused:
            conn.credentials_refused = True
            log.warning("credentials refused", proxy=shown(conn.proxy.id), peer=conn.peer, reason=why,
                        names=[shown(n) for n in sorted(w.names)[:5]])

    def _stage(self, conn: Connection, w: WatchedResource, ctx: PushContext,
               generated: Generated, *, partial: bool, force: frozenset[str],
               push: PushRequest | None, always: bool = False) -> tuple[bytes | None, frozenset[str]]:
        """The response that sends what the proxy does not have yet (None: nothing to send), and
        the names whose content changed (for CDS: the clusters Envoy will re-create and keep
        warming until their EDS is re-sent). The stream state records it as sent.

        SotW CDS/LDS responses must list everything (omission deletes); SotW EDS/RDS and delta
        may carry only what changed. Nothing is sent when nothing changed, which also means a
        version the proxy rejected is never sent to it again."""
        plan = self.generated.plan(w.sent, generated, frozenset(force), delta=conn.delta,
                                   complete=w.type_url in typeurls.STATE_OF_THE_WORLD_COMPLETE,
                                   partial=partial, always=always)
        if plan.empty and not always:
            w.sent = plan.held_after  # the same content; maybe the map its peers share
            return None, frozenset()
        nonce, body = self._response(conn, w, ctx, plan)
        w.sent = plan.held_after  # shared, never mutated in place
        w.nonce_sent, w.version_sent, w.last_sent_at = nonce, ctx.version, time.time()
        w.sent_response(nonce, plan.out, None if push is None else (push.start, push.version))
        if push is not None:
            record = self.history.get(push.version)
            if record is not None:
                record.responses += 1
                record.bytes_sent += len(body)
        pushes, size, _ = self._metrics_for(w.type_url)
        pushes.inc()
        size.observe(len(body))
        return body, plan.changed

    def _response(self, conn: Connection, w: WatchedResource, ctx: PushContext, plan: Plan) -> tuple[str, bytes]:
        """(nonce, body). Proxies given the same plan in the same push get the same bytes object,
        nonce included: a full push to a thousand sidecars builds ten bodies, not a thousand.
        A shared nonce is unique within a stream because shared responses are numbered in the
        order they are built and a stream only ever takes one newer than the last it took;
        otherwise (rare: an older plan met again) the response gets a nonce of its own."""
        key = (w.type_url, ctx.version, conn.delta)
        shared = plan.bodies.get(key)
        if shared is None:
            self._shared_seq += 1
            nonce = f"{self._shared_seq:x}"  # stream nonces are "CONN-N": never equal to these
            shared = plan.bodies[key] = (self._shared_seq, nonce, self._encode(conn, w, ctx, plan, nonce))
        seq, nonce, body = shared
        if seq > w.last_shared_seq:
            w.last_shared_seq = seq
            return nonce, body
        nonce = conn.next_nonce()
        return nonce, self._encode(conn, w, ctx, plan, nonce)

    @staticmethod
    def _encode(conn: Connection, w: WatchedResource, ctx: PushContext, plan: Plan, nonce: str) -> bytes:
        if conn.delta:
            return wire.delta_response(ctx.version, [plan.fields], w.type_url, list(plan.removed), nonce)
        return wire.sotw_response(ctx.version, [plan.fields], w.type_url, nonce)

    def _metrics_for(self, type_url: str) -> tuple:
        """The per-type metric children (pushes, config size, push time): labels() looked up once."""
        found = self._type_metrics.get(type_url)
        if found is None:
            short = typeurls.SHORT.get(type_url, "other")
            found = self._type_metrics[type_url] = (
                self.metrics.xds_pushes.labels(short), self.metrics.xds_config_size.labels(short),
                self.metrics.xds_push_time.labels(short))
        return found


def _log_telemetry_problems(previous: PushContext | None, ctx: PushContext) -> None:
    """A Telemetry (or provider) that cannot be applied is logged once, when it first appears
    (also in /debug/configz `unsupported` while it lasts)."""
    if previous is not None and previous.telemetry is ctx.telemetry and previous.mesh is ctx.mesh \
            and previous.by_host is ctx.by_host:
        return
    seen = {tuple(sorted(p.items())) for p in previous.telemetry_problems} if previous is not None else set()
    for p in ctx.telemetry_problems:
        if tuple(sorted(p.items())) not in seen:
            log.warning("telemetry not applied", kind=p["kind"], namespace=p["namespace"], name=p["name"],
                        reason=p["reason"])
