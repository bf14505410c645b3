"""What the status and request checks (status_checks.py, checks.py) share: the conformance
namespaces, upstream's consistency settings, CheckFailed, and polling until a check holds.
"""

from __future__ import annotations

import asyncio
import time

GW_GROUP = "gateway.networking.k8s.io"
INFRA_NS = "gateway-conformance-infra"
MESH_NS = "gateway-conformance-mesh"
CONSECUTIVE = 3
STATUS_TIMEOUT = 30.0  # upstream's defaults are 60 s (GatewayMustHaveCondition) and 30 s (routes)
CONSISTENCY_TIMEOUT = 30.0


class CheckFailed(AssertionError):
    pass


def split_name(ref: str, default_ns: str = INFRA_NS) -> tuple[str, str]:
    ns, sep, name = ref.partition("/")
    return (ns, name) if sep else (default_ns, ref)


async def poll(check, timeout: float, what: str) -> None:
    """Run `check` (returns None when it holds, else a description) until it holds or time runs out."""
    deadline = time.monotonic() + timeout
    problem = "never checked"
    while time.monotonic() < deadline:
        problem = await check()
        if problem is None:
            return
        await asyncio.sleep(0.2)
    raise CheckFailed(f"{what}: {problem}")
