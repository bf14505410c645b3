"""/debug/ambientz: istiod's view of ambient mode (workloads, services, policies; IPs as text),
plus what each connected ztunnel subscribed to, holds and acknowledged (`?proxyID=` for one)."""

from __future__ import annotations

import base64
import ipaddress
import json
import time

from aiohttp import web
from google.protobuf import json_format

from pilot.model.ambient.index import ambient_index
from pilot.networking.ztunnel_authz import authorization
from pilot.networking.ztunnel_wds import service_address, workload_address
from pilot.xds import typeurls
from pilot.xds.discovery import DiscoveryServer


def _text_ip(b64: str) -> str:
    """Proto JSON shows bytes as base64; people read addresses."""
    return str(ipaddress.ip_address(base64.b64decode(b64)))


def _gateway(g: dict) -> dict:
    if "address" in g:
        g["address"]["address"] = _text_ip(g["address"]["address"])
    return g


def _workload(w) -> dict:
    d = json_format.MessageToDict(workload_address(w).workload)
    d["addresses"] = [_text_ip(a) for a in d.get("addresses", [])]
    if "waypoint" in d:
        _gateway(d["waypoint"])
    return d


def _service(s) -> dict:
    d = json_format.MessageToDict(service_address(s).service)
    for a in d.get("addresses", []):
        a["address"] = _text_ip(a["address"])
    if "waypoint" in d:
        _gateway(d["waypoint"])
    return d


def _iso(ts: float) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else None


class AmbientDebug:
    def __init__(self, server: DiscoveryServer) -> None:
        self.server = server

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/debug/ambientz", self.ambientz)]

    async def ambientz(self, req: web.Request) -> web.Response:
        ctx = self.server.push_context
        index = ambient_index(ctx)
        proxy_id = req.query.get("proxyID", "")
        ztunnels = []
        for conn in self.server.connections.values():
            p = conn.proxy
            if p.type != "ztunnel" or (proxy_id and proxy_id not in (p.id, conn.id, f"{p.pod_name}.{p.namespace}")):
                continue
            types = {}
            for type_url in typeurls.AMBIENT_TYPES:
                w = conn.watched.get(type_url)
                if w is None:
                    continue
                nack = w.last_nack
                types[typeurls.SHORT[type_url]] = {
                    "subscribed": ["*"] if w.wildcard else sorted(w.names),
                    "sent": dict(sorted(w.sent.items())),  # name -> version the ztunnel holds
                    "nonce_sent": w.nonce_sent, "nonce_acked": w.nonce_acked,
                    "last_sent": _iso(w.last_sent_at), "last_acked": _iso(w.last_acked_at),
                    "last_nack": None if nack is None else {"nonce": nack.nonce, "message": nack.message,
                                                            "at": _iso(nack.at)}}
            ztunnels.append({"proxy": p.id, "connection_id": conn.id, "address": conn.peer,
                             "connected_at": _iso(conn.connected_at), "types": types})
        if proxy_id and not ztunnels:
            return _json({"error": f"ztunnel {proxy_id!r} is not connected"}, 404)
        waypoints = index.waypoints.by_name.values() if index.waypoints is not None else ()
        return _json({
            "version": ctx.version,
            "enabled": self.server.features.enable_ambient,
            "workloads": [_workload(w) for _, w in sorted(index.workloads.items())],
            "services": [_service(s) for _, s in sorted(index.services.items())],
            "policies": [json_format.MessageToDict(authorization(p)) for _, p in sorted(index.policies.items())],
            "policy_status": [{"namespace": s.namespace, "name": s.name, "reason": s.reason, "message": s.message,
                               "sent_to_ztunnel": s.sent} for s in index.statuses],
            "waypoints": [{"namespace": w.namespace, "name": w.name, "traffic_type": w.traffic_type,
                           "address": w.address.hostname or w.address.ip, "service_accounts": list(w.service_accounts)}
                          for w in sorted(waypoints, key=lambda w: (w.namespace, w.name))],
            "ztunnels": ztunnels,
        })


def _json(data, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, indent=2) + "\n", status=status, content_type="application/json")
