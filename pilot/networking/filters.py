"""Network and HTTP filters shared by listener builders."""

from __future__ import annotations

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from pilot.model.mesh_settings import ListenerSettings
from pilot.networking import telemetry, wasm
from pilot.networking.protos import ads_config_source, duration, pack

HCM_FILTER = "envoy.filters.network.http_connection_manager"
TCP_PROXY_FILTER = "envoy.filters.network.tcp_proxy"
STATEFUL_SESSION_FILTER = "envoy.filters.http.stateful_session"


def access_logs(settings: ListenerSettings) -> list[accesslog_pb2.AccessLog]:
    """The access logs of the listener's class (MeshConfig accessLogFile or the Telemetry API)."""
    return telemetry.access_logs(settings.telemetry)


def fault_filter() -> hcm_pb2.HttpFilter:
    """Inert until a route's typed_per_filter_config (a VirtualService fault) configures it."""
    return hcm_pb2.HttpFilter(name="envoy.filters.http.fault", typed_config=pack(fault_pb2.HTTPFault()))


def cors_filter() -> hcm_pb2.HttpFilter:
    return hcm_pb2.HttpFilter(name="envoy.filters.http.cors", typed_config=pack(cors_pb2.Cors()))


def stateful_session_filter() -> hcm_pb2.HttpFilter:
    """istiod's EmptySessionFilter: with no session state it does nothing, until a route's
    typed_per_filter_config (an HTTPRoute rule's sessionPersistence) gives it one."""
    return hcm_pb2.HttpFilter(name=STATEFUL_SESSION_FILTER, typed_config=pack(stateful_session_pb2.StatefulSession()))


def router_filter() -> hcm_pb2.HttpFilter:
    return hcm_pb2.HttpFilter(name="envoy.filters.http.router", typed_config=pack(router_pb2.Router()))


def http_connection_manager(stat_prefix: str, route_config_name: str,
                            settings: ListenerSettings, port: int = 0,
                            security: tuple[hcm_pb2.HttpFilter, ...] | list[hcm_pb2.HttpFilter] = ()
                            ) -> hcm_pb2.HttpConnectionManager:
    """`port`: the listener's, for WasmPlugins matching ports; `security`: authentication and
    authorization filters to run first (a gateway's policies, pilot/networking/policy_filters.py)."""
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix=stat_prefix,
        codec_type=hcm_pb2.HttpConnectionManager.AUTO,
        rds=hcm_pb2.Rds(config_source=ads_config_source(), route_config_name=route_config_name),
        http_filters=wasm.insert([*security, fault_filter(), cors_filter(),
                                  *([stateful_session_filter()] if settings.session_filter else []), router_filter()],
                                 settings.wasm, port),
        access_log=access_logs(settings),
    )
    telemetry.apply_tracing(hcm, settings.telemetry)
    return hcm


def hcm_network_filter(hcm: hcm_pb2.HttpConnectionManager) -> listener_components_pb2.Filter:
    return listener_components_pb2.Filter(name=HCM_FILTER, typed_config=pack(hcm))


def tcp_proxy_filter(stat_prefix: str, cluster: str, settings: ListenerSettings,
                     limits: tuple[float | None, float | None] = (None, None)
                     ) -> listener_components_pb2.Filter:
    """`limits`: (idle timeout, maximum connection duration) in seconds, None for Envoy's default
    (a DestinationRule's connectionPool.tcp idleTimeout / maxConnectionDuration, as istiod sets them)."""
    tp = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix, cluster=cluster, access_log=access_logs(settings))
    idle, longest = limits
    if idle is not None:
        tp.idle_timeout.CopyFrom(duration(idle))
    if longest is not None:
        tp.max_downstream_connection_duration.CopyFrom(duration(longest))
    return listener_components_pb2.Filter(name=TCP_PROXY_FILTER, typed_config=pack(tp))
