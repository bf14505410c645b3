"""Which outbound ports carry HTTP and which TCP services, decided once per PushContext."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pilot.model.protocol import Protocol
from pilot.model.services import MeshService


@dataclass(frozen=True)
class PortPlan:
    """What one outbound port carries. Built by `plan_ports`; the input of the listener builders."""

    port: int
    http: bool
    tcp_services: tuple[MeshService, ...]  # for TCP ports: services on it, stable order


def port_is_http(svc: MeshService, port: int) -> bool:
    """Whether the service's port `port` (callers pass ports it has) speaks HTTP."""
    sp = svc.port(port)
    return sp is not None and sp.protocol.is_http


def plan_ports(by_port: Mapping[int, tuple[MeshService, ...]],
               protocols: Mapping[int, Protocol] | None = None) -> tuple[list[PortPlan], list[str]]:
    """Decide each port's protocol. HTTP wins a port shared with TCP services, as in istiod where
    the HTTP listener takes the wildcard port; the losers are reported as conflicts.
    `protocols`: ports whose listener protocol is given (a Sidecar egress listener's
    `port.protocol`, as istiod builds that listener): every service on it is served that way."""
    plans: list[PortPlan] = []
    conflicts: list[str] = []
    for port, services in sorted(by_port.items()):
        given = (protocols or {}).get(port)
        if given is not None:
            plans.append(PortPlan(port, True, ()) if given.is_http else PortPlan(port, False, tuple(services)))
            continue
        http = [s for s in services if port_is_http(s, port)]
        tcp = tuple(s for s in services if not port_is_http(s, port))
        if http:
            plans.append(PortPlan(port, True, ()))
            conflicts.extend(f"{s.hostname}:{port} is TCP but port {port} is HTTP for "
                             f"{http[0].hostname}; it gets no outbound listener" for s in tcp)
        else:
            plans.append(PortPlan(port, False, tcp))
    return plans, conflicts
