"""istiod's debug xDS types, which istioctl asks over ADS (`proxy-status`, `version`,
`x internal-debug`):

- `istio.io/debug/syncz`: one envoy.service.status.v3.ClientConfig per connected proxy (named by
  its node id) with each subscribed type's sync state; the response carries the replica's
  ControlPlane identifier (istioctl reads the replica name and version from it).
- `istio.io/debug/config_dump`: the resource name picks a proxy (a part of its node id, e.g.
  `POD.NAMESPACE`); the response's resources are the admin.v3 ConfigDump sections of what this
  control plane would send it (istioctl diffs them against Envoy's own /config_dump).
- `istio.io/debug`: the resource name is a /debug path (`syncz`, `config_dump?proxyID=...`), the
  one resource holds that page's body.

As in istiod, a debug request is answered once and starts no watch: the stream is not pushed to
afterwards and the client does not ACK. Authorization is istiod's: with
ENABLE_DEBUG_ENDPOINT_AUTH (default) the caller must have proved an identity on the secure port;
an identity of the system namespace (or DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES) sees every proxy,
any other only the proxies of its own namespace (and of `istio.io/debug` only config_dump).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import grpc
from envoy.admin.v3 import config_dump_pb2, config_dump_shared_pb2
from envoy.config.core.v3 import base_pb2, extension_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import any_pb2, struct_pb2, timestamp_pb2

from pilot import logging as plog
from pilot import version
from pilot.networking.wasm import PULL_SECRET_ENV, WASM_HTTP_TYPE
from pilot.security import spiffe
from pilot.xds import typeurls

if TYPE_CHECKING:
    from pilot.xds.connection import Connection, WatchedResource
    from pilot.xds.discovery import DiscoveryServer

log = plog.get("ads")

DEBUG = "istio.io/debug"
SYNCZ = DEBUG + "/syncz"  # istiod's TypeDebugSyncronization
CONFIG_DUMP = DEBUG + "/config_dump"  # istiod's TypeDebugConfigDump
# /debug pages a caller outside the system namespace may read through `istio.io/debug` (istiod's
# activeNamespaceDebuggers; ndsz and edsz are not served here).
NAMESPACED_PAGES = frozenset({"config_dump", "ndsz", "edsz"})
_CLIENT_CONFIG = "type.googleapis.com/envoy.service.status.v3.ClientConfig"

# `istio.io/debug` pages: (resource name, caller namespace or "" for all) -> page body.
HttpView = Callable[[str, str], Awaitable[bytes]]


def is_debug(type_url: str) -> bool:
    return type_url == DEBUG or type_url.startswith(DEBUG + "/")


class DebugRefused(Exception):
    """The stream ends with this status, as istiod's generator error ends it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def is_debug_client(conn: Connection) -> bool:
    """istioctl and other debug clients (istiod's adsc) say GENERATOR `event`: they are no proxy."""
    return conn.proxy.metadata.get("GENERATOR") == "event"


def _pack(msg) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)
    return a


def _timestamp(t: float) -> timestamp_pb2.Timestamp | None:
    if not t:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def _status(w: WatchedResource) -> int:
    """istiod's debugSyncStatus: ERROR while the last response is rejected, else by nonces."""
    if w.last_nack is not None and not w.last_nack.cleared:
        return csds_pb2.ERROR
    if not w.nonce_sent:
        return csds_pb2.NOT_SENT
    return csds_pb2.SYNCED if w.nonce_acked == w.nonce_sent else csds_pb2.STALE


def client_config(conn: Connection) -> csds_pb2.ClientConfig:
    """What istiod's syncz says of one proxy: its node (id; CLUSTER_ID, NAMESPACE, ISTIO_VERSION)
    and, per subscribed type, whether it holds what it was last sent."""
    p = conn.proxy
    md = struct_pb2.Struct()
    md.update(
        {
            "CLUSTER_ID": str(p.metadata.get("CLUSTER_ID") or "Kubernetes"),
            "NAMESPACE": p.namespace,
            "ISTIO_VERSION": p.istio_version or "",
        }
    )
    cc = csds_pb2.ClientConfig(node=base_pb2.Node(id=p.id, metadata=md))
    for type_url in sorted(conn.watched):
        w = conn.watched[type_url]
        x = cc.generic_xds_configs.add(
            type_url=type_url, config_status=_status(w), version_info=w.version_acked
        )
        sent = _timestamp(w.last_sent_at)
        if sent is not None:
            x.last_updated.CopyFrom(sent)
        if w.last_nack is not None and not w.last_nack.cleared:
            x.error_state.details = w.last_nack.message
            at = _timestamp(w.last_nack.at)
            if at is not None:
                x.error_state.last_update_attempt.CopyFrom(at)
    return cc


