"""Graceful termination as istio-agent does it: the first SIGTERM (or SIGINT) asks Envoy to drain
its listeners (admin `POST /drain_listeners?graceful`, inbound only for sidecars so the application
can still call out while it shuts down), the agent reports not ready, and Envoy is stopped once
`terminationDrainDuration` has passed. A second signal ends the wait at once.

Envoy's own `--drain-time-s`/`--drain-strategy immediate` decide how fast it discourages
keep-alive connections (Connection: close, HTTP/2 GOAWAY) during that window.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

import aiohttp

from pilot import logging as plog
from pilot.agent.supervisor import EnvoySupervisor

log = plog.get("agent")

ADMIN_TIMEOUT = 5.0


def drain_path(inbound_only: bool) -> str:
    # `graceful`: Envoy discourages connections for --drain-time-s before closing listeners rather
    # than closing them now; `inboundonly` leaves the outbound listeners (the app's calls) alone.
    return "/drain_listeners?inboundonly&graceful" if inbound_only else "/drain_listeners?graceful"


class GracefulStop:
    def __init__(self, envoy: EnvoySupervisor, *, duration: float, inbound_only: bool) -> None:
        self.envoy = envoy
        self.duration = duration
        self.inbound_only = inbound_only
        self._task: asyncio.Task | None = None

    def on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._task is not None:
            log.info("second signal during the drain; stopping envoy now", signal=name)
            self._task.cancel()
            self.envoy.request_stop(sig)
            return
        if self.duration <= 0 or not self.envoy.running or not self.envoy.admin_address:
            # Nothing to drain (no Envoy serving yet) or draining turned off.
            self.envoy.request_stop(sig)
            return
        self.envoy.begin_drain()
        self._task = asyncio.create_task(self._drain(), name="graceful-termination")

    async def _drain(self) -> None:
        log.info("agent draining proxy for termination", inbound_only=self.inbound_only)
        try:
            async with aiohttp.ClientSession() as s, s.post(
                    f"http://{self.envoy.admin_address}{drain_path(self.inbound_only)}",
                    timeout=aiohttp.ClientTimeout(total=ADMIN_TIMEOUT)) as r:
                if r.status != 200:
                    log.warning("envoy refused to drain its listeners", status=r.status,
                                reason=(await r.text()).strip()[:200])
        except (aiohttp.ClientError, TimeoutError) as e:
            # Still wait: connections in flight deserve the window even if the drain call failed.
            log.warning("cannot ask envoy to drain its listeners", error=str(e))
        log.info(f"graceful termination period is {self.duration:g}s, starting...")
        await asyncio.sleep(self.duration)
        log.info("graceful termination period complete, terminating remaining proxies")
        self.envoy.request_stop(signal.SIGTERM)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
