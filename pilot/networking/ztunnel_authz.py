"""Builder for ztunnel's L4 authorization: an AuthzPolicy in, an istio.security.Authorization out."""

from __future__ import annotations

import ipaddress

from google.protobuf import empty_pb2

from pilot.gen.workloadapi.security import authorization_pb2 as sec
from pilot.model.ambient.types import AuthzMatch, AuthzPolicy, Cidr, StringMatch


def _strings(values: tuple[StringMatch, ...]) -> list[sec.StringMatch]:
    out = []
    for kind, value in values:
        if kind == "presence":
            out.append(sec.StringMatch(presence=empty_pb2.Empty()))
        else:
            match = sec.StringMatch()
            setattr(match, kind, value)  # exact, prefix, suffix (a oneof of strings)
            out.append(match)
    return out


def _cidrs(values: tuple[Cidr, ...]) -> list[sec.Address]:
    return [sec.Address(address=ipaddress.ip_address(a).packed, length=n) for a, n in values]


def _accounts(values: tuple[tuple[str, str], ...]) -> list[sec.ServiceAccountMatch]:
    return [sec.ServiceAccountMatch(namespace=ns, serviceAccount=sa) for ns, sa in values]


def _match(m: AuthzMatch) -> sec.Match:
    return sec.Match(
        namespaces=_strings(m.namespaces), not_namespaces=_strings(m.not_namespaces),
        service_accounts=_accounts(m.service_accounts), not_service_accounts=_accounts(m.not_service_accounts),
        principals=_strings(m.principals), not_principals=_strings(m.not_principals),
        source_ips=_cidrs(m.source_ips), not_source_ips=_cidrs(m.not_source_ips),
        destination_ips=_cidrs(m.destination_ips), not_destination_ips=_cidrs(m.not_destination_ips),
        destination_ports=list(m.destination_ports), not_destination_ports=list(m.not_destination_ports))


def authorization(p: AuthzPolicy) -> sec.Authorization:
    return sec.Authorization(
        name=p.name, namespace=p.namespace, scope=p.scope, action=p.action,  # enum names
        groups=[sec.Group(rules=[sec.Rules(matches=[_match(m) for m in part]) for part in rule])
                for rule in p.rules])
