"""pilot-agent's app probers (ISTIO_KUBE_APP_PROBERS) against real servers: HTTP, TCP and the
gRPC health protocol, each able to say healthy and not."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import grpc
import pytest
from aiohttp import web

from pilot.agent import app_probes
from pilot.agent.config import ConfigError, load
from tests.support.ports import free_port


async def test_http_tcp_and_grpc_probes_follow_the_app():
    healthy = {"http": True, "grpc": True}

    async def ready(_r):
        return web.Response(status=200 if healthy["http"] else 500)

    app = web.Application()
    app.add_routes([web.get("/ready", ready)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = site._server.sockets[0].getsockname()[1]

    async def check(request: bytes, _ctx) -> bytes:
        assert request == b"\x0a\x03web"  # HealthCheckRequest{service: "web"}
        return b"\x08\x01" if healthy["grpc"] else b"\x08\x02"  # SERVING / NOT_SERVING

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)}
            )
        ]
    )
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    probers = app_probes.parse_probers(
        json.dumps(
            {
                "/app-health/web/readyz": {
                    "httpGet": {"path": "/ready", "port": http_port},
                    "timeoutSeconds": 2,
                },
                "/app-health/web/livez": {"tcpSocket": {"port": http_port}},
                "/app-health/web/startupz": {"grpc": {"port": grpc_port, "service": "web"}},
                "/app-health/db/livez": {"tcpSocket": {"port": free_port()}},
            }
        )
    )
    try:
        async with aiohttp.ClientSession() as s:

            async def status(path: str) -> int:
                return (await app_probes.run(probers[path], "127.0.0.1", s))[0]

            assert await status("/app-health/web/readyz") == 200
            assert await status("/app-health/web/livez") == 200
            assert await status("/app-health/web/startupz") == 200
            assert await status("/app-health/db/livez") == 500  # nothing listens
            healthy.update(http=False, grpc=False)
            assert await status("/app-health/web/readyz") == 500
            assert await status("/app-health/web/startupz") == 500
    finally:
        await server.stop(0)
        await runner.cleanup()
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    "value",
    [
        "{",
        "[]",
        '{"/x": {"tcpSocket": {"port": 1}}}',
        '{"/app-health/a/livez": {"tcpSocket": {"port": "http"}}}',
        '{"/app-health/a/livez": {}}',
    ],
)
def test_a_bad_probers_variable_stops_the_agent_naming_it(value):
    with pytest.raises(ConfigError, match="ISTIO_KUBE_APP_PROBERS"):
        load(
            proxy_type="sidecar",
            env={"ISTIO_KUBE_APP_PROBERS": value, "INSTANCE_IP": "127.0.0.1"},
            overrides={},
            find_envoy=lambda _p: "/bin/true",
            read_file=lambda _p: "",
        )
