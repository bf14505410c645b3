"""networking.istio.io kinds, VirtualService and what every kind shares: realistic manifests parse
into typed objects through `parse_object` (every served API version), the Istio JSON names, and
istiod's validation-webhook rules reject bad VirtualServices with a reason that names the field;
plus the RE2 and host-matching helpers."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import pytest
from pydantic import BaseModel, ValidationError

from pilot.config import networking as net
from pilot.config.kinds import BY_NAME, KINDS
from pilot.config.validation import parse_object

from .networking_examples import (
    DESTINATION_RULE,
    EXAMPLES,
    GATEWAY,
    TCP_TLS_VIRTUAL_SERVICE,
    VERSIONS,
    VIRTUAL_SERVICE,
    WORKLOAD_ENTRY,
    edit,
    parse,
    reject,
)


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
    assert tcp.match[0].port == 27017
    assert tcp.route[0].destination.port.number == 5555 and tcp.route[0].weight == 0
    assert tls.match[0].sni_hosts == ["login.example.com"] and [d.weight for d in tls.route] == [80, 20]


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
        ("Gateway", "gateways"), ("EnvoyFilter", "envoyfilters"), ("ProxyConfig", "proxyconfigs"),
        ("WorkloadGroup", "workloadgroups")}
    envoy_filter = BY_NAME["EnvoyFilter"]  # istio serves it as v1alpha3 only
    assert envoy_filter.versions == ("v1alpha3",) and envoy_filter.accepts("networking.istio.io/v1alpha3")
    assert not envoy_filter.accepts("networking.istio.io/v1")
    proxy_config = BY_NAME["ProxyConfig"]  # and ProxyConfig as v1beta1 only
    assert proxy_config.versions == ("v1beta1",) and not proxy_config.accepts("networking.istio.io/v1")
    for k in istio:
        if k in (envoy_filter, proxy_config):
            continue
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
    assert tp["loadBalancer"]["warmup"]["minimumPercent"] == 20
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
            want = "from" if name == "from_" else _proto_json_name(name)
            if (field.alias or name) != want:
                wrong.append(f"{model.__name__}.{name}: {field.alias} != {want}")
    assert wrong == []
    # istio's two selectors: DestinationRule's (type.v1beta1) is matchLabels, Sidecar's and
    # ServiceEntry's (networking.v1alpha3) is labels; neither spelling is accepted for the other.
    assert net.WorkloadSelector.model_validate({"matchLabels": {"app": "a"}}).match_labels == {"app": "a"}
    assert net.NetworkingWorkloadSelector.model_validate({"labels": {"app": "a"}}).match_labels == {"app": "a"}
    for model, other in ((net.WorkloadSelector, "labels"), (net.NetworkingWorkloadSelector, "matchLabels")):
        with pytest.raises(ValidationError):
            model.model_validate({other: {"app": "a"}})


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
     lambda s: _http(s)["route"][1].update(weight=20), ("spec.http[0].route", "total destination weight 95 != 100")),
    ("weight over 100", VIRTUAL_SERVICE,
     lambda s: _http(s)["route"][0].update(weight=175), ("spec.http[0].route[0].weight", "not in range 0..100")),
    ("invalid regex", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0].update(uri={"regex": "/api/(v1"}), ("spec.http[0].match[0].uri", "invalid regex")),
    ("lookahead is not RE2", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0]["headers"].update(cookie={"regex": "^(?!.*debug).*$"}),
     ("spec.http[0].match[0].headers.cookie", "lookaround")),
    ("regex in a query parameter", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0]["queryParams"].update(q={"regex": "*"}), ("queryParams.q", "invalid regex")),
    ("two match kinds", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0].update(uri={"exact": "/a", "prefix": "/a"}),
     ("spec.http[0].match[0].uri", "only one of exact, prefix or regex")),
    ("empty uri match", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0].update(uri={}), ("spec.http[0].match[0].uri", "one of exact, prefix or regex must be set")),
    ("empty prefix", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0].update(uri={"prefix": ""}), ("uri", "prefix string match should not be empty")),
    ("bad duration", VIRTUAL_SERVICE,
     lambda s: _http(s).update(timeout="10 seconds"), ("spec.http[0].timeout", "invalid duration")),
    ("zero timeout", VIRTUAL_SERVICE,
     lambda s: _http(s).update(timeout="0s"), ("spec.http[0].timeout", "greater than 1ms")),
    ("sub-millisecond precision", VIRTUAL_SERVICE,
     lambda s: _http(s).update(timeout="1.5ms"), ("spec.http[0].timeout", "ms precision")),
    ("bad perTryTimeout", VIRTUAL_SERVICE,
     lambda s: _http(s)["retries"].update(perTryTimeout="-1s"), ("spec.http[0].retries.perTryTimeout", "1ms")),
    ("bad fixedDelay", VIRTUAL_SERVICE,
     lambda s: _http(s)["fault"]["delay"].update(fixedDelay="5"), ("spec.http[0].fault.delay.fixedDelay", "invalid duration")),
    ("retry policy with 0 attempts", VIRTUAL_SERVICE,
     lambda s: _http(s)["retries"].update(attempts=0), ("spec.http[0].retries", "attempts are set to 0")),
    ("bad retryOn", VIRTUAL_SERVICE,
     lambda s: _http(s)["retries"].update(retryOn="5xx,sometimes"), ("spec.http[0].retries.retryOn", "'sometimes'")),
    ("fault percentage", VIRTUAL_SERVICE,
     lambda s: _http(s)["fault"]["abort"].update(percentage={"value": 150}),
     ("spec.http[0].fault.abort.percentage.value", "[0.0001, 100.0]")),
    ("empty fault", VIRTUAL_SERVICE, lambda s: _http(s).update(fault={}), ("spec.http[0].fault", "abort and/or a delay")),
    ("abort status", VIRTUAL_SERVICE,
     lambda s: _http(s)["fault"]["abort"].update(httpStatus=700), ("spec.http[0].fault.abort.httpStatus", "200-599")),
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
     lambda s: (_http(s, 4).pop("route"), _http(s, 4).update(delegate={"name": "reviews-v1", "namespace": "bookinfo"})),
     ("spec.http[4].delegate: delegate is not supported",)),
    ("invalid redirect code", VIRTUAL_SERVICE,
     lambda s: _http(s, 1)["redirect"].update(redirectCode=305), ("spec.http[1].redirect.redirectCode", "305")),
    ("empty redirect", VIRTUAL_SERVICE,
     lambda s: _http(s, 1).update(redirect={"redirectCode": 302}), ("spec.http[1].redirect", "must specify URI")),
    ("route and redirect", VIRTUAL_SERVICE,
     lambda s: _http(s, 1).update(route=[{"destination": {"host": "a"}}]),
     ("spec.http[1]", "both route and redirect")),
    ("no action", VIRTUAL_SERVICE,
     lambda s: _http(s, 2).pop("directResponse"), ("spec.http[2]", "HTTP route, redirect or directResponse is required")),
    ("direct response status", VIRTUAL_SERVICE,
     lambda s: _http(s, 2)["directResponse"].update(status=99), ("spec.http[2].directResponse.status", "200-599")),
    ("rewrite uri and regex", VIRTUAL_SERVICE,
     lambda s: _http(s, 3)["rewrite"].update(uri="/x"), ("spec.http[3].rewrite", "only contain one of uri")),
    ("destination host *", VIRTUAL_SERVICE,
     lambda s: _http(s, 4)["route"][0]["destination"].update(host="*"), ("destination.host", "invalid destination host")),
    ("destination without host", VIRTUAL_SERVICE,
     lambda s: _http(s, 4)["route"][0]["destination"].pop("host"), ("spec.http[4].route[0].destination.host", "Field required")),
    ("bad subset name", VIRTUAL_SERVICE,
     lambda s: _http(s, 4)["route"][0]["destination"].update(subset="v1.0"), ("destination.subset", "subset name is invalid")),
    ("port out of range", VIRTUAL_SERVICE,
     lambda s: _http(s, 4)["route"][0]["destination"].update(port={"number": 70000}),
     ("destination.port.number", "1..65535")),
    ("header name", VIRTUAL_SERVICE,
     lambda s: _http(s)["match"][0]["headers"].update({"bad header": {"exact": "x"}}), ("headers", "not a valid header name")),
    ("set Host on a response", VIRTUAL_SERVICE,
     lambda s: _http(s)["route"][0]["headers"]["response"]["set"].update(host="x"),
     ("spec.http[0].route[0].headers", "response.set", "Host")),
    ("header value %", VIRTUAL_SERVICE,
     lambda s: _http(s)["headers"]["request"]["set"].update({"x-pct": "50%"}), ("spec.http[0].headers", "x-pct")),
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
     lambda s: s["tcp"][0].update(route=[]), ("spec.tcp[0].route", "TCP route is required")),
    ("tls weights", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tls"][0]["route"][1].update(weight=30), ("spec.tls[0].route", "!= 100")),
    ("tls match without sniHosts", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tls"][0]["match"][0].pop("sniHosts"), ("spec.tls[0].match[0]: sniHosts: TLS match must have at least one SNI host",)),
    ("sni host outside the hosts", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tls"][0]["match"][0].update(sniHosts=["login.other.org"]),
     ("tls[0].match[0].sniHosts[0]", "not a compatible subset")),
    ("destination subnet (not generated)", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tcp"][0]["match"][0].update(destinationSubnets=["10.0.0.0/16"]),
     ("spec.tcp[0].match[0].destinationSubnets: destinationSubnets is not supported",)),
    ("TLS source labels on a gateway (not generated)", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tls"][0]["match"][0].update(sourceLabels={"app": "a"}),
     ("tls[0].match[0]: sourceLabels/sourceNamespace are not supported on gateways",)),
    ("TCP source namespace for a gateway's match", TCP_TLS_VIRTUAL_SERVICE,
     lambda s: s["tcp"][0]["match"][0].update(sourceNamespace="prod", gateways=["istio-system/edge-gateway"]),
     ("tcp[0].match[0]: sourceLabels/sourceNamespace are not supported on gateways",)),
    ("misspelt retries", VIRTUAL_SERVICE, lambda s: _http(s).update(retrys={"attempts": 3}),
     ("spec.http[0].retrys: unknown field",)),
    ("misspelt timeout", VIRTUAL_SERVICE, lambda s: _http(s).update(timout="5s"), ("spec.http[0].timout: unknown field",)),
    ("misspelt http, not masked by the rules check", VIRTUAL_SERVICE, lambda s: s.update(htp=s.pop("http")),
     ("spec.htp: unknown field",)),
    ("mirror and mirrors", VIRTUAL_SERVICE,
     lambda s: _http(s).update(mirror={"host": "a"}, mirrors=[{"destination": {"host": "b"}}]),
     ("cannot contain both mirror and mirrors",)),
    ("mirror without a destination", VIRTUAL_SERVICE,
     lambda s: _http(s).update(mirrors=[{"percentage": {"value": 5}}]), ("spec.http[0].mirrors[0].destination",)),
]


@pytest.mark.parametrize("base,change,expected", [pytest.param(b, c, e, id=i) for i, b, c, e in CASES])
def test_rejected_with_a_reason_naming_the_field(base, change, expected):
    reason = reject(edit(base, change))
    for text in expected:
        assert text in reason, f"{text!r} not in {reason!r}"


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
