"""PushRequest: what changed and why, merged across events until the debouncer lets it go."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pilot.model.dependencies import merge_scopes
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
    # Per connection, once scoped (DiscoveryServer.scope): the types to regenerate, each whole
    # (None) or some of its resources (names). None: every watched type, whole.
    scope: Mapping[str, frozenset[str] | None] | None = None

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
            scope=merge_scopes(self.scope, other.scope),
        )

    def scoped(self, scope: Mapping[str, frozenset[str] | None] | None) -> PushRequest:
        """This request as one connection gets it: limited to `scope`."""
        return replace(self, scope=scope)

    def kinds(self) -> set[str]:
        return {k.kind for k in self.config_keys}

    def reason_text(self) -> str:
        return ",".join(sorted(self.reasons)) or "unknown"
