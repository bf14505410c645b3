"""`eds`: one EndpointSlice changes; the endpoint-only path (no PushContext rebuild, only the
affected ClusterLoadAssignment) must reach every proxy that watches that cluster, with the
default debounce. Every proxy here sees every service, so every proxy watches it.

`proxies_received_eds` counts proxies that received (and ACKed) an EDS response carrying the
changed cluster after the write; `resources_per_response` shows whether that response held one
ClusterLoadAssignment or the whole set.
"""

from __future__ import annotations

import time

from benchmarks import stats
from benchmarks.options import Options
from benchmarks.scenarios.harness import CpuWindow, Harness, pooled


async def run(opts: Options) -> dict:
    async with Harness(opts, "eds") as h:
        lg = await h.loadgen(h.server.grpc_port)
        await h.connect_all(lg, opts.proxies)
        rounds = []
        services = h.mesh.services
        for r in range(opts.rounds):
            svc = services[(r * max(1, len(services) // max(1, opts.rounds))) % len(services)]
            watching = await lg.watching("eds", svc.cluster)
            window = CpuWindow(h.server.cpu_s)
            x = time.time()
            h.mesh.move_endpoint(svc)
            change = (await lg.converge("eds", [(x, svc.cluster)], opts.timeout()))["changes"][0]
            window.close()
            push = await h.last_push()
            rounds.append({"cluster": svc.cluster, "watching": watching, "change": change,
                           "server_cpu_s": window.cpu, "push": push})
        changes = [r["change"] for r in rounds]
        received = min(c["acked"] for c in changes)
        watching = min(r["watching"] for r in rounds)
        lg_stats = await lg.stats()
        return h.result(
            change="one EndpointSlice: one endpoint address moved",
            convergence_ms=stats.summary(pooled(changes)),
            proxies_acked=received,
            proxies_received_eds=received,
            proxies_watching=watching,
            all_watchers_received=received == watching,
            resources_per_response={"min": min(c["resources_min"] for c in changes),
                                    "max": max(c["resources_max"] for c in changes)},
            server_cpu_s=sum(r["server_cpu_s"] for r in rounds) / len(rounds),
            server_rss_mb=h.server.rss_mb(),
            bytes_received={"eds_per_change": sum(c["bytes"] for c in changes) // len(changes),
                            "eds_max_response": max(c["max_bytes"] for c in changes),
                            "total_by_type": lg_stats["bytes"]},
            rounds=[{"cluster": r["cluster"], "watching": r["watching"], "received": r["change"]["acked"],
                     "convergence_ms": stats.summary(r["change"]["ack_ms"]), "server_cpu_s": r["server_cpu_s"],
                     "server_push": r["push"]} for r in rounds],
            loadgen=lg_stats,
            note=f"{received}/{watching} watchers got EDS",
        )
