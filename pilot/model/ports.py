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
    # A sniffed port (istiod's ListenerProtocolAuto): HTTP connections get the port's route config,
    # everything else the TCP chains of `tcp_services` (the services that name no protocol, and
    # any TCP service sharing the port, as istiod merges them).
    sniff: bool = False


def port_is_http(svc: MeshService, port: int, sniff: bool = True) -> bool:
    """Whether the service's port `port` (callers pass ports it has) may carry HTTP routes: it
    speaks HTTP, or names no protocol and is sniffed."""
    sp = svc.port(port)
    return sp is not None and (sp.protocol.is_http or (sniff and sp.protocol.is_unsupported))


def _sniffed(svc: MeshService, port: int) -> bool:
    sp = svc.port(port)
    return sp is not None and sp.protocol.is_unsupported


def plan_ports(by_port: Mapping[int, tuple[MeshService, ...]],
               protocols: Mapping[int, Protocol] | None = None,
               sniff: bool = True) -> tuple[list[PortPlan], list[str]]:
    """Decide each port's protocol. HTTP wins a port shared with TCP services, as in istiod where
    the HTTP listener takes the wildcard port; the losers are reported as conflicts.
    `protocols`: ports whose listener protocol is given (a Sidecar egress listener's
    `port.protocol`, as istiod builds that listener): every service on it is served that way.
    A port with a service that names no protocol is sniffed when `sniff`
    (PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_OUTBOUND): then HTTP and TCP services share it."""
    plans: list[PortPlan] = []
    conflicts: list[str] = []
    for port, services in sorted(by_port.items()):
        given = (protocols or {}).get(port)
        if given is not None and not (given.is_unsupported and sniff):
            plans.append(PortPlan(port, True, ()) if given.is_http else PortPlan(port, False, tuple(services)))
            continue
        if given is not None:  # the egress listener names no protocol: sniff for every service
            plans.append(PortPlan(port, True, tuple(services), sniff=True))
            continue
        auto = [s for s in services if _sniffed(s, port)] if sniff else []
        http = [s for s in services if port_is_http(s, port) and not _sniffed(s, port)]
        tcp = tuple(s for s in services if not port_is_http(s, port, sniff))  # (sniff off: unnamed too)
        if auto:
            plans.append(PortPlan(port, True, tuple(auto) + tcp, sniff=True))
        elif http:
            plans.append(PortPlan(port, True, ()))
            conflicts.extend(f"{s.hostname}:{port} is TCP but port {port} is HTTP for "
                             f"{http[0].hostname}; it gets no outbound listener" for s in tcp)
        else:
            plans.append(PortPlan(port, False, tcp))
    return plans, conflicts