def find_connection(server: DiscoveryServer, proxy_id: str, namespace: str = "") -> Connection | None:
    """istiod's getProxyConnection: the first proxy whose connection id contains `proxy_id`
    (the full node id, `POD.NAMESPACE`, or a connection id), among the proxies of `namespace`
    when one is given (a caller restricted to its namespace). Debug clients are never matched."""
    if not proxy_id:
        return None
    for conn in list(server.connections.values()):
        if is_debug_client(conn) or (namespace and conn.proxy.namespace != namespace):
            continue
        if proxy_id in conn.id:
            return conn
    return None


def _redacted(any_bytes: bytes) -> any_pb2.Any:
    """A Secret as istiod dumps it: the private key replaced by `[redacted]`."""
    a = any_pb2.Any.FromString(any_bytes)
    secret = secret_pb2.Secret()
    if a.Unpack(secret) and secret.HasField("tls_certificate"):
        secret.tls_certificate.private_key.Clear()
        secret.tls_certificate.private_key.inline_bytes = b"[redacted]"
        return _pack(secret)
    return a


REDACTED = "<Redacted>"  # istiod's word for a pull secret in its debug dump


def _redacted_ecds(any_bytes: bytes) -> any_pb2.Any:
    """An extension config as istiod dumps it: a WasmPlugin's image pull secret replaced."""
    a = any_pb2.Any.FromString(any_bytes)
    tec = extension_pb2.TypedExtensionConfig()
    if not a.Unpack(tec) or tec.typed_config.type_url != WASM_HTTP_TYPE:
        return a
    filt = http_wasm_pb2.Wasm()
    tec.typed_config.Unpack(filt)
    env = filt.config.vm_config.environment_variables.key_values
    if PULL_SECRET_ENV not in env:
        return a
    env[PULL_SECRET_ENV] = REDACTED
    tec.typed_config.Pack(filt)
    return _pack(tec)


def config_dump(
    server: DiscoveryServer, conn: Connection, include_eds: bool = False
) -> config_dump_pb2.ConfigDump:
    """istiod's connectionConfigDump: what this control plane would send the proxy now, for
    the types it watches, in Envoy's /config_dump shape (EDS only when asked, as Envoy's own
    /config_dump leaves it out without include_eds)."""
    ctx = server.push_context
    version_ = ctx.version
    held: dict[str, list[tuple[str, bytes]]] = {}
    for type_url in (typeurls.CLUSTER, typeurls.LISTENER, typeurls.ROUTE, typeurls.SECRET, typeurls.ENDPOINT,
                     typeurls.EXTENSION_CONFIG):
        w = conn.watched.get(type_url)
        if w is None or (type_url == typeurls.ENDPOINT and not include_eds):
            continue
        generated = server.generated.generate(ctx, type_url, conn.proxy, server._requested(conn, w))
        held[type_url] = [(r.name, r.any_bytes) for r in generated.resources]

    s = config_dump_shared_pb2
    clusters = s.ClustersConfigDump(
        version_info=version_,
        dynamic_active_clusters=[
            s.ClustersConfigDump.DynamicCluster(version_info=version_, cluster=any_pb2.Any.FromString(b))
            for _, b in held.get(typeurls.CLUSTER, ())
        ],
    )
    listeners = s.ListenersConfigDump(
        version_info=version_,
        dynamic_listeners=[
            s.ListenersConfigDump.DynamicListener(
                name=name,
                active_state=s.ListenersConfigDump.DynamicListenerState(
                    version_info=version_, listener=any_pb2.Any.FromString(b)
                ),
            )
            for name, b in held.get(typeurls.LISTENER, ())
        ],
    )
    routes = s.RoutesConfigDump(
        dynamic_route_configs=[
            s.RoutesConfigDump.DynamicRouteConfig(
                version_info=version_, route_config=any_pb2.Any.FromString(b)
            )
            for _, b in held.get(typeurls.ROUTE, ())
        ]
    )
    secrets = config_dump_pb2.SecretsConfigDump(
        dynamic_active_secrets=[
            config_dump_pb2.SecretsConfigDump.DynamicSecret(
                name=name, version_info=version_, secret=_redacted(b)
            )
            for name, b in held.get(typeurls.SECRET, ())
        ]
    )
    configs = [_pack(config_dump_pb2.BootstrapConfigDump()), _pack(clusters)]
    if include_eds:
        configs.append(
            _pack(
                s.EndpointsConfigDump(
                    dynamic_endpoint_configs=[
                        s.EndpointsConfigDump.DynamicEndpointConfig(
                            version_info=version_, endpoint_config=any_pb2.Any.FromString(b)
                        )
                        for _, b in held.get(typeurls.ENDPOINT, ())
                    ]
                )
            )
        )
    configs += [
        _pack(listeners),
        _pack(s.ScopedRoutesConfigDump()),
        _pack(routes),
        _pack(secrets),
        # The filter configurations the proxy subscribed to over ECDS (WasmPlugins, EnvoyFilter
        # EXTENSION_CONFIG), as Envoy's own dump lists them under `ecds_filters`.
        _pack(s.EcdsConfigDump(ecds_filters=[
            s.EcdsConfigDump.EcdsFilterConfig(version_info=version_, ecds_filter=_redacted_ecds(b))
            for _, b in held.get(typeurls.EXTENSION_CONFIG, ())
        ])),
    ]
    return config_dump_pb2.ConfigDump(configs=configs)


