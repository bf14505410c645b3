"""AuthorizationPolicy -> Envoy RBAC filters, as istiod's pilot/pkg/security/authz/builder does.

One RBAC filter per action present, in istiod's order: CUSTOM, AUDIT (RBAC action LOG), DENY,
ALLOW. Each rule of each policy becomes one RBAC policy named `ns[NS]-policy[NAME]-rule[I]` whose
permissions are the rule's `to` entries (OR) and whose principals are its `from` entries (OR);
inside one entry every attribute must match (AND), values of one attribute are ORed and
`not*` values negated. `when` conditions join the permissions (destination.ip, destination.port,
connection.sni, experimental.envoy.filters.*) or the principals (everything else, among them
source.serviceAccount and source.trustDomain). Trust domains (`trustDomains`, `source.trustDomain`)
naming the mesh's trust domain or one of its aliases match all of them, as principals do.

Semantics users rely on:
- Once any ALLOW policy selects a workload, requests no ALLOW rule matches are denied (an ALLOW
  RBAC filter with those policies); an ALLOW policy without rules (`spec: {}`) allows nothing.
- DENY is evaluated before ALLOW, so a DENY match wins.
- A policy annotated `istio.io/dry-run: "true"` goes into shadow rules: evaluated, logged in
  stats (`istio_dry_run_allow_` / `istio_dry_run_deny_`), never enforced.
- CUSTOM delegates the decision to the ext_authz provider its policies name (MeshConfig
  extensionProviders, pilot/networking/ext_authz.py): an RBAC filter holding their rules as shadow
  rules (named `istio-ext-authz-ns[NS]-policy[NAME]-rule[I]`, never enforced) marks the requests
  they match, and the ext_authz filter after it checks only those. When the provider cannot be
  used (not defined, in error, several providers for one workload), the workload gets a deny-all
  RBAC filter (`default-deny-all-due-to-bad-CUSTOM-action`), as istiod: failing closed keeps a
  policy meant to restrict from silently allowing. The reason is in /debug/configz and
  /debug/push_status.

TCP (the network filter), istiod's rule (authz/model/model.go `checkError`): attributes only
HTTP carries (hosts, methods, paths, requestPrincipals, request.headers[...], request.auth.*)
cannot be checked on a TCP connection.
- In an ALLOW policy the whole rule holding one is dropped: it allows nothing on TCP, so the
  workload's TCP ports get less access, never more.
- In a DENY (or AUDIT) policy only those values are dropped: the rule matches more, so it denies
  more. A DENY rule with only HTTP attributes denies every TCP connection of the workload
  (istiod warns about this at validation and recommends adding `ports`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as network_rbac_pb2

from pilot.config.security import AuthorizationPolicy
from pilot.model.security_policies import WorkloadPolicies
from pilot.model.store import Entry
from pilot.networking import ext_authz as xa
from pilot.networking import rbac_matchers as m
from pilot.networking.protos import pack

HTTP_RBAC_FILTER = "envoy.filters.http.rbac"
NETWORK_RBAC_FILTER = "envoy.filters.network.rbac"
TCP_STAT_PREFIX = "tcp."
DRY_RUN_ANNOTATION = "istio.io/dry-run"
SHADOW_PREFIX = {rbac_pb2.RBAC.ALLOW: "istio_dry_run_allow_", rbac_pb2.RBAC.DENY: "istio_dry_run_deny_"}
ACTIONS = {"ALLOW": rbac_pb2.RBAC.ALLOW, "DENY": rbac_pb2.RBAC.DENY, "AUDIT": rbac_pb2.RBAC.LOG}
CUSTOM_DENY_ALL = "default-deny-all-due-to-bad-CUSTOM-action"

Permission, Principal = rbac_pb2.Permission, rbac_pb2.Principal
Generator = Callable[[str, bool], Any]
Clause = tuple[Generator, Sequence[str], Sequence[str]]

# `when` keys evaluated on the destination side (permissions); every other key is about the source.
_PERMISSION_KEYS: dict[str, Generator] = {
    "destination.ip": m.destination_ip_permission,
    "destination.port": m.port_permission,
    "connection.sni": m.sni_permission,
}
_PRINCIPAL_KEYS: dict[str, Generator] = {
    "source.ip": m.source_ip_principal,
    "remote.ip": m.remote_ip_principal,
    "source.namespace": m.namespace_principal,
    "source.principal": m.principal_principal,
    "request.auth.principal": m.request_principal_principal,
    "request.auth.audiences": m.audience_principal,
    "request.auth.presenter": m.presenter_principal,
}

MATCH_NEVER = rbac_pb2.Policy(permissions=[Permission(not_rule=Permission(any=True))],
                              principals=[Principal(not_id=Principal(any=True))])
MATCH_ALL = rbac_pb2.Policy(permissions=[Permission(any=True)], principals=[Principal(any=True)])


# --- trust domains --------------------------------------------------------------------------------
def expand_trust_domains(values: Sequence[str], trust_domains: Sequence[str]) -> list[str]:
    """istiod's ExpandTrustDomainAliases: a value that is one of the mesh's trust domains (its own
    or an alias) stands for all of them; other values are kept as written."""
    out: list[str] = []
    for v in values:
        for td in (trust_domains if v in trust_domains else (v,)):
            if td not in out:
                out.append(td)
    return out


def with_trust_domains(principals: Sequence[str], trust_domains: Sequence[str]) -> list[str]:
    """istiod's ReplaceTrustDomainAliases: a principal `TD/ns/NS/sa/SA` whose TD is the mesh's
    trust domain, one of its aliases or `cluster.local` (a stand-in for "ours") is expanded to
    every trust domain of the mesh; `*` trust domains and other shapes are left as written."""
    out: list[str] = []
    for p in principals:
        parts = p.split("/")
        if len(parts) != 5 or parts[0] == "*" or (parts[0] not in trust_domains and parts[0] != "cluster.local"):
            out.append(p)
            continue
        for td in trust_domains:
            replaced = "/".join([td, *parts[1:]])
            if replaced not in out:
                out.append(replaced)
    return out


# --- one rule -------------------------------------------------------------------------------------
def _when_clauses(when: Sequence[Any], permission: bool, namespace: str, trust_domains: Sequence[str]
                  ) -> list[Clause]:
    out: list[Clause] = []
    for c in when:
        if c is None:
            continue
        key = c.key
        if key in _PERMISSION_KEYS or key.startswith("experimental.envoy.filters."):
            if permission:
                gen = _PERMISSION_KEYS.get(key) or m.envoy_filter_permission(key)
                out.append((gen, c.values, c.not_values))
        elif not permission:
            if key == "source.principal":
                out.append((m.principal_principal, with_trust_domains(c.values, trust_domains),
                            with_trust_domains(c.not_values, trust_domains)))
                continue
            if key == "source.trustDomain":
                out.append((m.trust_domain_principal, expand_trust_domains(c.values, trust_domains),
                            expand_trust_domains(c.not_values, trust_domains)))
                continue
            if key == "source.serviceAccount":
                gen = m.service_account_principal(namespace)
            elif key.startswith("request.headers"):
                gen = m.request_header_principal(key)
            elif key.startswith("request.auth.claims"):
                gen = m.claim_principal(key)
            else:
                gen = _PRINCIPAL_KEYS[key]
            out.append((gen, c.values, c.not_values))
    return out


def _source_clauses(src: Any, namespace: str, trust_domains: Sequence[str]) -> list[Clause]:
    return [
        (m.principal_principal, with_trust_domains(src.principals or (), trust_domains),
         with_trust_domains(src.not_principals or (), trust_domains)),
        (m.service_account_principal(namespace), src.service_accounts or (), src.not_service_accounts or ()),
        (m.request_principal_principal, src.request_principals or (), src.not_request_principals or ()),
        (m.trust_domain_principal, expand_trust_domains(src.trust_domains or (), trust_domains),
         expand_trust_domains(src.not_trust_domains or (), trust_domains)),
        (m.namespace_principal, src.namespaces or (), src.not_namespaces or ()),
        (m.remote_ip_principal, src.remote_ip_blocks or (), src.not_remote_ip_blocks or ()),
        (m.source_ip_principal, src.ip_blocks or (), src.not_ip_blocks or ()),
    ]


def _operation_clauses(op: Any) -> list[Clause]:
    return [
        (m.host_permission, op.hosts or (), op.not_hosts or ()),
        (m.method_permission, op.methods or (), op.not_methods or ()),
        (m.path_permission, op.paths or (), op.not_paths or ()),
        (m.port_permission, op.ports or (), op.not_ports or ()),
    ]


def _combine(clauses: list[Clause], for_tcp: bool, action: int, permission: bool) -> Any:
    """AND of the clauses (ANY when none). A value an action cannot use on TCP raises HttpOnly
    for ALLOW (the caller drops the rule) and is skipped otherwise."""
    kind = Permission if permission else Principal

    def any_of(items: list) -> Any:
        return kind(or_rules=Permission.Set(rules=items)) if permission else kind(or_ids=Principal.Set(ids=items))

    def negated(x: Any) -> Any:
        return kind(not_rule=x) if permission else kind(not_id=x)

    terms = []
    for gen, values, not_values in clauses:
        for vals, negate in ((values, False), (not_values, True)):
            generated = []
            for v in vals:
                try:
                    generated.append(gen(v, for_tcp))
                except m.HttpOnly:
                    if action == rbac_pb2.RBAC.ALLOW:
                        raise
            if generated:
                terms.append(negated(any_of(generated)) if negate else any_of(generated))
    if not terms:
        terms.append(kind(any=True))
    return kind(and_rules=Permission.Set(rules=terms)) if permission else kind(and_ids=Principal.Set(ids=terms))


def rule_policy(rule: Any, namespace: str, action: int, for_tcp: bool, trust_domains: Sequence[str]
                ) -> rbac_pb2.Policy | None:
    """One AuthorizationPolicy rule as an RBAC policy; None when an ALLOW rule needs HTTP on TCP."""
    base_principal = _when_clauses(rule.when, False, namespace, trust_domains)
    base_permission = _when_clauses(rule.when, True, namespace, trust_domains)
    try:
        principals = [_combine(_source_clauses(f.source, namespace, trust_domains) + base_principal,
                               for_tcp, action, False) for f in rule.from_ or () if f is not None]
        if not rule.from_:
            principals = [_combine(base_principal, for_tcp, action, False)]
        permissions = [_combine(_operation_clauses(t.operation) + base_permission, for_tcp, action, True)
                       for t in rule.to or () if t is not None]
        if not rule.to:
            permissions = [_combine(base_permission, for_tcp, action, True)]
    except m.HttpOnly:
        return None
    return rbac_pb2.Policy(permissions=permissions, principals=principals)


# --- whole filters --------------------------------------------------------------------------------
def is_dry_run(e: Entry[AuthorizationPolicy]) -> bool:
    """Go's strconv.ParseBool; anything else counts as not dry-run, as in istiod."""
    return e.obj.metadata.annotations.get(DRY_RUN_ANNOTATION, "") in ("1", "t", "T", "TRUE", "true", "True")


