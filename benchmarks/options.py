"""What a benchmark run was asked to do: sizes and protocol, reduced by default, `--full` for the
reference sizes of ARCHITECTURE.md section 2 (1,000 services, 1,000 proxies)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"

REDUCED = {"services": 200, "proxies": 200, "churn_seconds": 10.0}
FULL = {"services": 1000, "proxies": 1000, "churn_seconds": 60.0}


@dataclass(frozen=True)
class Options:
    services: int
    proxies: int
    full: bool = False
    delta: bool = False
    channels: int = 10
    namespaces: int = 10
    rounds: int = 3  # pushes measured in `push` and `eds`; latencies of all rounds are pooled
    churn_rate: float = 10.0  # endpoint changes per second
    churn_seconds: float = 10.0
    out: Path | None = None  # a file for one scenario, a directory for `all`
    keep_workdir: bool = False
    server_env: tuple[tuple[str, str], ...] = ()  # extra PILOT_* knobs for the server under test
    port_name: str = "http"  # the services' port name; one without a protocol prefix is sniffed
    repeats: int = 3  # `sniffing`: runs of each side, alternating

    def out_path(self, scenario: str, several: bool) -> Path:
        if self.out is None:
            return RESULTS_DIR / f"{scenario}.json"
        return self.out / f"{scenario}.json" if several else self.out

    def public(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out) if self.out else None
        d["server_env"] = dict(self.server_env)
        d["protocol"] = "delta" if self.delta else "sotw"
        return d

    def timeout(self, per_proxy_s: float = 0.05, base_s: float = 60.0) -> float:
        """A deadline that grows with the load, for waits that must not hang a run forever."""
        return base_s + per_proxy_s * self.proxies + 0.01 * self.services
