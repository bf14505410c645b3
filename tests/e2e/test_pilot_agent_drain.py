"""pilot-agent's graceful termination with the real agent, Envoy and control plane: SIGTERM drains
Envoy for terminationDrainDuration (not ready meanwhile, requests in flight finish), then stops it;
a second signal ends the wait at once."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.e2e.test_pilot_agent import NAMESPACE, agent, plane
from tests.support.agent import PilotAgent
from tests.support.backends import HttpBackend, answered_by
from tests.support.ports import free_port
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)

HOST = f"backend.{NAMESPACE}.svc.cluster.local"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer("ES256")


async def ready_status(a: PilotAgent) -> tuple[int, str]:
    return await a.get("status", "/healthz/ready", timeout=3)


async def routed_sidecar(tmp_path, cp, issuer, backend: HttpBackend, drain: str) -> tuple[PilotAgent, int]:
    """A sidecar whose outbound listener 127.0.0.1:PORT (INTERCEPTION_MODE NONE) reaches `backend`."""
    port = free_port()
    cp.write("backend-svc.yaml", service_yaml("backend", port, namespace=NAMESPACE))
    cp.write("backend-eps.yaml", endpoint_slice_yaml("backend", backend.port, namespace=NAMESPACE))
    a = agent(tmp_path, cp, issuer, env={"PROXY_CONFIG": json.dumps({
        "discoveryAddress": f"127.0.0.1:{cp.secure_port}", "proxyAdminPort": 0, "statusPort": 0,
        "concurrency": 1, "terminationDrainDuration": drain})})
    await a.start()
    await a.wait_ready()

    async def routed() -> bool:
        try:
            return await answered_by(f"http://127.0.0.1:{port}/", HOST, timeout=3) == (200, "backend")
        except aiohttp.ClientError:
            return False

    await wait_for(routed, timeout=20, interval=0.1, message=f"outbound route to the backend\n{a.log_tail()}")
    return a, port


async def test_sigterm_drains_then_stops_envoy_and_exits_0(tmp_path, issuer):
    drain = 3.0
    async with plane(tmp_path, issuer) as cp, HttpBackend("backend") as backend:
        a, port = await routed_sidecar(tmp_path, cp, issuer, backend, f"{drain:g}s")
        try:
            seen = backend.request_count
            slow = asyncio.create_task(answered_by(f"http://127.0.0.1:{port}/?delay=1.5", HOST, timeout=10))
            await wait_for(lambda: backend.request_count > seen, timeout=5, message="slow request reached backend")
            signalled = time.monotonic()
            a.signal(signal.SIGTERM)

            async def not_ready() -> bool:
                status, text = await ready_status(a)
                return status == 503 and "draining" in text

            await wait_for(not_ready, timeout=drain, interval=0.05, message=f"503 while draining\n{a.log_tail()}")
            # The request in flight when the pod was told to stop is answered, not cut.
            assert await slow == (200, "backend")
            # A sidecar drains inbound only: the app still calls out while it shuts down, and its
            # keep-alive connections are not told to close (a drained listener answers
            # `Connection: close`).
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/", headers={"Host": HOST},
                                                           timeout=aiohttp.ClientTimeout(total=3)) as r:
                assert r.status == 200 and r.headers.get("x-backend-name") == "backend"
                assert r.headers.get("Connection", "").lower() != "close", dict(r.headers)
            assert a.proc.returncode is None, "the agent did not wait for the drain"

            assert await a.wait_exit(timeout=drain + 10) == 0
            took = time.monotonic() - signalled
            assert drain - 0.5 <= took <= drain + 10, took
            # Envoy is gone: new connections to its listener are refused.
            with pytest.raises(aiohttp.ClientConnectionError):
                await answered_by(f"http://127.0.0.1:{port}/", HOST, timeout=3)
            log = a.log_text()
            assert "agent draining proxy for termination" in log and "inbound_only=True" in log
            assert "graceful termination period complete" in log
            assert "envoy refused to drain" not in log and "cannot ask envoy to drain" not in log
        finally:
            await a.stop()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
async def test_a_second_signal_during_the_drain_exits_at_once(tmp_path, issuer, second):
    async with plane(tmp_path, issuer) as cp:
        a = agent(tmp_path, cp, issuer, env={"TERMINATION_DRAIN_DURATION_SECONDS": "60"})
        async with a:
            await a.wait_ready()
            a.signal(signal.SIGTERM)
            await wait_for(lambda: "graceful termination period is 60s" in a.log_text(), timeout=10,
                           message=a.log_tail())
            assert (await ready_status(a))[0] == 503
            signalled = time.monotonic()
            a.signal(second)
            assert await a.wait_exit(timeout=15) == 0
            assert time.monotonic() - signalled < 15  # nowhere near the 60 s drain
            assert "second signal during the drain; stopping envoy now" in a.log_text()
            assert "graceful termination period complete" not in a.log_text()
