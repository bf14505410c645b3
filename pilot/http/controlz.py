"""ControlZ for this control plane: /debug/ui, a page an operator opens in a browser (istiod has
ControlZ on its own port; here it is one more debug page, behind the same authentication).

- `/debug/ui` and `/debug/ui.js`: a static page and its script (pilot/http/ui/, no build step,
  nothing loaded from elsewhere); the script reads `/debug/controlz` and renders it.
- `/debug/controlz`: one JSON summary computed from the server's state when asked: connected
  proxies and their sync state per type, the last pushes with their stages, rejected config and
  NACKs, log scopes, memory, process and environment (secrets redacted).
- `/debug/scopes` (GET) and `/debug/scopes/{scope}` (PUT or POST `{"output_level": "debug"}`):
  log levels per scope, changed at run time; the shape of istiod's ControlZ `/scopej/`.

A level change is a write: off localhost it needs what every /debug path needs (auth.py), and it
must come as JSON from this page's own origin, so another site open in an operator's browser
cannot change levels by posting a form to localhost.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import re
import resource
import sys
import time
from importlib import resources

from aiohttp import web

from pilot import features as feat
from pilot import logging as plog
from pilot import version
from pilot.xds import typeurls
from pilot.xds.connection import Connection, WatchedResource
from pilot.xds.discovery import DiscoveryServer
from pilot.xds.sync_state import sync_state

log = plog.get("controlz")
STARTED_AT = time.time()  # this module is imported while the server starts
PUSHES_SHOWN = 30

# The page may talk to this server only; scripts come from the file /debug/ui.js, never inline.
_CSP = ("default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
        "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")

# Names whose values are credentials in the conventions people use; a value that looks like a key,
# a token or a URL with a password is hidden whatever its name.
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSW|PASSPHRASE|CREDENTIAL|PRIVATE|COOKIE|SESSION|SIGNATURE"
                          r"|AUTH(?!OR)|API_?KEY|ACCESS_?KEY|KEY$", re.IGNORECASE)
_SECRET_VALUE = re.compile(r"-----BEGIN |^eyJ[\w-]+\.[\w-]+\.|^(Bearer|Basic) ", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^/:@\s]+:)[^/@\s]+@")


def redact_env(environ: dict[str, str]) -> list[dict]:
    """The environment as shown: a secret's value replaced by its length, a URL's password by
    `***`; each variable marked with the knob that reads it, or as an unknown PILOT_* name."""
    out = []
    for name in sorted(environ):
        value = environ[name]
        if _SECRET_NAME.search(name) or _SECRET_VALUE.search(value):
            shown, redacted = f"<redacted: {len(value)} chars>", True
        else:
            shown = _URL_PASSWORD.sub(r"\1***@", value)
            redacted = shown != value
        knob = feat.KNOBS.get(name)
        row = {"name": name, "value": shown, "redacted": redacted}
        if knob is not None:
            row["knob"] = knob.help
        elif name.startswith(feat.UNKNOWN_PREFIX):
            row["unknown"] = True  # a PILOT_* variable no knob reads: a typo, or a knob not supported
        out.append(row)
    return out


def _proc_status() -> dict[str, int]:
    """Linux's /proc/self/status memory lines in bytes (empty elsewhere)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if key in ("VmRSS", "VmHWM", "VmSize", "VmData") and len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
                elif key == "Threads" and parts:
                    out[key] = int(parts[0])
    except OSError:
        pass
    return out


def memory() -> dict:
    status = _proc_status()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "rss_bytes": status.get("VmRSS"),
        "peak_rss_bytes": status.get("VmHWM", usage.ru_maxrss * 1024),  # ru_maxrss is in kB on Linux
        "virtual_bytes": status.get("VmSize"),
        "data_bytes": status.get("VmData"),
        "gc": {"thresholds": list(gc.get_threshold()), "pending": list(gc.get_count()),
               "generations": [{"collections": s["collections"], "collected": s["collected"],
                                "uncollectable": s["uncollectable"]} for s in gc.get_stats()]},
    }


def process(server: DiscoveryServer) -> dict:
    times = os.times()
    try:
        fds: int | None = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = None
    lag = server.metrics.registry.get_sample_value("pilot_event_loop_lag_max_seconds")
    return {
        "pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd(), "hostname": platform.node(),
        "python": sys.version.split()[0], "platform": platform.platform(),
        "version": version.build_info(), "started": _iso(STARTED_AT),
        "uptime_seconds": round(time.time() - STARTED_AT, 1),
        "cpu_seconds": {"user": round(times.user, 2), "system": round(times.system, 2)},
        "threads": _proc_status().get("Threads"), "open_fds": fds,
        "event_loop_lag_max_seconds": lag,
    }


