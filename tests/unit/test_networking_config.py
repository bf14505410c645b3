"""networking.istio.io kinds: realistic manifests parse into typed objects through `parse_object`
(every served API version), and istiod's validation-webhook rules reject bad ones with a reason
that names the field."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from pilot.config import networking as net
from pilot.config.kinds import BY_NAME, KINDS
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
  - match: [{port: 27017, destinationSubnets: [10.0.0.0/16]}]
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
      localityLbSetting:
        enabled: true
        distribute:
        - from: us-west/zone1/*
          to: {"us-west/zone1/*": 80, "us-west/zone2/*": 20}
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
  network: vm-network
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
    tls: {mode: MUTUAL, serverCertificate: /etc/certs/server.pem, privateKey: /etc/certs/key.pem,
          caCertificates: /etc/certs/ca.pem, minProtocolVersion: TLSV1_2}
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


# --- parsing --------------------------------------------------------------------------------------
def test_virtual_service_example():
    vs = parse(VIRTUAL_SERVICE)
    assert isinstance(vs, net.VirtualService) and vs.metadata.namespace == "bookinfo"
    spec = vs.spec
    assert spec.hosts == ["reviews", "reviews.example.com"] and spec.gateways == [] and not spec.applies_to_gateway
    canary, legacy, health, rewrite, default = spec.http
    m = canary.match[0]
    assert m.name == "jason" and m.uri == net.StringMatch(prefix="/reviews")
    assert m.headers["end-user"].exact == "jason" and m.headers["x-debug"].is_empty
    assert m.query_params["beta"].regex == "^(yes|true)$" and m.without_headers["x-skip"].exact == "1"
    assert m.ignore_uri_case and m.source_labels == {"app": "productpage"} and m.port is None
    d0, d1 = canary.route
    assert (d0.destination.host, d0.destination.subset, d0.destination.port.number, d0.weight) == \
        ("reviews", "v2", 9080, 75)
    assert d0.headers.response.set == {"x-canary": "true"} and d1.weight == 25 and d1.destination.port is None
    assert canary.timeout == "2.5s"
    assert (canary.retries.attempts, canary.retries.per_try_timeout, canary.retries.retry_on) == \
        (3, "500ms", "5xx,connect-failure,503")
    assert canary.fault.delay.fixed_delay == "7s" and canary.fault.delay.percentage.value == 0.1
    assert canary.fault.abort.http_status == 503 and canary.fault.abort.grpc_status is None
    assert canary.mirror.subset == "v4" and canary.mirror_percentage.value == 10.5
    assert canary.headers.request.remove == ["x-internal"] and "x-envoy-pct" in canary.headers.request.add
    cors = canary.cors_policy
    assert cors.allow_origins[1].regex and cors.allow_methods == ["GET", "POST"] and cors.max_age == "24h"
    assert cors.allow_credentials is False and cors.expose_headers == ["x-trace-id"]
    assert legacy.redirect == net.HTTPRedirect(uri="/new", authority="reviews.example.com", redirect_code=308)
    assert legacy.route == [] and legacy.redirect.port is None and legacy.redirect.scheme is None
    assert health.direct_response.status == 200 and health.direct_response.body.string == "ok"
    assert health.match[0].method.exact == "GET"
    assert rewrite.rewrite.uri is None and rewrite.rewrite.uri_regex_rewrite.rewrite == "/\\1"
    assert rewrite.rewrite.authority == "reviews.internal" and rewrite.route[0].weight == 0
    assert default.match == [] and default.name == "" and default.timeout is None and default.retries is None


def test_tcp_and_tls_routes():
    vs = parse(TCP_TLS_VIRTUAL_SERVICE)
    assert vs.spec.gateways == ["istio-system/edge-gateway", "mesh"] and not vs.spec.applies_to_gateway
    tcp, tls = vs.spec.tcp[0], vs.spec.tls[0]
    assert tcp.match[0].port == 27017 and tcp.match[0].destination_subnets == ["10.0.0.0/16"]
    assert tcp.route[0].destination.port.number == 5555 and tcp.route[0].weight == 0
    assert tls.match[0].sni_hosts == ["login.example.com"] and [d.weight for d in tls.route] == [80, 20]


def test_destination_rule_example():
    dr = parse(DESTINATION_RULE)
    assert isinstance(dr, net.DestinationRule)
    tp = dr.spec.traffic_policy
    assert dr.spec.host == "reviews.bookinfo.svc.cluster.local" and dr.spec.export_to == [".", "istio-system"]
    assert tp.load_balancer.simple == "LEAST_REQUEST" and tp.load_balancer.consistent_hash is None
    dist = tp.load_balancer.locality_lb_setting.distribute[0]
    assert dist.from_ == "us-west/zone1/*" and dist.to == {"us-west/zone1/*": 80, "us-west/zone2/*": 20}
    tcp, http = tp.connection_pool.tcp, tp.connection_pool.http
    assert (tcp.max_connections, tcp.connect_timeout, tcp.tcp_keepalive.interval) == (100, "30ms", "75s")
    assert (http.http1_max_pending_requests, http.http2_max_requests, http.max_requests_per_connection,
            http.max_retries, http.idle_timeout, http.h2_upgrade_policy) == (64, 1000, 10, 3, "1h", "UPGRADE")
    od = tp.outlier_detection
    assert (od.consecutive_5xx_errors, od.consecutive_gateway_errors, od.interval, od.base_ejection_time,
            od.max_ejection_percent, od.consecutive_errors) == (7, 3, "5m", "15m", 50, None)
    assert tp.tls.mode == "ISTIO_MUTUAL"
    pls = tp.port_level_settings[0]
    assert pls.port.number == 9080 and pls.load_balancer.consistent_hash.http_cookie.name == "user"
    v1, v2 = dr.spec.subsets
    assert (v1.name, v1.labels, v1.traffic_policy) == ("v1", {"version": "v1"}, None)
    assert v2.traffic_policy.tls.mode == "MUTUAL" and v2.traffic_policy.tls.sni == "reviews.example.com"
    assert v2.traffic_policy.tls.subject_alt_names == ["reviews.example.com"]


def test_service_entry_examples():
    se = parse(SERVICE_ENTRY)
    assert isinstance(se, net.ServiceEntry)
    s = se.spec
    assert (s.location, s.resolution, s.addresses) == ("MESH_INTERNAL", "STATIC", ["192.192.192.192/24"])
    assert s.ports == [net.ServiceEntryPort(number=27018, name="mongodb", protocol="MONGO")]
    assert [e.address for e in s.endpoints] == ["2.2.2.2", "3.3.3.3"]
    assert s.endpoints[1].ports == {"mongodb": 27019} and s.endpoints[1].weight == 3
    dns = parse(DNS_SERVICE_ENTRY).spec
    assert dns.resolution == "DNS" and dns.location == "MESH_EXTERNAL" and dns.endpoints == []
    defaults = parse({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry", "metadata": {"name": "x"},
                      "spec": {"hosts": ["x.example.com"]}}).spec
    assert (defaults.location, defaults.resolution, defaults.ports) == ("MESH_EXTERNAL", "NONE", [])


def test_workload_entry_example():
    we = parse(WORKLOAD_ENTRY)
    assert isinstance(we, net.WorkloadEntry)
    s = we.spec
    assert (s.address, s.ports, s.network, s.locality, s.weight, s.service_account) == \
        ("2.2.2.2", {"http": 9080}, "vm-network", "us-central1/us-central1-a", 10, "details-legacy")
    assert parse(edit(WORKLOAD_ENTRY, lambda s: s.update(address="vm1.example.com"))).spec.address == "vm1.example.com"
    assert parse(edit(WORKLOAD_ENTRY, lambda s: s.update(address="unix:///var/run/a.sock", ports={})))


def test_sidecar_example():
    sc = parse(SIDECAR)
    assert isinstance(sc, net.Sidecar)
    s = sc.spec
    assert s.workload_selector.match_labels == {"app": "ratings"} == s.workload_selector.labels
    ing = s.ingress[0]
    assert (ing.port.number, ing.port.protocol, ing.port.name, ing.default_endpoint, ing.capture_mode) == \
        (9080, "HTTP", "somename", "127.0.0.1:8080", "NONE")
    assert s.egress[0].hosts == ["prod-us1/*"] and s.egress[1].port is None
    assert s.outbound_traffic_policy.mode == "REGISTRY_ONLY"


def test_gateway_example():
    gw = parse(GATEWAY)
    assert isinstance(gw, net.Gateway)
    http, https, mtls, tcp, passthrough = gw.spec.servers
    assert gw.spec.selector == {"app": "my-gateway-controller"}
    assert (http.port.number, http.port.protocol, http.tls.https_redirect, http.tls.mode) == (80, "HTTP", True, "PASSTHROUGH")
    assert https.tls.credential_name == "bookinfo-secret" and https.tls.server_certificate is None
    assert mtls.hosts == ["bookinfo-namespace/*.bookinfo.com"] and mtls.tls.min_protocol_version == "TLSV1_2"
    assert tcp.tls is None and tcp.name == "" and tcp.bind is None
    assert passthrough.tls.mode == "AUTO_PASSTHROUGH"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_every_served_version_is_accepted(kind, version):
    doc = copy.deepcopy(EXAMPLES[kind])
    doc["apiVersion"] = f"networking.istio.io/{version}"
    obj = parse_object(doc)
    assert type(obj) is BY_NAME[kind].model and obj.api_version == f"networking.istio.io/{version}"


def test_registry():
    istio = [k for k in KINDS if k.group == "networking.istio.io"]
    assert {(k.kind, k.plural) for k in istio} == {
        ("VirtualService", "virtualservices"), ("DestinationRule", "destinationrules"),
        ("ServiceEntry", "serviceentries"), ("WorkloadEntry", "workloadentries"), ("Sidecar", "sidecars"),
        ("Gateway", "gateways")}
    for k in istio:
        assert k.namespaced and k.versions == VERSIONS and k.api_version == "networking.istio.io/v1"
        assert k.path("ns1", "x") == f"/apis/networking.istio.io/v1/namespaces/ns1/{k.plural}/x"
        assert all(k.accepts(f"networking.istio.io/{v}") for v in VERSIONS)
        assert not k.accepts("networking.istio.io/v2") and not k.accepts("v1")


def test_unsupported_version_and_defaults():
    doc = copy.deepcopy(GATEWAY)
    doc["apiVersion"] = "networking.istio.io/v2"
    assert "unsupported apiVersion 'networking.istio.io/v2' for Gateway" in reject(doc)
    doc = copy.deepcopy(WORKLOAD_ENTRY)
    del doc["metadata"]["namespace"]
    assert parse_object(doc, default_namespace="vms").metadata.namespace == "vms"
    assert "spec: Field required" in reject({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                                             "metadata": {"name": "x"}})


# --- JSON names -----------------------------------------------------------------------------------
def test_json_names_that_to_camel_gets_wrong_round_trip():
    dr = parse(DESTINATION_RULE)
    dumped = dr.model_dump(by_alias=True, exclude_none=True)
    tp = dumped["spec"]["trafficPolicy"]
    assert tp["outlierDetection"]["consecutive5xxErrors"] == 7
    assert tp["connectionPool"]["http"]["http1MaxPendingRequests"] == 64
    assert tp["connectionPool"]["http"]["http2MaxRequests"] == 1000
    assert tp["loadBalancer"]["localityLbSetting"]["distribute"][0]["from"] == "us-west/zone1/*"
    again = parse_object(dumped)
    assert again == dr
    # The snake_case names are accepted too (populate_by_name), as everywhere in pilot.config.
    assert net.OutlierDetection.model_validate({"consecutive_5xx_errors": 2}).consecutive_5xx_errors == 2


def _proto_json_name(field: str) -> str:
    """protoc's json_name: drop each '_' and upper-case the next letter (digits stay as they are)."""
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), field)


