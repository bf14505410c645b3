"""istiod's gauges that describe what the control plane knows, computed from the current
PushContext (and the connected proxies) each time /metrics is scraped, so they can never drift
from the state they describe:

- `pilot_services`: services known (Kubernetes Services and ServiceEntry hosts).
- `pilot_virt_services`: VirtualServices known, those translated from Gateway API routes included
  (as istiod counts them).
- `pilot_eds_no_instances`: clusters (service ports) without a single endpoint.
- `pilot_conflict_outbound_listener_tcp_over_current_tcp`: TCP services that share an outbound
  port with an earlier TCP service and have no cluster IP of their own to be told apart by, so
  they get no listener of their own (istiod's iptables-mode rule).
- `pilot_conflict_inbound_listener`: connected sidecars with a workload port that could not be
  served inbound (the proxies /debug/push_status lists).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from pilot.xds.discovery import DiscoveryServer

_HELP = {
    "pilot_services": "Total services known to pilot.",
    "pilot_virt_services": "Total virtual services known to pilot.",
    "pilot_eds_no_instances": "Number of clusters without instances.",
    "pilot_conflict_outbound_listener_tcp_over_current_tcp": (
        "Number of conflicting tcp listeners with current tcp listener."
    ),
    "pilot_conflict_inbound_listener": "Number of conflicting inbound listeners.",
}


class StateCollector:
    def __init__(self, server: DiscoveryServer) -> None:
        self.server = server

    def describe(self):
        """Names only: registering must not compute anything."""
        return [GaugeMetricFamily(name, text) for name, text in _HELP.items()]

    def collect(self):
        values = self.values()
        return [GaugeMetricFamily(name, text, value=values[name]) for name, text in _HELP.items()]

    def values(self) -> dict[str, float]:
        server = self.server
        ctx = server.push_context
        no_instances = sum(1 for svc in ctx.services for p in svc.ports if not ctx.endpoints(svc, p.port))
        tcp_over_tcp = 0
        for plan in ctx.full_view.port_plans:
            seen_ips: set[str] = set()
            for i, svc in enumerate(plan.tcp_services):
                if i and (not svc.cluster_ip or svc.cluster_ip in seen_ips):
                    tcp_over_tcp += 1
                if svc.cluster_ip:
                    seen_ips.add(svc.cluster_ip)
        inbound = 0
        for conn in list(server.connections.values()):
            p = conn.proxy
            if p.type == "sidecar" and not p.is_grpc and ctx.inbound_plan(p).problems:
                inbound += 1
        vs = (
            len(server.store.list("VirtualService"))
            + len(ctx.gateway_api.virtual_services)
            + len(ctx.gateway_api.mesh_virtual_services)
        )
        return {
            "pilot_services": len(ctx.services),
            "pilot_virt_services": vs,
            "pilot_eds_no_instances": no_instances,
            "pilot_conflict_outbound_listener_tcp_over_current_tcp": tcp_over_tcp,
            "pilot_conflict_inbound_listener": inbound,
        }
