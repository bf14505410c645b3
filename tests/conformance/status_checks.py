"""Status expectations: conditions on a Gateway (or ListenerSet), its listeners and a route's
parents, polled until they hold (upstream's GatewayMustHaveCondition,
GatewayAndRoutesMustBeAccepted and the like). See checks.py for the request side.
"""

from __future__ import annotations

from tests.conformance.check_support import GW_GROUP, STATUS_TIMEOUT, poll, split_name
from tests.conformance.cluster import Cluster


def _conditions_problem(conditions: list[dict], want: list[list[str]]) -> str | None:
    have = {c["type"]: c for c in conditions}
    for w in want:
        ctype, cstatus, reason = (list(w) + [None])[:3]
        c = have.get(ctype)
        if c is None or c["status"] != cstatus or (reason is not None and c.get("reason") != reason):
            got = {t: (c["status"], c.get("reason")) for t, c in have.items()}
            return f"want {ctype}={cstatus}" + (f"/{reason}" if reason else "") + f", have {got}"
    return None


def _parent_matches(entry: dict, ns: str, name: str, section: str | None, route_ns: str,
                    kind: str = "Gateway") -> bool:
    ref = entry["parentRef"]
    return (ref["name"] == name and ref.get("namespace", route_ns) == ns
            and (section is None or ref.get("sectionName") == section) and ref.get("kind", "Gateway") == kind)


async def check_status(cluster: Cluster, spec: dict, timeout: float = STATUS_TIMEOUT) -> None:
    kind = spec["kind"]
    ns, name = ("", spec["name"]) if kind == "GatewayClass" else split_name(spec["name"])

    async def check() -> str | None:
        status = await cluster.status(kind, ns, name)
        if status is None:
            return f"no {kind} {ns}/{name} in /debug/gatewayz"
        if spec.get("latest"):  # upstream *MustHaveLatestConditions: observedGeneration is current
            gen = cluster.objects[(kind, ns, name)]["metadata"]["generation"]
            conds = list(status.get("conditions", []))
            for part in ("listeners", "parents", "ancestors"):
                for x in status.get(part, []):
                    conds += x.get("conditions", [])
            stale = [(c["type"], c.get("observedGeneration")) for c in conds if c.get("observedGeneration") != gen]
            if stale or not conds:
                return f"conditions {stale or 'none'} not at generation {gen}"
            return None
        # upstream GatewayMustHaveAttachedListeners
        if kind == "Gateway" and "attachedListenerSets" in spec \
                and status.get("attachedListenerSets", 0) != spec["attachedListenerSets"]:
            return f"attachedListenerSets {status.get('attachedListenerSets')}, want {spec['attachedListenerSets']}"
        if kind in ("Gateway", "GatewayClass", "ListenerSet"):
            if "listener" in spec:
                ls = next((x for x in status.get("listeners", []) if x["name"] == spec["listener"]), None)
                if ls is None:
                    return f"no listener {spec['listener']} in {status.get('listeners')}"
                if "attachedRoutes" in spec and ls.get("attachedRoutes") != spec["attachedRoutes"]:
                    return f"attachedRoutes {ls.get('attachedRoutes')}, want {spec['attachedRoutes']}"
                if "supportedKinds" in spec:
                    # as upstream's listenersMatch: the expected kinds are present (empty: none at all)
                    kinds = sorted(k["kind"] for k in ls.get("supportedKinds", []))
                    want = spec["supportedKinds"]
                    if (not want and kinds) or not set(want) <= set(kinds):
                        return f"supportedKinds {kinds}, want {spec['supportedKinds']}"
                return _conditions_problem(ls.get("conditions", []), spec.get("conditions", []))
            if "listeners" in spec:  # the exact set of listener names in status
                names = sorted(x["name"] for x in status.get("listeners", []))
                if names != sorted(spec["listeners"]):
                    return f"listeners {names}, want {sorted(spec['listeners'])}"
            if spec.get("zeroRoutes"):  # upstream GatewayMustHaveZeroRoutes
                counts = {x["name"]: x.get("attachedRoutes") for x in status.get("listeners", [])}
                if any(counts.values()):
                    return f"attachedRoutes {counts}, want 0"
            if "allListeners" in spec:  # every listener has these conditions
                for ls in status.get("listeners", []):
                    problem = _conditions_problem(ls.get("conditions", []), spec["allListeners"])
                    if problem:
                        return f"listener {ls['name']}: {problem}"
                if not status.get("listeners"):
                    return "no listeners in status"
            return _conditions_problem(status.get("conditions", []), spec.get("conditions", []))
        if kind == "BackendTLSPolicy":  # upstream BackendTLSPolicyMustHaveCondition: any ancestor naming the Gateway
            gns, gname = split_name(spec["ancestor"])
            problems = []
            for a in status.get("ancestors", []):
                ref = a["ancestorRef"]
                if ref["name"] == gname and ref.get("namespace", gns) == gns:
                    problem = _conditions_problem(a.get("conditions", []), spec.get("conditions", []))
                    if problem is None:
                        return None
                    problems.append(problem)
            return f"no ancestor {gns}/{gname} with {spec.get('conditions')}: {problems or status.get('ancestors')}"
        # a route
        parents = status.get("parents", [])
        if spec.get("noAcceptedParents"):
            accepted = [p for p in parents if any(c["type"] == "Accepted" and c["status"] == "True"
                                                  for c in p.get("conditions", []))]
            return f"accepted parents {accepted}" if accepted else None
        pns, pname = split_name(spec["parent"])
        section = spec.get("section")
        entry = next((p for p in parents if _parent_matches(p, pns, pname, section, ns,
                                                            spec.get("parentKind", "Gateway"))), None)
        if entry is None:
            return f"no parent {pns}/{pname}/{section} in {[p['parentRef'] for p in parents]}"
        return _conditions_problem(entry.get("conditions", []), spec.get("conditions", []))

    await poll(check, timeout, f"{kind} {ns}/{name} {spec}")