def _iso(ts: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else None


def type_state(w: WatchedResource | None) -> str:
    """pilot.xds.sync_state for a live stream (a NACK cleared by a later ACK no longer stands),
    with the page's one refinement: a response never acknowledged at all."""
    if w is None:
        return sync_state(None, None, None)
    n = w.last_nack
    state = sync_state(w.nonce_sent, w.nonce_acked, n.nonce if n is not None and not n.cleared else None)
    return "STALE (never acknowledged)" if state == "STALE" and not w.nonce_acked else state


def _proxy(conn: Connection) -> dict:
    p = conn.proxy
    types: dict[str, dict] = {}
    for type_url, w in sorted(conn.watched.items()):
        types[typeurls.SHORT.get(type_url, type_url)] = {
            "state": type_state(w), "version_acked": w.version_acked or None, "resources": len(w.sent)}
    states = {t["state"] for t in types.values()}
    overall = ("NACKED" if "NACKED" in states else
               "STALE" if any(s.startswith("STALE") for s in states) else
               "SYNCED" if "SYNCED" in states else "NOT SENT")
    return {"id": p.id, "name": f"{p.pod_name}.{p.namespace}" if p.pod_name else p.id, "type": p.type,
            "namespace": p.namespace, "istio_version": p.istio_version or None, "address": conn.peer,
            "connected": _iso(conn.connected_at), "connection_id": conn.id, "delta": conn.delta,
            "state": overall, "types": types}


def _nacks(server: DiscoveryServer) -> list[dict]:
    out = []
    for conn in list(server.connections.values()):
        for type_url, w in sorted(conn.watched.items()):
            n = w.last_nack
            if n is None or n.cleared:
                continue
            out.append({"proxy": conn.proxy.id, "type": typeurls.SHORT.get(type_url, type_url),
                        "at": _iso(n.at), "message": n.message, "resources": list(n.resources),
                        "config": list(n.origins), "nonce": n.nonce, "count": w.nacks})
    return out


def summary(server: DiscoveryServer) -> dict:
    conns = list(server.connections.values())
    return {
        "version": server.push_context.version,
        "proxies": sorted((_proxy(c) for c in conns), key=lambda p: p["id"]),
        "pushes": [p.as_dict() for p in server.history.recent()[:PUSHES_SHOWN]],
        "rejected": [r.as_dict() for r in server.store.rejections()],
        "unsupported": [*server.push_context.security.problems, *server.push_context.telemetry_problems],
        "nacks": _nacks(server),
        "scopes": plog.scopes(),
        "levels": list(plog.LEVEL_NAMES),
        "memory": memory(),
        "process": process(server),
        "env": redact_env(dict(os.environ)),
        "generated": _iso(time.time()),
    }


def _asset(name: str) -> bytes:
    return resources.files("pilot.http").joinpath("ui", name).read_bytes()


def _same_origin(request: web.Request) -> bool:
    """A browser names the page that sent a request in Origin; it must be this server."""
    origin = request.headers.get("Origin")
    return origin is None or origin in (f"http://{request.host}", f"https://{request.host}")


class ControlzHandlers:
    def __init__(self, server: DiscoveryServer) -> None:
        self.server = server
        self._page = _asset("controlz.html")
        self._script = _asset("controlz.js")

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/debug/ui", self.page),
            web.get("/debug/ui.js", self.script),
            web.get("/debug/controlz", self.controlz),
            web.get("/debug/scopes", self.scopes),
            web.put("/debug/scopes/{scope}", self.set_scope),
            web.post("/debug/scopes/{scope}", self.set_scope),
        ]

    async def page(self, _req: web.Request) -> web.Response:
        return web.Response(body=self._page, content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-store"})

    async def script(self, _req: web.Request) -> web.Response:
        return web.Response(body=self._script, content_type="text/javascript", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    async def controlz(self, _req: web.Request) -> web.Response:
        return web.json_response(summary(self.server), dumps=lambda d: json.dumps(d, default=str))

    async def scopes(self, _req: web.Request) -> web.Response:
        return web.json_response(plog.scopes())

    async def set_scope(self, req: web.Request) -> web.Response:
        scope = req.match_info["scope"]
        if not _same_origin(req):
            return web.json_response({"error": f"a level change from another site ({req.headers['Origin']}) "
                                               "is refused"}, status=403)
        if req.content_type != "application/json":
            return web.json_response({"error": 'send JSON: Content-Type: application/json, body '
                                               '{"output_level": "debug"}'}, status=415)
        try:
            body = await req.json()
        except ValueError as e:
            return web.json_response({"error": f"the body is not JSON: {e}"}, status=400)
        level = body.get("output_level") if isinstance(body, dict) else None
        if not isinstance(level, str):
            return web.json_response({"error": 'want {"output_level": LEVEL} with LEVEL one of '
                                               + ", ".join(plog.LEVEL_NAMES)}, status=400)
        before = {s["name"]: s["output_level"] for s in plog.scopes()}
        if scope not in before:
            return web.json_response({"error": f"unknown log scope {scope!r}", "scopes": sorted(before)},
                                     status=404)
        try:
            plog.set_level(scope, level)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        # Said at the level that always shows (and after the change, so it is logged either way).
        log.warning("log level changed", changed_scope=scope, level=level.lower(),
                    was=before[scope], peer=req.remote)
        return web.json_response(next(s for s in plog.scopes() if s["name"] == scope))
