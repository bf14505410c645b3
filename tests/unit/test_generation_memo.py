"""The per-push generation memo shares one output between proxies only when the output cannot
differ between them: EDS without subsets is the same for every namespace; a subset is not
(which DestinationRule defines it depends on the client's namespace)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time

from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.features import Features
from pilot.xds.cache import CachedResource
from pilot.xds.discovery import GENERATORS, DiscoveryServer
from pilot.xds.generated import GenerationMemo
from pilot.xds.generators import eds
from pilot.xds.pace import Pace
from pilot.xds.typeurls import CLUSTER, ENDPOINT

from .helpers import World, proxy, service

HOST = "reviews.default.svc.cluster.local"
PLAIN = f"outbound|9080||{HOST}"
SUBSET = f"outbound|9080|v1|{HOST}"


def labelled_pod(name: str, ip: str, version: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                           "labels": {"app": "reviews", "version": version}},
            "status": {"podIP": ip, "phase": "Running"}}


def destination_rule(namespace: str, version: str) -> dict:
    """Subset v1 of reviews, as this namespace's DestinationRule defines it."""
    return {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": "reviews", "namespace": namespace},
            "spec": {"host": HOST, "subsets": [{"name": "v1", "labels": {"version": version}}]}}


def world() -> World:
    w = World()
    w.apply(service("reviews"), labelled_pod("reviews-a", "10.1.0.1", "a"), labelled_pod("reviews-b", "10.1.0.2", "b"),
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "reviews-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "reviews"}},
             "addressType": "IPv4", "ports": [{"name": "http", "port": 9080}],
             "endpoints": [{"addresses": [ip], "conditions": {"ready": True},
                            "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}}
                           for pod, ip in (("reviews-a", "10.1.0.1"), ("reviews-b", "10.1.0.2"))]},
            destination_rule("default", "a"), destination_rule("other", "b"))
    return w


def addresses(generated) -> list[str]:
    cla = generated.resources[0].message(endpoint_pb2.ClusterLoadAssignment)
    return [e.endpoint.address.socket_address.address for lo in cla.endpoints for e in lo.lb_endpoints]


def test_eds_without_subsets_is_shared_across_namespaces_and_subsets_are_not():
    w = world()
    memo = GenerationMemo(GENERATORS, w.cache, {ENDPOINT: eds.reads_no_proxy})
    ctx = w.ctx()
    here, there = proxy("default", pod_name="p1"), proxy("other", pod_name="p2", ip="10.0.0.2")
    plain = frozenset({PLAIN})
    assert memo.generate(ctx, ENDPOINT, here, plain) is memo.generate(ctx, ENDPOINT, there, plain)
    assert addresses(memo.generate(ctx, ENDPOINT, here, plain)) == ["10.1.0.1", "10.1.0.2"]
    subset = frozenset({SUBSET})
    assert addresses(memo.generate(ctx, ENDPOINT, here, subset)) == ["10.1.0.1"]  # default's rule
    assert addresses(memo.generate(ctx, ENDPOINT, there, subset)) == ["10.1.0.2"]  # its own namespace's
    both = frozenset({PLAIN, SUBSET})
    assert memo.generate(ctx, ENDPOINT, here, both) is not memo.generate(ctx, ENDPOINT, there, both)


