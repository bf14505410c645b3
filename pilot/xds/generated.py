"""Generator output shared by every proxy with the same traits and subscription in one push.

A push to 1,000 sidecars in ten namespaces runs each generator ten times, not a thousand: the
memo is keyed by (type, proxy traits, requested names) and lives as long as the PushContext.
The assembled bytes of a SotW response body are shared too; each proxy adds only its nonce.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field

from pilot.model.dependencies import Deps
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.xds.cache import CachedResource, XdsCache, framed
from pilot.xds.generators.envoy_filter import patches_for
from pilot.xds.generators.grpc import server_inputs as grpc_server_inputs
from pilot.xds.typeurls import LISTENER


@dataclass(eq=False)
class Generated:
    resources: tuple[CachedResource, ...]
    # Requested names that exist nowhere: a delta answer to a request lists them as removed.
    absent: tuple[str, ...] = ()
    _versions: dict[str, str] | None = field(default=None, repr=False)
    _sotw_fields: bytes | None = field(default=None, repr=False)
    # What generating it read (pilot/model/dependencies.py); None when recording is off.
    deps: Deps | None = field(default=None, repr=False)

    def versions(self) -> Mapping[str, str]:
        """name -> version. Shared by every proxy given this output: read-only by convention."""
        if self._versions is None:
            self._versions = {r.name: r.version for r in self.resources}
        return self._versions

    def sotw_fields(self) -> bytes:
        if self._sotw_fields is None:
            self._sotw_fields = framed(self.resources, delta=False)
        return self._sotw_fields


Generator = Callable[[PushContext, Proxy, frozenset[str] | None, XdsCache], list[CachedResource]]


# The same, one resource at a time (a generator function): agenerate() yields to the event loop
# between resources once a slice has run SLICE seconds. A None is a point within one resource
# where it may yield too (a route configuration of a thousand virtual hosts).
Sliced = Callable[[PushContext, Proxy, frozenset[str] | None, XdsCache], Iterator[CachedResource | None]]
SLICE = 0.005

# Per type, optionally: whether a request's output leaves the proxy unread (then the memo key
# holds no proxy traits and proxies in every namespace share one output, plan and body).
ReadsNoProxy = Callable[[frozenset[str] | None], bool]
# Per type, optionally: what of a proxy the output reads beyond its memo key, None for nothing
# (EDS: the client's locality, while locality load balancing can apply).
ProxyInputs = Callable[[PushContext, Proxy], Hashable | None]


class Key:
    """A memo key: the one object per distinct `parts` in a context (GenerationMemo._intern), so
    it hashes and compares by identity, in C, however deep its parts are. The dict lookups a
    push makes per stream and type (outputs being generated, outputs made) then cost no hashing
    of a tuple (tuples keep no hash) nor of the dataclasses nested in a proxy key."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple) -> None:
        self.parts = parts

    def __repr__(self) -> str:
        return f"Key{self.parts!r}"


