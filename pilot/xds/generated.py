"""Generator output shared by every proxy with the same traits and subscription in one push.

A push to 1,000 sidecars in ten namespaces runs each generator ten times, not a thousand: the
memo is keyed by (type, proxy traits, requested names) and lives as long as the PushContext.
The assembled bytes of a SotW response body are shared too; each proxy adds only its nonce.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from pilot.model.dependencies import Deps
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.xds.cache import CachedResource, XdsCache
from pilot.xds.generators.envoy_filter import patches_for


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
            self._sotw_fields = b"".join(r.sotw_field for r in self.resources)
        return self._sotw_fields


Generator = Callable[[PushContext, Proxy, frozenset[str] | None, XdsCache], list[CachedResource]]


# Per type, optionally: whether a request's output leaves the proxy unread (then the memo key
# holds no proxy traits and proxies in every namespace share one output, plan and body).
ReadsNoProxy = Callable[[frozenset[str] | None], bool]


class GenerationMemo:
    def __init__(self, generators: Mapping[str, Generator], cache: XdsCache,
                 reads_no_proxy: Mapping[str, ReadsNoProxy] | None = None, record: bool = True) -> None:
        self.generators = generators
        # Record what each generated output read, once per output (proxies sharing it share it).
        self.record = record
        self.cache = cache
        self.reads_no_proxy = dict(reads_no_proxy or {})
        self._version: str | None = None
        self._memo: dict[Hashable, Generated] = {}
        self._plans: dict[Hashable, tuple[Mapping, Generated, Plan]] = {}
        self._proxy_keys: dict[int, tuple[Proxy, Mapping, Hashable]] = {}
        self.hits = 0
        self.misses = 0

    def _proxy_key(self, ctx: PushContext, proxy: Proxy) -> Hashable:
        """Generators read nothing of a proxy but its traits, the Sidecar that scopes it (for a
        router: the Gateways its labels select), which sourceLabels matches and DestinationRule
        workloadSelectors its labels meet and,
        for a sidecar, its inbound plan (the services selecting it, their mTLS modes and
        policies), for a router the ports of the Services selecting it (and, per type, the EnvoyFilter
        patches it gets). Worked out once per proxy and context: a push asks for it once per type."""
        hit = self._proxy_keys.get(id(proxy))
        # The metadata object is replaced, never mutated, when a proxy turns out to be gRPC.
        if hit is not None and hit[0] is proxy and hit[1] is proxy.metadata:
            return hit[2]
        labels = proxy.labels
        scope = (ctx.gateways.select(labels) if proxy.type == "router"
                 else ctx.sidecar_for(proxy.namespace, labels))
        if proxy.is_grpc:
            own = None
        elif proxy.type == "sidecar":
            own = ctx.inbound_plan(proxy)
        else:  # a router listens on the target ports of the Services selecting it
            own = ctx.gateway_port_map(proxy)
        traffic = ctx.traffic
        key = (proxy.traits, scope, traffic.source_signature(labels), traffic.rule_signature(labels), own)
        self._proxy_keys[id(proxy)] = (proxy, proxy.metadata, key)
        return key

    def generate(self, ctx: PushContext, type_url: str, proxy: Proxy,
                 requested: frozenset[str] | None) -> Generated:
        if ctx.version != self._version:
            self._memo = {}
            self._plans = {}
            self._proxy_keys = {}
            self._version = ctx.version
        independent = self.reads_no_proxy.get(type_url)
        proxy_key = None if independent is not None and independent(requested) else self._proxy_key(ctx, proxy)
        # EnvoyFilter patches of this type only: a filter of listeners splits no one's clusters.
        key = (type_url, proxy_key, requested, None if proxy_key is None else patches_for(ctx, proxy, type_url))
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

    def plan(self, held: Mapping[str, str], generated: Generated, force: frozenset[str], **mode: bool) -> Plan:
        """`plan_response`, shared by every proxy that holds the same map and gets the same
        output in this push: a full push to a thousand identical sidecars plans once."""
        key = (id(held), id(generated), force, *sorted(mode.items()))
        hit = self._plans.get(key)
        if hit is not None and hit[0] is held and hit[1] is generated:
            return hit[2]
        result = plan_response(held, generated, force, **mode)
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
            return Plan(out, b"".join(r.delta_field for r in out), removed, desired, changed,
                        not out and not removed)
        unchanged = not changed and (not complete or held.keys() == desired.keys())
        return Plan(generated.resources, generated.sotw_fields(), (), desired, changed, unchanged)
    # Named resources (EDS, RDS): send only what changed; a subset push (partial) leaves the rest.
    out = tuple(r for r in generated.resources if r.name in changed)
    fields = b"".join((r.delta_field if delta else r.sotw_field) for r in out)
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
