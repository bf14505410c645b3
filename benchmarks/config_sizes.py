"""CDS and LDS bytes per proxy for the push benchmark mesh (benchmarks/mesh.py), with every port
named `http` (what the benchmark runs) and with the same ports named `web` (no protocol: sniffed,
istiod's ListenerProtocolAuto). Computed in-process with the real generators, no server:

    python -m benchmarks.config_sizes [--services 1000] [--namespaces 10]

prints JSON: for each variant the resource counts and serialised bytes (the Any bytes a SotW
response carries, which is what a proxy receives) of one benchmark proxy (benchmarks/proxy.py's
node in namespace ns0), with INTERCEPTION_MODE NONE (what the benchmark runs: listeners bind
127.0.0.1:PORT) and REDIRECT (iptables, as istiod's sidecars usually run), and the ratio sniffed / named.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import yaml

from benchmarks.mesh import SYSTEM_NAMESPACE, MeshFiles
from benchmarks.proxy import node_for
from pilot.config.mesh import MeshConfig
from pilot.config.validation import parse_object
from pilot.model.mesh import MeshHolder
from pilot.model.proxy import proxy_from_node
from pilot.model.push_context import PushContext
from pilot.model.store import Store
from pilot.xds.cache import XdsCache
from pilot.xds.generators import cds, lds


def _docs(root: Path, port_name: str) -> list[dict]:
    out = []
    for path in sorted(root.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("Service", "EndpointSlice"):
                ports = doc["spec"]["ports"] if doc["kind"] == "Service" else doc["ports"]
                for p in ports:
                    p["name"] = port_name
            if doc:
                out.append(doc)
    return out


def measure(services: int, namespaces: int, port_name: str, interception: str = "NONE") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        MeshFiles(Path(tmp), services, namespaces).write_all()
        docs = _docs(Path(tmp), port_name)
    store = Store()
    for d in docs:
        store.apply(parse_object(d), source="bench")
    mesh = MeshHolder(MeshConfig(), SYSTEM_NAMESPACE)
    mesh.refresh(store)
    ctx = PushContext.build(store, mesh.current, mesh.version, "cluster.local", "v1")
    node = node_for(0, "ns0")
    node.metadata.update({"INTERCEPTION_MODE": interception})
    proxy = proxy_from_node(node)
    cache = XdsCache()
    out: dict = {"port_name": port_name, "interception": interception}
    for kind, gen in (("cds", cds), ("lds", lds)):
        resources = gen.generate(ctx, proxy, None, cache)
        out[kind] = {"resources": len(resources), "bytes": sum(len(r.any_bytes) for r in resources)}
    # (the listeners just generated: not a second generation, and one pass for the largest)
    out["lds"]["largest_listener"] = max(resources, key=lambda r: len(r.any_bytes)).name if resources else ""
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--namespaces", type=int, default=10)
    args = ap.parse_args(argv)
    report: dict = {"services": args.services, "namespaces": args.namespaces}
    for mode in ("NONE", "REDIRECT"):
        named = measure(args.services, args.namespaces, "http", mode)
        sniffed = measure(args.services, args.namespaces, "web", mode)
        report[mode] = {"named_http": named, "sniffed": sniffed,
                        "ratio": {k: round(sniffed[k]["bytes"] / named[k]["bytes"], 3) for k in ("cds", "lds")}}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
