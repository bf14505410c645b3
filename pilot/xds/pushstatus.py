"""What each push did, stage by stage, and which push produced each resource version.

Answers "why did my change take 4 s" (/debug/push_timeline) and "which push last changed this
resource, and why" (/debug/explain) without per-proxy bookkeeping: resource versions are content
hashes shared by every proxy, so one record per (type, name, version) serves them all.
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field


@dataclass
class PushRecord:
    version: str
    full: bool
    reasons: dict[str, int]
    config_keys: list[str]
    debounce_s: float
    context_build_s: float
    proxies: int
    first_event_monotonic: float
    started_at: float = field(default_factory=time.time)
    # Accumulated while proxies are served:
    generate_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    queue_max_s: float = 0.0
    send_s: float = 0.0
    responses: int = 0
    bytes_sent: int = 0
    acks: int = 0
    nacks: int = 0
    convergence_max_s: float = 0.0

    def as_dict(self) -> dict:
        return {
            "version": self.version, "full": self.full, "reasons": self.reasons,
            "config_keys": self.config_keys, "proxies": self.proxies,
            "started_at": self.started_at,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at)),
            "debounce_s": self.debounce_s, "context_build_s": self.context_build_s,
            "stages_ms": {
                "debounce": round(self.debounce_s * 1000, 2),
                "context_build": round(self.context_build_s * 1000, 2),
                "generate": {t: round(s * 1000, 2) for t, s in sorted(self.generate_s.items())},
                "queue_max": round(self.queue_max_s * 1000, 2),
                "send": round(self.send_s * 1000, 2),
                "first_event_to_last_ack": round(self.convergence_max_s * 1000, 2),
            },
            "responses": self.responses, "bytes_sent": self.bytes_sent, "acks": self.acks, "nacks": self.nacks,
        }


class PushHistory:
    def __init__(self, pushes: int = 100, builds: int = 200_000) -> None:
        self._pushes: OrderedDict[str, PushRecord] = OrderedDict()
        self._builds: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        self._max_pushes = pushes
        self._max_builds = builds

    def add(self, record: PushRecord) -> None:
        self._pushes[record.version] = record
        while len(self._pushes) > self._max_pushes:
            self._pushes.popitem(last=False)

    def get(self, version: str) -> PushRecord | None:
        return self._pushes.get(version)

    def recent(self) -> list[PushRecord]:
        return list(reversed(self._pushes.values()))

    def note_build(self, type_url: str, name: str, resource_version: str, push_version: str) -> None:
        """The first push whose context produced this content is the push that changed it."""
        key = (type_url, name, resource_version)
        if key not in self._builds:
            self._builds[key] = push_version
            if len(self._builds) > self._max_builds:
                self._builds.popitem(last=False)

    def built_in(self, type_url: str, name: str, resource_version: str) -> str | None:
        return self._builds.get((type_url, name, resource_version))
