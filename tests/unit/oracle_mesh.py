"""The mesh the push oracle (test_push_oracle.py) changes: every config kind a generator reads
(Gateway API Gateways, HTTPRoutes to a Gateway and to a Service, a BackendTLSPolicy and its CA
ConfigMap, an ambient waypoint and the labels that enrol a namespace in it, RequestAuthentications
included), as *slots* (one object each) with a few variants, one of which may be "absent".

A random change picks a slot and moves it to another variant: an add, a modify or a delete of
that kind. Slots are independent, so orders such as "the Pod after its EndpointSlice" (or the
Pod leaving while its slice still names it) come up by themselves.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import yaml

SYSTEM_NS = "istio-system"
CERT_A = b"-----BEGIN CERTIFICATE-----\nMAo=\n-----END CERTIFICATE-----\n"
CERT_B = b"-----BEGIN CERTIFICATE-----\nMAs=\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN PRIVATE KEY-----\nMAo=\n-----END PRIVATE KEY-----\n"


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _meta(name: str, namespace: str, **extra: Any) -> dict:
    return {"name": name, "namespace": namespace, **extra}


def service(
    name: str,
    ns: str = "default",
    port: int = 9080,
    target: int = 9080,
    selector: dict | None = None,
    port_name: str = "http",
    ip: str = "10.96.0.10",
) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, ns),
        "spec": {
            "clusterIP": ip,
            "selector": selector if selector is not None else {"app": name},
            "ports": [{"name": port_name, "port": port, "targetPort": target}],
        },
    }


def endpoint_slice(
    name: str,
    svc: str,
    pods: list[tuple[str, str]],
    ns: str = "default",
    port: int = 9080,
    port_name: str = "http",
    node: str = "",
) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": _meta(name, ns, labels={"kubernetes.io/service-name": svc}),
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": port}],
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": ns},
                **({"nodeName": node} if node else {}),
            }
            for pod, ip in pods
        ],
    }


def pod(name: str, ip: str, labels: dict, sa: str, ns: str = "default") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(name, ns, labels=labels),
        "spec": {"serviceAccountName": sa, "nodeName": "node-1"},
        "status": {"podIP": ip, "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _istio(kind: str, name: str, ns: str, spec: dict, group: str = "networking.istio.io") -> dict:
    return {"apiVersion": f"{group}/v1", "kind": kind, "metadata": _meta(name, ns), "spec": spec}


def destination_rule(name: str, host: str, spec: dict, ns: str = "default") -> dict:
    return _istio("DestinationRule", name, ns, {"host": host, **spec})


def virtual_service(name: str, spec: dict, ns: str = "default") -> dict:
    return _istio("VirtualService", name, ns, spec)


def sidecar(name: str, ns: str, egress: list[str], selector: dict | None = None, **extra: Any) -> dict:
    spec: dict[str, Any] = {"egress": [{"hosts": egress}], **extra}
    if selector is not None:
        spec["workloadSelector"] = {"labels": selector}
    return _istio("Sidecar", name, ns, spec)


def peer_authentication(
    name: str, ns: str, mode: str, selector: dict | None = None, port_levels: dict | None = None
) -> dict:
    spec: dict[str, Any] = {"mtls": {"mode": mode}}
    if selector is not None:
        spec["selector"] = {"matchLabels": selector}
    if port_levels:
        spec["portLevelMtls"] = {str(p): {"mode": m} for p, m in port_levels.items()}
    return _istio("PeerAuthentication", name, ns, spec, "security.istio.io")


def authorization_policy(name: str, ns: str, selector: dict, namespaces: list[str]) -> dict:
    return _istio(
        "AuthorizationPolicy",
        name,
        ns,
        {
            "selector": {"matchLabels": selector},
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"namespaces": namespaces}}]}],
        },
        "security.istio.io",
    )


def gateway(servers: list[dict]) -> dict:
    return _istio(
        "Gateway", "ingress", SYSTEM_NS, {"selector": {"istio": "ingressgateway"}, "servers": servers}
    )


HTTP_SERVER = {
    "port": {"number": 80, "name": "http", "protocol": "HTTP"},
    "hosts": ["*/bookinfo.example.com"],
}
HTTPS_SERVER = {
    "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
    "hosts": ["*/bookinfo.example.com"],
    "tls": {"mode": "SIMPLE", "credentialName": "bookinfo-cred"},
}


def secret(cert: bytes) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta("bookinfo-cred", SYSTEM_NS),
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": _b64(cert), "tls.key": _b64(KEY)},
    }


def service_entry(name: str, spec: dict, ns: str = "default") -> dict:
    return _istio("ServiceEntry", name, ns, spec)


def workload_entry(name: str, address: str, labels: dict, sa: str, ns: str = "default", network: str = "") -> dict:
    spec = {"address": address, "labels": labels, "serviceAccount": sa, **({"network": network} if network else {})}
    return _istio("WorkloadEntry", name, ns, spec)


def _gateway_service(network: str, address: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta("eastwest", SYSTEM_NS, labels={"topology.istio.io/network": network}),
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.98", "ports": [{"name": "tls", "port": 15443}]},
            "status": {"loadBalancer": {"ingress": [{"ip": address}]}}}


def node(name: str, zone: str) -> dict:
    labels = {"topology.kubernetes.io/region": "r1", "topology.kubernetes.io/zone": zone}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def envoy_filter(name: str, ns: str, patches: list[dict], selector: dict | None = None, priority: int = 0,
                 gateways: tuple[str, ...] = ()) -> dict:
    spec: dict = {"configPatches": patches, "priority": priority}
    if selector is not None:
        spec["workloadSelector"] = {"labels": selector}
    if gateways:  # targetRefs to Gateway API Gateways of the namespace
        spec["targetRefs"] = [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": g} for g in gateways]
    return {"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter", "metadata": _meta(name, ns),
            "spec": spec}


def _timeout(seconds: str, host: str | None = None, context: str = "ANY") -> dict:
    match: dict = {"context": context}
    if host is not None:
        match["cluster"] = {"service": host}
    return {"applyTo": "CLUSTER", "match": match, "patch": {"operation": "MERGE", "value": {"connect_timeout": seconds}}}


_LUA = {"applyTo": "HTTP_FILTER",
        "match": {"listener": {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager",
                                                          "subFilter": {"name": "envoy.filters.http.router"}}}}},
        "patch": {"operation": "INSERT_BEFORE", "value": {"name": "envoy.filters.http.lua", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "inlineCode": "-- oracle"}}}}
_ROUTE_HEADER = {"applyTo": "ROUTE_CONFIGURATION", "match": {"context": "GATEWAY"},
                 "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [
                     {"header": {"key": "x-oracle", "value": "1"}}]}}}


def request_authentication(name: str, ns: str, selector: dict | None, issuer: str) -> dict:
    spec: dict[str, Any] = {"jwtRules": [{"issuer": issuer, "jwks": JWKS}]}
    if selector is not None:
        spec["selector"] = {"matchLabels": selector}
    return _istio("RequestAuthentication", name, ns, spec, "security.istio.io")


# A syntactically valid JWK set (the oracle compares generated config, it verifies no token).
JWKS = '{"keys": [{"kty": "RSA", "e": "AQAB", "kid": "k1", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw"}]}'


def gateway_class(name: str, controller: str) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": name},
            "spec": {"controllerName": controller}}


def k8s_gateway(name: str, ns: str, class_name: str, listeners: list[dict], **extra: Any) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": _meta(name, ns),
            "spec": {"gatewayClassName": class_name, "listeners": listeners, **extra}}


def http_route(name: str, ns: str, parent: dict, backend: str, port: int, path: str | None = None) -> dict:
    rule: dict[str, Any] = {"backendRefs": [{"name": backend, "port": port}]}
    if path is not None:
        rule["matches"] = [{"path": {"type": "PathPrefix", "value": path}}]
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": _meta(name, ns),
            "spec": {"parentRefs": [parent], "rules": [rule]}}


def backend_tls_policy(name: str, ns: str, service_name: str, config_map: str, hostname: str) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy", "metadata": _meta(name, ns),
            "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": service_name}],
                     "validation": {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": config_map}],
                                    "hostname": hostname}}}


def config_map(name: str, ns: str, data: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, ns), "data": data}


WEB_PARENT = {"name": "web", "namespace": SYSTEM_NS}
RATINGS_PARENT = {"group": "", "kind": "Service", "name": "ratings", "port": 9080}  # GAMMA: a mesh route
ALL_ROUTES = {"namespaces": {"from": "All"}}
HBONE = [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]


def namespace(name: str, labels: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def mesh_configmap(mesh: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta("istio", SYSTEM_NS),
        "data": {"mesh": yaml.safe_dump(mesh)},
    }


def telemetry(name: str, ns: str, spec: dict) -> dict:
    return _istio("Telemetry", name, ns, spec, group="telemetry.istio.io")


# Providers the Telemetry slots name; the zipkin collector is a Service the slots change.
TELEMETRY_MESH = {"extensionProviders": [
    {"name": "file-log", "envoyFileAccessLog": {"path": "/dev/stdout", "logFormat": {"labels": {"c": "%RESPONSE_CODE%"}}}},
    {"name": "zipkin", "zipkin": {"service": "ratings.default.svc.cluster.local", "port": 9080}},
]}

REVIEWS = "reviews.default.svc.cluster.local"
RATINGS = "ratings.default.svc.cluster.local"
V1 = {"app": "reviews", "version": "v1"}
V2 = {"app": "reviews", "version": "v2"}
SUBSETS = {
    "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]
}


def slots() -> dict[str, list[dict | None]]:
    """Slot name -> its variants; variant 0 is the initial state (None: absent at first)."""
    return {
        # Services (one is the Sidecar-scoped proxy's own: its targetPort shapes its inbound)
        "svc/reviews": [
            service("reviews", ip="10.96.0.11"),
            service("reviews", target=9090, ip="10.96.0.11"),
            service("reviews", port_name="grpc", ip="10.96.0.11"),
            None,
        ],
        "svc/ratings": [
            service("ratings", ip="10.96.0.12"),
            service("ratings", target=9091, ip="10.96.0.12"),
            None,
        ],
        "svc/productpage": [
            service("productpage", ip="10.96.0.13"),
            service("productpage", target=9090, ip="10.96.0.13"),
        ],
        "svc/details": [
            service("details", "shop", ip="10.96.0.14"),
            service("details", "shop", port=9081, target=9081, ip="10.96.0.14"),
            None,
        ],
        "svc/new": [None, service("newcomer", ip="10.96.0.15"), service("newcomer", "shop", ip="10.96.0.16")],
        "svc/ingress": [
            service(
                "ingressgateway",
                SYSTEM_NS,
                port=80,
                target=8080,
                selector={"istio": "ingressgateway"},
                ip="10.96.0.17",
            ),
            service(
                "ingressgateway",
                SYSTEM_NS,
                port=80,
                target=8081,
                selector={"istio": "ingressgateway"},
                ip="10.96.0.17",
            ),
        ],
        # Endpoints, naming Pods that may or may not exist (yet)
        "eps/reviews": [
            endpoint_slice("reviews-1", "reviews", [("reviews-v1", "10.1.0.1"), ("reviews-v2", "10.1.0.2")]),
            endpoint_slice("reviews-1", "reviews", [("reviews-v1", "10.1.0.1")]),
            endpoint_slice("reviews-1", "reviews", [("reviews-v1", "10.1.0.1")], node="node-2"),
            endpoint_slice("reviews-1", "reviews", [("reviews-v3", "10.1.0.3")]),
            None,
        ],
        "eps/ratings": [
            endpoint_slice("ratings-1", "ratings", [("ratings-1", "10.1.0.4")]),
            endpoint_slice("ratings-1", "ratings", [("ratings-1", "10.1.0.5")]),
            None,
        ],
        "eps/productpage": [
            endpoint_slice("productpage-1", "productpage", [("productpage-1", "10.1.0.6")]),
            None,
        ],
        "eps/details": [endpoint_slice("details-1", "details", [("details-1", "10.1.0.7")], ns="shop"), None],
        "pod/reviews-v1": [
            pod("reviews-v1", "10.1.0.1", V1, "reviews"),
            pod("reviews-v1", "10.1.0.1", V2, "reviews"),
            pod("reviews-v1", "10.1.0.1", V1, "reviews-other"),
            None,
        ],
        "pod/reviews-v2": [
            None,
            pod("reviews-v2", "10.1.0.2", V2, "reviews"),
            pod("reviews-v2", "10.1.0.2", V2, "legacy"),
        ],
        "pod/reviews-v3": [None, pod("reviews-v3", "10.1.0.3", V1, "reviews-v3")],
        "pod/ratings-1": [
            pod("ratings-1", "10.1.0.4", {"app": "ratings"}, "ratings"),
            pod("ratings-1", "10.1.0.4", {"app": "ratings", "version": "v1"}, "ratings"),
            None,
        ],
        "pod/details-1": [pod("details-1", "10.1.0.7", {"app": "details"}, "details", "shop"), None],
        "pod/productpage-1": [pod("productpage-1", "10.1.0.6", {"app": "productpage"}, "productpage"), None],
        # Traffic rules
        "dr/reviews": [
            destination_rule("reviews", "reviews", SUBSETS),
            destination_rule("reviews", "reviews", {"subsets": SUBSETS["subsets"][:1]}),
            destination_rule(
                "reviews", "reviews", {**SUBSETS, "trafficPolicy": {"tls": {"mode": "DISABLE"}}}
            ),
            # Its pool shapes the reviews servers' inbound cluster too (istiod's buildInboundCluster)
            destination_rule(
                "reviews", "reviews", {**SUBSETS, "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 7}}}}
            ),
            # outlier detection: locality failover, EDS per client locality
            destination_rule(
                "reviews", "reviews", {**SUBSETS, "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 3}}}
            ),
            None,
        ],
        # A Node's topology labels are its endpoints' locality
        "node/1": [None, node("node-1", "za"), node("node-1", "zb")],
        "node/2": [None, node("node-2", "za")],
        "dr/ratings": [
            None,
            destination_rule(
                "ratings",
                "ratings",
                {"trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}}}},
            ),
            destination_rule(
                "ratings", "ratings", {"subsets": [{"name": "v1", "labels": {"version": "v1"}}]}
            ),
        ],
        "dr/shop-reviews": [None, destination_rule("reviews-from-shop", REVIEWS, SUBSETS, ns="shop")],
        # details uses shop's waypoint: its traffic policy shapes the waypoint's inbound-vip clusters
        "dr/details": [
            None,
            destination_rule("details", "details", {"trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 3}}},
                             ns="shop"),
            destination_rule("details", "details", {"trafficPolicy": {"connectionPool": {"tcp": {
                "connectTimeout": "2s"}}}}, ns="shop"),
        ],
        "vs/reviews": [
            virtual_service(
                "reviews",
                {
                    "hosts": ["reviews"],
                    "http": [{"route": [{"destination": {"host": "reviews", "subset": "v1"}}]}],
                },
            ),
            virtual_service(
                "reviews",
                {
                    "hosts": ["reviews"],
                    "http": [
                        {
                            "route": [
                                {"destination": {"host": "reviews", "subset": "v1"}, "weight": 50},
                                {"destination": {"host": "reviews", "subset": "v2"}, "weight": 50},
                            ]
                        }
                    ],
                },
            ),
            None,
        ],
        "vs/ratings": [
            None,
            virtual_service(
                "ratings",
                {
                    "hosts": ["ratings"],
                    "http": [{"timeout": "3s", "route": [{"destination": {"host": "ratings"}}]}],
                },
            ),
        ],
        "vs/bookinfo": [
            virtual_service(
                "bookinfo",
                {
                    "hosts": ["bookinfo.example.com"],
                    "gateways": ["istio-system/ingress"],
                    "http": [{"route": [{"destination": {"host": "productpage.default.svc.cluster.local"}}]}],
                },
            ),
            virtual_service(
                "bookinfo",
                {
                    "hosts": ["bookinfo.example.com"],
                    "gateways": ["istio-system/ingress"],
                    "http": [{"route": [{"destination": {"host": REVIEWS}}]}],
                },
            ),
            None,
        ],
        # Scoping
        "sidecar/productpage": [
            sidecar(
                "productpage", "default", [f"./{RATINGS}", "istio-system/*"], selector={"app": "productpage"}
            ),
            sidecar("productpage", "default", ["./*", "istio-system/*"], selector={"app": "productpage"}),
            sidecar("productpage", "default", [f"./{REVIEWS}"], selector={"app": "productpage"}),
            None,
        ],
        "sidecar/shop": [
            sidecar("default", "shop", ["./*", f"default/{REVIEWS}"]),
            None,
            sidecar("default", "shop", ["./*"], outboundTrafficPolicy={"mode": "REGISTRY_ONLY"}),
        ],
        # Gateways
        "gateway/ingress": [gateway([HTTP_SERVER]), gateway([HTTP_SERVER, HTTPS_SERVER]), None],
        "secret/bookinfo": [secret(CERT_A), secret(CERT_B), None],
        # Security
        "pa/mesh": [
            None,
            peer_authentication("default", SYSTEM_NS, "STRICT"),
            peer_authentication("default", SYSTEM_NS, "PERMISSIVE"),
        ],
        "pa/reviews": [
            None,
            peer_authentication("reviews", "default", "STRICT", {"app": "reviews"}, {9080: "DISABLE"}),
            peer_authentication("reviews", "default", "DISABLE", {"app": "reviews"}),
        ],
        "pa/productpage": [
            None,
            peer_authentication("productpage", "default", "STRICT", {"app": "productpage"}),
        ],
        "authz/reviews": [
            None,
            authorization_policy("reviews", "default", {"app": "reviews"}, ["default"]),
            authorization_policy("reviews", "default", {"app": "reviews"}, ["shop"]),
        ],
        "authz/productpage": [
            None,
            authorization_policy("productpage", "default", {"app": "productpage"}, ["shop"]),
        ],
        # ServiceEntries and their WorkloadEntries
        "se/db": [
            service_entry(
                "db",
                {
                    "hosts": ["db.internal"],
                    "location": "MESH_INTERNAL",
                    "resolution": "STATIC",
                    "ports": [{"number": 5432, "name": "tcp", "protocol": "TCP"}],
                    "workloadSelector": {"labels": {"app": "db"}},
                },
            ),
            service_entry(
                "db",
                {
                    "hosts": ["db.internal"],
                    "location": "MESH_INTERNAL",
                    "resolution": "STATIC",
                    "ports": [{"number": 5433, "name": "tcp", "protocol": "TCP"}],
                    "workloadSelector": {"labels": {"app": "db"}},
                },
            ),
            None,
        ],
        "se/api": [
            None,
            service_entry(
                "api",
                {
                    "hosts": ["api.example.com"],
                    "location": "MESH_EXTERNAL",
                    "resolution": "DNS",
                    "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
                },
            ),
        ],
        "we/db-1": [
            workload_entry("db-1", "10.2.0.1", {"app": "db"}, "db"),
            workload_entry("db-1", "10.2.0.2", {"app": "db"}, "db"),
            workload_entry("db-1", "10.2.0.1", {"app": "other"}, "db"),
            workload_entry("db-1", "10.2.0.1", {"app": "db"}, "db-admin"),
            None,
        ],
        "we/db-2": [None, workload_entry("db-2", "10.2.0.3", {"app": "db"}, "db")],
        # A WorkloadEntry the Kubernetes Service ratings selects (PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES)
        "we/ratings-vm": [None, workload_entry("ratings-vm", "10.2.0.9", {"app": "ratings"}, "ratings-vm"),
                          workload_entry("ratings-vm", "10.2.0.9", {"app": "ratings"}, "ratings-legacy"),
                          workload_entry("ratings-vm", "10.2.0.9", {"app": "ratings", "security.istio.io/tlsMode": "istio"},
                                         "ratings-vm", network="net-b")],
        # A Pod the ServiceEntry's workloadSelector picks (istiod selects Pods too)
        "pod/db-pod": [None, pod("db-pod", "10.1.0.30", {"app": "db"}, "db-pod"),
                       pod("db-pod", "10.1.0.30", {"app": "other"}, "db-pod")],
        # EnvoyFilters: selecting a few workloads, a namespace, the whole mesh (root namespace)
        "ef/reviews": [
            None,
            envoy_filter("reviews", "default", [_timeout("3s", REVIEWS), _LUA], selector={"app": "reviews"}),
            envoy_filter("reviews", "default", [_timeout("4s", RATINGS)], selector={"app": "productpage"}),
        ],
        "ef/shop": [None, envoy_filter("all", "shop", [_LUA, _timeout("5s", context="SIDECAR_INBOUND")])],
        "ef/mesh": [
            None,
            envoy_filter("mesh", SYSTEM_NS, [_timeout("6s", context="SIDECAR_OUTBOUND"), _ROUTE_HEADER], priority=5),
            envoy_filter("mesh", SYSTEM_NS, [_LUA], selector={"istio": "ingressgateway"}),
        ],
        # targetRefs: the Gateway API Gateway's router only (then another Gateway, then a selector)
        "ef/gateway-api": [
            None,
            envoy_filter("web", SYSTEM_NS, [_LUA, _ROUTE_HEADER, _timeout("7s", context="GATEWAY")], gateways=("web",)),
            envoy_filter("web", SYSTEM_NS, [_LUA], gateways=("other", "waypoint")),
            envoy_filter("web", SYSTEM_NS, [_timeout("8s")], selector={"gateway.networking.k8s.io/gateway-name": "web"}),
        ],
        "ra/reviews": [
            None,
            request_authentication("reviews", "default", {"app": "reviews"}, "https://issuer.example"),
            request_authentication("reviews", "default", {"app": "reviews"}, "https://other.example"),
        ],
        "ra/mesh": [None, request_authentication("mesh", SYSTEM_NS, None, "https://mesh.example")],
        # Gateway API: a Gateway served by its own router, its HTTPRoute, and a mesh (GAMMA) route
        "gwclass/istio": [gateway_class("istio", "istio.io/gateway-controller"), None],
        "k8sgw/web": [
            None,
            k8s_gateway("web", SYSTEM_NS, "istio", [{"name": "http", "port": 80, "protocol": "HTTP",
                                                     "allowedRoutes": ALL_ROUTES}]),
            k8s_gateway("web", SYSTEM_NS, "istio", [{"name": "http", "port": 8080, "protocol": "HTTP",
                                                     "hostname": "*.example.com", "allowedRoutes": ALL_ROUTES}]),
        ],
        "httproute/web": [
            None,
            http_route("web", "default", WEB_PARENT, "productpage", 9080),
            http_route("web", "default", WEB_PARENT, "reviews", 9080, path="/reviews"),
        ],
        "httproute/mesh": [
            None,
            http_route("ratings-split", "default", RATINGS_PARENT, "reviews", 9080),
            http_route("ratings-split", "default", RATINGS_PARENT, "ratings", 9080, path="/v2"),
        ],
        # BackendTLSPolicy on a Service the gateway routes to, and its CA ConfigMap (emptied: fails closed)
        "btls/productpage": [
            None,
            backend_tls_policy("pp-tls", "default", "productpage", "pp-ca", "pp.example.com"),
            backend_tls_policy("pp-tls", "default", "productpage", "pp-ca", "other.example.com"),
        ],
        "cm/pp-ca": [
            None,
            config_map("pp-ca", "default", {"ca.crt": CERT_A.decode()}),
            config_map("pp-ca", "default", {"ca.crt": CERT_B.decode()}),
            config_map("pp-ca", "default", {"ca.crt": ""}),
        ],
        # Ambient waypoint of namespace shop (its Service gives it an address)
        "waypoint/shop": [
            None,
            k8s_gateway("waypoint", "shop", "istio-waypoint", HBONE),
            k8s_gateway("waypoint", "shop", "istio-waypoint", HBONE, addresses=[{"type": "IPAddress",
                                                                                 "value": "10.96.0.98"}]),
        ],
        "svc/waypoint": [
            None,
            {"apiVersion": "v1", "kind": "Service",
             "metadata": _meta("waypoint", "shop", labels={"gateway.istio.io/managed": "istio.io-mesh-controller"}),
             "spec": {"clusterIP": "10.96.0.99", "ports": [{"name": "mesh", "port": 15008}]}},
        ],
        # Multi-network: an east-west gateway Service (labelled with the network it reaches), the
        # system namespace's network, a WorkloadEntry on another network (see we/ratings-vm)
        "svc/eastwest": [
            None,
            _gateway_service("net-b", "192.0.2.1"),
            _gateway_service("net-b", "192.0.2.2"),
            _gateway_service("net-c", "192.0.2.1"),
            _gateway_service("net-a", "192.0.2.3"),  # with ns/system: every unlabelled endpoint is net-a's
        ],
        "ns/system": [None, namespace(SYSTEM_NS, {"topology.istio.io/network": "net-a"})],
        # Namespaces (ambient enrolment, waypoint use) and the mesh
        "ns/shop": [
            namespace("shop", {}),
            namespace("shop", {"istio.io/dataplane-mode": "ambient"}),
            namespace("shop", {"istio.io/dataplane-mode": "ambient", "istio.io/use-waypoint": "waypoint"}),
        ],
        "ns/default": [
            namespace("default", {}),
            namespace("default", {"istio.io/dataplane-mode": "ambient"}),
        ],
        # Telemetry: mesh-wide, namespace-wide and workload-level (providers from the mesh below)
        "tel/mesh": [
            None,
            telemetry("mesh", SYSTEM_NS, {"accessLogging": [{"providers": [{"name": "file-log"}]}]}),
            telemetry("mesh", SYSTEM_NS, {"tracing": [{"providers": [{"name": "zipkin"}],
                                                       "randomSamplingPercentage": 10}]}),
        ],
        "tel/reviews": [
            None,
            telemetry("reviews", "default", {"selector": {"matchLabels": {"app": "reviews"}},
                                             "tracing": [{"providers": [{"name": "zipkin"}],
                                                          "customTags": {"t": {"literal": {"value": "x"}}}}]}),
            telemetry("reviews", "default", {"selector": {"matchLabels": {"app": "reviews"}},
                                             "accessLogging": [{"match": {"mode": "SERVER"}, "disabled": True}]}),
        ],
        "tel/shop": [
            None,
            telemetry("shop", "shop", {"accessLogging": [{"providers": [{"name": "envoy"}],
                                                          "filter": {"expression": "response.code >= 400"}}]}),
            telemetry("shop", "shop", {"accessLogging": [{"providers": [{"name": "missing"}]}]}),
        ],
        "mesh": [mesh_configmap(TELEMETRY_MESH), mesh_configmap({**TELEMETRY_MESH, "connectTimeout": "3s"})],
    }


def copy_doc(doc: dict | None) -> dict | None:
    return copy.deepcopy(doc) if doc is not None else None