def _rbac(policies: Sequence[Entry[AuthorizationPolicy]], action: int, for_tcp: bool, trust_domains: Sequence[str],
          prefix: str = "") -> tuple[rbac_pb2.RBAC | None, rbac_pb2.RBAC | None]:
    """(enforced rules, shadow rules), each None when no policy of that kind exists."""
    enforced: dict[str, rbac_pb2.Policy] | None = None
    shadow: dict[str, rbac_pb2.Policy] | None = None
    for e in policies:
        spec = e.obj.spec
        if is_dry_run(e):
            shadow = {} if shadow is None else shadow
            target = shadow
        else:
            enforced = {} if enforced is None else enforced
            target = enforced
        ns, name = e.key.namespace, e.key.name
        for i, rule in enumerate(spec.rules or ()):
            if rule is None:
                continue
            generated = rule_policy(rule, ns, action, for_tcp, trust_domains)
            if generated is not None:
                target[f"{prefix}ns[{ns}]-policy[{name}]-rule[{i}]"] = generated
        if not spec.rules:
            target[f"{prefix}ns[{ns}]-policy[{name}]-rule[0]"] = MATCH_NEVER

    def as_rbac(p: dict | None) -> rbac_pb2.RBAC | None:
        return None if p is None else rbac_pb2.RBAC(action=action, policies=p)

    return as_rbac(enforced), as_rbac(shadow)


