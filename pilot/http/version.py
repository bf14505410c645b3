"""/version: istiod's build information (pkg/version BuildInfo JSON fields)."""

from __future__ import annotations

from aiohttp import web

from pilot.version import build_info


async def version_handler(_req: web.Request) -> web.Response:
    return web.json_response(build_info())
