"""ext_authz provider resolution (pilot/model/ext_authz.py): what makes a CUSTOM policy fail closed,
with istiod's reasons, and what a resolved provider carries."""

from __future__ import annotations

import json

from pilot.config.mesh import parse_mesh_config
from pilot.model import dependencies as dep
from pilot.model.push_context import PushContext
from pilot.networking.authz import CUSTOM_DENY_ALL
from pilot.networking.policy_filters import inbound_http_filters
from tests.support.policies import authz, store_of
from tests.support.static_config import to_dict

SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext-authz", "namespace": "foo"},
           "spec": {"clusterIP": "10.0.0.99", "ports": [{"name": "grpc", "port": 9000}]}}


def ctx_of(providers: list[dict], *docs: dict) -> PushContext:
    mesh = parse_mesh_config(json.dumps({"extensionProviders": providers}))
    return PushContext.build(store_of(SERVICE, *docs), mesh, "m", "cluster.local", "v")


def custom(name: str, provider: str) -> dict:
    return authz(name, action="CUSTOM", provider={"name": provider}, rules=[{}])


def http(**fields) -> dict:
    return {"name": "p", "envoyExtAuthzHttp": {"service": "foo/ext-authz", "port": 9000, **fields}}


def error_of(providers: list[dict], *docs: dict) -> str:
    ctx = ctx_of(providers, *(docs or (custom("c", "p"),)))
    wp = ctx.workload_policies("default", {"app": "web"})
    assert wp.ext_authz is not None
    return wp.ext_authz.error


def test_service_spellings_resolve_to_the_registry_host() -> None:
    for service in ("foo/ext-authz", "ext-authz.foo.svc.cluster.local", "foo/ext-authz.foo.svc.cluster.local"):
        ctx = ctx_of([http(service=service)], custom("c", "p"))
        r = ctx.workload_policies("default", {}).ext_authz
        assert r is not None and not r.error and r.hostname == "ext-authz.foo.svc.cluster.local", service
    assert "could not find service bar/ext-authz" in error_of([http(service="bar/ext-authz")])


def test_bad_provider_fields_fail_closed_with_istiods_reasons() -> None:
    assert "port must be in the range [1, 65535], found: 70000" in error_of([http(port=70000)])
    assert "unsupported statusOnError '999'" in error_of([http(statusOnError="999")])
    assert "pathPrefix must begin with `/`" in error_of([http(pathPrefix="check")])
    assert 'a single wildcard ("*") is not supported' in error_of([http(includeRequestHeadersInCheck=["*"])])
    assert "invalid timeout" in error_of([http(timeout="soon")])
    assert "not of an ext_authz kind" in error_of([{"name": "p", "zipkin": {"service": "z", "port": 9411}}])


def test_one_provider_per_workload() -> None:
    other = {"name": "q", "envoyExtAuthzGrpc": {"service": "foo/ext-authz", "port": 9000}}
    err = error_of([http(), other], custom("a", "p"), custom("b", "q"))
    assert "only 1 provider can be used per workload, found multiple providers: ['p', 'q']" in err
    ctx = ctx_of([http(), other], custom("a", "p"), custom("b", "q"))
    filters = [to_dict(f) for f in inbound_http_filters(ctx.workload_policies("default", {}), "cluster.local")]
    assert [f["name"] for f in filters] == ["envoy.filters.http.rbac"]
    assert list(filters[0]["typed_config"]["rules"]["policies"]) == [CUSTOM_DENY_ALL]
    # Each policy alone names a good provider: the workload's conflict is reported per connected
    # proxy in /debug/push_status (pilot/http/debug.py), not per policy.
    assert not [p for p in ctx.security.problems if p["kind"] == "AuthorizationPolicy"]


def test_a_provider_service_change_is_a_dependency_of_the_workloads_filters() -> None:
    ctx = ctx_of([http()], custom("c", "p"))
    with ctx.recording() as deps:
        ctx.workload_policies("default", {"app": "web"})
    assert dep.ALL_SERVICES in deps.all_facets()
