"""AuthorizationPolicy (istiod's ValidateAuthorizationPolicy and security.ValidateAttribute).

The shape rules are istiod's: a DENY or CUSTOM policy needs `rules`; CUSTOM needs `provider.name`
and cannot match on identities; `from`/`to` may not be empty lists, a `from` needs a non-empty
`source`, a `to` a non-empty `operation`; no empty strings in any list; IPs, CIDRs and ports
parse; every `when` key is an attribute istiod knows, with values or notValues. A null rule (`- `)
is rejected rather than skipped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pilot.config.base import StrictModel, StrictObject
from pilot.config.networking.validation import _raise_if
from pilot.config.security.common import (
    PolicyTargetReference,
    Provider,
    Selector,
    empty_value_problem,
    ip_problems,
    path_template_problems,
    port_problems,
    selector_problems,
    service_account_problem,
    trust_domain_problem,
    wildcard_problem,
)

Action = Literal["ALLOW", "DENY", "AUDIT", "CUSTOM"]
Values = list[str] | None  # None (absent) and [] differ only where istiod says so

# `when` keys istiod 1.30 generates config for (pilot/pkg/security/authz/model/model.go), and the
# keys it rejects with a reason of their own (pkg/config/security ValidateAttribute).
PLAIN_KEYS = ("source.ip", "remote.ip", "source.namespace", "source.serviceAccount", "source.trustDomain",
              "source.principal", "request.auth.principal", "request.auth.audiences",
              "request.auth.presenter", "destination.ip", "destination.port", "connection.sni")
MAP_KEYS = ("request.headers", "request.auth.claims", "experimental.envoy.filters.")
IP_KEYS = ("source.ip", "remote.ip", "destination.ip")


class Source(StrictModel):
    principals: Values = None
    not_principals: Values = None
    request_principals: Values = None
    not_request_principals: Values = None
    namespaces: Values = None
    not_namespaces: Values = None
    ip_blocks: Values = None
    not_ip_blocks: Values = None
    remote_ip_blocks: Values = None
    not_remote_ip_blocks: Values = None
    service_accounts: Values = None
    not_service_accounts: Values = None
    # The trust domain of the peer's SPIFFE identity (mTLS), like the `source.trustDomain` key.
    trust_domains: Values = None
    not_trust_domains: Values = None

    def is_empty(self) -> bool:
        return not any(getattr(self, f) for f in type(self).model_fields)

    def problems(self, i: int) -> list[str]:
        errs = []
        if (self.principals or self.not_principals or self.namespaces or self.not_namespaces) and \
                (self.service_accounts or self.not_service_accounts):
            errs.append(f"cannot set serviceAccounts with namespaces or principals, found at rule {i}")
        if self.is_empty():
            errs.append(f"`from.source` must not be empty, found at rule {i}")
        for f, name in (("ip_blocks", "ipBlocks"), ("not_ip_blocks", "notIpBlocks"),
                        ("remote_ip_blocks", "remoteIpBlocks"), ("not_remote_ip_blocks", "notRemoteIpBlocks")):
            errs += [f"{name}: {e}, found at rule {i}" for e in ip_problems(getattr(self, f))]
        for f, alias in (("principals", "Principals"), ("request_principals", "RequestPrincipals"),
                         ("namespaces", "Namespaces"), ("ip_blocks", "IpBlocks"),
                         ("remote_ip_blocks", "RemoteIpBlocks")):
            errs += empty_value_problem(alias, getattr(self, f))
            errs += empty_value_problem("Not" + alias, getattr(self, "not_" + f))
        for f, name in (("service_accounts", "ServiceAccounts"),
                        ("not_service_accounts", "NotServiceAccounts")):
            if err := service_account_problem(name, getattr(self, f)):
                errs.append(err)
        for f, name in (("trust_domains", "TrustDomains"), ("not_trust_domains", "NotTrustDomains")):
            if err := trust_domain_problem(name, getattr(self, f)):
                errs.append(err)
        return errs


class From(StrictModel):
    source: Source | None = None


class Operation(StrictModel):
    hosts: Values = None
    not_hosts: Values = None
    ports: Values = None
    not_ports: Values = None
    methods: Values = None
    not_methods: Values = None
    paths: Values = None
    not_paths: Values = None

    def problems(self, i: int) -> list[str]:
        errs = []
        if not any(getattr(self, f) for f in type(self).model_fields):
            errs.append(f"`to.operation` must not be empty, found at rule {i}")
        errs += [f"ports: {e}, found at rule {i}" for e in port_problems(self.ports)]
        errs += [f"notPorts: {e}, found at rule {i}" for e in port_problems(self.not_ports)]
        for f, alias in (("ports", "Ports"), ("methods", "Methods"), ("paths", "Paths"), ("hosts", "Hosts")):
            errs += empty_value_problem(alias, getattr(self, f))
            errs += empty_value_problem("Not" + alias, getattr(self, "not_" + f))
        errs += path_template_problems("Paths", self.paths) + path_template_problems("NotPaths", self.not_paths)
        return errs


class To(StrictModel):
    operation: Operation | None = None


class Condition(StrictModel):
    key: str = ""
    values: list[str] = Field(default_factory=list)
    not_values: list[str] = Field(default_factory=list)

    def problems(self) -> list[str]:
        if not self.key:
            return ["`key` must not be empty"]
        if not self.values and not self.not_values:
            return [f"at least one of `values` or `notValues` must be set for key {self.key}"]
        errs = []
        for what, values in (("value", self.values), ("notValue", self.not_values)):
            if err := attribute_problem(self.key, values):
                errs.append(f"invalid `{what}` for `key` {self.key}: {err}")
        return errs


def _map_key_problem(key: str) -> str | None:
    """`name[key]`: a name, then one bracketed, non-empty key at the end."""
    open_at = key.find("[")
    if key.endswith("]") and 0 < open_at < len(key) - 2:
        return None
    return f"bad key ({key}): should have format a[b]"


def attribute_problem(key: str, values: list[str]) -> str | None:
    """istio security.ValidateAttribute."""
    if any(v == "" for v in values):
        return f"empty value not allowed, found in {key}"
    if key.startswith(MAP_KEYS):
        return _map_key_problem(key)
    if key in IP_KEYS:
        errs = ip_problems(values)
        return "; ".join(errs) if errs else None
    if key == "destination.port":
        errs = port_problems(values)
        return "; ".join(errs) if errs else None
    if key == "source.serviceAccount":
        return service_account_problem(key, values)
    if key == "source.trustDomain":
        return wildcard_problem(key, values)
    if key in PLAIN_KEYS:
        return None
    if key == "destination.namespace":
        return f"attribute {key} is replaced by the metadata.namespace"
    if key.startswith("destination.labels"):
        return f"attribute {key} is replaced by the workload selector"
    if key in ("destination.name", "destination.user"):
        return f"deprecated attribute {key}: only supported in v1alpha1"
    return f"unknown attribute: {key}"


class Rule(StrictModel):
    from_: list[From | None] | None = Field(default=None, alias="from")
    to: list[To | None] | None = None
    when: list[Condition | None] = Field(default_factory=list)

    def problems(self, i: int, action: str) -> list[str]:
        errs = []
        if self.from_ is not None and not self.from_:
            errs.append(f"`from` must not be empty, found at rule {i}")
        for f in self.from_ or ():
            if f is None:
                errs.append(f"`from` must not be nil, found at rule {i}")
            elif f.source is None:
                errs.append(f"`from.source` must not be nil, found at rule {i}")
            else:
                errs += f.source.problems(i)
        if self.to is not None and not self.to:
            errs.append(f"`to` must not be empty, found at rule {i}")
        for t in self.to or ():
            if t is None:
                errs.append(f"`to` must not be nil, found at rule {i}")
            elif t.operation is None:
                errs.append(f"`to.operation` must not be nil, found at rule {i}")
            else:
                errs += t.operation.problems(i)
        for c in self.when:
            if c is None:
                errs.append("when field cannot be nil")
            else:
                errs += c.problems()
        if action == "CUSTOM":
            errs += self._custom_problems()
        return errs

    def _custom_problems(self) -> list[str]:
        """ext_authz sees neither the peer identity nor the JWT, so CUSTOM rules cannot use them."""
        errs = []
        for f in self.from_ or ():
            src = f.source if f is not None else None
            if src is None:
                continue
            for field, name in (("namespaces", "From.Namespaces"), ("not_namespaces", "From.NotNamespaces"),
                                ("service_accounts", "From.ServiceAccounts"),
                                ("not_service_accounts", "From.NotServiceAccounts"),
                                ("trust_domains", "From.TrustDomains"),
                                ("not_trust_domains", "From.NotTrustDomains"),
                                ("principals", "From.Principals"), ("not_principals", "From.NotPrincipals"),
                                ("request_principals", "From.RequestPrincipals"),
                                ("not_request_principals", "From.NotRequestPrincipals")):
                if getattr(src, field):
                    errs.append(f"{name} is currently not supported with CUSTOM action")
        for c in self.when:
            if c is not None and (c.key in ("source.namespace", "source.serviceAccount", "source.trustDomain",
                                                 "source.principal")
                                  or c.key.startswith("request.auth.")):
                errs.append(f"{c.key} is currently not supported with CUSTOM action")
        return errs


class AuthorizationPolicySpec(StrictModel):
    selector: Selector | None = None
    target_ref: PolicyTargetReference | None = None
    target_refs: list[PolicyTargetReference] = Field(default_factory=list)
    rules: list[Rule | None] | None = None
    action: Action = "ALLOW"
    # A MeshConfig extensionProviders name (ext_authz kinds); one that does not resolve makes the
    # selected workloads deny every request, as istiod does.
    provider: Provider | None = Field(
        default=None, description="a MeshConfig extensionProviders name (envoyExtAuthzHttp or envoyExtAuthzGrpc); "
                                  "one that does not resolve makes the selected workloads deny every request")

    @model_validator(mode="after")
    def _valid(self) -> AuthorizationPolicySpec:
        errs = selector_problems(self.selector, self.target_ref, self.target_refs)
        no_rules = not self.rules  # `rules: []` is no rules, as in the proto
        if self.action == "CUSTOM":
            if no_rules:
                errs.append("CUSTOM action without `rules` is meaningless as it will never be triggered, "
                            "add an empty rule `{}` if you want it be triggered for every request")
            elif self.provider is None or not self.provider.name:
                errs.append("`provider.name` must not be empty")
        elif self.provider is not None:
            errs.append(f"`provider` must not be with non CUSTOM action, found {self.action}")
        if self.action == "DENY" and no_rules:
            errs.append("DENY action without `rules` is meaningless as it will never be triggered, "
                        "add an empty rule `{}` if you want it be triggered for every request")
        for i, rule in enumerate(self.rules or ()):
            if rule is None:
                errs.append(f"`rule` must not be nil, found at rule {i}")
            else:
                errs += rule.problems(i, self.action)
        _raise_if(errs)
        return self

    @property
    def target_references(self) -> list[PolicyTargetReference]:
        return ([self.target_ref] if self.target_ref is not None else []) + list(self.target_refs)


class AuthorizationPolicy(StrictObject):
    kind: Literal["AuthorizationPolicy"] = "AuthorizationPolicy"
    spec: AuthorizationPolicySpec = AuthorizationPolicySpec()
