"""istiod's /debug endpoints, as JSON views over the server's state (read-only)."""

from __future__ import annotations

import html
import json
import time

from aiohttp import web

from pilot import version
from pilot.config.core import Secret
from pilot.config.gateway_api import GATEWAY_API_KINDS
from pilot.http import config_dump
from pilot.http.ambient_debug import AmbientDebug
from pilot.http.controlz import ControlzHandlers
from pilot.model import dependencies, envoy_filters
from pilot.model.ambient.waypoints import WAYPOINT_CLASS
from pilot.model.dependencies import Deps
from pilot.model.events import SERVICE_ENDPOINTS
from pilot.model.gateways import config_origins
from pilot.model.store import ConfigKey
from pilot.model.traffic import destination_problems
from pilot.status.view import GatewayStatusView
from pilot.xds import typeurls
from pilot.xds.connection import Connection, WatchedResource
from pilot.xds.discovery import GENERATORS, DiscoveryServer
from pilot.xds.generators import bootstrap

_SYNC_FIELDS = {typeurls.CLUSTER: "cluster", typeurls.LISTENER: "listener", typeurls.ROUTE: "route",
                typeurls.ENDPOINT: "endpoint"}


_TYPE_ALIASES = {short: t for t, short in typeurls.SHORT.items()} | {
    "clusters": typeurls.CLUSTER, "endpoints": typeurls.ENDPOINT, "listeners": typeurls.LISTENER,
    "routes": typeurls.ROUTE}


def _key_ref(key: str) -> str:
    """`ServiceEndpoints/ns/name` is an endpoint change of Service ns/name."""
    kind, _, rest = key.partition("/")
    return f"Service/{rest}" if kind == SERVICE_ENDPOINTS else key


def _inputs(deps: Deps, name: str) -> list[str]:
    """Everything a resource's build read (for a per-resource type, that resource's part), as
    an operator names it: objects (Pods included), and the lookups a new object could meet."""
    if deps.named is not None:
        part = deps.named.get(name)
        mine = dependencies.Deps()
        mine.facets, mine.children = set(deps.facets), [*deps.children, *([part] if part else [])]
        deps = mine
    return sorted({dependencies.describe(f) for f in deps.all_facets()})


def _json(data, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, indent=2, default=str) + "\n", status=status,
                        content_type="application/json")


def _iso(ts: float) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else None


def _nack(w: WatchedResource) -> dict | None:
    n = w.last_nack
    if n is None:
        return None
    return {"nonce": n.nonce, "accepted_version": n.version, "code": n.code, "message": n.message,
            "at": _iso(n.at), "resources": list(n.resources), "config": list(n.origins), "count": w.nacks}


# What each path shows, for /debug (istiod's debug index has one line per handler too).
DESCRIPTIONS = {
    "/debug/ui": "ControlZ: a page with proxies and their sync state, recent pushes, rejections, NACKs, "
                 "log levels (changeable), memory and environment",
    "/debug/ui.js": "the ControlZ page's script",
    "/debug/controlz": "the ControlZ page's data as JSON",
    "/debug/scopes": "log scopes and their levels (PUT or POST /debug/scopes/SCOPE "
                     "{\"output_level\": \"debug\"} changes one)",
    "/debug/syncz": "synchronization status of every connected proxy (sent and ACKed nonce/version per type)",
    "/debug/adsz": "connected xDS clients: metadata, labels and what each subscribed to",
    "/debug/connections": "each xDS stream's state: bytes queued, time writing, responses sent",
    "/debug/configz": "config in the store, rejected documents with the reason, policies applied differently",
    "/debug/registryz": "the service registry: services with their ports",
    "/debug/endpointz": "endpoints per service port",
    "/debug/networkz": "cross-network gateways (meshNetworks, Services labelled topology.istio.io/network)",
    "/debug/config_dump": "Envoy's ConfigDump of what this server would send ?proxyID=",
    "/debug/push_status": "the push context version, conflicts and the last pushes",
    "/debug/mesh": "the MeshConfig in force, fields not applied, unknown PILOT_* variables",
    "/debug/cachez": "xDS resource cache size, hits and misses",
    "/debug/loop_lag": "event-loop lag p50/p99/max over the kept samples (?since=UNIX_SECONDS), "
                       "with how often stream work and new streams waited for a turn",
    "/debug/push_timeline": "the last pushes, newest first, with the time each stage took",
    "/debug/explain": "for ?proxyID=&type=&name=: what a resource is built from and which push changed it",
    "/debug/gatewayz": "Gateway API objects with their computed status and the Istio config they became",
    "/debug/list": "the debug commands as a JSON list of names (istiod's /debug/list)",
    "/debug/ambientz": "ambient mode: workloads, services, policies and what each ztunnel holds",
}


