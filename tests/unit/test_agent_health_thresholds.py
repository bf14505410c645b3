"""The VM readiness probe's thresholds (pilot/agent/health.py) as the kubelet counts them, against
a real HTTP server whose answers follow a script: a state change is reported only after
`successThreshold` / `failureThreshold` results in a row, and the first result at once."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from aiohttp import web

from pilot.agent import health
from tests.support.wait import wait_for


async def _scripted(statuses: list[int]) -> tuple[web.AppRunner, int, list[int]]:
    """A server answering the i-th request with statuses[i] (the last one after the script)."""
    served: list[int] = []

    async def probe(_r: web.Request) -> web.Response:
        status = statuses[min(len(served), len(statuses) - 1)]
        served.append(status)
        return web.Response(status=status, text="" if status == 200 else f"status {status}")

    app = web.Application()
    app.add_routes([web.get("/ready", probe)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], served  # type: ignore[union-attr]


async def _reports(statuses: list[int], **probe_fields: int) -> list[tuple[int, bool]]:
    """(requests served when reported, healthy) for each report over the whole script."""
    runner, port, served = await _scripted(statuses)
    parsed = health.parse({"httpGet": {"port": port, "path": "/ready"}, **probe_fields})
    assert parsed is not None
    # periodSeconds is whole seconds in the API; the schedule itself is not what is tested here.
    probe = replace(parsed, period=0.01)
    reports: list[tuple[int, bool]] = []
    task = asyncio.create_task(health.run_forever(probe, "127.0.0.1", lambda ok, _m: reports.append((len(served), ok))))
    try:
        await wait_for(lambda: len(served) >= len(statuses) + 2 or None, 20, message=f"probed {served}")
    finally:
        task.cancel()
        await runner.cleanup()
    return reports


async def test_failure_threshold_needs_that_many_failures_in_a_row():
    script = [200, 500, 500, 200, 500, 500, 500, 500, 200]
    reports = await _reports(script, failureThreshold=3)
    # healthy at the first answer; two failures then a success change nothing; the third
    # failure in a row (request 7) reports unhealthy; one success (threshold 1) recovers.
    assert reports == [(1, True), (7, False), (9, True)]


async def test_success_threshold_needs_that_many_successes_in_a_row():
    script = [500, 200, 500, 200, 200, 200, 500]
    reports = await _reports(script, successThreshold=3, failureThreshold=1)
    # the first result counts at once (unhealthy); 200, 500 does not recover; three 200s do;
    # one failure (threshold 1) is reported at once.
    assert reports == [(1, False), (6, True), (7, False)]


async def test_thresholds_below_one_are_refused_with_the_field():
    for field in ("successThreshold", "failureThreshold", "periodSeconds"):
        try:
            health.parse({"httpGet": {"port": 80}, field: -1})
        except health.ProbeConfigError as e:
            assert f"readinessProbe.{field}" in str(e)
        else:
            raise AssertionError(f"{field}: -1 accepted")
