"""Locality load balancing applied to a cluster's endpoint groups for one client, as istiod's
loadbalancer.ApplyLocalityLoadBalancer: `distribute` rewrites the groups' weights, `failover`
ranks them into priorities by how much of the client's locality they share (region, zone,
subzone), `failoverPriority` ranks endpoints by the labels they share with the client."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pilot.model.locality import LocalityLb
from pilot.model.services import EndpointAddress, Locality


@dataclass
class Group:
    """One LocalityLbEndpoints being built."""

    locality: Locality
    endpoints: list[EndpointAddress]
    weight: int
    priority: int = 0
    extra: dict = field(default_factory=dict)


def locality_match(loc: Locality, rule: str) -> bool:
    """istiod's util.LocalityMatch: `region[/zone[/subzone]]`, `*` matching anything."""
    region, zone, subzone = (rule.split("/", 2) + ["", ""])[:3]
    return ((region == "*" or loc.region == region) and (zone in ("*", "") or loc.zone == zone)
            and (subzone in ("*", "") or loc.subzone == subzone))


def lb_priority(client: Locality, ep: Locality) -> int:
    if client.region != ep.region:
        return 3
    if client.zone != ep.zone:
        return 2
    return 0 if client.subzone == ep.subzone else 1


def apply(groups: list[Group], lb: LocalityLb) -> list[Group]:
    s = lb.setting
    if s.distribute:
        _weights(groups, lb.client, s.distribute)
        return groups
    if s.failover_priority:
        groups = _failover_priorities(groups, lb.client_labels, s.failover_priority)
        if s.failover:
            _failover(groups, lb.client, s.failover)
        return groups
    _failover(groups, lb.client, s.failover)
    return groups


def _weights(groups: list[Group], client: Locality, distribute) -> None:
    for source, targets in distribute:
        if not locality_match(client, source):
            continue
        unmatched = set(range(len(groups)))
        for target, weight in targets:
            matched = {i: groups[i].weight for i in sorted(unmatched) if locality_match(groups[i].locality, target)}
            unmatched -= matched.keys()
            total = sum(matched.values())
            for i, original in matched.items():
                share = original * weight / total if total else 0
                if share > 0:
                    groups[i].weight = math.ceil(share)
        for i in unmatched:  # localities the rule gives no share get no traffic
            groups[i].endpoints = []
        return


def _compact(groups: list[Group]) -> None:
    """Priorities run 0..N without gaps, as Envoy requires."""
    rank = {p: i for i, p in enumerate(sorted({g.priority for g in groups}))}
    for g in groups:
        g.priority = rank[g.priority]


def _failover(groups: list[Group], client: Locality, failover) -> None:
    for g in groups:
        p = lb_priority(client, g.locality)
        if p == 3:
            for source, target in failover:
                if source == client.region:
                    if g.locality.region != target:
                        p = 4
                    break
        g.priority = g.priority * 5 + p
    _compact(groups)


def _failover_priorities(groups: list[Group], client_labels, priorities) -> list[Group]:
    if not client_labels:
        return groups
    client = dict(client_labels)
    names: list[str] = []
    overrides: dict[str, str] = {}
    for item in priorities:
        name, sep, value = item.partition("=")
        names.append(name)
        if sep:
            overrides[name] = value
    lowest = len(names)
    out: list[Group] = []
    for g in groups:
        by_priority: dict[int, list[EndpointAddress]] = {}
        for ep in g.endpoints:
            labels = dict(ep.labels)
            priority = 0
            for j, name in enumerate(names):
                if overrides.get(name, client.get(name, "")) != labels.get(name, ""):
                    priority = lowest - j
                    break
            by_priority.setdefault(priority, []).append(ep)
        for priority in sorted(by_priority):
            eps = by_priority[priority]
            out.append(Group(g.locality, eps, sum(e.weight for e in eps), priority))
    _compact(out)
    return out