class DebugHandlers:
    def __init__(self, server: DiscoveryServer, gateway_status: GatewayStatusView | None = None) -> None:
        self.server = server
        self.gateway_status = gateway_status
        self._controlz = ControlzHandlers(server)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/debug", self.index),
            web.get("/debug/syncz", self.syncz),
            web.get("/debug/adsz", self.adsz),
            web.get("/debug/connections", self.connections),
            web.get("/debug/configz", self.configz),
            web.get("/debug/registryz", self.registryz),
            web.get("/debug/endpointz", self.endpointz),
            web.get("/debug/networkz", self.networkz),
            web.get("/debug/config_dump", self.config_dump),
            web.get("/debug/push_status", self.push_status),
            web.get("/debug/mesh", self.mesh),
            web.get("/debug/cachez", self.cachez),
            web.get("/debug/loop_lag", self.loop_lag),
            web.get("/debug/push_timeline", self.push_timeline),
            web.get("/debug/explain", self.explain),
            web.get("/debug/gatewayz", self.gatewayz),
            web.get("/debug/list", self.list_names),
            *AmbientDebug(self.server).routes(),
            *self._controlz.routes(),
        ]

    def _endpoints(self) -> list[dict]:
        methods: dict[str, set[str]] = {}
        for r in self.routes():
            if r.path != "/debug" and "{" not in r.path:
                methods.setdefault(r.path, set()).add(r.method)
        return [{"path": p, "description": DESCRIPTIONS.get(p, ""), "methods": sorted(m)}
                for p, m in sorted(methods.items())]

    async def index(self, req: web.Request) -> web.Response:
        """A browser gets a page of links; a program the same list as JSON."""
        endpoints = self._endpoints()
        if "text/html" not in req.headers.get("Accept", ""):
            return _json({"endpoints": endpoints})
        rows = "".join(f'<tr><td><a href="{html.escape(e["path"])}">{html.escape(e["path"])}</a></td>'
                       f'<td>{html.escape(e["description"])}</td></tr>' for e in endpoints)
        page = ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>pilot-discovery debug</title>"
                "<style>body{font-family:system-ui,sans-serif;margin:20px}td{padding:3px 12px 3px 0;"
                "border-bottom:1px solid #eee}</style></head><body><h1>Debug endpoints</h1>"
                f'<p>Start at <a href="/debug/ui">/debug/ui</a>.</p><table>{rows}</table></body></html>')
        return web.Response(text=page, content_type="text/html")

    async def list_names(self, _req: web.Request) -> web.Response:
        """istiod's shape: the command names without `/debug/`."""
        return _json(sorted(e["path"].removeprefix("/debug/") for e in self._endpoints()
                            if e["path"] != "/debug/list"))

    def _sync_status(self, conn: Connection) -> dict:
        out = {"cluster_id": conn.proxy.metadata.get("CLUSTER_ID", self.server.features.cluster_id), "proxy": conn.proxy.id,
               "proxy_type": conn.proxy.type, "istio_version": conn.proxy.istio_version,
               "connection_id": conn.id, "delta": conn.delta,
               # Which replica answers (POD_NAME, else the host name): pilotctl's ISTIOD column.
               "istiod": version.instance_id()}
        for type_url, field in _SYNC_FIELDS.items():
            w = conn.watched.get(type_url)
            out[f"{field}_sent"] = w.nonce_sent if w else ""
            out[f"{field}_acked"] = w.nonce_acked if w else ""
            out[f"{field}_version_sent"] = w.version_sent if w else ""
            out[f"{field}_version_acked"] = w.version_acked if w else ""
            out[f"{field}_nack"] = _nack(w) if w else None
        return out

    async def syncz(self, _req: web.Request) -> web.Response:
        return _json([self._sync_status(c) for c in self.server.connections.values()])

    def _client(self, conn: Connection) -> dict:
        return {"connectionId": conn.id, "connectedAt": _iso(conn.connected_at), "address": conn.peer,
                "delta": conn.delta, "labels": conn.proxy.labels, "metadata": conn.proxy.metadata,
                "watches": {t: (["*"] if w.wildcard else sorted(w.names)) for t, w in conn.watched.items()}}

    async def adsz(self, _req: web.Request) -> web.Response:
        conns = list(self.server.connections.values())
        return _json({"totalClients": len(conns), "clients": [self._client(c) for c in conns]})

    async def connections(self, _req: web.Request) -> web.Response:
        return _json([self._connection(c) for c in self.server.connections.values()])

    @staticmethod
    def _connection(c: Connection) -> dict:
        """Who is connected and how its stream is doing: a proxy that does not read shows a
        growing `writingForSeconds` (until PILOT_XDS_SEND_TIMEOUT closes it)."""
        writing = c.writing_for()
        state = "writing" if c.writing else ("pushing" if c.pushing or c.pending_push is not None else "idle")
        return {"connectionId": c.id, "proxy": c.proxy.id, "address": c.peer,
                "connectedAt": _iso(c.connected_at), "delta": c.delta, "state": state,
                "bytesQueued": c.bytes_queued, "writingForSeconds": round(writing, 3),
                "lastWriteSeconds": round(c.last_write_s, 3),
                "lastWriteAt": _iso(c.last_write_at),
                "responsesSent": c.responses_sent, "bytesSent": c.bytes_sent,
                "requestsQueued": c.requests_queued, "requestBytesQueued": c.request_bytes_queued,
                "pushPending": c.pending_push is not None}

    async def configz(self, _req: web.Request) -> web.Response:
        store = self.server.store
        configs = []
        for kind in store.kinds():
            for e in sorted(store.list(kind), key=lambda e: e.key):
                obj = e.obj.model_dump(mode="json", by_alias=True, exclude_defaults=True)
                if isinstance(e.obj, Secret):  # gateway credentials: never show private keys
                    obj["data"] = {k: f"<redacted: {len(v.get_secret_value())} base64 chars>"
                                   for k, v in e.obj.data.items()}
                if kind in GATEWAY_API_KINDS:  # the status this controller computes, not a stored one
                    obj.pop("status", None)
                    status = self.gateway_status.get(e.key) if self.gateway_status is not None else None
                    if status is not None:
                        obj["status"] = status
                configs.append({"kind": kind, "namespace": e.key.namespace, "name": e.key.name,
                                "revision": e.revision, "source": e.source, "object": obj})
        # Accepted policies this control plane cannot apply as written, and what it does instead.
        unsupported = [*self.server.push_context.security.problems, *self.server.push_context.telemetry_problems]
        return _json({"configs": configs, "rejected": [r.as_dict() for r in store.rejections()],
                      "unsupported": unsupported})

    async def gatewayz(self, _req: web.Request) -> web.Response:
        """Gateway API objects with the status this controller computed for them (the status the
        leader writes in Kubernetes mode), and the Istio config they were translated into."""
        view = self.gateway_status
        ctx = self.server.push_context
        objects = []
        for key, status in view.items() if view is not None else ():
            entry = self.server.store.get(key)
            objects.append({"kind": entry.obj.kind if entry else key.kind, "apiVersion": entry.obj.api_version
                            if entry else None, "namespace": key.namespace, "name": key.name,
                            "generation": entry.obj.metadata.generation if entry else None, "status": status})
        generated = [{"kind": e.key.kind, "namespace": e.key.namespace, "name": e.key.name,
                      "from": list(config_origins(e))}
                     for e in (*ctx.gateway_api.gateways, *ctx.gateway_api.virtual_services,
                               *ctx.gateway_api.mesh_virtual_services, *ctx.gateway_api.destination_rules)]
        return _json({"version": view.version if view is not None else ctx.version, "objects": objects,
                      "generated": generated})

    async def registryz(self, _req: web.Request) -> web.Response:
        ctx = self.server.push_context
        def auto(s) -> dict:
            # istiod's Service fields: what DNS-capturing proxies use for a ServiceEntry without addresses
            pair = ctx.auto_addresses.get((s.namespace, s.hostname)) if s.kind == "ServiceEntry" else None
            return {"autoAllocatedIPv4Address": pair[0], "autoAllocatedIPv6Address": pair[1]} if pair else {}

        return _json([{"hostname": s.hostname, "namespace": s.namespace, "name": s.name,
                       "clusterIP": s.cluster_ip, "revision": s.revision, **auto(s),
                       "ports": [{"name": p.name, "port": p.port, "protocol": p.protocol.value,
                                  "targetPort": p.target_port} for p in s.ports]} for s in ctx.services])

    async def endpointz(self, _req: web.Request) -> web.Response:
        ctx = self.server.push_context
        out = []
        for s in ctx.services:
            for p in s.ports:
                out.append({"service": s.hostname, "port": p.port, "endpoints": [
                    {"address": e.address, "port": e.port, "locality": e.locality.label(), "ready": e.ready,
                     "network": ctx.networks.network_of(e.address, e.network)}
                    for e in ctx.endpoints(s, p.port)]})
        return _json(out)

    async def networkz(self, _req: web.Request) -> web.Response:
        """istiod's /debug/networkz: every network gateway, with its Go field names."""
        return _json([{"Network": g.network, "Cluster": g.cluster, "Addr": g.address, "Port": g.port}
                      for g in self.server.push_context.networks.gateways])

    def _find(self, proxy_id: str) -> Connection | None:
        for c in self.server.connections.values():
            p = c.proxy
            if proxy_id in (p.id, c.id, f"{p.pod_name}.{p.namespace}"):
                return c
        return None

    async def config_dump(self, req: web.Request) -> web.Response:
        return await config_dump.config_dump(self.server, req)

    async def push_status(self, _req: web.Request) -> web.Response:
        s = self.server
        ctx = s.push_context
        return _json({"version": ctx.version, "connected": len(s.connections),
                      "conflicts": list(ctx.conflicts) + list(ctx.traffic.conflicts)
                      + list(destination_problems(ctx.traffic, set(ctx.by_host), ctx.domain))
                      + self._inbound_problems(),
                      # Accepted policies applied differently from what they ask (a CUSTOM policy
                      # whose ext_authz provider does not resolve denies), with the reason.
                      "policyProblems": list(ctx.security.problems),
                      # EnvoyFilter revisions left out because a proxy rejected what they made.
                      "envoyFilterRejections": sorted(s.rejected_envoy_filters.values(),
                                                      key=lambda r: r["envoyFilter"]),
                      # Accepted EnvoyFilters that target what gets no patches (a waypoint).
                      "envoyFilterProblems": envoy_filters.waypoint_target_problems(
                          ctx.envoy_filters, ((e.key.namespace, e.key.name) for e in ctx.waypoint_gateways()
                                              if e.obj.spec.gateway_class_name == WAYPOINT_CLASS)),
                      # Connected Envoys whose bootstrap lacks their BOOTSTRAP patches (or holds
                      # old ones): fetched once, at pilot-agent's start (BOOTSTRAP_XDS_AGENT).
                      "bootstrapPatchesNotInEffect": self._bootstrap_not_in_effect(),
                      "pushes": [p.as_dict() for p in s.history.recent()]})

    def _bootstrap_not_in_effect(self) -> list[dict]:
        ctx, out = self.server.push_context, []
        for conn in list(self.server.connections.values()):
            if typeurls.BOOTSTRAP in conn.watched:
                continue  # the agent's own bootstrap request, not Envoy
            row = bootstrap.not_in_effect(ctx, conn.proxy)
            if row is not None:
                out.append(row)
        return sorted(out, key=lambda r: r["proxy"])

    def _inbound_problems(self) -> list[str]:
        """Workload ports connected sidecars cannot serve inbound, and CUSTOM policies failing
        closed for them, and why."""
        ctx, out = self.server.push_context, list[str]()
        for conn in list(self.server.connections.values()):
            if conn.proxy.type == "sidecar" and not conn.proxy.is_grpc:
                out.extend(f"{conn.proxy.id}: {p}" for p in ctx.inbound_plan(conn.proxy).problems)
                # Per workload: its CUSTOM policies may each be fine yet name different providers.
                ext = ctx.security.for_workload(conn.proxy.namespace, conn.proxy.labels).ext_authz
                if ext is not None and ext.error:
                    out.append(f"{conn.proxy.id}: CUSTOM AuthorizationPolicy denies every request "
                               f"(default-deny-all-due-to-bad-CUSTOM-action): {ext.error}")
        return sorted(set(out))

    async def mesh(self, _req: web.Request) -> web.Response:
        m = self.server.mesh
        # `unsupported`: fields the MeshConfig in force sets that are not applied (ignored, as
        # istiod tolerates them); `unknownEnv`: PILOT_* variables no knob declares.
        return _json({"source": m.source, "version": m.version,
                      "mesh": m.current.model_dump(mode="json", by_alias=True, exclude_none=True),
                      "unsupported": list(m.unsupported),
                      "unknownEnv": list(self.server.features.unknown_env)})

    async def cachez(self, _req: web.Request) -> web.Response:
        return _json(self.server.cache.stats())

    async def loop_lag(self, req: web.Request) -> web.Response:
        """Event-loop lag (pilot/loop_lag.py) since `since` (unix seconds; default: the samples kept)."""
        try:
            since = float(req.query.get("since", "0"))
        except ValueError:
            return _json({"error": "since must be unix seconds"}, status=400)
        pace = self.server.pace
        return _json({**self.server.loop_lag.summary(since), "turn_waits": pace.waits,
                      "admission_waits": pace.admission_waits})

    async def push_timeline(self, _req: web.Request) -> web.Response:
        """The last pushes, newest first, with the time spent in each stage."""
        return _json([p.as_dict() for p in self.server.history.recent()])

    def _origin(self, ref: str) -> dict:
        if ref == "MeshConfig":
            m = self.server.mesh
            return {"kind": "MeshConfig", "source": m.source, "version": m.version}
        kind, _, rest = ref.partition("/")
        namespace, _, name = rest.partition("/")
        entry = self.server.store.get(ConfigKey(kind, namespace, name))
        out: dict = {"kind": kind, "namespace": namespace, "name": name}
        if entry is None:
            out["deleted"] = True
        else:
            out.update(revision=entry.revision, resourceVersion=entry.obj.metadata.resource_version or None,
                       source=entry.source)
        return out

    async def explain(self, req: web.Request) -> web.Response:
        """For one resource a proxy holds: what it is built from, which push last changed it and
        why, and whether the proxy has (and accepted) the current version."""
        proxy_id, type_url, name = (req.query.get(k, "") for k in ("proxyID", "type", "name"))
        type_url = _TYPE_ALIASES.get(type_url.lower(), type_url)
        missing = [k for k, v in (("proxyID", proxy_id), ("type", type_url), ("name", name)) if not v]
        if missing:
            return _json({"error": f"{', '.join(missing)} required: "
                                   "/debug/explain?proxyID=POD.NAMESPACE&type=cds|eds|lds|rds|sds&name=NAME"},
                         status=400)
        conn = self._find(proxy_id)
        if conn is None:
            return _json({"error": f"proxy {proxy_id!r} is not connected"}, status=404)
        if type_url not in GENERATORS:
            return _json({"error": f"unknown type {type_url!r}", "types": sorted(GENERATORS)}, status=400)
        server = self.server
        ctx = server.push_context
        with ctx.recording() as deps:  # what building it reads: the inputs a change must meet
            found = [r for r in GENERATORS[type_url](ctx, conn.proxy, frozenset([name]), server.cache)
                     if r.name == name]
        w = conn.watched.get(type_url)
        held = w.sent.get(name) if w else None
        if not found and held is None:
            return _json({"error": f"{proxy_id} neither has nor would get {typeurls.SHORT.get(type_url)} {name!r}"},
                         status=404)
        res = found[0] if found else None
        out: dict = {"proxy": conn.proxy.id, "type": type_url, "name": name,
                     "current": {"version": res.version if res else None, "push_context": ctx.version,
                                 "exists": res is not None},
                     "proxy_holds": {"version": held, "up_to_date": res is not None and held == res.version}}
        if w is not None:
            out["proxy_holds"]["last_response_acked"] = bool(w.nonce_sent) and w.nonce_sent == w.nonce_acked
            out["proxy_holds"]["nack"] = _nack(w)
        out["inputs"] = _inputs(deps, name)
        held = server.held_deps(conn, type_url)
        if held is not None:
            # What the server matches changes against for this proxy (the config it was given).
            out["proxy_holds"]["inputs"] = _inputs(held, name)
        if res is not None:
            out["built_from"] = [self._origin(o) for o in res.origins]
            push_version = server.history.built_in(type_url, name, res.version)
            record = server.history.get(push_version) if push_version else None
            changed: dict = {"push_version": push_version}
            if record is not None:
                origin_refs = set(res.origins)
                changed.update(at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.started_at)),
                               reasons=record.reasons,
                               because_of=[k for k in record.config_keys if _key_ref(k) in origin_refs]
                               or record.config_keys)
            elif push_version:
                changed["note"] = "built for the startup config or a proxy's request, before any push changed it"
            out["last_changed"] = changed
        return _json(out)
