"""PushRequest: what changed and why, merged across events until the debouncer lets it go."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from pilot.model.store import ConfigKey

# Reasons, named as istiod names them in pilot_xds_pushes / push_status.
ENDPOINT_UPDATE = "endpoint"
CONFIG_UPDATE = "config"
SERVICE_UPDATE = "service"
MESH_UPDATE = "mesh"
PROXY_REQUEST = "proxyrequest"
GLOBAL_UPDATE = "global"


@dataclass
class PushRequest:
    full: bool
    config_keys: set[ConfigKey] = field(default_factory=set)
    reasons: Counter = field(default_factory=Counter)
    start: float = field(default_factory=time.monotonic)  # first event, for convergence time
    # Filled in when the push is started.
    version: str = ""

    def merge(self, other: PushRequest | None) -> PushRequest:
        """Union of both; the older start wins so convergence time counts from the first change."""
        if other is None:
            return self
        return PushRequest(
            full=self.full or other.full,
            config_keys=self.config_keys | other.config_keys,
            reasons=self.reasons + other.reasons,
            start=min(self.start, other.start),
            version=other.version or self.version,
        )

    def kinds(self) -> set[str]:
        return {k.kind for k in self.config_keys}

    def reason_text(self) -> str:
        return ",".join(sorted(self.reasons)) or "unknown"
