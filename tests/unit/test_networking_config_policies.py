"""networking.istio.io DestinationRule, ServiceEntry, WorkloadEntry, Sidecar and Gateway: realistic
manifests parse into typed objects through `parse_object`, and istiod's validation-webhook rules
reject bad ones with a reason that names the field."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from pilot.config import networking as net

from .networking_examples import (
    DESTINATION_RULE,
    DNS_SERVICE_ENTRY,
    GATEWAY,
    SERVICE_ENTRY,
    SIDECAR,
    WORKLOAD_ENTRY,
    edit,
    parse,
    reject,
)


# --- parsing --------------------------------------------------------------------------------------
def test_destination_rule_example():
    dr = parse(DESTINATION_RULE)
    assert isinstance(dr, net.DestinationRule)
    tp = dr.spec.traffic_policy
    assert dr.spec.host == "reviews.bookinfo.svc.cluster.local" and dr.spec.export_to == [".", "istio-system"]
    assert tp.load_balancer.simple == "LEAST_REQUEST" and tp.load_balancer.consistent_hash is None
    warmup = tp.load_balancer.warmup
    assert (warmup.duration, warmup.minimum_percent, warmup.aggression) == ("60s", 20, 2)
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
    assert (s.address, s.ports, s.locality, s.weight, s.service_account) == \
        ("2.2.2.2", {"http": 9080}, "us-central1/us-central1-a", 10, "details-legacy")
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


# --- rejections: each names the field -----------------------------------------------------------------
CASES: list[tuple[str, dict, Callable[[dict], object], tuple[str, ...]]] = [
    # DestinationRule
    ("duplicate subset names", DESTINATION_RULE,
     lambda s: s["subsets"][1].update(name="v1"), ("spec.subsets", "duplicate subset names: v1")),
    ("subset without a name", DESTINATION_RULE, lambda s: s["subsets"][0].pop("name"), ("spec.subsets[0].name",)),
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
     lambda s: s["subsets"][0].update(trafficPolicy={}), ("spec.subsets[0].trafficPolicy", "at least one field")),
    ("port policy without a port", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["portLevelSettings"][0].pop("port"), ("portLevelSettings[0].port", "valid port")),
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
    ("locality weights not summing to 100", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(localityLbSetting={
         "distribute": [{"from": "r1/zone-a/*", "to": {"r1/zone-a/*": 80, "r1/zone-b/*": 10}}]}),
     ("spec.trafficPolicy.loadBalancer.localityLbSetting", "total locality weight 90 != 100")),
    ("locality distribute with a wildcard in the middle", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(localityLbSetting={
         "distribute": [{"from": "r1/*/sz", "to": {"r1/*": 100}}]}),
     ("localityLbSetting", "wildcard '*' number can not exceed 1 and must be in the end")),
    ("locality distribute with an empty zone", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(localityLbSetting={
         "distribute": [{"from": "r1//sz", "to": {"r1/*": 100}}]}),
     ("localityLbSetting", "must not contain empty region/zone/subzone info")),
    ("locality failover to the same region", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(localityLbSetting={
         "failover": [{"from": "r1", "to": "r1"}]}),
     ("localityLbSetting", "must specify different regions")),
    ("locality failover naming a zone", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(localityLbSetting={
         "failover": [{"from": "r1/zone-a", "to": "r2"}]}),
     ("localityLbSetting", "failover only specify region")),
    ("locality distribute and failover together", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(localityLbSetting={
         "distribute": [{"from": "r1/*", "to": {"r1/*": 100}}], "failover": [{"from": "r1", "to": "r2"}]}),
     ("localityLbSetting", "can not simultaneously specify 'distribute' and 'failover'")),
    ("locality failover with a topology failoverPriority", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(localityLbSetting={
         "failover": [{"from": "r1", "to": "r2"}], "failoverPriority": ["topology.kubernetes.io/zone"]}),
     ("localityLbSetting", "can not simultaneously set 'failover' and topology label")),
    ("overlapping distribute sources", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(localityLbSetting={
         "distribute": [{"from": "r1/*", "to": {"r1/*": 100}}, {"from": "r1/zone-a", "to": {"r1/*": 100}}]}),
     ("localityLbSetting", "overlap with previous specified ones")),
    ("warmup without a duration", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["loadBalancer"].update(warmup={"minimumPercent": 10}),
     ("loadBalancer.warmup.duration", "duration is required")),
    ("maglev table size not prime", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["portLevelSettings"][0]["loadBalancer"]["consistentHash"].update(
         maglev={"tableSize": 1000}), ("consistentHash.maglev.tableSize", "prime")),
    ("misspelt pool field", DESTINATION_RULE,
     lambda s: s["trafficPolicy"]["connectionPool"]["tcp"].update(maxConection=1),
     ("spec.trafficPolicy.connectionPool.tcp.maxConection: unknown field",)),
    ("misspelt field alone in a traffic policy", DESTINATION_RULE,
     lambda s: s["subsets"][0].update(trafficPolicy={"loadBalncer": {"simple": "RANDOM"}}),
     ("spec.subsets[0].trafficPolicy.loadBalncer: unknown field",)),
    ("retry budget over 100%", DESTINATION_RULE,
     lambda s: s["trafficPolicy"].update(retryBudget={"percent": 120}), ("spec.trafficPolicy.retryBudget.percent",)),
    ("tunnel (not generated)", DESTINATION_RULE,
     lambda s: s["trafficPolicy"].update(tunnel={"targetHost": "a", "targetPort": 80}),
     ("spec.trafficPolicy.tunnel", "not supported")),
    ("Sidecar selector spelling in a DestinationRule", DESTINATION_RULE,
     lambda s: s.update(exportTo=["."], workloadSelector={"labels": {"app": "reviews"}}),
     ("spec.workloadSelector.labels: unknown field",)),
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
     lambda s: s["ports"][0].update(protocol="SMTP"), ("spec.ports[0].protocol", "unsupported protocol")),
    ("port without a name", SERVICE_ENTRY, lambda s: s["ports"][0].pop("name"), ("spec.ports[0].name",)),
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
    ("no address", WORKLOAD_ENTRY, lambda s: s.update(address=""), ("spec", "address is required")),
    ("bad address", WORKLOAD_ENTRY, lambda s: s.update(address="not an address"), ("address", "not a valid FQDN or an IP")),
    ("unix endpoint with ports", WORKLOAD_ENTRY,
     lambda s: s.update(address="unix:///var/run/a.sock"), ("must not include ports",)),
    ("port name", WORKLOAD_ENTRY, lambda s: s.update(ports={"http_1": 80}), ("spec.ports", "invalid port name")),
    ("label value", WORKLOAD_ENTRY, lambda s: s.update(labels={"app": "-bad-"}), ("spec.labels", "invalid label value")),
    # Sidecar
    ("bad egress host format", SIDECAR,
     lambda s: s["egress"][1]["hosts"].append("reviews.prod.svc.cluster.local"),
     ("spec.egress[1].hosts", "must be of form namespace/dnsName")),
    ("egress short name", SIDECAR,
     lambda s: s["egress"][0].update(hosts=["prod-us1/reviews"]), ("spec.egress[0].hosts", "short names")),
    ("egress namespace", SIDECAR,
     lambda s: s["egress"][0].update(hosts=["Prod_US/*"]), ("spec.egress[0].hosts", "invalid namespace value")),
    ("egress partial wildcard", SIDECAR,
     lambda s: s["egress"][0].update(hosts=["prod/foo*.example.com"]), ("spec.egress[0].hosts", "partial wildcard")),
    ("egress without hosts", SIDECAR, lambda s: s["egress"][0].pop("hosts"), ("spec.egress[0].hosts", "at least one host")),
    ("catch-all egress not last", SIDECAR, lambda s: s["egress"].reverse(), ("spec.egress", "should be the last")),
    ("empty sidecar", SIDECAR, lambda s: s.clear(), ("spec", "empty configuration")),
    ("ingress without port", SIDECAR, lambda s: s["ingress"][0].pop("port"), ("spec.ingress[0].port", "port is required")),
    ("defaultEndpoint", SIDECAR,
     lambda s: s["ingress"][0].update(defaultEndpoint="10.0.0.1:8080"), ("spec.ingress[0]", "defaultEndpoint")),
    ("ingress protocol", SIDECAR,
     lambda s: s["ingress"][0]["port"].update(protocol="SMTP"), ("spec.ingress[0]", "port.protocol")),
    ("selector wildcard", SIDECAR,
     lambda s: s["workloadSelector"].update(labels={"app": "*"}), ("spec.workloadSelector", "wildcard")),
    ("UDS egress without a socket bind", SIDECAR,
     lambda s: s["egress"][0]["port"].update(number=0), ("spec.egress[0]", "unix domain socket bind")),
    # Valid for istiod, not generated here: refused rather than served as something else (a UDS
    # listener would become a catch-all, HTTP_PROXY a plain TCP listener).
    ("UDS egress listener", SIDECAR,
     lambda s: s["egress"][0].update(port={"number": 0}, bind="unix:///var/run/app.sock"),
     ("spec.egress[0]", "unix domain socket egress listener is not supported")),
    ("HTTP_PROXY egress listener", SIDECAR,
     lambda s: s["egress"][0]["port"].update(protocol="HTTP_PROXY"),
     ("spec.egress[0]", "HTTP_PROXY is not supported")),
    # Gateway
    ("server without hosts", GATEWAY, lambda s: s["servers"][0].update(hosts=[]), ("spec.servers[0].hosts", "at least one host")),
    ("no servers", GATEWAY, lambda s: s.update(servers=[]), ("spec.servers", "at least one server")),
    ("duplicate port names", GATEWAY,
     lambda s: s["servers"][1]["port"].update(name="http"), ("spec.servers", "duplicate name http")),
    ("HTTPS without tls", GATEWAY, lambda s: s["servers"][1].pop("tls"), ("spec.servers[1]", "must have TLS settings")),
    ("SIMPLE without certificate", GATEWAY,
     lambda s: s["servers"][1]["tls"].pop("credentialName"), ("spec.servers[1].tls", "SIMPLE TLS requires a server certificate")),
    ("MUTUAL without CA", GATEWAY,
     lambda s: s["servers"][2].update(tls={"mode": "MUTUAL"}), ("spec.servers[2].tls", "client CA bundle")),
    ("certificates from files", GATEWAY,
     lambda s: s["servers"][2].update(tls={"mode": "MUTUAL", "serverCertificate": "/etc/certs/server.pem",
                                           "privateKey": "/etc/certs/key.pem", "caCertificates": "/etc/ca.pem"}),
     ("spec.servers[2].tls.serverCertificate: serverCertificate is not supported",
      "spec.servers[2].tls.caCertificates: caCertificates is not supported")),
    ("TLS settings on a TCP port", GATEWAY,
     lambda s: s["servers"][3].update(tls={"mode": "SIMPLE", "credentialName": "c"}),
     ("spec.servers[3]", "non HTTPS/TLS ports")),
    ("port without a name", GATEWAY, lambda s: s["servers"][3]["port"].pop("name"), ("spec.servers[3]", "port name must be set")),
    ("port number", GATEWAY, lambda s: s["servers"][3]["port"].update(number=0), ("spec.servers[3]", "port.number")),
    ("server without a port", GATEWAY, lambda s: s["servers"][3].pop("port"), ("spec.servers[3].port", "port is required")),
    ("server host", GATEWAY, lambda s: s["servers"][3].update(hosts=["*/foo"]), ("spec.servers[3].hosts", "short names")),
    ("tls mode", GATEWAY, lambda s: s["servers"][4]["tls"].update(mode="STRICT"), ("spec.servers[4].tls.mode",)),
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


def test_service_entry_export_to_fewer_namespaces_is_refused() -> None:
    """The registry shows ServiceEntries everywhere: a narrower exportTo would be ignored, hence refused."""
    for export in (["."], ["prod"], ["~"]):
        reason = reject(edit(SERVICE_ENTRY, lambda s, e=export: s.update(exportTo=e)))
        assert "spec.exportTo" in reason and "not supported" in reason, reason
    assert parse(edit(SERVICE_ENTRY, lambda s: s.update(exportTo=["*"])))