def _models() -> list[type[BaseModel]]:
    return [v for v in vars(net).values()
            if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__.startswith(net.__name__ + ".")]


def test_every_field_reads_the_istio_json_name():
    wrong = []
    for model in _models():
        for name, field in model.model_fields.items():
            if model.__name__ == "WorkloadSelector":
                continue  # matchLabels and labels, checked below
            want = "from" if name == "from_" else _proto_json_name(name)
            if (field.alias or name) != want:
                wrong.append(f"{model.__name__}.{name}: {field.alias} != {want}")
    assert wrong == []
    dr_style = net.WorkloadSelector.model_validate({"matchLabels": {"app": "a"}})
    sidecar_style = net.WorkloadSelector.model_validate({"labels": {"app": "a"}})
    assert dr_style == sidecar_style and sidecar_style.labels == {"app": "a"}


# --- what istiod accepts that a naive check would not -------------------------------------------------
@pytest.mark.parametrize("change", [
    pytest.param(lambda s: s.update(hosts=["*"], gateways=["istio-system/edge"]), id="* with a gateway"),
    pytest.param(lambda s: s.update(hosts=["10.0.0.1"]), id="an IP host (istiod accepts it)"),
    pytest.param(lambda s: s.update(hosts=["*.bookinfo.svc.cluster.local"]), id="wildcard host"),
    pytest.param(lambda s: s.update(hosts=[]), id="delegate (no hosts)"),
    pytest.param(lambda s: s["http"][0]["route"].__setitem__(slice(None), [{"destination": {"host": "r"}, "weight": 50}]),
                 id="one destination, any weight"),
    pytest.param(lambda s: s["http"][0].update(timeout="1ms"), id="1ms timeout"),
])
def test_virtual_service_accepted(change):
    parse(edit(VIRTUAL_SERVICE, change))


