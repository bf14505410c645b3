"""AuthorizationPolicy and PeerAuthentication as ztunnel's L4 Authorization resources.

The translation is istiod's (pilot/pkg/serviceregistry/kube/controller/ambient/authorization.go):

- A policy with targetRef(s) is for waypoints, never for ztunnel. Without a selector it is
  NAMESPACE-scoped (GLOBAL in the root namespace); with one, WORKLOAD_SELECTOR, and the Workloads
  it selects list it by name. AUDIT and CUSTOM are not sent, with a status saying why.
- Each rule becomes one group of parts that must all match: the `to` operations (ports), the `from`
  sources (namespaces, service accounts, principals, IP blocks), and one part per `when` condition
  on an L4 key. Values ending or starting in `*` become prefix/suffix matches, a lone `*` presence.
- ztunnel sees only L4. A rule with HTTP attributes (hosts, methods, paths, request principals,
  remote IPs, other `when` keys) is dropped from an ALLOW policy (it can never match, so the
  policy allows less: if every rule had one, it allows nothing) and enforced without those
  attributes in a DENY policy (it matches more). Either way the policy is still sent, with a
  status message naming the attributes.
- PeerAuthentication STRICT becomes a reference to one static DENY policy that refuses callers
  without an identity; a workload policy with port-level exceptions becomes a policy of its own.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from pilot.config.security import AuthorizationPolicy, PeerAuthentication
from pilot.model.ambient.types import (
    ALLOW,
    DENY,
    SCOPE_GLOBAL,
    SCOPE_NAMESPACE,
    SCOPE_WORKLOAD_SELECTOR,
    AuthzMatch,
    AuthzPolicy,
    AuthzRule,
    Cidr,
    StringMatch,
)
from pilot.model.security_policies import peer_authentication_levels
from pilot.model.store import Entry

STATIC_STRICT_POLICY = "istio_converted_static_strict"  # '_' cannot appear in Kubernetes names
CONVERTED_PEER_AUTHENTICATION_PREFIX = "converted_peer_authentication_"
L4_WHEN_KEYS = frozenset({"source.ip", "source.namespace", "source.principal", "destination.ip",
                          "destination.port"})

_HTTP_RULE = ("ztunnel does not support HTTP attributes (found: {found}). In ambient mode you must use "
              "a waypoint proxy to enforce HTTP rules. {effect}")
_DENY_EFFECT = ("DENY policy with HTTP attributes is enforced without the HTTP rules. This will be more "
                "restrictive than requested.")
_ALLOW_EFFECT = ("Within an ALLOW policy, rules matching HTTP attributes are omitted. This will be more "
                 "restrictive than requested.")
_ANY_PRINCIPAL = (("presence", ""),)


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    """Why a policy is not enforced by ztunnel as written (istiod writes it to the policy's status)."""

    namespace: str
    name: str
    reason: str
    message: str
    sent: bool  # False: the policy is not sent to ztunnel at all


def convert_authorization_policy(entry: Entry[AuthorizationPolicy], root_namespace: str
                                 ) -> tuple[AuthzPolicy | None, PolicyStatus | None]:
    spec = entry.obj.spec
    ns, name = entry.key.namespace, entry.key.name
    if spec.target_references:
        return None, None
    if spec.selector is not None:
        scope = SCOPE_WORKLOAD_SELECTOR
    else:
        scope = SCOPE_GLOBAL if ns == root_namespace else SCOPE_NAMESPACE
    if spec.action not in (ALLOW, DENY):
        return None, PolicyStatus(ns, name, "UnsupportedValue",
                                  f"ztunnel does not support the {spec.action} action", sent=False)
    rules: list[AuthzRule] = []
    http_found: set[str] = set()
    for rule in spec.rules or ():
        converted, found = _rule(spec.action, rule, ns)
        if converted is not None:
            rules.append(converted)
        http_found.update(found)
    policy = AuthzPolicy(name, ns, scope, spec.action, tuple(rules))
    if http_found:
        effect = _DENY_EFFECT if spec.action == DENY else _ALLOW_EFFECT
        return policy, PolicyStatus(ns, name, "UnsupportedValue",
                                    _HTTP_RULE.format(found=", ".join(sorted(http_found)), effect=effect), sent=True)
    return policy, None


def _rule(action: str, rule, namespace: str) -> tuple[AuthzRule | None, set[str]]:
    http: set[str] = set()
    parts: list[tuple[AuthzMatch, ...]] = []
    to_matches = []
    for to in rule.to or ():
        op = to.operation
        http.update(f for f, attr in (("hosts", op.hosts), ("notHosts", op.not_hosts), ("methods", op.methods),
                                      ("notMethods", op.not_methods), ("paths", op.paths),
                                      ("notPaths", op.not_paths)) if attr)
        to_matches.append(AuthzMatch(destination_ports=_ports(op.ports), not_destination_ports=_ports(op.not_ports)))
    from_matches = []
    for frm in rule.from_ or ():
        src = frm.source
        # Trust domains have no field in ztunnel's Match (istiod 1.30 drops them there, which
        # widens an ALLOW): they are handled like the HTTP attributes, so an ALLOW rule naming
        # them allows nothing at L4 and a DENY rule denies regardless of trust domain.
        http.update(f for f, attr in (("remoteIpBlocks", src.remote_ip_blocks),
                                      ("notRemoteIpBlocks", src.not_remote_ip_blocks),
                                      ("requestPrincipals", src.request_principals),
                                      ("notRequestPrincipals", src.not_request_principals),
                                      ("trustDomains", src.trust_domains),
                                      ("notTrustDomains", src.not_trust_domains)) if attr)
        from_matches.append(AuthzMatch(
            source_ips=_cidrs(src.ip_blocks), not_source_ips=_cidrs(src.not_ip_blocks),
            namespaces=_strings(src.namespaces), not_namespaces=_strings(src.not_namespaces),
            service_accounts=_service_accounts(src.service_accounts, namespace),
            not_service_accounts=_service_accounts(src.not_service_accounts, namespace),
            principals=_strings(src.principals), not_principals=_strings(src.not_principals)))
    if to_matches:
        parts.append(tuple(to_matches))
    if from_matches:
        parts.append(tuple(from_matches))
    for cond in rule.when:
        if cond.key not in L4_WHEN_KEYS:
            http.add(cond.key)
        parts.append((_when(cond),))
    if action == ALLOW and http:
        # An HTTP condition can never be seen at L4, so the rule can never match.
        return None, http
    return tuple(parts), http


def _when(cond) -> AuthzMatch:
    """One condition as a match; a key ztunnel cannot see yields an empty (always true) match,
    which is how a DENY rule gets broader."""
    key, values, not_values = cond.key, cond.values, cond.not_values
    fields: dict = {}
    if key == "source.namespace":
        fields = {"namespaces": _strings(values), "not_namespaces": _strings(not_values)}
    elif key == "source.principal":
        fields = {"principals": _strings(values), "not_principals": _strings(not_values)}
    elif key == "source.ip":
        fields = {"source_ips": _cidrs(values), "not_source_ips": _cidrs(not_values)}
    elif key == "destination.ip":
        fields = {"destination_ips": _cidrs(values), "not_destination_ips": _cidrs(not_values)}
    elif key == "destination.port":
        fields = {"destination_ports": _ports(values), "not_destination_ports": _ports(not_values)}
    return AuthzMatch(**fields)


def _strings(values) -> tuple[StringMatch, ...]:
    out = []
    for v in values or ():
        if v == "*":
            out.append(("presence", ""))
        elif v.startswith("*"):
            out.append(("suffix", v[1:]))
        elif v.endswith("*"):
            out.append(("prefix", v[:-1]))
        else:
            out.append(("exact", v))
    return tuple(out)


def _service_accounts(values, namespace: str) -> tuple[tuple[str, str], ...]:
    out = []
    for v in values or ():
        ns, slash, sa = v.partition("/")
        out.append((ns, sa) if slash else (namespace, v))
    return tuple(out)


def _ports(values) -> tuple[int, ...]:
    out = []
    for v in values or ():
        try:
            p = int(v)
        except ValueError:
            continue
        if 0 <= p <= 65535:
            out.append(p)
    return tuple(out)


def _cidrs(values) -> tuple[Cidr, ...]:
    out = []
    for v in values or ():
        try:
            if "/" in v:
                # The address as written (istiod keeps host bits: 10.1.2.3/8 stays 10.1.2.3).
                iface = ipaddress.ip_interface(v)
                out.append((str(iface.ip), iface.network.prefixlen))
            else:
                ip = ipaddress.ip_address(v)
                out.append((str(ip), ip.max_prefixlen))
        except ValueError:
            continue
    return tuple(out)


# --- PeerAuthentication --------------------------------------------------------------------------
def static_strict_policy(root_namespace: str) -> AuthzPolicy:
    """Refuses callers without a mesh identity; workloads under STRICT mTLS reference it."""
    return AuthzPolicy(STATIC_STRICT_POLICY, root_namespace, SCOPE_WORKLOAD_SELECTOR, DENY,
                       (((AuthzMatch(not_principals=_ANY_PRINCIPAL),),),))


def _mode(e: Entry[PeerAuthentication] | None) -> str:
    return e.obj.spec.mode if e is not None else "UNSET"


def _converted_name(e: Entry) -> str:
    return CONVERTED_PEER_AUTHENTICATION_PREFIX + e.key.name


def _selector(e: Entry[PeerAuthentication]) -> dict[str, str]:
    sel = e.obj.spec.selector
    return sel.match_labels if sel is not None else {}


def workload_peer_authentication_policies(peer_authentications: Mapping[str, tuple[Entry[PeerAuthentication], ...]],
                                          namespace: str, labels: Mapping[str, str],
                                          root_namespace: str) -> tuple[str, ...]:
    """The "namespace/name" Authorization resources that enforce a workload's PeerAuthentication:
    the static STRICT policy, and/or the workload policy converted for its port exceptions."""
    mesh, ns_level, workload = peer_authentication_levels(peer_authentications, namespace, labels, root_namespace)
    strict = _mode(mesh) == "STRICT"
    if ns_level is not None and _mode(ns_level) != "UNSET":
        strict = _mode(ns_level) == "STRICT"
    port_policy = ""
    if workload is not None:
        mode = _mode(workload)
        port_modes = workload.obj.spec.port_modes()
        if mode == "STRICT":
            strict = True
        elif mode in ("PERMISSIVE", "DISABLE"):
            strict = False
        if port_modes:
            key = f"{workload.key.namespace}/{_converted_name(workload)}"
            if mode == "STRICT":
                if any(m in ("PERMISSIVE", "DISABLE") for m in port_modes.values()):
                    port_policy, strict = key, False
            elif mode in ("PERMISSIVE", "DISABLE"):
                if any(m == "STRICT" for m in port_modes.values()):
                    port_policy = key
            elif strict:
                if any(m == "PERMISSIVE" for m in port_modes.values()):
                    port_policy, strict = key, False
            elif any(m == "STRICT" for m in port_modes.values()):
                port_policy = key
    out = set()
    if strict:
        out.add(f"{root_namespace}/{STATIC_STRICT_POLICY}")
    if port_policy:
        out.add(port_policy)
    return tuple(sorted(out))


def convert_peer_authentication(entry: Entry[PeerAuthentication],
                                peer_authentications: Mapping[str, tuple[Entry[PeerAuthentication], ...]],
                                root_namespace: str) -> AuthzPolicy | None:
    """A workload PeerAuthentication with port-level modes as a DENY policy (None when the static
    STRICT policy alone expresses it, or it says nothing ztunnel must enforce)."""
    spec = entry.obj.spec
    ns = entry.key.namespace
    if ns == root_namespace or not _selector(entry) or not spec.port_level_mtls:
        return None
    mesh, ns_level, _ = peer_authentication_levels(peer_authentications, ns, {}, root_namespace)
    mode = spec.mode
    parts: list[tuple[AuthzMatch, ...]] = []
    groups: list[AuthzRule] = []
    if mode == "STRICT":
        parts.append((AuthzMatch(not_principals=_ANY_PRINCIPAL),))
    # Inherited strictness needs an UNSET workload mode (istiod's condition also lets a STRICT
    # mesh override a PERMISSIVE workload here, leaving that STRICT port unenforced).
    parent_strict = (mode == "STRICT" or (mode == "UNSET" and (
        (ns_level is not None and _mode(ns_level) == "STRICT")
        or ((ns_level is None or _mode(ns_level) == "UNSET") and mesh is not None and _mode(mesh) == "STRICT"))))
    non_strict_port = False
    for port, port_mode in sorted(spec.port_modes().items()):
        if port_mode == "STRICT":
            if parent_strict:
                continue  # the parent policy already refuses plaintext here
            groups.append(((AuthzMatch(not_principals=_ANY_PRINCIPAL, destination_ports=(port,)),),))
        elif port_mode in ("PERMISSIVE", "DISABLE"):
            if mode in ("PERMISSIVE", "DISABLE"):
                continue
            if mode == "UNSET" and ((ns_level is not None and _mode(ns_level) != "STRICT")
                                    or (ns_level is None and mesh is not None and _mode(mesh) != "STRICT")
                                    or (ns_level is None and mesh is None)):
                continue
            non_strict_port = True
            parts.append((AuthzMatch(not_destination_ports=(port,)),))
    if mode == "STRICT" and not non_strict_port:
        return None
    if not parts and not groups:
        return None
    merge_strict = ((mesh is not None and _mode(mesh) == "STRICT"
                     and (ns_level is None or _mode(ns_level) in ("UNSET", "STRICT")))
                    or (ns_level is not None and _mode(ns_level) == "STRICT"))
    if merge_strict and non_strict_port and mode != "STRICT":  # STRICT put it first already
        parts.append((AuthzMatch(not_principals=_ANY_PRINCIPAL),))
    if parts:
        groups.append(tuple(parts))
    return AuthzPolicy(_converted_name(entry), ns, SCOPE_WORKLOAD_SELECTOR, DENY, tuple(groups))
