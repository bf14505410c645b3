"""networking.istio.io example manifests and the parse/edit/reject helpers shared by the
`test_networking_config_*` modules."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from pilot.config.validation import InvalidObject, parse_object

VERSIONS = ("v1", "v1beta1", "v1alpha3")

VIRTUAL_SERVICE = yaml.safe_load("""
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews, reviews.example.com]
  http:
  - name: jason-canary
    match:
    - name: jason
      headers:
        end-user: {exact: jason}
        x-debug: {}
      uri: {prefix: /reviews}
      queryParams:
        beta: {regex: "^(yes|true)$"}
      withoutHeaders:
        x-skip: {exact: "1"}
      ignoreUriCase: true
      sourceLabels: {app: productpage}
    route:
    - destination: {host: reviews, subset: v2, port: {number: 9080}}
      weight: 75
      headers:
        response:
          set: {x-canary: "true"}
    - destination: {host: reviews, subset: v3}
      weight: 25
    timeout: 2.5s
    retries: {attempts: 3, perTryTimeout: 500ms, retryOn: "5xx,connect-failure,503"}
    fault:
      delay: {fixedDelay: 7s, percentage: {value: 0.1}}
      abort: {httpStatus: 503, percentage: {value: 5}}
    mirror: {host: reviews, subset: v4}
    mirrorPercentage: {value: 10.5}
    headers:
      request:
        set: {x-request-start: "t=%START_TIME(%s.%3f)%"}
        add: {x-envoy-pct: "100%%"}
        remove: [x-internal]
    corsPolicy:
      allowOrigins: [{exact: "https://example.com"}, {regex: "https://.*\\\\.example\\\\.org"}]
      allowMethods: [GET, POST]
      allowHeaders: [x-custom, "*"]
      exposeHeaders: [x-trace-id]
      maxAge: 24h
      allowCredentials: false
  - name: legacy
    match: [{uri: {exact: /old}}]
    redirect: {uri: /new, authority: reviews.example.com, redirectCode: 308}
  - name: health
    match: [{uri: {exact: /healthz}, method: {exact: GET}}]
    directResponse: {status: 200, body: {string: ok}}
  - name: rewrite
    match: [{uri: {prefix: /v1/}}]
    rewrite: {uriRegexRewrite: {match: "^/v1/(.*)$", rewrite: "/\\\\1"}, authority: reviews.internal}
    route: [{destination: {host: reviews}}]
  - route:
    - destination: {host: reviews, subset: v1}
""")

TCP_TLS_VIRTUAL_SERVICE = yaml.safe_load("""
apiVersion: networking.istio.io/v1alpha3
kind: VirtualService
metadata: {name: edge, namespace: istio-system}
spec:
  hosts: ["*.example.com", mongo.prod.svc.cluster.local]
  gateways: [istio-system/edge-gateway, mesh]
  tcp:
  - match: [{port: 27017}]
    route:
    - destination: {host: mongo.prod.svc.cluster.local, port: {number: 5555}}
  tls:
  - match: [{port: 443, sniHosts: [login.example.com]}]
    route:
    - destination: {host: login.prod.svc.cluster.local}
      weight: 80
    - destination: {host: login-canary.prod.svc.cluster.local}
      weight: 20
""")

DESTINATION_RULE = yaml.safe_load("""
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec:
  host: reviews.bookinfo.svc.cluster.local
  exportTo: [".", istio-system]
  trafficPolicy:
    loadBalancer:
      simple: LEAST_REQUEST
      warmup: {duration: 60s, minimumPercent: 20, aggression: 2}
    connectionPool:
      tcp: {maxConnections: 100, connectTimeout: 30ms, tcpKeepalive: {time: 7200s, interval: 75s}}
      http: {http1MaxPendingRequests: 64, http2MaxRequests: 1000, maxRequestsPerConnection: 10,
             maxRetries: 3, idleTimeout: 1h, h2UpgradePolicy: UPGRADE}
    outlierDetection:
      consecutive5xxErrors: 7
      consecutiveGatewayErrors: 3
      interval: 5m
      baseEjectionTime: 15m
      maxEjectionPercent: 50
    tls: {mode: ISTIO_MUTUAL}
    portLevelSettings:
    - port: {number: 9080}
      loadBalancer:
        consistentHash:
          httpCookie: {name: user, ttl: 0s}
  subsets:
  - name: v1
    labels: {version: v1}
  - name: v2
    labels: {version: v2}
    trafficPolicy:
      loadBalancer: {simple: ROUND_ROBIN}
      tls:
        mode: MUTUAL
        clientCertificate: /etc/certs/client.pem
        privateKey: /etc/certs/key.pem
        caCertificates: /etc/certs/ca.pem
        subjectAltNames: [reviews.example.com]
        sni: reviews.example.com
