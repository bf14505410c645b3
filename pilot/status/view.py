"""The status of every Gateway API object as of the current PushContext, with lastTransitionTime
stamped when each condition's status last changed (as this process saw it).

The status itself comes from the translation pass (model/gateway_api); this only adds times, so
it is the one stateful, clocked piece and lives apart from the pure model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from pilot.model.gateway_api.conditions import Status, stamp
from pilot.model.push_context import PushContext
from pilot.model.store import ConfigKey


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class GatewayStatusView:
    def __init__(self, clock: Callable[[], str] = now_rfc3339) -> None:
        self.clock = clock
        self.version = ""
        self._desired: Mapping[ConfigKey, Status] | None = None
        self._stamped: dict[ConfigKey, Status] = {}
        self.listeners: list[Callable[[Mapping[ConfigKey, Status]], None]] = []

    def update(self, ctx: PushContext) -> None:
        """Take the status a new PushContext computed (a DiscoveryServer context listener)."""
        self.version = ctx.version
        desired = ctx.gateway_api.statuses
        if desired is self._desired:
            return
        self._desired = desired
        now = self.clock()
        self._stamped = {k: stamp(self._stamped.get(k), v, now) for k, v in desired.items()}
        for listener in self.listeners:
            listener(desired)

    @property
    def desired(self) -> Mapping[ConfigKey, Status]:
        """The latest status without transition times (what the kube writer stamps itself)."""
        return self._desired or {}

    def get(self, key: ConfigKey) -> Status | None:
        return self._stamped.get(key)

    def items(self) -> list[tuple[ConfigKey, Status]]:
        return sorted(self._stamped.items())
