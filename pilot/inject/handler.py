"""The aiohttp face of the injector, for the HTTPS webhook server to mount:

    app.router.add_route("POST", "/inject", handler)
    app.router.add_route("POST", "/inject/{params:.*}", handler)   # istiod's /inject/cluster/X/net/Y

(`INJECT_PATHS` lists both, as istiod's mux registers `/inject` and the `/inject/` prefix.)
HTTP errors are istiod's: no body 400, a Content-Type other than application/json 415; a body that
is not JSON is answered 200 with an AdmissionReview refusing it, as istiod's decoder failure is.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from pilot.inject.review import InjectionContext, review_bytes

INJECT_PATHS = ("/inject", "/inject/{params:.*}")
MAX_BODY = 3 * 1024 * 1024  # the apiserver's own request limit is 3 MiB

# Rendering is CPU work of a millisecond or two: inline is cheaper than a thread hop and keeps
# the event loop free enough. Pods far larger than usual go to a thread.
_INLINE_LIMIT = 256 * 1024


def inject_handler(ctx: InjectionContext):
    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if not body:
            return web.Response(status=400, text="no body found\n")
        if request.content_type != "application/json":
            return web.Response(status=415, text="invalid Content-Type, want `application/json`\n")
        if len(body) > _INLINE_LIMIT:
            resp = await asyncio.to_thread(review_bytes, body, ctx, request.path)
        else:
            resp = review_bytes(body, ctx, request.path)
        return web.json_response(resp)

    return handle


def add_routes(app: web.Application, ctx: InjectionContext) -> None:
    handler = inject_handler(ctx)
    for path in INJECT_PATHS:
        app.router.add_route("POST", path, handler)


def application(ctx: InjectionContext) -> web.Application:
    """An app with just the injector (tests, benchmarks); the real server mounts `inject_handler`."""
    app = web.Application(client_max_size=MAX_BODY)
    add_routes(app, ctx)
    return app
