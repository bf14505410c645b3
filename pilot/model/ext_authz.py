"""Which ext_authz provider a workload's CUSTOM AuthorizationPolicies use, resolved per push.

istiod (pilot/pkg/security/authz/builder/extauthz.go) resolves every MeshConfig extension provider
of an ext_authz kind against the registry, then, per workload, requires its CUSTOM policies to
name one and the same provider that resolved without error. Anything else (no provider named,
several, an unknown name, a provider in error) makes the workload deny every request: a policy
meant to restrict never silently allows. The reason travels with the result, for /debug and the
log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pilot.config.ext_authz import EnvoyExtAuthzGrpcProvider, EnvoyExtAuthzHttpProvider
from pilot.config.extension_providers import ExtensionProvider
from pilot.durations import parse_duration
from pilot.model.services import MeshService

Provider = EnvoyExtAuthzHttpProvider | EnvoyExtAuthzGrpcProvider

# envoy.type.v3.StatusCode: the statuses Envoy can answer with (istiod refuses others).
_KNOWN_STATUS = frozenset({
    100, *range(200, 209), 226, *range(300, 306), 307, 308, *range(400, 419), *range(421, 425), 426, 428, 429,
    431, *range(500, 509), 510, 511})


@dataclass(frozen=True)
class ResolvedExtAuthz:
    """A provider as a workload uses it: the config and the service it calls, or why not."""

    name: str
    provider: Provider | None = None
    hostname: str = ""
    port: int = 0
    error: str = ""  # non-empty: CUSTOM fails closed (deny-all) for the workloads using it

    @property
    def grpc(self) -> bool:
        return isinstance(self.provider, EnvoyExtAuthzGrpcProvider)


def _lookup(service: str, domain: str, by_host: Mapping[str, MeshService]) -> tuple[str, str]:
    """(hostname, error) for `ns/name`, `ns/hostname` or `hostname`, as istiod's LookupCluster."""
    if not service:
        return "", "service must not be empty"
    namespace, _, name = service.rpartition("/")
    candidates = [name] if "." in name or not namespace else [f"{name}.{namespace}.svc.{domain}", name]
    for host in candidates:
        svc = by_host.get(host)
        if svc is not None and (not namespace or svc.namespace == namespace):
            if host.startswith("*"):
                return "", f"wildcard host {host} of service {service} is not supported"
            return host, ""
    return "", f"could not find service {service} in the registry"


def _problems(p: Provider) -> list[str]:
    errs = []
    if not 1 <= p.port <= 65535:
        errs.append(f"port must be in the range [1, 65535], found: {p.port}")
    if p.status_on_error:
        try:
            code = int(p.status_on_error)
        except ValueError:
            code = -1
        if code not in _KNOWN_STATUS:
            errs.append(f"unsupported statusOnError {p.status_on_error!r}")
    if p.timeout is not None:
        try:
            if parse_duration(p.timeout) <= 0:
                errs.append(f"timeout must be positive, found: {p.timeout}")
        except ValueError as e:
            errs.append(f"invalid timeout {p.timeout!r}: {e}")
    if isinstance(p, EnvoyExtAuthzHttpProvider):
        if p.path_prefix and not p.path_prefix.startswith("/"):
            errs.append(f"pathPrefix must begin with `/`, found: {p.path_prefix!r}")
        for field, values in (("includeRequestHeadersInCheck", p.include_request_headers_in_check),
                              ("includeHeadersInCheck", p.include_headers_in_check),
                              ("headersToUpstreamOnAllow", p.headers_to_upstream_on_allow),
                              ("headersToDownstreamOnDeny", p.headers_to_downstream_on_deny),
                              ("headersToDownstreamOnAllow", p.headers_to_downstream_on_allow)):
            if "*" in values:
                errs.append(f'a single wildcard ("*") is not supported, change it to either prefix or '
                            f"suffix match: {field}")
    return errs


def resolve_providers(providers: Sequence[ExtensionProvider], by_host: Mapping[str, MeshService],
                      domain: str) -> Mapping[str, ResolvedExtAuthz]:
    """Every named provider, resolved or with its errors (a duplicate name is an error of both)."""
    out: dict[str, ResolvedExtAuthz] = {}
    seen: set[str] = set()
    for i, config in enumerate(providers):
        name = config.name
        if not name:
            continue  # nothing can name it; istiod reports it, which the MeshConfig load does not
        p = config.ext_authz
        if p is None:
            r = ResolvedExtAuthz(name, error=f"extension provider {name!r} is not of an ext_authz kind "
                                             "(envoyExtAuthzHttp, envoyExtAuthzGrpc) supported here")
        else:
            errs = _problems(p)
            host, err = _lookup(p.service, domain, by_host)
            if err:
                errs.append(err)
            r = ResolvedExtAuthz(name, p, host, p.port, "; ".join(errs))
        if name in seen:
            r = ResolvedExtAuthz(name, error=f"extension provider name must be unique, found duplicate "
                                             f"{name!r} at index {i}")
        seen.add(name)
        out[name] = r
    return out


def for_workload(resolved: Mapping[str, ResolvedExtAuthz], names: Sequence[str]) -> ResolvedExtAuthz:
    """The provider of a workload's CUSTOM policies (`names`, one per policy), istiod's getExtAuthz."""
    if not names:
        return ResolvedExtAuthz("", error="no provider specified in authorization policy")
    if len(set(names)) > 1:
        return ResolvedExtAuthz("", error=f"only 1 provider can be used per workload, found multiple "
                                          f"providers: {sorted(set(names))}")
    found = resolved.get(names[0])
    if found is None:
        return ResolvedExtAuthz(names[0], error=f"available providers are {sorted(resolved)} but found "
                                                f"{names[0]!r}")
    if found.error:
        return ResolvedExtAuthz(names[0], error=f"found errors in provider {names[0]}: {found.error}")
    return found
