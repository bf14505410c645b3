"""GAMMA with a real sidecar Envoy (file mode, no iptables): an HTTPRoute whose parent is the
`reviews` Service changes where the sidecar sends requests for `reviews`, its status is shown at
/debug/gatewayz, and removing the parent Service withdraws it; the same for an HTTPRoute whose
parent is a ServiceEntry, for the ServiceEntry's host."""

# ruff: noqa: F811 - `mesh` is a pytest fixture imported from traffic_mesh and requested by name
from __future__ import annotations

import textwrap

from tests.e2e.traffic_mesh import Mesh, mesh  # noqa: F401 - fixture


def _version_service(name: str, port: int, backend_port: int) -> str:
    """A Service with one endpoint: the backend of one version only."""
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: {name}, namespace: default}}
        spec: {{ports: [{{name: http, port: {port}}}]}}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
        addressType: IPv4
        ports: [{{name: http, port: {backend_port}}}]
        endpoints: [{{addresses: ["127.0.0.1"]}}]
        """)


ROUTE = """\
    apiVersion: gateway.networking.k8s.io/v1
    kind: HTTPRoute
    metadata: {{name: reviews, namespace: default, generation: 4}}
    spec:
      parentRefs: [{{group: "", kind: Service, name: {parent}, port: {port}}}]
      rules:
      - matches: [{{headers: [{{name: end-user, value: jason}}]}}]
        backendRefs: [{{name: reviews-v2, port: {port}}}]
      - backendRefs: [{{name: reviews-v1, port: {port}}}]
    """


async def _status(m: Mesh, name: str = "reviews") -> dict | None:
    for o in (await m.cp.debug("/debug/gatewayz"))["objects"]:
        if (o["kind"], o["namespace"], o["name"]) == ("HTTPRoute", "default", name):
            return o["status"]
    return None


async def test_http_route_on_a_service_routes_the_sidecars_requests(mesh: Mesh):
    m = mesh
    m.cp.write("versions.yaml", _version_service("reviews-v1", m.port, m.backends["v1"].port) + "---\n"
               + _version_service("reviews-v2", m.port, m.backends["v2"].port))
    m.cp.write("route.yaml", ROUTE.format(parent="reviews", port=m.port))

    async def routed():
        jason = {(await m.get(headers={"end-user": "jason"}))[1] for _ in range(6)}
        others = {(await m.get())[1] for _ in range(6)}
        return jason == {"v2"} and others == {"v1"}

    await m.until(routed, "the HTTPRoute on Service reviews decides its traffic")
    for _ in range(8):  # without the route, either version answers half the time
        assert (await m.get(headers={"end-user": "jason"}))[1] == "v2"
        assert (await m.get(headers={"end-user": "someone"}))[1] == "v1"

    [parent] = (await _status(m))["parents"]
    assert parent["parentRef"] == {"group": "", "kind": "Service", "name": "reviews", "port": m.port}
    assert parent["controllerName"] == "istio.io/gateway-controller"
    assert {c["type"]: (c["status"], c["reason"], c["observedGeneration"]) for c in parent["conditions"]} == {
        "Accepted": ("True", "Accepted", 4), "ResolvedRefs": ("True", "ResolvedRefs", 4)}

    # A parent Service that does not exist: not accepted, and reviews is plain round robin again.
    m.cp.write("route.yaml", ROUTE.format(parent="ratings", port=m.port))

    async def withdrawn():
        seen = {(await m.get(headers={"end-user": "jason"}))[1] for _ in range(10)}
        return seen == {"v1", "v2"}

    await m.until(withdrawn, "the route no longer applies to reviews")
    [parent] = (await _status(m))["parents"]
    accepted = next(c for c in parent["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"], accepted["message"]) == (
        "False", "NoMatchingParent", 'parent service: "ratings" not found')


SE_HOST = "api.example.com"
SE_ROUTE = """\
    apiVersion: gateway.networking.k8s.io/v1
    kind: HTTPRoute
    metadata: {{name: api, namespace: default, generation: 2}}
    spec:
      parentRefs: [{{group: networking.istio.io, kind: ServiceEntry, name: api, port: {port}}}]
      rules:
      - matches: [{{headers: [{{name: end-user, value: jason}}]}}]
        backendRefs: [{{name: reviews-v2, port: {port}}}]
      - backendRefs: [{{group: networking.istio.io, kind: Hostname, name: api.example.com, port: {port}}}]
    """


def _service_entry(port: int, backend_port: int) -> str:
    """api.example.com on the mesh port, its one endpoint the v1 backend on loopback."""
    return textwrap.dedent(f"""\
        apiVersion: networking.istio.io/v1
        kind: ServiceEntry
        metadata: {{name: api, namespace: default}}
        spec:
          hosts: [{SE_HOST}]
          ports: [{{number: {port}, name: http, protocol: HTTP}}]
          resolution: STATIC
          endpoints: [{{address: 127.0.0.1, ports: {{http: {backend_port}}}}}]
        """)


async def test_http_route_on_a_service_entry_routes_the_sidecars_requests_for_its_host(mesh: Mesh):
    m = mesh
    m.cp.write("versions.yaml", _version_service("reviews-v2", m.port, m.backends["v2"].port))
    # The route before its ServiceEntry: not accepted, with istiod's reason and message.
    m.cp.write("route.yaml", SE_ROUTE.format(port=m.port))

    async def refused():
        status = await _status(m, "api")
        return status is not None and status["parents"][0]["conditions"]

    await m.until(refused, "the route's status is shown")
    [parent] = (await _status(m, "api"))["parents"]
    assert parent["parentRef"] == {"group": "networking.istio.io", "kind": "ServiceEntry", "name": "api",
                                   "port": m.port}
    assert parent["controllerName"] == "istio.io/gateway-controller"
    accepted = next(c for c in parent["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"], accepted["message"]) == (
        "False", "NoMatchingParent", 'parent service entry: "api" not found')

    # Adding the ServiceEntry pushes the route to the sidecar: jason to reviews-v2, others to the
    # ServiceEntry's own endpoint (v1).
    m.cp.write("se.yaml", _service_entry(m.port, m.backends["v1"].port))

    async def routed():
        jason = {(await m.get(headers={"Host": SE_HOST, "end-user": "jason"}))[1] for _ in range(4)}
        others = {(await m.get(headers={"Host": SE_HOST}))[1] for _ in range(4)}
        return jason == {"v2"} and others == {"v1"}

    await m.until(routed, "the HTTPRoute on ServiceEntry api decides the traffic to its host")
    [parent] = (await _status(m, "api"))["parents"]
    assert {c["type"]: (c["status"], c["reason"], c["observedGeneration"]) for c in parent["conditions"]} == {
        "Accepted": ("True", "Accepted", 2), "ResolvedRefs": ("True", "ResolvedRefs", 2)}

    # Removing the ServiceEntry withdraws the route: jason is no longer sent to reviews-v2.
    m.cp.remove("se.yaml")

    async def withdrawn():
        return (await m.get(headers={"Host": SE_HOST, "end-user": "jason"}))[1] != "v2"

    await m.until(withdrawn, "the route no longer applies once its ServiceEntry is gone")
    assert (await _status(m, "api"))["parents"][0]["conditions"][0]["reason"] == "NoMatchingParent"
