"""RDS a virtual host at a time (pilot/xds/generators/rds.py `sliced`): the same route
configurations as generate(), EnvoyFilter patches included, and a cold one of a thousand
virtual hosts no longer built in one call on the event loop."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time

from pilot.xds.cache import XdsCache
from pilot.xds.discovery import GENERATORS, SLICED
from pilot.xds.generated import SLICE, GenerationMemo
from pilot.xds.generators import rds
from pilot.xds.pace import Pace
from pilot.xds.typeurls import ROUTE

from .helpers import World, proxy, service


def world(services: int) -> World:
    w = World()
    w.apply(*(service(f"svc-{i}", cluster_ip=f"10.96.{i // 250}.{i % 250 + 1}") for i in range(services)))
    w.apply({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
             "metadata": {"name": "svc-1", "namespace": "default"},
             "spec": {"hosts": ["svc-1"], "http": [{"timeout": "3s", "route": [{"destination": {"host": "svc-1"}}]}]}})
    return w


def bytes_of(resources) -> list[tuple[str, bytes]]:
    return [(r.name, r.any_bytes) for r in resources if r is not None]


def test_sliced_routes_are_generate_s_routes_with_and_without_patches():
    w = world(30)
    ctx = w.ctx()
    sidecar = proxy("default")
    want = bytes_of(rds.generate(ctx, sidecar, frozenset({"9080"}), XdsCache()))
    steps = list(rds.sliced(ctx, sidecar, frozenset({"9080"}), XdsCache()))  # a cold cache: built in steps
    assert bytes_of(steps) == want and len(want) == 1
    assert steps.count(None) == 31, "a pause point after each virtual host, and before serialising"
    # A warm cache: the one entry both paths share, no steps.
    cache = XdsCache()
    first = rds.generate(ctx, sidecar, frozenset({"9080"}), cache)
    assert list(rds.sliced(ctx, sidecar, frozenset({"9080"}), cache)) == first

    w.apply({"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
             "metadata": {"name": "vh", "namespace": "istio-system"},
             "spec": {"configPatches": [{"applyTo": "VIRTUAL_HOST", "match": {"context": "SIDECAR_OUTBOUND"},
                                         "patch": {"operation": "MERGE",
                                                   "value": {"request_headers_to_add": [
                                                       {"header": {"key": "x-patched", "value": "1"}}]}}}]}})
    ctx = w.ctx()
    patched = bytes_of(rds.generate(ctx, sidecar, frozenset({"9080"}), XdsCache()))
    assert patched != want and b"x-patched" in patched[0][1]
    assert bytes_of(rds.sliced(ctx, sidecar, frozenset({"9080"}), XdsCache())) == patched


def _ticker(ticks: list[float], stop: list[bool]):
    async def ticker():
        while not stop[0]:
            ticks.append(time.process_time())
            await asyncio.sleep(0)
    return ticker()


async def test_a_cold_route_configuration_of_a_thousand_services_yields_to_the_loop():
    w = world(1000)
    ctx = w.ctx()
    held = {}
    for name, sliced in (("sliced", SLICED), ("whole", {})):
        memo = GenerationMemo(GENERATORS, XdsCache(), {}, sliced=sliced, turn=Pace().turn)
        ticks: list[float] = []
        stop = [False]
        task = asyncio.create_task(_ticker(ticks, stop))
        await asyncio.sleep(0)
        # What is measured is the generation's slicing, not the test process's collector (with
        # the default thresholds a full collection of this process alone takes 10 ms and more;
        # the server sets its own, pilot/bootstrap.py).
        gc.disable()
        try:
            start = time.process_time()
            out = await memo.agenerate(ctx, ROUTE, proxy("default"), frozenset({"9080"}))
            end = time.process_time()
        finally:
            gc.enable()
        stop[0] = True
        await task
        assert len(out.resources) == 1
        during = [start, *(t for t in ticks if start <= t <= end), end]
        held[name] = max(b - a for a, b in itertools.pairwise(during))
    # Built whole, one call of 10-30 ms (CPU); sliced, the longest pause is a slice (SLICE of
    # wall time) or one step that cannot be cut (serialising the half-megabyte message, 1-5 ms).
    assert held["sliced"] < min(held["whole"] / 2, SLICE + 0.007), held
