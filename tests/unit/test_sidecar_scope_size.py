"""A Sidecar scoping a proxy to its own namespace shrinks what it is sent (the traffic issue's
figure: CDS+LDS+RDS bytes and generation time for one sidecar in a 200-service mesh)."""

from __future__ import annotations

import json
import time

from pilot.config.mesh import MeshConfig
from pilot.config.validation import parse_object
from pilot.model.mesh import MeshHolder
from pilot.model.proxy import Proxy
from pilot.model.push_context import PushContext
from pilot.model.store import Store
from pilot.xds.cache import XdsCache
from pilot.xds.generators import cds, lds, rds


def _mesh(with_sidecar: bool) -> PushContext:
    store = Store()
    for i in range(200):
        store.apply(parse_object({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc{i}", "namespace": f"ns{i % 10}"},
            "spec": {"clusterIP": f"10.96.{i // 250}.{i % 250 + 1}", "ports": [{"name": "http", "port": 8000 + i % 20}]}}))
    if with_sidecar:
        store.apply(parse_object({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                                  "metadata": {"name": "default", "namespace": "ns0"},
                                  "spec": {"egress": [{"hosts": ["./*"]}]}}))
    mesh = MeshHolder(MeshConfig(), "istio-system")
    return PushContext.build(store, mesh.current, mesh.version, "cluster.local", "v1")


def _config(ctx: PushContext) -> dict:
    proxy = Proxy("sidecar~10.0.0.1~a.ns0~ns0.svc.cluster.local", "sidecar", ("10.0.0.1",), "a", "ns0",
                  "cluster.local", metadata={"NAMESPACE": "ns0"})
    cache = XdsCache()
    t0 = time.perf_counter()
    clusters = cds.generate(ctx, proxy, None, cache)
    listeners = lds.generate(ctx, proxy, None, cache)
    ports = {str(p.port) for p in ctx.view(ctx.sidecar_for("ns0", {})).port_plans if p.http}
    routes = rds.generate(ctx, proxy, frozenset(ports), cache)
    elapsed = time.perf_counter() - t0
    return {"clusters": len(clusters), "listeners": len(listeners), "routes": len(routes),
            "bytes": sum(len(r.any_bytes) for r in clusters + listeners + routes),
            "generate_ms": round(elapsed * 1000, 1)}


def test_sidecar_scoped_to_its_namespace_gets_a_fraction_of_the_config(capsys):
    full, scoped = _config(_mesh(False)), _config(_mesh(True))
    # 200 services in 10 namespaces: ns0 holds 20 of them on 2 of the 20 ports.
    assert full["clusters"] == 202 and scoped["clusters"] == 22  # + BlackHole and Passthrough
    assert scoped["listeners"] == 3 and scoped["routes"] == 2  # virtualOutbound + one per port
    assert scoped["bytes"] < full["bytes"] / 5
    with capsys.disabled():
        print("\nFIGURES " + json.dumps({"sidecar_scope_200_services": {"without": full, "with": scoped}}))