# Public for the proxyless gRPC server listener, which names and filters its RBAC filters apart.
rbac_rules = _rbac


def _trust_domains(trust_domain: str, aliases: Sequence[str]) -> tuple[str, ...]:
    return (trust_domain, *(a for a in aliases if a != trust_domain))


def _by_action(policies: WorkloadPolicies) -> list[tuple[int, tuple[Entry[AuthorizationPolicy], ...]]]:
    return [(ACTIONS["AUDIT"], policies.audit), (ACTIONS["DENY"], policies.deny), (ACTIONS["ALLOW"], policies.allow)]


# --- CUSTOM ---------------------------------------------------------------------------------------
_DENY_ALL = rbac_pb2.RBAC(action=rbac_pb2.RBAC.DENY, policies={CUSTOM_DENY_ALL: MATCH_ALL})


def _custom_rules(policies: WorkloadPolicies, for_tcp: bool, tds: Sequence[str]) -> rbac_pb2.RBAC | None:
    # DENY semantics for the rules, so an HTTP-only value on TCP widens the match (checks more).
    # Dry-run CUSTOM policies are not checked at all, as in istiod.
    rules, _shadow = _rbac(policies.custom, rbac_pb2.RBAC.DENY, for_tcp, tds, prefix=xa.MATCH_PREFIX + "-")
    return rules


