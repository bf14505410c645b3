"""Gateways and their listeners as this controller judges them (pure): which listeners can be
served, which route kinds each accepts, which certificate it presents, which conflict, and the
Gateway's address (the Service of its deployment).

Protocols: HTTP and HTTPS take HTTPRoute and GRPCRoute; TLS Passthrough takes TLSRoute; TLS
Terminate and TCP take TCPRoute. Anything else (UDP, unknown) is not accepted.

Conflicts, per port in listener order (the earlier listener keeps the port): a listener whose
protocol class differs from the port's (HTTP against HTTPS/TLS against TCP) is ProtocolConflict;
one with the same hostname as an earlier listener of its class (a second TCP listener alike) is
HostnameConflict. A conflicted listener is neither accepted nor programmed.

Addresses: the Service istiod's automated deployment creates, `<gateway>-<class>` in the
Gateway's namespace, or the Service a `Hostname` address names; its cluster-local hostname is
the address. (Its load balancer's addresses are not reported: a Service's status is not read,
so that load-balancer updates never cause a push.) `IPAddress` addresses are not supported
(istiod binds only Hostname addresses).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pilot.config.core import Secret, Service
from pilot.config.gateway_api import GROUP, KubernetesGateway
from pilot.model.credentials import CERT_KEYS
from pilot.model.gateway_api.conditions import condition, sorted_conditions
from pilot.model.gateway_api.references import ReferenceGrants
from pilot.model.store import Entry

HTTP_KINDS = ((GROUP, "HTTPRoute"), (GROUP, "GRPCRoute"))
TLS_PASSTHROUGH_KINDS = ((GROUP, "TLSRoute"),)
TCP_KINDS = ((GROUP, "TCPRoute"),)
_PORT_CLASS = {"HTTP": "http", "HTTPS": "tls", "TLS": "tls", "TCP": "tcp"}


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str
    message: str


ACCEPTED = Verdict(True, "Accepted", "No errors found")


@dataclass(frozen=True)
class ListenerState:
    gateway: Entry[KubernetesGateway]
    index: int
    kinds: tuple[tuple[str, str], ...]  # route (group, kind) that may attach
    accepted: Verdict
    conflicted: Verdict  # ok=True: conflicted
    resolved: Verdict
    credential: str = ""  # the internal server's credentialName: NAME, or NAMESPACE/NAME across namespaces

    @property
    def spec(self):
        return self.gateway.obj.spec.listeners[self.index]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def programmed(self) -> bool:
        return self.accepted.ok and not self.conflicted.ok and self.resolved.reason != "InvalidCertificateRef" \
            and self.resolved.reason != "RefNotPermitted"

    def status(self, attached: int, generation: int) -> dict:
        programmed = self.programmed
        why = "No errors found" if programmed else (
            "Bad TLS configuration" if self.resolved.reason in ("InvalidCertificateRef", "RefNotPermitted")
            else self.conflicted.message if self.conflicted.ok else self.accepted.message)
        return {
            "name": self.name,
            "supportedKinds": [{"group": g, "kind": k} for g, k in self.kinds],
            "attachedRoutes": attached,
            "conditions": sorted_conditions([
                condition("Accepted", self.accepted.ok, self.accepted.reason, self.accepted.message, generation),
                condition("Conflicted", self.conflicted.ok, self.conflicted.reason, self.conflicted.message,
                          generation),
                condition("Programmed", programmed, "Programmed" if programmed else "Invalid", why, generation),
                condition("ResolvedRefs", self.resolved.ok, self.resolved.reason, self.resolved.message, generation),
            ]),
        }


@dataclass(frozen=True)
class GatewayState:
    entry: Entry[KubernetesGateway]
    class_name: str
    listeners: tuple[ListenerState, ...]
    accepted: Verdict
    programmed: Verdict
    addresses: tuple[tuple[str, str], ...]  # (type, value)

    def status(self, attached: Mapping[str, int]) -> dict:
        gen = self.entry.obj.metadata.generation
        out: dict = {}
        if self.addresses:
            out["addresses"] = [{"type": t, "value": v} for t, v in self.addresses]
        out["conditions"] = sorted_conditions([
            condition("Accepted", self.accepted.ok, self.accepted.reason, self.accepted.message, gen),
            condition("Programmed", self.programmed.ok, self.programmed.reason, self.programmed.message, gen),
        ])
        out["listeners"] = [ls.status(attached.get(ls.name, 0), gen) for ls in self.listeners]
        return out


def _supported_kinds(listener) -> tuple[tuple[tuple[str, str], ...], Verdict | None]:
    proto = listener.protocol
    native: tuple[tuple[str, str], ...]
    if proto in ("HTTP", "HTTPS"):
        native = HTTP_KINDS
    elif proto == "TLS":
        native = TLS_PASSTHROUGH_KINDS if listener.tls.mode == "Passthrough" else TCP_KINDS
    elif proto == "TCP":
        native = TCP_KINDS
    else:
        return (), None
    wanted = [k.key() for k in listener.allowed_routes.kinds]
    if not wanted:
        return native, None
    ok = tuple(k for k in dict.fromkeys(wanted) if k in native)
    bad = [f"{g}/{k}" for g, k in wanted if (g, k) not in native]
    if bad:
        return ok, Verdict(False, "InvalidRouteKinds", f"unsupported route kind(s) for {proto}: {', '.join(bad)}")
    return ok, None


def _certificate(gateway: Entry[KubernetesGateway], listener, secrets: Mapping[tuple[str, str], Entry[Secret]],
                 grants: ReferenceGrants) -> tuple[str, Verdict | None]:
    """The credentialName for a terminating listener, or why there is none."""
    ref = listener.tls.certificate_refs[0] if listener.tls.certificate_refs else None
    if ref is None:
        return "", Verdict(False, "InvalidCertificateRef", "no certificateRefs (tls.options alone are not supported)")
    ns = ref.namespace or gateway.key.namespace
    where = f"{ref.group or 'core'}/{ref.kind}/{ns}/{ref.name}"
    if ref.group not in ("", "core") or ref.kind != "Secret":
        return "", Verdict(False, "InvalidCertificateRef", f"invalid certificate reference {where}, only Secret is "
                                                            "allowed")
    if not grants.allowed(GROUP, "Gateway", gateway.key.namespace, "", "Secret", ns, ref.name):
        return "", Verdict(False, "RefNotPermitted", f"certificate reference {where} is not permitted (missing a "
                                                     "ReferenceGrant?)")
    secret = secrets.get((ns, ref.name))
    if secret is None:
        return "", Verdict(False, "InvalidCertificateRef", f"invalid certificate reference {where}, secret {ns}/"
                                                            f"{ref.name} not found")
    data = secret.obj.data
    if not any(c in data and k in data for c, k in CERT_KEYS):
        return "", Verdict(False, "InvalidCertificateRef", f"invalid certificate reference {where}, the secret has "
                                                            "no tls.crt and tls.key")
    return (ref.name if ns == gateway.key.namespace else f"{ns}/{ref.name}"), None


def evaluate_listeners(gateway: Entry[KubernetesGateway], secrets: Mapping[tuple[str, str], Entry[Secret]],
                       grants: ReferenceGrants) -> tuple[ListenerState, ...]:
    out: list[ListenerState] = []
    port_class: dict[int, str] = {}
    seen_hosts: dict[tuple[int, str], str] = {}
    for i, listener in enumerate(gateway.obj.spec.listeners):
        kinds, kind_problem = _supported_kinds(listener)
        resolved = kind_problem or Verdict(True, "ResolvedRefs", "No errors found")
        accepted = ACCEPTED
        conflicted = Verdict(False, "NoConflicts", "No errors found")
        credential = ""
        cls = _PORT_CLASS.get(listener.protocol)
        if cls is None:
            hint = f'. hint: "{listener.protocol.upper()}" (uppercase) may be supported' \
                if listener.protocol.upper() in _PORT_CLASS and listener.protocol != listener.protocol.upper() else ""
            accepted = Verdict(False, "UnsupportedProtocol", f'protocol "{listener.protocol}" is unsupported{hint}')
        else:
            owner = port_class.setdefault(listener.port, cls)
            host_key = (listener.port, listener.hostname or "")
            if owner != cls:
                conflicted = Verdict(True, "ProtocolConflict", f"port {listener.port} already serves another protocol "
                                                               f"(an earlier listener)")
            elif host_key in seen_hosts:
                conflicted = Verdict(True, "HostnameConflict", f"listener {seen_hosts[host_key]} already serves "
                                                               f"hostname {listener.hostname or '*'!r} on port "
                                                               f"{listener.port}")
            else:
                seen_hosts[host_key] = listener.name
            if conflicted.ok:
                accepted = Verdict(False, conflicted.reason, conflicted.message)
            elif listener.tls is not None and listener.tls.mode == "Terminate":
                credential, problem = _certificate(gateway, listener, secrets, grants)
                if problem is not None:
                    resolved = problem
        out.append(ListenerState(gateway, i, kinds if cls is not None else (), accepted, conflicted, resolved,
                                 credential))
    return tuple(out)


def evaluate_gateway(gateway: Entry[KubernetesGateway], class_name: str,
                     services: Mapping[tuple[str, str], Entry[Service]],
                     secrets: Mapping[tuple[str, str], Entry[Secret]], grants: ReferenceGrants, domain: str) -> GatewayState:
    spec = gateway.obj.spec
    ns, name = gateway.key.namespace, gateway.key.name
    listeners = evaluate_listeners(gateway, secrets, grants)
    ips = [a.value for a in spec.addresses if a.type != "Hostname"]
    hostnames = [a.value for a in spec.addresses if a.type == "Hostname"]
    if ips:
        msg = f"only Hostname is supported, ignoring [{', '.join(ips)}]"
        return GatewayState(gateway, class_name, listeners, Verdict(False, "UnsupportedAddress", msg),
                            Verdict(False, "UnsupportedAddress", "Failed to assign to any requested addresses"), ())
    host = hostnames[0] if hostnames else f"{name}-{class_name}.{ns}.svc.{domain}"
    svc_name, _, rest = host.partition(".")
    svc_ns = rest.split(".")[0] if rest else ns
    service = services.get((svc_ns, svc_name))
    accepted = Verdict(True, "Accepted", "Resource accepted")
    if service is None:
        return GatewayState(gateway, class_name, listeners, accepted, Verdict(
            False, "AddressNotUsable", f'Failed to assign to any requested addresses: hostname "{host}" not found'), ())
    fqdn = f"{svc_name}.{svc_ns}.svc.{domain}"
    ports = sorted({ls.spec.port for ls in listeners})
    assigned = ", ".join(f"{fqdn}:{p}" for p in ports)
    return GatewayState(gateway, class_name, listeners, accepted,
                        Verdict(True, "Programmed", f"Resource programmed, assigned to service(s) {assigned}"),
                        (("Hostname", fqdn),))