""")

SERVICE_ENTRY = yaml.safe_load("""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external-svc-mongocluster, namespace: prod}
spec:
  hosts: [mymongodb.somedomain]
  addresses: [192.192.192.192/24]
  ports:
  - {number: 27018, name: mongodb, protocol: MONGO}
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints:
  - address: 2.2.2.2
  - address: 3.3.3.3
    ports: {mongodb: 27019}
    labels: {region: eu}
    locality: eu-west/zone-a
    weight: 3
""")

DNS_SERVICE_ENTRY = yaml.safe_load("""
apiVersion: networking.istio.io/v1beta1
kind: ServiceEntry
metadata: {name: external-svc-https}
spec:
  hosts: [api.dropboxapi.com, www.googleapis.com]
  location: MESH_EXTERNAL
  ports:
  - {number: 443, name: https, protocol: TLS}
  resolution: DNS
  exportTo: ["*"]
""")

WORKLOAD_ENTRY = yaml.safe_load("""
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: details-svc, namespace: bookinfo}
spec:
  serviceAccount: details-legacy
  address: 2.2.2.2
  labels: {app: details-legacy, instance-id: vm1}
  ports: {http: 9080}
  locality: us-central1/us-central1-a
  weight: 10
""")

SIDECAR = yaml.safe_load("""
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: ratings, namespace: prod-us1}
spec:
  workloadSelector:
    labels: {app: ratings}
  ingress:
  - port: {number: 9080, protocol: HTTP, name: somename}
    defaultEndpoint: 127.0.0.1:8080
    captureMode: NONE
  egress:
  - port: {number: 9080, protocol: HTTP, name: egresshttp}
    hosts: [prod-us1/*]
  - hosts: ["./*", "istio-system/*", "~/*", "*/reviews.prod.svc.cluster.local"]
  outboundTrafficPolicy: {mode: REGISTRY_ONLY}
""")

GATEWAY = yaml.safe_load("""
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: my-gateway, namespace: some-config-namespace}
spec:
  selector: {app: my-gateway-controller}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [uk.bookinfo.com, eu.bookinfo.com]
    tls: {httpsRedirect: true}
  - port: {number: 443, name: https-443, protocol: HTTPS}
    hosts: [uk.bookinfo.com, eu.bookinfo.com]
    tls: {mode: SIMPLE, credentialName: bookinfo-secret}
  - port: {number: 9443, name: https-9443, protocol: HTTPS}
    hosts: [bookinfo-namespace/*.bookinfo.com]
    tls: {mode: MUTUAL, credentialName: bookinfo-mtls, minProtocolVersion: TLSV1_2}
  - port: {number: 2379, name: tcp-etcd, protocol: TCP}
    hosts: ["*"]
  - port: {number: 15443, name: tls, protocol: TLS}
    hosts: ["*.local"]
    tls: {mode: AUTO_PASSTHROUGH}
""")

EXAMPLES = {"VirtualService": VIRTUAL_SERVICE, "DestinationRule": DESTINATION_RULE, "ServiceEntry": SERVICE_ENTRY,
            "WorkloadEntry": WORKLOAD_ENTRY, "Sidecar": SIDECAR, "Gateway": GATEWAY}


def parse(doc: dict) -> Any:
    return parse_object(copy.deepcopy(doc))


def edit(doc: dict, change: Callable[[dict], object]) -> dict:
    doc = copy.deepcopy(doc)
    change(doc["spec"])
    return doc


def reject(doc: dict) -> str:
    with pytest.raises(InvalidObject) as e:
        parse_object(doc)
    return e.value.reason
