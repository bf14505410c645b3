"""GAMMA with a real sidecar Envoy (file mode, no iptables): an HTTPRoute whose parent is the
`reviews` Service changes where the sidecar sends requests for `reviews`, its status is shown at
/debug/gatewayz, and removing the parent Service withdraws it."""

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


async def _status(m: Mesh) -> dict | None:
    for o in (await m.cp.debug("/debug/gatewayz"))["objects"]:
        if (o["kind"], o["namespace"], o["name"]) == ("HTTPRoute", "default", "reviews"):
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