class GenerationMemo:
    def __init__(self, generators: Mapping[str, Generator], cache: XdsCache,
                 reads_no_proxy: Mapping[str, ReadsNoProxy] | None = None, record: bool = True,
                 sliced: Mapping[str, Sliced] | None = None,
                 proxy_inputs: Mapping[str, ProxyInputs] | None = None,
                 turn: Callable[[], Awaitable[None]] | None = None) -> None:
        self.generators = generators
        # Awaited whenever agenerate resumes after waiting (pilot/xds/pace.py's turn): the
        # work that follows, a slice or a stream's response, keeps to the loop's budget. A
        # hundred streams woken at once by the output they waited for would otherwise each
        # plan and write a response in one iteration (30 ms and more).
        self.turn = turn
        # Per type, optionally: the same output a resource at a time, for agenerate().
        self.sliced = dict(sliced or {})
        self._running: dict[Key, tuple[PushContext, asyncio.Future]] = {}
        # Record what each generated output read, once per output (proxies sharing it share it).
        self.record = record
        self.cache = cache
        self.reads_no_proxy = dict(reads_no_proxy or {})
        self.proxy_inputs = dict(proxy_inputs or {})
        self._version: str | None = None
        self._memo: dict[Key, Generated] = {}
        self._plans: dict[Hashable, tuple[Mapping, Generated, Plan]] = {}
        self._proxy_keys: dict[int, tuple[Proxy, Mapping, Key]] = {}
        self._interned: dict[tuple, Key] = {}
        self.hits = 0
        self.misses = 0

    def _intern(self, parts: tuple) -> Key:
        """The one Key of these parts in this context (the table goes with the context: a Key
        is never looked up in a later context's memo)."""
        key = self._interned.get(parts)
        if key is None:
            key = self._interned[parts] = Key(parts)
        return key

    def _proxy_key(self, ctx: PushContext, proxy: Proxy) -> Key:
        """Generators read nothing of a proxy but its traits, the Sidecar that scopes it (for a
        router: the Gateways its labels select), which sourceLabels matches and DestinationRule
        workloadSelectors its labels meet and,
        for a sidecar, its inbound plan (the services selecting it, their mTLS modes and
        policies), for a router the ports of the Services selecting it (and, per type, the EnvoyFilter
        patches it gets), and its telemetry plan. Worked out once per proxy and context: a push asks
        for it once per type."""
        hit = self._proxy_keys.get(id(proxy))
        # The metadata object is replaced, never mutated, when a proxy turns out to be gRPC.
        if hit is not None and hit[0] is proxy and hit[1] is proxy.metadata:
            return hit[2]
        labels = proxy.labels
        grpc = proxy.is_grpc
        scope = (ctx.gateways.select(labels) if proxy.type == "router"
                 else ctx.sidecar_for(proxy.namespace, labels))
        if grpc:
            own = None
        elif proxy.type == "sidecar":
            own = ctx.inbound_plan(proxy)
        else:  # a router listens on the target ports of the Services selecting it
            own = ctx.gateway_port_map(proxy)
        traffic = ctx.traffic
        # What its Telemetries make it log and trace (workload-level ones select by labels).
        telemetry = ctx.telemetry_plan(proxy) if not grpc else None
        # And the WasmPlugins that select it (also by labels).
        wasm = ctx.wasm_plan(proxy) if not grpc else None
        # Its IP families: how DNS clusters resolve, which cluster IPs of dual-stack Services it
        # sees, and (ISTIO_DUAL_STACK, both families) [::] listeners; others must not share.
        families = proxy.ip_families
        key = self._intern((proxy.traits, scope, traffic.source_signature(labels), traffic.rule_signature(labels),
                            own, telemetry, wasm, families))
        self._proxy_keys[id(proxy)] = (proxy, proxy.metadata, key)
        return key

    def _reset(self, ctx: PushContext) -> None:
        if ctx.version != self._version:
            self._memo = {}
            self._plans = {}
            self._proxy_keys = {}
            self._interned = {}
            self._version = ctx.version

    def _key(self, ctx: PushContext, type_url: str, proxy: Proxy, requested: frozenset[str] | None) -> Key:
        """Called once per stream and type in a push: the parts are cheap to hash (the proxy key,
        the shared name set and the patch set keep their hashes), and the Key made of them is
        looked up twice (outputs being generated, outputs made) by identity."""
        inputs = self.proxy_inputs.get(type_url)
        extra = inputs(ctx, proxy) if inputs is not None else None
        independent = self.reads_no_proxy.get(type_url) if extra is None else None
        proxy_key: Hashable = None if independent is not None and independent(requested) \
            else self._proxy_key(ctx, proxy)
        if type_url == LISTENER and proxy.is_grpc:
            # A gRPC server's inbound listeners read its addresses and labels (grpc_server_inputs).
            proxy_key = (proxy_key, grpc_server_inputs(proxy, requested))
        # EnvoyFilter patches of this type only: a filter of listeners splits no one's clusters.
        patches = None if proxy_key is None else patches_for(ctx, proxy, type_url)
        return self._intern((type_url, proxy_key, requested, patches) if extra is None
                            else (type_url, proxy_key, requested, patches, extra))

    def generate(self, ctx: PushContext, type_url: str, proxy: Proxy,
                 requested: frozenset[str] | None) -> Generated:
        self._reset(ctx)
        key = self._key(ctx, type_url, proxy, requested)
        out = self._memo.get(key)
        if out is None:
            self.misses += 1
            if self.record:
                with ctx.recording() as deps:
                    made = self.generators[type_url](ctx, proxy, requested, self.cache)
            else:
                deps = None
                made = self.generators[type_url](ctx, proxy, requested, self.cache)
            out = Generated(tuple(made), getattr(made, "absent", ()), deps=deps)
            self._memo[key] = out
        else:
            self.hits += 1
        return out

    async def agenerate(self, ctx: PushContext, type_url: str, proxy: Proxy,
                        requested: frozenset[str] | None) -> Generated:
        """generate(), without holding the event loop for long: a type with a resource-at-a-time
        generator (`sliced`) yields to the loop every SLICE seconds of a cold generation (a
        thousand clusters take 15-100 ms, during which every stream would wait). Streams asking
        for an output being generated wait for it rather than generate it again."""
        self._reset(ctx)
        each = self.sliced.get(type_url)
        if each is None:
            return self.generate(ctx, type_url, proxy, requested)
        key = self._key(ctx, type_url, proxy, requested)
        while (running := self._running.get(key)) is not None and running[0] is ctx:
            await asyncio.wait([running[1]])  # raises only if this task is cancelled
            if self.turn is not None:
                await self.turn()
            if not running[1].cancelled():
                self.hits += 1
                return running[1].result()
            # The stream generating it went away mid-way: generate it here (or wait for another).
        out = self._memo.get(key)
        if out is not None:
            self.hits += 1
            return out
        self.misses += 1
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._running[key] = (ctx, done)
        try:
            out = await self._sliced(ctx, each, proxy, requested)
        except BaseException:
            done.cancel()  # waiters generate it themselves
            raise
        finally:
            if self._running.get(key, (None, None))[1] is done:
                del self._running[key]
        if ctx.version == self._version:  # a newer context started meanwhile: this one is not its
            self._memo[key] = out
        done.set_result(out)
        return out

    async def _sliced(self, ctx: PushContext, each: Sliced, proxy: Proxy,
                      requested: frozenset[str] | None) -> Generated:
        made: list[CachedResource] = []
        deps = Deps() if self.record else None
        # The recording stack is this generation's only while it runs: detached at each yield.
        held = [deps] if deps is not None else None
        it = each(ctx, proxy, requested, self.cache)
        while True:
            until = time.perf_counter() + SLICE
            finished = True
            if held is not None:
                ctx.resume_recording(held)
            try:
                for res in it:
                    if res is not None:
                        made.append(res)
                    if time.perf_counter() >= until:
                        finished = False
                        break
            finally:
                if held is not None:
                    held = ctx.suspend_recording()
            if finished:
                return Generated(tuple(made), deps=deps)
            await asyncio.sleep(0)  # the rest of the loop runs; then this generation goes on
            if self.turn is not None:
                await self.turn()

    def plan(self, held: Mapping[str, str], generated: Generated, force: frozenset[str], *, delta: bool,
             complete: bool, partial: bool, always: bool) -> Plan:
        """`plan_response`, shared by every proxy that holds the same map and gets the same
        output in this push: a full push to a thousand identical sidecars plans once."""
        key = (id(held), id(generated), force, delta, complete, partial, always)
        hit = self._plans.get(key)
        if hit is not None and hit[0] is held and hit[1] is generated:
            return hit[2]
        result = plan_response(held, generated, force, delta=delta, complete=complete, partial=partial,
                               always=always)
        self._plans[key] = (held, generated, result)  # the references keep both ids from being reused
        return result