class DebugXds:
    """Answers the debug types on one DiscoveryServer's streams (plaintext and secure alike;
    what a caller may see follows the identity it proved)."""

    def __init__(self, server: DiscoveryServer) -> None:
        self.server = server
        self.http_view: HttpView | None = None  # set by bootstrap: the /debug pages

    def _caller_namespace(self, conn: Connection) -> str | None:
        """None: unauthenticated. "": may see every proxy. Else: only proxies of that namespace."""
        f = self.server.features
        if not conn.proxy.identity:
            return "" if not f.enable_debug_endpoint_auth else None
        ns = spiffe.parse(conn.proxy.identity).namespace
        if not f.enable_debug_endpoint_auth:
            return ""
        system = self.server.mesh.current.root_namespace or "istio-system"
        return "" if ns == system or ns in f.debug_endpoint_auth_allowed_namespaces else ns

    def _refuse_unauthenticated(self, conn: Connection) -> None:
        log.warning(
            "debug request refused: connect over the secure port (15012) with a token or certificate",
            proxy=conn.proxy.id[:256],
            peer=conn.peer,
        )
        raise DebugRefused(grpc.StatusCode.UNAUTHENTICATED, "authentication required")

    async def resources(
        self, conn: Connection, type_url: str, names: list[str]
    ) -> list[tuple[str, any_pb2.Any]]:
        caller = self._caller_namespace(conn)
        if type_url == DEBUG:
            return await self._page(conn, names, caller)
        if caller is None:
            self._refuse_unauthenticated(conn)
        if type_url == SYNCZ:
            conns = sorted(
                (
                    c
                    for c in list(self.server.connections.values())
                    if not is_debug_client(c) and (not caller or c.proxy.namespace == caller)
                ),
                key=lambda c: c.proxy.id,
            )
            return [(c.proxy.id, _pack(client_config(c))) for c in conns]
        if type_url == CONFIG_DUMP:
            if len(names) != 1:
                log.info("config_dump debug request must name one proxy", names=len(names))
                return []
            target = find_connection(self.server, names[0], caller or "")
            if target is None:
                log.info("config_dump debug request: proxy not connected here", proxy=names[0][:256])
                return []
            return [("", a) for a in config_dump(self.server, target).configs]
        return []  # other istio.io/debug/* types: nothing known, answered empty as istiod does

    async def _page(
        self, conn: Connection, names: list[str], caller: str | None
    ) -> list[tuple[str, any_pb2.Any]]:
        """`istio.io/debug`: always needs a proven identity (istiod's DebugGen)."""
        if not conn.proxy.identity:
            self._refuse_unauthenticated(conn)
        if len(names) != 1:
            raise DebugRefused(grpc.StatusCode.INVALID_ARGUMENT, "exactly one debug request is required")
        name = names[0]
        page = name.partition("?")[0]
        if caller and page not in NAMESPACED_PAGES:
            raise DebugRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the debug info is not available for current identity: {conn.proxy.identity!r}",
            )
        if self.http_view is None:
            raise DebugRefused(grpc.StatusCode.UNAVAILABLE, "debug pages are not served by this server")
        body = await self.http_view(name, caller or "")
        return [(name, any_pb2.Any(type_url=DEBUG, value=body))]

    async def respond(self, conn: Connection, type_url: str, names: list[str], *, delta: bool) -> bytes:
        """The whole response, serialised (debug responses are rare: no shared bytes needed)."""
        resources = await self.resources(conn, type_url, names)
        nonce = conn.next_nonce()
        ctx_version = self.server.push_context.version
        cp = (
            base_pb2.ControlPlane(identifier=version.control_plane_identifier())
            if type_url == SYNCZ
            else None
        )
        if delta:
            resp = discovery_pb2.DeltaDiscoveryResponse(
                system_version_info=ctx_version,
                type_url=type_url,
                nonce=nonce,
                control_plane=cp,
                resources=[discovery_pb2.Resource(name=n, resource=a) for n, a in resources],
            )
        else:
            resp = discovery_pb2.DiscoveryResponse(
                version_info=ctx_version,
                type_url=type_url,
                nonce=nonce,
                control_plane=cp,
                resources=[a for _, a in resources],
            )
        return resp.SerializeToString()
