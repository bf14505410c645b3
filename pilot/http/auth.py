"""Who may read the debug endpoints: they reveal every proxy's config and the mesh's topology.

istiod's rule (allowAuthenticatedOrLocalhost): callers on this host are trusted; anyone else must
present a bearer token the control plane's authenticators accept (a Kubernetes service-account
token through TokenReview, or a JWT from a JWT_RULE issuer). An identity in istiod's own
namespace may read everything; any other identity only the per-proxy views of proxies in its
own namespace (what `istioctl proxy-config` needs), nothing mesh-wide.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

from pilot import logging as plog
from pilot.security.authn import AuthenticationError, Authenticators, Credentials, bearer_token

log = plog.get("debug-auth")

# Views scoped to one proxy by ?proxyID=: allowed for callers in that proxy's namespace.
PER_PROXY = ("/debug/config_dump", "/debug/explain")
# Set on a request admitted only for proxies of this namespace: a handler that finds proxies by a
# part of their id (config_dump, as istiod) must look among that namespace's proxies only.
CALLER_NAMESPACE = "debug_caller_namespace"


def is_local(request: web.Request) -> bool:
    peer = request.remote or ""
    try:
        return ipaddress.ip_address(peer.split("%")[0]).is_loopback
    except ValueError:
        return peer == ""  # unix sockets


def proxy_namespace(proxy_id: str) -> str:
    """`sidecar~IP~POD.NS~NS.svc.DOMAIN` or `POD.NS` -> NS."""
    parts = proxy_id.split("~")
    pod_ns = parts[2] if len(parts) == 4 else proxy_id
    return pod_ns.rpartition(".")[2]


def _deny(status: int, message: str) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return web.json_response({"error": message}, status=status, headers=headers)


def debug_auth(authenticators: Authenticators | None, system_namespace: str):
    @web.middleware
    async def middleware(request: web.Request, handler):
        if not request.path.startswith("/debug") or is_local(request):
            return await handler(request)
        if authenticators is None:
            return _deny(403, "debug endpoints need authentication off localhost, and no authenticator is "
                              "configured (run in Kubernetes mode or set JWT_RULE)")
        token = bearer_token(request.headers.items())
        if token is None:
            return _deny(401, "debug endpoints off localhost need 'Authorization: Bearer <token>'")
        try:
            caller = await authenticators.authenticate(Credentials(bearer_token=token))
        except AuthenticationError as e:
            log.info("debug request refused", path=request.path, peer=request.remote, error=str(e))
            return _deny(401, str(e))
        if caller.namespace == system_namespace:
            return await handler(request)
        proxy_id = request.query.get("proxyID", "")
        if request.path in PER_PROXY and proxy_id and proxy_namespace(proxy_id) == caller.namespace:
            request[CALLER_NAMESPACE] = caller.namespace
            return await handler(request)
        log.info("debug request refused", path=request.path, caller=caller.account, proxy=proxy_id)
        return _deny(403, f"{caller.account} may read only the per-proxy views ({', '.join(PER_PROXY)}) "
                          f"of proxies in namespace {caller.namespace}; everything else needs an identity "
                          f"in {system_namespace}")
    return middleware