def _custom_http(policies: WorkloadPolicies, tds: Sequence[str]) -> list[hcm_pb2.HttpFilter]:
    provider = policies.ext_authz
    if not policies.custom:
        return []
    if provider is None or provider.error:
        return [hcm_pb2.HttpFilter(name=HTTP_RBAC_FILTER, typed_config=pack(http_rbac_pb2.RBAC(rules=_DENY_ALL)))]
    marker = http_rbac_pb2.RBAC(shadow_rules=_custom_rules(policies, False, tds),
                                shadow_rules_stat_prefix=xa.SHADOW_STAT_PREFIX)
    return [hcm_pb2.HttpFilter(name=HTTP_RBAC_FILTER, typed_config=pack(marker)),
            hcm_pb2.HttpFilter(name=xa.HTTP_EXT_AUTHZ_FILTER,
                               typed_config=pack(xa.http_ext_authz(provider, HTTP_RBAC_FILTER)))]


def _custom_network(policies: WorkloadPolicies, tds: Sequence[str]) -> list[listener_components_pb2.Filter]:
    provider = policies.ext_authz
    if not policies.custom:
        return []
    if provider is None or provider.error:
        config = network_rbac_pb2.RBAC(rules=_DENY_ALL, stat_prefix=TCP_STAT_PREFIX)
        return [listener_components_pb2.Filter(name=NETWORK_RBAC_FILTER, typed_config=pack(config))]
    check = xa.network_ext_authz(provider, NETWORK_RBAC_FILTER)
    if check is None:
        return []  # an HTTP provider cannot check a TCP connection (istiod ignores it there)
    marker = network_rbac_pb2.RBAC(shadow_rules=_custom_rules(policies, True, tds), stat_prefix=TCP_STAT_PREFIX,
                                   shadow_rules_stat_prefix=xa.SHADOW_STAT_PREFIX)
    return [listener_components_pb2.Filter(name=NETWORK_RBAC_FILTER, typed_config=pack(marker)),
            listener_components_pb2.Filter(name=xa.NETWORK_EXT_AUTHZ_FILTER, typed_config=pack(check))]


def http_rbac_filters(policies: WorkloadPolicies, trust_domain: str,
                      trust_domain_aliases: Sequence[str] = ()) -> list[hcm_pb2.HttpFilter]:
    tds = _trust_domains(trust_domain, trust_domain_aliases)
    out = _custom_http(policies, tds)
    for action, entries in _by_action(policies):
        if not entries:
            continue
        rules, shadow = _rbac(entries, action, False, tds)
        config = http_rbac_pb2.RBAC(rules=rules, shadow_rules=shadow,
                                    shadow_rules_stat_prefix=SHADOW_PREFIX.get(action, "") if shadow else "")
        out.append(hcm_pb2.HttpFilter(name=HTTP_RBAC_FILTER, typed_config=pack(config)))
    return out


def network_rbac_filters(policies: WorkloadPolicies, trust_domain: str,
                         trust_domain_aliases: Sequence[str] = ()) -> list[listener_components_pb2.Filter]:
    tds = _trust_domains(trust_domain, trust_domain_aliases)
    out = _custom_network(policies, tds)
    for action, entries in _by_action(policies):
        if not entries:
            continue
        rules, shadow = _rbac(entries, action, True, tds)
        config = network_rbac_pb2.RBAC(rules=rules, shadow_rules=shadow, stat_prefix=TCP_STAT_PREFIX,
                                       shadow_rules_stat_prefix=SHADOW_PREFIX.get(action, "") if shadow else "")
        out.append(listener_components_pb2.Filter(name=NETWORK_RBAC_FILTER, typed_config=pack(config)))
    return out