@dataclass(frozen=True, eq=False)
class Plan:
    """What one response carries, given what a proxy holds and what it should hold."""

    out: tuple[CachedResource, ...]
    fields: bytes  # `out`, framed for the protocol's response message
    removed: tuple[str, ...]  # delta only
    held_after: Mapping[str, str]  # name -> version once the proxy takes this response
    changed: frozenset[str]  # names whose content differs from what was held (or forced)
    empty: bool  # nothing to tell the proxy
    # The whole response, once per (type, push version), for every proxy given this plan: see
    # DiscoveryServer._response. Filled lazily, so the dataclass stays frozen otherwise.
    bodies: dict = field(default_factory=dict, repr=False)


def plan_response(held: Mapping[str, str], generated: Generated, force: frozenset[str], *, delta: bool,
                  complete: bool, partial: bool, always: bool) -> Plan:
    """Pure: the response for one proxy. `held` maps are never mutated: when the proxy ends up
    holding exactly the generated set, `held_after` *is* the generated version map, so proxies
    in the same state share one map and, through the memo, one plan. That holds for an empty
    plan too: a proxy whose map only equals the generated one (it was built in an earlier push)
    moves onto the shared one, so its next push shares a plan and a body with its peers."""
    desired = generated.versions()
    changed = frozenset(n for n, v in desired.items() if held.get(n) != v) | (force & desired.keys())
    if complete or always:
        if delta:
            out = tuple(r for r in generated.resources if r.name in changed)
            removed = tuple(n for n in held if n not in desired)
            if always:
                removed += tuple(n for n in generated.absent if n not in held)
            return Plan(out, framed(out, delta=True), removed, desired, changed,
                        not out and not removed)
        unchanged = not changed and (not complete or held.keys() == desired.keys())
        return Plan(generated.resources, generated.sotw_fields(), (), desired, changed, unchanged)
    # Named resources (EDS, RDS): send only what changed; a subset push (partial) leaves the rest.
    out = tuple(r for r in generated.resources if r.name in changed)
    fields = framed(out, delta)
    removed = () if partial or not delta else tuple(n for n in held if n not in desired)
    if not out and not removed:
        # Nothing to send: the proxy keeps what it holds (see DiscoveryServer._send).
        return Plan((), b"", (), desired if held == desired else held, changed, True)
    if not partial:
        held_after: Mapping[str, str] = desired
    elif held.keys() <= desired.keys():
        held_after = desired
    else:
        held_after = {**held, **{r.name: r.version for r in out}}
    return Plan(out, fields, removed, held_after, changed, False)