# --- rejections: each names the field -----------------------------------------------------------------
def _http(doc: dict, i: int = 0) -> dict:
    return doc["http"][i]


CASES: list[tuple[str, dict, Callable[[dict], object], tuple[str, ...]]] = [
    # VirtualService
    ("weights not summing to 100", VIRTUAL_SERVICE,
     lambda s: _http(s)["route"][1].update(weight=20), ("spec.http.0.route", "total destination weight 95 != 100")),
    ("weight over 100", VIRTUAL_SERVICE,
     lambda s: _http(s)["route"][0].update(weight=175), ("spec.http.0.route.0.weight", "not in range 0..100")),
    ("invalid regex", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0].update(uri={"regex": "/api/(v1"}), ("spec.http.0.match.0.uri", "invalid regex")),
    ("lookahead is not RE2", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0]["headers"].update(cookie={"regex": "^(?!.*debug).*$"}),
     ("spec.http.0.match.0.headers.cookie", "lookaround")),
    ("regex in a query parameter", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0]["queryParams"].update(q={"regex": "*"}), ("queryParams.q", "invalid regex")),
    ("two match kinds", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0].update(uri={"exact": "/a", "prefix": "/a"}),
     ("spec.http.0.match.0.uri", "only one of exact, prefix or regex")),
    ("empty uri match", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0].update(uri={}), ("spec.http.0.match.0.uri", "one of exact, prefix or regex must be set")),
    ("empty prefix", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0].update(uri={"prefix": ""}), ("uri", "prefix string match should not be empty")),
    ("bad duration", VIRTUAL_SERVICE,
     lambda s: _http(s).update(timeout="10 seconds"), ("spec.http.0.timeout", "invalid duration")),
    ("zero timeout", VIRTUAL_SERVICE,
     lambda s: _http(s).update(timeout="0s"), ("spec.http.0.timeout", "greater than 1ms")),
    ("sub-millisecond precision", VIRTUAL_SERVICE,
     lambda s: _http(s).update(timeout="1.5ms"), ("spec.http.0.timeout", "ms precision")),
    ("bad perTryTimeout", VIRTUAL_SERVICE,
     lambda s: _http(s)["retries"].update(perTryTimeout="-1s"), ("spec.http.0.retries.perTryTimeout", "1ms")),
    ("bad fixedDelay", VIRTUAL_SERVICE,
     lambda s: _http(s)["fault"]["delay"].update(fixedDelay="5"), ("spec.http.0.fault.delay.fixedDelay", "invalid duration")),
    ("retry policy with 0 attempts", VIRTUAL_SERVICE,
     lambda s: _http(s)["retries"].update(attempts=0), ("spec.http.0.retries", "attempts are set to 0")),
    ("bad retryOn", VIRTUAL_SERVICE,
     lambda s: _http(s)["retries"].update(retryOn="5xx,sometimes"), ("spec.http.0.retries.retryOn", "'sometimes'")),
    ("fault percentage", VIRTUAL_SERVICE,
     lambda s: _http(s)["fault"]["abort"].update(percentage={"value": 150}),
     ("spec.http.0.fault.abort.percentage.value", "[0.0001, 100.0]")),
    ("empty fault", VIRTUAL_SERVICE, lambda s: _http(s).update(fault={}), ("spec.http.0.fault", "abort and/or a delay")),
    ("abort status", VIRTUAL_SERVICE,
     lambda s: _http(s)["fault"]["abort"].update(httpStatus=700), ("spec.http.0.fault.abort.httpStatus", "200-599")),
    ("empty hosts entry", VIRTUAL_SERVICE, lambda s: s.update(hosts=[""]), ("spec", "hosts[0]", "empty domain name")),
    ("* host without gateways", VIRTUAL_SERVICE,
     lambda s: s.update(hosts=["*"]), ("spec", "hosts[0]", "wildcard host * is not allowed")),
    ("* host bound to mesh too", VIRTUAL_SERVICE,
     lambda s: s.update(hosts=["*"], gateways=["mesh", "istio-system/edge"]), ("hosts[0]", "wildcard host *")),
    ("duplicate hosts", VIRTUAL_SERVICE,
     lambda s: s.update(hosts=["*.example.com", "a.example.com"]), ("hosts", "duplicate hosts")),
    ("bad host", VIRTUAL_SERVICE, lambda s: s.update(hosts=["bad_host.com"]), ("hosts[0]", "'bad_host' invalid")),
    ("no routes at all", VIRTUAL_SERVICE, lambda s: s.update(http=[]), ("spec", "http, tcp or tls must be provided")),
    ("delegate with gateways", VIRTUAL_SERVICE,
     lambda s: s.update(hosts=[], gateways=["istio-system/edge"]), ("delegate virtual service",)),
    ("delegation (not modelled)", VIRTUAL_SERVICE,
     lambda s: _http(s, 4).update(route=None, delegate={"name": "reviews-v1", "namespace": "bookinfo"}),
     ("spec.http.4", "delegation is not supported")),
    ("invalid redirect code", VIRTUAL_SERVICE,
     lambda s: _http(s, 1)["redirect"].update(redirectCode=305), ("spec.http.1.redirect.redirectCode", "305")),
    ("empty redirect", VIRTUAL_SERVICE,
     lambda s: _http(s, 1).update(redirect={"redirectCode": 302}), ("spec.http.1.redirect", "must specify URI")),
    ("route and redirect", VIRTUAL_SERVICE,
     lambda s: _http(s, 1).update(route=[{"destination": {"host": "a"}}]),
     ("spec.http.1", "both route and redirect")),
    ("no action", VIRTUAL_SERVICE,
     lambda s: _http(s, 2).pop("directResponse"), ("spec.http.2", "HTTP route, redirect or directResponse is required")),
    ("direct response status", VIRTUAL_SERVICE,
     lambda s: _http(s, 2)["directResponse"].update(status=99), ("spec.http.2.directResponse.status", "200-599")),
    ("rewrite uri and regex", VIRTUAL_SERVICE,
     lambda s: _http(s, 3)["rewrite"].update(uri="/x"), ("spec.http.3.rewrite", "only contain one of uri")),
    ("destination host *", VIRTUAL_SERVICE,
     lambda s: _http(s, 4)["route"][0]["destination"].update(host="*"), ("destination.host", "invalid destination host")),
    ("destination without host", VIRTUAL_SERVICE,
     lambda s: _http(s, 4)["route"][0]["destination"].pop("host"), ("spec.http.4.route.0.destination.host", "Field required")),
    ("bad subset name", VIRTUAL_SERVICE,
     lambda s: _http(s, 4)["route"][0]["destination"].update(subset="v1.0"), ("destination.subset", "subset name is invalid")),
    ("port out of range", VIRTUAL_SERVICE,
     lambda s: _http(s, 4)["route"][0]["destination"].update(port={"number": 70000}),
     ("destination.port.number", "1..65535")),
    ("header name", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0]["headers"].update({"bad header": {"exact": "x"}}), ("headers", "not a valid header name")),
    ("set Host on a response", VIRTUAL_SERVICE,
     lambda s: _http(s)["route"][0]["headers"]["response"]["set"].update(host="x"),
     ("spec.http.0.route.0.headers", "response.set", "Host")),
    ("header value %", VIRTUAL_SERVICE,
     lambda s: _http(s)["headers"]["request"]["set"].update({"x-pct": "50%"}), ("spec.http.0.headers", "x-pct")),
    ("cors method", VIRTUAL_SERVICE,
     lambda s: _http(s)["corsPolicy"].update(allowMethods=["get"]), ("corsPolicy.allowMethods", "not a supported HTTP method")),
    ("cors maxAge precision", VIRTUAL_SERVICE,
     lambda s: _http(s)["corsPolicy"].update(maxAge="1500ms"), ("corsPolicy.maxAge", "seconds precision")),
    ("JWT claim routing in the mesh", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0]["headers"].update({"@request.auth.claims.group": {"exact": "admin"}}),
     ("http[0].match[0]", "only supported for gateway")),
    ("source namespace", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0].update(sourceNamespace="Not_A_Label"), ("sourceNamespace", "invalid")),
    ("gateway reference", VIRTUAL_SERVICE,
     lambda s: s.update(gateways=["istio-system/"]), ("spec.gateways", "cannot be empty")),
    ("exportTo", VIRTUAL_SERVICE, lambda s: s.update(exportTo=["*", "."]), ("spec.exportTo", "public (*)")),
    ("exportTo ~ outside a ServiceEntry", VIRTUAL_SERVICE, lambda s: s.update(exportTo=["~"]), ("spec.exportTo",)),
    ("tcp route without destinations", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tcp"][0].update(route=[]), ("spec.tcp.0.route", "TCP route is required")),
    ("tls weights", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tls"][0]["route"][1].update(weight=30), ("spec.tls.0.route", "!= 100")),
    ("tls match without sniHosts", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tls"][0]["match"][0].pop("sniHosts"), ("spec.tls.0.match.0: sniHosts: TLS match must have at least one SNI host",)),
    ("sni host outside the hosts", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tls"][0]["match"][0].update(sniHosts=["login.other.org"]),
     ("tls[0].match[0].sniHosts[0]", "not a compatible subset")),
    ("destination subnet", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tcp"][0]["match"][0].update(destinationSubnets=["10.0.0.0/40"]),
     ("spec.tcp.0.match.0.destinationSubnets", "not a valid CIDR")),
    # DestinationRule
    ("duplicate subset names", DESTINATION_RULE,
     lambda s: s["subsets"][1].update(name="v1"), ("spec.subsets", "duplicate subset names: v1")),
    ("subset without a name", DESTINATION_RULE, lambda s: s["subsets"][0].pop("name"), ("spec.subsets.0.name",)),
    ("empty host", DESTINATION_RULE, lambda s: s.update(host=""), ("spec.host", "empty domain name")),
    ("LB with both simple and consistentHash", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(consistentHash={"useSourceIp": True}),
     ("spec.trafficPolicy.loadBalancer", "only one of simple or consistentHash")),
    ("two hash keys", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["portLevelSettings"][0]["loadBalancer"]["consistentHash"].update(httpHeaderName="x"),
     ("consistentHash", "only one hash key")),
    ("cookie without a name", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["portLevelSettings"][0]["loadBalancer"]["consistentHash"].update(httpCookie={"ttl": "1s"}),
     ("httpCookie.name", "name required")),
    ("empty traffic policy", DESTINATION_RULE,
     lambda s: s["subsets"][0].update(trafficPolicy={}), ("spec.subsets.0.trafficPolicy", "at least one field")),
    ("port policy without a port", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["portLevelSettings"][0].pop("port"), ("portLevelSettings.0.port", "valid port")),
    ("negative pool size", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["connectionPool"]["http"].update(http1MaxPendingRequests=-1),
     ("connectionPool.http.http1MaxPendingRequests", "greater than or equal to 0")),
    ("bad interval", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["outlierDetection"].update(interval="5 minutes"),
     ("outlierDetection.interval", "invalid duration")),
    ("ejection percent", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["outlierDetection"].update(maxEjectionPercent=101),
     ("outlierDetection.maxEjectionPercent", "0..100")),
    ("local origin failures without split", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["outlierDetection"].update(consecutiveLocalOriginFailures=5),
     ("outlierDetection", "splitExternalLocalOriginErrors")),
    ("locality weights", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"]["localityLbSetting"]["distribute"][0]["to"].update(
         {"us-west/zone2/*": 30}), ("localityLbSetting", "total locality weight 110 != 100")),
    ("distribute and failover", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"]["localityLbSetting"].update(
         failover=[{"from": "us-east", "to": "eu-west"}]), ("localityLbSetting", "'distribute' and 'failover'")),
    ("mutual TLS without a key", DESTINATION_RULE,
     lambda s: s["subsets"][1]["trafficPolicy"]["tls"].pop("privateKey"), ("tls", "private key required")),
    ("unknown TLS mode", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["tls"].update(mode="STRICT"), ("spec.trafficPolicy.tls.mode",)),
    ("workload selector with exportTo elsewhere", DESTINATION_RULE,
     lambda s: s.update(workloadSelector={"matchLabels": {"app": "reviews"}}), ("spec.exportTo", "workload selector")),
    # ServiceEntry
    ("STATIC ServiceEntry without endpoints", SERVICE_ENTRY,
     lambda s: s.pop("endpoints"), ("spec", "endpoints", "resolution type STATIC")),
    ("STATIC endpoint not an IP", SERVICE_ENTRY,
     lambda s: s["endpoints"][0].update(address="mongo.example.com"), ("endpoints[0].address", "not a valid IP")),
    ("endpoint port not a service port", SERVICE_ENTRY,
     lambda s: s["endpoints"][1].update(ports={"http": 80}), ("endpoints[1].ports", "'http' is not defined")),
    ("endpoints and workloadSelector", SERVICE_ENTRY,
     lambda s: s.update(workloadSelector={"labels": {"app": "mongo"}}), ("only one of workloadSelector or endpoints",)),
    ("empty hosts", SERVICE_ENTRY, lambda s: s.update(hosts=[]), ("spec.hosts", "at least one host")),
    ("no hosts", SERVICE_ENTRY, lambda s: s.pop("hosts"), ("spec.hosts", "at least one host")),
    ("host *", SERVICE_ENTRY, lambda s: s.update(hosts=["*"]), ("spec.hosts", "invalid host *")),
    ("duplicate port numbers", SERVICE_ENTRY,
     lambda s: s["ports"].append({"number": 27018, "name": "mongo2"}), ("spec.ports", "27018 already defined")),
    ("duplicate port names", SERVICE_ENTRY,
     lambda s: s["ports"].append({"number": 27020, "name": "mongodb"}), ("spec.ports", "'mongodb' already defined")),
    ("bad protocol", SERVICE_ENTRY,
     lambda s: s["ports"][0].update(protocol="SMTP"), ("spec.ports.0.protocol", "unsupported protocol")),
    ("port without a name", SERVICE_ENTRY, lambda s: s["ports"][0].pop("name"), ("spec.ports.0.name",)),
    ("bad address", SERVICE_ENTRY, lambda s: s.update(addresses=["300.1.1.1"]), ("spec.addresses", "not a valid IP")),
    ("unknown resolution", SERVICE_ENTRY, lambda s: s.update(resolution="MAGIC"), ("spec.resolution",)),
    ("DNS wildcard host without endpoints", DNS_SERVICE_ENTRY,
     lambda s: s.update(hosts=["*.googleapis.com"]), ("hosts[0]", "must be FQDN")),
    ("DNS with several hosts on a TCP port", DNS_SERVICE_ENTRY,
     lambda s: s["ports"][0].update(protocol="TCP"), ("multiple hosts provided with non-HTTP, non-TLS ports",)),
    ("NONE with endpoints", DNS_SERVICE_ENTRY,
     lambda s: s.update(resolution="NONE", endpoints=[{"address": "1.1.1.1"}]), ("resolution type NONE",)),
    ("CIDR with DNS", DNS_SERVICE_ENTRY,
     lambda s: s.update(addresses=["10.0.0.0/8"]), ("addresses", "CIDR addresses are allowed only")),
    ("exportTo ~ and others", DNS_SERVICE_ENTRY, lambda s: s.update(exportTo=["~", "."]), ("spec.exportTo", "no one (~)")),
    # WorkloadEntry
    ("no address", WORKLOAD_ENTRY, lambda s: s.update(address="", network=""), ("spec", "address is required")),
    ("bad address", WORKLOAD_ENTRY, lambda s: s.update(address="not an address"), ("address", "not a valid FQDN or an IP")),
    ("unix endpoint with ports", WORKLOAD_ENTRY,
     lambda s: s.update(address="unix:///var/run/a.sock"), ("must not include ports",)),
    ("port name", WORKLOAD_ENTRY, lambda s: s.update(ports={"http_1": 80}), ("spec.ports", "invalid port name")),
    ("label value", WORKLOAD_ENTRY, lambda s: s.update(labels={"app": "-bad-"}), ("spec.labels", "invalid label value")),
    # Sidecar
    ("bad egress host format", SIDECAR,
     lambda s: s["egress"][1]["hosts"].append("reviews.prod.svc.cluster.local"),
     ("spec.egress.1.hosts", "must be of form namespace/dnsName")),
    ("egress short name", SIDECAR,
     lambda s: s["egress"][0].update(hosts=["prod-us1/reviews"]), ("spec.egress.0.hosts", "short names")),
    ("egress namespace", SIDECAR,
     lambda s: s["egress"][0].update(hosts=["Prod_US/*"]), ("spec.egress.0.hosts", "invalid namespace value")),
    ("egress partial wildcard", SIDECAR,
     lambda s: s["egress"][0].update(hosts=["prod/foo*.example.com"]), ("spec.egress.0.hosts", "partial wildcard")),
    ("egress without hosts", SIDECAR, lambda s: s["egress"][0].pop("hosts"), ("spec.egress.0.hosts", "at least one host")),
    ("catch-all egress not last", SIDECAR, lambda s: s["egress"].reverse(), ("spec.egress", "should be the last")),
    ("empty sidecar", SIDECAR, lambda s: s.clear(), ("spec", "empty configuration")),
    ("ingress without port", SIDECAR, lambda s: s["ingress"][0].pop("port"), ("spec.ingress.0.port", "port is required")),
    ("defaultEndpoint", SIDECAR,
     lambda s: s["ingress"][0].update(defaultEndpoint="10.0.0.1:8080"), ("spec.ingress.0", "defaultEndpoint")),
    ("ingress protocol", SIDECAR,
     lambda s: s["ingress"][0]["port"].update(protocol="SMTP"), ("spec.ingress.0", "port.protocol")),
    ("selector wildcard", SIDECAR,
     lambda s: s["workloadSelector"].update(labels={"app": "*"}), ("spec.workloadSelector", "wildcard")),
    ("UDS egress without a socket bind", SIDECAR,
     lambda s: s["egress"][0]["port"].update(number=0), ("spec.egress.0", "unix domain socket bind")),
    # Gateway
    ("server without hosts", GATEWAY, lambda s: s["servers"][0].update(hosts=[]), ("spec.servers.0.hosts", "at least one host")),
    ("no servers", GATEWAY, lambda s: s.update(servers=[]), ("spec.servers", "at least one server")),
    ("duplicate port names", GATEWAY,
     lambda s: s["servers"][1]["port"].update(name="http"), ("spec.servers", "duplicate name http")),
    ("HTTPS without tls", GATEWAY, lambda s: s["servers"][1].pop("tls"), ("spec.servers.1", "must have TLS settings")),
    ("SIMPLE without certificate", GATEWAY,
     lambda s: s["servers"][1]["tls"].pop("credentialName"), ("spec.servers.1.tls", "SIMPLE TLS requires a server certificate")),
    ("MUTUAL without CA", GATEWAY,
     lambda s: s["servers"][2]["tls"].pop("caCertificates"), ("spec.servers.2.tls", "client CA bundle")),
    ("TLS settings on a TCP port", GATEWAY,
     lambda s: s["servers"][3].update(tls={"mode": "SIMPLE", "credentialName": "c"}),
     ("spec.servers.3", "non HTTPS/TLS ports")),
    ("port without a name", GATEWAY, lambda s: s["servers"][3]["port"].pop("name"), ("spec.servers.3", "port name must be set")),
    ("port number", GATEWAY, lambda s: s["servers"][3]["port"].update(number=0), ("spec.servers.3", "port.number")),
    ("server without a port", GATEWAY, lambda s: s["servers"][3].pop("port"), ("spec.servers.3.port", "port is required")),
    ("server host", GATEWAY, lambda s: s["servers"][3].update(hosts=["*/foo"]), ("spec.servers.3.hosts", "short names")),
    ("tls mode", GATEWAY, lambda s: s["servers"][4]["tls"].update(mode="STRICT"), ("spec.servers.4.tls.mode",)),
]