async def check_accepted(cluster: Cluster, spec: dict) -> None:
    """upstream GatewayAndRoutesMustBeAccepted (+ ResolvedRefs True with `resolvedRefs: true`): every
    route has the Gateway (or the listed sections of it) among its parents, Accepted; every listener
    of the Gateway Accepted, Programmed and ResolvedRefs. With `parentKind: ListenerSet`
    (`gateway` names the ListenerSet), upstream RoutesAndParentMustBeAccepted for it."""
    gns, gname = split_name(spec["gateway"])
    # (`sections` name the listeners upstream lists; its parent match ignores sectionName, so one
    # Accepted entry for the Gateway satisfies each of them)
    kind = spec.get("kind", "HTTPRoute")
    parent_kind = spec.get("parentKind", "Gateway")
    for route in spec.get("routes", []):
        rns, rname = split_name(route)

        async def check(rns=rns, rname=rname) -> str | None:
            status = await cluster.status(kind, rns, rname)
            if status is None:
                return "no status"
            parents = status.get("parents", [])
            # As upstream's parentsForRouteMatch: a parent entry for the Gateway, matched by
            # group, kind, name and namespace (not sectionName), from our controller, Accepted.
            want = [["Accepted", "True", "Accepted"]]
            if spec.get("resolvedRefs"):
                want.append(["ResolvedRefs", "True", "ResolvedRefs"])
            ours = [p for p in parents
                    if (p["parentRef"].get("group"), p["parentRef"].get("kind"), p["parentRef"]["name"])
                    == (GW_GROUP, parent_kind, gname) and p["parentRef"].get("namespace", rns) == gns
                    and p.get("controllerName") == "istio.io/gateway-controller"]
            if not ours:
                return f"parents {[p['parentRef'] for p in parents]}, want {parent_kind} {gns}/{gname}"
            problems = [x for p in ours if (x := _conditions_problem(p.get("conditions", []), want))]
            return problems[0] if len(problems) == len(ours) else None

        await poll(check, STATUS_TIMEOUT, f"{kind} {rns}/{rname} accepted by {gns}/{gname}")
    await check_status(cluster, {"kind": parent_kind, "name": f"{gns}/{gname}", "allListeners": [
        ["ResolvedRefs", "True"], ["Accepted", "True"], ["Programmed", "True"]]})
