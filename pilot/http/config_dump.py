"""/debug/config_dump?proxyID=: istiod's view of what it would send one proxy, in Envoy's own
/config_dump JSON (admin.v3.ConfigDump, snake_case field names), so tools that read Envoy's dump
(istioctl proxy-config, proxy-status PROXY) read this one too."""

from __future__ import annotations

import json

from aiohttp import web

# The resource types a dump holds must be in the descriptor pool for JSON rendering.
from envoy.config.cluster.v3 import cluster_pb2  # noqa: F401
from envoy.config.endpoint.v3 import endpoint_pb2  # noqa: F401
from envoy.config.listener.v3 import listener_pb2  # noqa: F401
from envoy.config.route.v3 import route_pb2  # noqa: F401
from google.protobuf import json_format

from pilot.http.auth import CALLER_NAMESPACE
from pilot.xds.discovery import DiscoveryServer
from pilot.xds.generators import debug

# istiod's words: istioctl recognises this one and asks the next replica.
NOT_CONNECTED = "Proxy not connected to this Pilot instance. It may be connected to another instance."


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n")


async def config_dump(server: DiscoveryServer, req: web.Request, caller_namespace: str = "") -> web.Response:
    """`caller_namespace` (not ""): only proxies of that namespace are found, as in istiod."""
    proxy_id = req.query.get("proxyID", "")
    if not proxy_id:
        return _text(400, "proxyID is required: /debug/config_dump?proxyID=POD.NAMESPACE (or a full node id)")
    # A caller the debug authentication restricted to its namespace (pilot/http/auth.py).
    caller_namespace = caller_namespace or req.get(CALLER_NAMESPACE, "")
    conn = debug.find_connection(server, proxy_id, caller_namespace)
    if conn is None:
        return _text(404, NOT_CONNECTED)
    dump = debug.config_dump(server, conn, include_eds="include_eds" in req.query)
    body = json_format.MessageToDict(dump, preserving_proto_field_name=True)
    return web.Response(text=json.dumps(body, indent=2) + "\n", content_type="application/json")