def _busy(seconds: float) -> None:
    """CPU work standing in for building one resource (process time: the machine's load does not stretch it)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


async def test_a_long_generation_yields_to_the_loop_and_is_shared_by_streams_asking_meanwhile():
    """A cold generation that takes 150 ms of CPU lets other tasks run between slices (a ticker
    keeps ticking, never held for long), two streams asking for it get one output generated
    once, and each resource's reads are recorded as its own even though another task recorded
    its own reads while the generation was paused."""
    w = world()
    ctx = w.ctx()
    built: list[str] = []

    def slow_eds(ctx, proxy, requested, cache):
        for name in sorted(requested):
            ctx.begin_resource(name)
            try:
                ctx.service(HOST)  # a recorded read
                _busy(0.003)
                built.append(name)
            finally:
                ctx.end_resource()
            yield CachedResource.from_message(name, endpoint_pb2.ClusterLoadAssignment(cluster_name=name), ENDPOINT)

    memo = GenerationMemo(GENERATORS, w.cache, {ENDPOINT: eds.reads_no_proxy}, sliced={ENDPOINT: slow_eds})
    names = frozenset(f"outbound|9080||n{i}.default.svc.cluster.local" for i in range(50))
    ticks: list[float] = []  # process time at each turn the ticker got
    stop = False

    async def ticker():
        while not stop:
            ticks.append(time.process_time())
            # Another stream's synchronous generation, recording its own reads meanwhile.
            with ctx.recording() as theirs:
                ctx.service("details.default.svc.cluster.local")
            assert not theirs.named
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start = time.process_time()
    first, second = await asyncio.gather(memo.agenerate(ctx, ENDPOINT, proxy("default"), names),
                                         memo.agenerate(ctx, ENDPOINT, proxy("other", ip="10.0.0.2"), names))
    end = time.process_time()
    stop = True
    await task

    assert first is second and len(built) == 50, "generated once for both streams"
    assert memo.generate(ctx, ENDPOINT, proxy("default"), names) is first  # and kept for the push
    during = [t for t in ticks if start <= t <= end]
    assert len(during) >= 10, f"the loop ran {len(during)} times during a {end - start:.3f} s generation"
    gaps = [b - a for a, b in zip([start, *during], [*during, end], strict=True)]
    assert max(gaps) < 0.05, f"the loop was held {max(gaps) * 1000:.0f} ms (CPU) at once"
    named = first.deps.named
    assert set(named) == names
    facets = {f for d in named.values() for f in d.facets}
    assert ("host", HOST) in facets and ("host", "details.default.svc.cluster.local") not in facets


def test_equal_traits_share_one_output_and_plan_and_labels_or_names_that_matter_split_them():
    """Through the server's memo (every per-type input it keys on): sidecars with equal traits
    get the one output and the one plan object; a proxy whose labels a Sidecar selects, or a
    different set of EDS names, gets its own; a new context shares again (its keys are its own)."""
    w = World()
    w.apply(service("reviews"), service("ratings", cluster_ip="10.96.0.21"),
            {"apiVersion": "networking.istio.io/v1", "kind": "Sidecar", "metadata": {"name": "narrow", "namespace": "default"},
             "spec": {"workloadSelector": {"labels": {"app": "narrow"}},
                      "egress": [{"hosts": ["./reviews.default.svc.cluster.local"]}]}})
    memo = DiscoveryServer(w.store, w.mesh, Features.from_env({})).generated

    def labelled(pod: str, ip: str, app: str):
        p = proxy("default", pod_name=pod, ip=ip)
        p.metadata["LABELS"] = {"app": app}
        return p

    a, b, narrow = labelled("a", "10.0.0.1", "wide"), labelled("b", "10.0.0.2", "wide"), labelled("c", "10.0.0.3", "narrow")
    held: dict[str, str] = {}

    def plan(generated):
        return memo.plan(held, generated, frozenset(), delta=False, complete=True, partial=False, always=False)

    for ctx in (w.ctx(), w.ctx()):
        cds_a, cds_b, cds_narrow = (memo.generate(ctx, CLUSTER, p, None) for p in (a, b, narrow))
        assert cds_a is cds_b and plan(cds_a) is plan(cds_b)
        assert cds_narrow is not cds_a and plan(cds_narrow) is not plan(cds_a)
        assert PLAIN in cds_narrow.versions() and "outbound|9080||ratings.default.svc.cluster.local" \
            in cds_a.versions().keys() - cds_narrow.versions().keys()
        one, two = frozenset({PLAIN}), frozenset({PLAIN, "outbound|9080||ratings.default.svc.cluster.local"})
        assert memo.generate(ctx, ENDPOINT, a, one) is memo.generate(ctx, ENDPOINT, b, frozenset({PLAIN}))
        assert memo.generate(ctx, ENDPOINT, a, one) is not memo.generate(ctx, ENDPOINT, b, two)
        assert len(memo.generate(ctx, ENDPOINT, b, two).resources) == 2


async def test_streams_woken_by_an_output_they_waited_for_take_turns_before_their_own_work():
    """A hundred streams of one namespace wait for the output the first of them generates; once
    it is there, each plans and writes its response (here 0.5 ms of CPU). With the server's turns
    (pilot/xds/pace.py) they share the loop's budget instead of all running in one iteration."""
    def slow_eds(ctx, proxy, requested, cache):
        for name in sorted(requested):
            _busy(0.001)
            yield CachedResource.from_message(name, endpoint_pb2.ClusterLoadAssignment(cluster_name=name), ENDPOINT)

    names = frozenset(f"outbound|9080||n{i}.default.svc.cluster.local" for i in range(20))

    async def held_longest(turn) -> float:
        w = world()
        ctx = w.ctx()
        memo = GenerationMemo(GENERATORS, w.cache, {ENDPOINT: eds.reads_no_proxy}, sliced={ENDPOINT: slow_eds},
                              turn=turn)
        ticks: list[float] = []
        stop = False

        async def ticker():
            while not stop:
                ticks.append(time.process_time())
                await asyncio.sleep(0)

        async def stream(i: int):
            out = await memo.agenerate(ctx, ENDPOINT, proxy("default", pod_name=f"p{i}"), names)
            _busy(0.0005)  # its response: plan, frame, write
            return out

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        gc.disable()  # the turns are measured, not the test process's collector
        try:
            start = time.process_time()
            outs = await asyncio.gather(*(stream(i) for i in range(100)))
            end = time.process_time()
        finally:
            gc.enable()
        stop = True
        await task
        assert all(o is outs[0] for o in outs), "one output for the namespace"
        during = [start, *(t for t in ticks if start <= t <= end), end]
        return max(b - a for a, b in itertools.pairwise(during))

    paced = await held_longest(Pace(budget=0.005).turn)
    assert paced < 0.025, f"the loop was held {paced * 1000:.0f} ms (CPU) at once"
    unpaced = await held_longest(None)  # without turns: all hundred responses in one iteration
    assert unpaced > 0.04, unpaced
