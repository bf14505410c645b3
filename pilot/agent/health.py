"""The workload's readiness probe on a VM (istio-agent's pkg/istio-agent/health): ProxyConfig
`readinessProbe` (from the WorkloadGroup's `probe`, written into mesh.yaml by `pilotctl x workload
entry configure`) is run by the agent, and each change of the result is reported to the control
plane as a DiscoveryRequest of type `istio.io/health` over the xDS stream the agent proxies
(`error_detail` set when unhealthy), which sets the auto-registered WorkloadEntry's Healthy
condition. Thresholds as the kubelet counts them; before the first result nothing is reported,
so the entry stays unhealthy (istiod treats a missing condition as not healthy)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from pilot import logging as plog
from pilot.agent.app_probes import Prober, ProberConfigError, prober, run

log = plog.get("health")

ProbeConfigError = ProberConfigError


@dataclass(frozen=True)
class ReadinessProbe:
    prober: Prober
    initial_delay: float = 0.0
    period: float = 10.0  # the kubelet's defaults
    success_threshold: int = 1
    failure_threshold: int = 3


def _count(probe: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    v = probe.get(key)
    if v is None or v == 0:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ProbeConfigError(f"ProxyConfig.readinessProbe.{key}: must be an integer >= {minimum}, got {v!r}")
    return v


def parse(probe: Any) -> ReadinessProbe | None:
    """ProxyConfig.readinessProbe (camelCase, as the WorkloadGroup's probe); None when absent."""
    if probe is None:
        return None
    if not isinstance(probe, Mapping):
        raise ProbeConfigError("ProxyConfig.readinessProbe: must be an object")
    if probe.get("exec") is not None:
        raise ProbeConfigError("ProxyConfig.readinessProbe.exec: command probes are not run by this agent "
                               "(use httpGet, tcpSocket or grpc)")
    base = prober("ProxyConfig.readinessProbe", probe)
    if base.kind == "tcpSocket" and not base.action.get("host"):
        # the API's default for tcpSocket; httpGet's is the VM's IP
        base = replace(base, action={**base.action, "host": "localhost"})
    return ReadinessProbe(base,
                          initial_delay=float(_count(probe, "initialDelaySeconds", 0, 0)),
                          period=float(_count(probe, "periodSeconds", 10, 1)),
                          success_threshold=_count(probe, "successThreshold", 1, 1),
                          failure_threshold=_count(probe, "failureThreshold", 3, 1))


async def run_forever(probe: ReadinessProbe, host: str, report: Callable[[bool, str], None]) -> None:
    """Probe every period; report (healthy, message) when the thresholded state changes."""
    state: bool | None = None
    streak_ok = streak_fail = 0
    await asyncio.sleep(probe.initial_delay)  # the probe's own schedule, not synchronisation
    async with aiohttp.ClientSession() as session:
        while True:
            code, body = await run(probe.prober, host, session)
            ok = code == 200
            streak_ok, streak_fail = (streak_ok + 1, 0) if ok else (0, streak_fail + 1)
            new = state
            if ok and streak_ok >= probe.success_threshold:
                new = True
            elif not ok and (streak_fail >= probe.failure_threshold or state is None):
                # The first result counts at once (as istio-agent's first report): a VM that is
                # down at start is not kept waiting failureThreshold periods to be reported.
                new = False
            if new != state:
                state = new
                message = "" if ok else body.strip()
                log.info("readiness changed", healthy=ok, message=message)
                report(ok, message)
            await asyncio.sleep(probe.period)
