"""A real Envoy as the TCP load balancer in front of server replicas on loopback, as a Kubernetes
Service (or a cloud L4 balancer) is in front of istiod's: each TCP connection (one gRPC channel,
carrying many streams) goes to one replica, round robin; a connection refused by a stopped
replica is tried on another (`max_connect_attempts`)."""

from __future__ import annotations

from pathlib import Path

from tests.support.envoy import Envoy  # the tests' Envoy runner: start, readiness, stop


def bootstrap(upstream_ports: list[int]) -> dict:
    """Listener and admin on port 0: the bound ports are read back once Envoy runs."""
    endpoints = [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
                 for p in upstream_ports]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "xds_lb",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.tcp_proxy",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                        "stat_prefix": "xds_lb", "cluster": "replicas", "max_connect_attempts": 5}}]}]}],
            "clusters": [{
                "name": "replicas", "type": "STATIC", "lb_policy": "ROUND_ROBIN", "connect_timeout": "1s",
                # A stopped replica refuses connections: passive ejection keeps it out for a while.
                "outlier_detection": {"consecutive_local_origin_failure": 1,
                                      "split_external_local_origin_errors": True,
                                      "base_ejection_time": "5s", "max_ejection_percent": 50},
                "load_assignment": {"cluster_name": "replicas", "endpoints": [{"lb_endpoints": endpoints}]}}]},
    }


class EnvoyLB:
    def __init__(self, workdir: Path, upstream_ports: list[int]) -> None:
        self.workdir = workdir
        self.upstream_ports = upstream_ports
        self.port = 0  # the balancer's listener, known once started
        self._envoy = Envoy(log_level="warning")

    async def start(self, timeout: float = 30.0) -> None:
        await self._envoy.start(bootstrap(self.upstream_ports), self.workdir, timeout=timeout)
        await self._envoy.wait_ready(timeout=timeout)
        self.port = (await self._envoy.listener_ports())["xds_lb"]

    async def stop(self) -> None:
        await self._envoy.stop()
