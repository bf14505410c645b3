"""The Kubernetes RBAC the control plane needs, derived from the code that makes the calls.

Nothing here is written by hand a second time: the informers' list+watch comes from the kind
registry (`source.watched_kinds()`), and every module that writes declares a module-level
`RBAC = (Rule(...), ...)` next to its requests (`leader.py`, `writers.py`). The ClusterRole and
Role in deploy/ must equal `required_rules()` exactly (tests/test_deploy.py), so a new watched
kind or a new write fails the tests until the manifests grant it, and a grant nobody uses fails
them too. `python -m pilot.sources.kube.rbac` prints the rules in manifest form.

Scopes: "cluster" rules go into the ClusterRole (every namespace, and cluster-scoped kinds);
"namespace" rules go into the Role in the control plane's own namespace (POD_NAMESPACE).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Scope = Literal["cluster", "namespace"]

# What one generic informer does per kind: LIST the collection, then WATCH it (informer.py).
# It never GETs a single object, so "get" is not granted for read-only kinds.
INFORMER_VERBS: frozenset[str] = frozenset({"list", "watch"})
# Every other module that calls the apiserver declares `RBAC = (Rule(...), ...)` and is listed
# here (tests/test_deploy.py fails for a module that calls `kube.request`/`kube.open` unlisted).
RBAC_MODULES: tuple[str, ...] = ("pilot.sources.kube.leader", "pilot.sources.kube.writers", "pilot.security.ca_storage",
                                 "pilot.security.authn", "pilot.sources.kube.status_writer", "pilot.sources.kube.ingress_status",
                                 "pilot.sources.kube.status_put",
                                 "pilot.security.secret_access", "pilot.webhook.ca_bundle",
                                 "pilot.sources.kube.tags", "pilot.gateway_deploy.controller",
                                 "pilot.autoregistration")


@dataclass(frozen=True)
class Rule:
    scope: Scope
    api_group: str  # "" is the core group
    resource: str  # plural, as in the REST path
    verbs: frozenset[str]

    def __post_init__(self) -> None:
        if self.scope not in ("cluster", "namespace"):
            raise ValueError(f"scope must be 'cluster' or 'namespace', not {self.scope!r}")
        if not self.verbs or "*" in self.verbs or self.resource == "*" or self.api_group == "*":
            raise ValueError("RBAC rules name their verbs and resources explicitly (no wildcards)")


def merge(rules: Iterable[Rule]) -> list[Rule]:
    """One rule per (scope, group, resource) with the union of verbs, in a stable order. A
    namespace rule whose verbs the cluster rule for the same resource already grants is dropped."""
    verbs: dict[tuple[Scope, str, str], set[str]] = {}
    for r in rules:
        verbs.setdefault((r.scope, r.api_group, r.resource), set()).update(r.verbs)
    out = []
    for (scope, group, resource), vs in sorted(verbs.items()):
        if scope == "namespace" and vs <= verbs.get(("cluster", group, resource), set()):
            continue
        out.append(Rule(scope, group, resource, frozenset(vs)))
    return out


def required_rules() -> list[Rule]:
    """Everything the control plane calls on the apiserver, merged per resource."""
    # Imported here: the declaring modules import Rule from this one.
    from pilot.sources.kube.source import watched_kinds

    rules = [Rule("cluster", k.group, k.plural, INFORMER_VERBS) for k in watched_kinds()]
    for name in RBAC_MODULES:
        rules += importlib.import_module(name).RBAC
    return merge(rules)


def policy_rules(rules: Iterable[Rule], scope: Scope) -> list[dict]:
    """Kubernetes PolicyRule dicts for one scope, resources with identical verbs grouped."""
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for r in rules:
        if r.scope == scope:
            grouped.setdefault((r.api_group, tuple(sorted(r.verbs))), []).append(r.resource)
    return [{"apiGroups": [group], "resources": sorted(resources), "verbs": list(verbs)}
            for (group, verbs), resources in sorted(grouped.items())]


def main() -> None:
    import yaml

    rules = required_rules()
    scopes: tuple[tuple[Scope, str], ...] = (("cluster", "ClusterRole"), ("namespace", "Role"))
    for scope, kind in scopes:
        print(f"# {kind} rules")
        print(yaml.safe_dump({"rules": policy_rules(rules, scope)}, sort_keys=False), end="")


if __name__ == "__main__":
    main()
