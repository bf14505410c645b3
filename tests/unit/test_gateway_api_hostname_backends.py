"""backendRefs of kind Hostname (group networking.istio.io), as istiod's buildDestination takes
them: the name is a host of the registry (a ServiceEntry's, exported to the route's namespace,
or a Service's FQDN), routed to directly; a namespace is refused; an unknown host is not found.
A `ServiceEntry` kind is not a backend istiod knows (InvalidKind)."""

from __future__ import annotations

from pilot.model.gateway_api import translate
from pilot.model.store import ConfigKey
from tests.unit.test_gateway_api import CLASS, SVC, conds, gateway, route, store_of

GW = gateway("- {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}\n")


def service_entry(export: str = "") -> str:
    return ("apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: egress}\n"
            "spec: {hosts: [api.example.com], location: MESH_EXTERNAL, resolution: DNS, "
            f"ports: [{{number: 443, name: https, protocol: HTTPS}}]{export}}}\n")


def backend_route(ref: str) -> str:
    return route("r", f"""\
        parentRefs: [{{name: web, namespace: infra}}]
        rules: [{{backendRefs: [{ref}]}}]
        """)


def resolved(result) -> tuple[str, str, str]:
    (parent,) = result.statuses[ConfigKey("HTTPRoute", "default", "r")]["parents"]
    c = next(c for c in parent["conditions"] if c["type"] == "ResolvedRefs")
    return c["status"], c["reason"], c["message"]


def destinations(result) -> set[str]:
    return {d.destination.host for vs in result.virtual_services for rule in vs.obj.spec.http for d in rule.route}


def test_a_hostname_backend_routes_to_the_service_entry_host():
    hostname = "{group: networking.istio.io, kind: Hostname, name: api.example.com, port: 443}"
    result = translate(store_of(CLASS, GW, service_entry(), backend_route(hostname)), "cluster.local")
    assert resolved(result)[:2] == ("True", "ResolvedRefs")
    assert destinations(result) == {"api.example.com"}
    # A Service's FQDN is a registry host too.
    fqdn = "{group: networking.istio.io, kind: Hostname, name: alpha.default.svc.cluster.local, port: 80}"
    result = translate(store_of(CLASS, GW, SVC, backend_route(fqdn)), "cluster.local")
    assert destinations(result) == {"alpha.default.svc.cluster.local"}


def test_hostname_backends_that_do_not_resolve_say_why():
    cases = [
        ("{group: networking.istio.io, kind: Hostname, name: api.example.com, port: 443, namespace: default}",
         service_entry(), ("False", "InvalidDestination", "namespace may not be set with Hostname type")),
        ("{group: networking.istio.io, kind: Hostname, name: nowhere.example.com, port: 443}", service_entry(),
         ("False", "BackendNotFound", "backend(nowhere.example.com) not found")),
        ("{group: networking.istio.io, kind: Hostname, name: api.example.com}", service_entry(),
         ("False", "InvalidDestination", "port is required in backendRef")),
        ("{group: networking.istio.io, kind: ServiceEntry, name: ext, namespace: egress, port: 443}", service_entry(),
         ("False", "RefNotPermitted", None)),
        ("{group: networking.istio.io, kind: ServiceEntry, name: ext, port: 443}", service_entry(),
         ("False", "InvalidKind", 'referencing unsupported backendRef: group "networking.istio.io" kind "ServiceEntry"')),
    ]
    for ref, entry, want in cases:
        result = translate(store_of(CLASS, GW, entry, backend_route(ref)), "cluster.local")
        got = resolved(result)
        assert got[:2] == want[:2] and (want[2] is None or got[2] == want[2]), (ref, got)
        assert "api.example.com" not in destinations(result)


def test_a_service_entry_change_reaches_a_memoized_route():
    hostname = "{group: networking.istio.io, kind: Hostname, name: api.example.com, port: 443}"
    store = store_of(CLASS, GW, backend_route(hostname))
    first = translate(store, "cluster.local")
    assert resolved(first)[1] == "BackendNotFound"
    for doc in store_of(service_entry()).list("ServiceEntry"):
        store.apply(doc.obj)
    again = translate(store, "cluster.local", first)
    assert resolved(again)[1] == "ResolvedRefs"
    assert conds(again.statuses[ConfigKey("HTTPRoute", "default", "r")]["parents"][0])["Accepted"][0] == "True"