@pytest.mark.parametrize("base,change,expected", [pytest.param(b, c, e, id=i) for i, b, c, e in CASES])
def test_rejected_with_a_reason_naming_the_field(base, change, expected):
    reason = reject(edit(base, change))
    for text in expected:
        assert text in reason, f"{text!r} not in {reason!r}"


def test_gateway_name_must_be_a_dns_label():
    doc = copy.deepcopy(GATEWAY)
    doc["metadata"]["name"] = "my.gateway"
    assert "metadata.name: invalid gateway name 'my.gateway'" in reject(doc)


def test_export_to_dot_and_own_namespace_are_duplicates():
    doc = edit(VIRTUAL_SERVICE, lambda s: s.update(exportTo=["bookinfo", "."]))
    assert "spec.exportTo: duplicate entries in exportTo: . and current namespace bookinfo" in reject(doc)


@pytest.mark.parametrize("expr", [r"^/api/v[0-9]+/.*$", r"\pL+", r"\p{Greek}", r"(?i)^abc\z", r"(?<name>a+)b",
                                  r"[[:alpha:]]+", r"a{2,3}?", r"[\]a-z]"])
def test_re2_syntax_accepted(expr):
    assert net.validate_regex(expr, "r") is None


@pytest.mark.parametrize("expr", [r"(a", r"a(?=b)", r"(?<!a)b", r"(a)\1", r"a*+", r"(?>a)", r"abc\Z", "", "a" * 1025])
def test_not_re2_rejected(expr):
    assert net.validate_regex(expr, "r") is not None


def test_host_matching_helpers():
    assert net.host_matches("*.example.com", "a.example.com") and net.host_matches("*.com", "*.example.com")
    assert not net.host_matches("a.example.com", "b.example.com")
    assert net.host_subset_of("a.example.com", "*.example.com") and not net.host_subset_of("*.example.com", "a.example.com")
    assert net.validate_wildcard_domain("*.example.com") is None and net.validate_wildcard_domain("a.*.com")
    assert net.validate_fqdn("reviews.default.svc.cluster.local.") is None and net.validate_fqdn("a.123")
