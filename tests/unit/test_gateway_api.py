"""Gateway API translation and status, pure: objects in, (Istio config, status) out. The e2e tests
prove traffic; these pin the status reasons, precedence, validation and cache-key behaviour."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from pilot.config.validation import InvalidObject, parse_object
from pilot.model.gateway_api import translate
from pilot.model.gateway_api.conditions import stamp
from pilot.model.gateway_api.hostnames import intersect, isolate
from pilot.model.gateways import GatewayIndex
from pilot.model.store import ConfigKey, Store
from tests.support.certs import issue, make_ca, tls_secret_yaml

API = "gateway.networking.k8s.io"
CLASS = f"apiVersion: {API}/v1\nkind: GatewayClass\nmetadata: {{name: istio}}\nspec: {{controllerName: " \
        "istio.io/gateway-controller}\n"


def store_of(*docs: str) -> Store:
    store = Store()
    for text in docs:
        for doc in yaml.safe_load_all(textwrap.dedent(text)):
            if doc:
                store.apply(parse_object(doc))
    return store


def gateway(listeners: str, name: str = "web", class_name: str = "istio", extra: str = "") -> str:
    return (f"apiVersion: {API}/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: infra, generation: 3}}\n"
            f"spec:\n  gatewayClassName: {class_name}\n{extra}  listeners:\n"
            + textwrap.indent(textwrap.dedent(listeners), "  "))


def route(name: str, spec: str, kind: str = "HTTPRoute", version: str = "v1", namespace: str = "default",
          created: str = "") -> str:
    stamp_ = f", creationTimestamp: '{created}'" if created else ""
    return (f"apiVersion: {API}/{version}\nkind: {kind}\nmetadata: {{name: {name}, namespace: {namespace}{stamp_}}}\n"
            "spec:\n" + textwrap.indent(textwrap.dedent(spec), "  "))


SVC = """\
    apiVersion: v1
    kind: Service
    metadata: {name: alpha, namespace: default}
    spec: {ports: [{name: http, port: 80}]}
    """


def conds(status: dict) -> dict:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def listeners(result, name: str = "web") -> dict:
    return {ls["name"]: ls for ls in result.statuses[ConfigKey("KubernetesGateway", "infra", name)]["listeners"]}


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("doc", "reason"), [
    (gateway("- {name: a, port: 443, protocol: HTTPS}\n"), "tls mode must be Terminate for protocol HTTPS"),
    (gateway("- {name: a, port: 80, protocol: HTTP}\n- {name: a, port: 81, protocol: HTTP}\n"),
     "Listener name must be unique"),
    (gateway("- {name: a, port: 80, protocol: HTTP, hostname: 10.0.0.1}\n"), "must not be an IP address"),
    (gateway("- {name: a, port: 9000, protocol: TCP, hostname: a.example.com}\n"),
     "hostname must not be specified for protocol TCP"),
    (route("r", "rules: [{matches: [{path: {type: Exact, value: nope}}]}]"), "must be an absolute path"),
    (route("r", """\
        rules:
        - filters:
          - {type: RequestRedirect, requestRedirect: {scheme: https}}
          - {type: URLRewrite, urlRewrite: {hostname: a.example.com}}
        """), "but not both"),
    (route("r", """\
        rules:
        - matches: [{path: {type: Exact, value: /a}}]
          filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]
        """), "exactly one PathPrefix match"),
    (route("r", "rules: [{backendRefs: [{name: alpha}]}]"), "port is required for a Service reference"),
    (route("r", "rules: [{backendRefs: [{name: alpha, port: 80, weight: 1000001}]}]"), "weight 1000001"),
    (route("r", "rules: [{filters: [{type: RequestMirror}]}]"), "must be specified for type RequestMirror"),
    # strict: an unknown field is refused with its path, as the apiserver's schema would
    (route("r", "rules: [{backendRefs: [{name: alpha, port: 80, wieght: 2}]}]"),
     "spec.rules[0].backendRefs[0].wieght: unknown field"),
    (route("r", "hostname: [a.example.com]"), "spec.hostname: unknown field"),
    (gateway("- {name: a, port: 80, protocol: HTTP, allowedRoute: {namespaces: {from: All}}}\n"),
     "spec.listeners[0].allowedRoute: unknown field"),
    (gateway("- {name: a, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: Selector, "
             "selector: {matchLabel: {a: b}}}}}\n"),
     "spec.listeners[0].allowedRoutes.namespaces.selector.matchLabel: unknown field"),
    (route("r", "rules: [{filters: [{type: CORS, cors: {allowOrigin: ['*']}}]}]"),
     "spec.rules[0].filters[0].cors.allowOrigin: unknown field"),
    # Gateway API 1.5/1.6 fields not applied here: refused by name, never ignored
    (gateway("- {name: a, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: c}], "
             "options: {gateway.istio.io/tls-cipher-suites: ECDHE-RSA-AES128-GCM-SHA256}}}\n"),
     "options['gateway.istio.io/tls-cipher-suites']: not supported"),
    (gateway("- {name: a, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: c}], "
             "options: {gateway.istio.io/tls-terminate-mode: ISTIO_SIMPLE}}}\n"),
     "'ISTIO_SIMPLE' is not supported"),
    (gateway("- {name: a, port: 443, protocol: TLS, tls: {mode: Passthrough, "
             "options: {gateway.istio.io/tls-terminate-mode: MUTUAL}}}\n"),
     "applies to mode Terminate only"),
    (gateway("- {name: a, port: 80, protocol: HTTP}\n",
             extra="  tls: {frontend: {default: {validation: {caCertificateRefs: [{name: ca}]}}}}\n"),
     "spec.tls.frontend.default.validation.caCertificateRefs[0].group: Field required"),  # ObjectReference: group and kind required
    (gateway("- {name: a, port: 80, protocol: HTTP}\n",
             extra="  tls: {backend: {clientCertificateRef: {name: c}}}\n"),
     "spec.tls.backend: backend is not supported"),
    (gateway("- {name: a, port: 80, protocol: HTTP}\n",
             extra="  tls: {frontend: {default: {validation: {caCertificateRefs: []}}}}\n"),
     "caCertificateRefs"),
    (gateway("- {name: a, port: 80, protocol: HTTP}\n",
             extra="  tls: {frontend: {default: {validation: {mode: Other, caCertificateRefs: "
                   "[{group: '', kind: ConfigMap, name: ca}]}}}}\n"),
     "spec.tls.frontend.default.validation.mode"),
    (gateway("- {name: a, port: 80, protocol: HTTP}\n",
             extra="  tls: {frontend: {default: {}, perPort: [{port: 443, tls: {}}, {port: 443, tls: {}}]}}\n"),
     "Port for TLS configuration must be unique"),
    (gateway("- {name: a, port: 80, protocol: HTTP}\n",
             extra="  infrastructure: {parametersRef: {group: '', kind: ConfigMap, name: x}}\n"),
     "spec.infrastructure.parametersRef: parametersRef is not supported"),
    (gateway("- {name: a, port: 80, protocol: HTTP}\n",
             extra="  allowedListeners: {namespaces: {from: Selector}}\n"),
     "spec.allowedListeners.namespaces: selector must be specified when from is Selector"),
    (gateway("- {name: a, port: 80, protocol: HTTP}\n",
             extra="  allowedListeners: {namespaces: {from: Some}}\n"),
     "spec.allowedListeners.namespaces.from"),
    (route("r", "rules: [{retry: {codes: [200]}}]"), "spec.rules[0].retry.codes[0]: Input should be greater than or equal to 400"),
    # sessionPersistence: what Envoy's stateful session cannot enforce is refused by name
    (route("r", "rules: [{sessionPersistence: {idleTimeout: 10m}}]"),
     "spec.rules[0].sessionPersistence.idleTimeout: idleTimeout is not supported"),
    (route("r", "rules: [{sessionPersistence: {absoluteTimeout: 1h}}]"),
     "absoluteTimeout is not supported with a Session cookie"),
    (route("r", "rules: [{sessionPersistence: {type: Header, absoluteTimeout: 1h}}]"),
     "absoluteTimeout is not supported with type Header"),
    (route("r", "rules: [{sessionPersistence: {cookieConfig: {lifetimeType: Permanent}}}]"),
     "AbsoluteTimeout must be specified when cookie lifetimeType is Permanent"),
    (route("r", "rules: [{sessionPersistence: {type: Header, cookieConfig: {lifetimeType: Session}}}]"),
     "cookieConfig can only be set with type Cookie"),
    (route("r", "rules: [{sessionPersistence: {sessionName: 'a b'}}]"),
     "sessionName must be a valid cookie or header name"),
    (route("r", "rules: [{sessionPersistence: {type: Query}}]"), "spec.rules[0].sessionPersistence.type"),
    (route("r", "useDefaultGateways: All"), "spec.useDefaultGateways: useDefaultGateways is not supported"),
    (route("r", "rules: [{filters: [{type: ExternalAuth, externalAuth: {protocol: HTTP}}]}]"),
     "spec.rules[0].filters[0].externalAuth: externalAuth is not supported"),
    (route("r", "rules: [{sessionPersistence: {type: Cookie}}]", kind="GRPCRoute"),
     "spec.rules[0].sessionPersistence: sessionPersistence is not supported"),
    ((f"apiVersion: {API}/v1\nkind: GatewayClass\nmetadata: {{name: c}}\nspec: {{controllerName: x, "
     "parametersRef: {group: '', kind: ConfigMap, name: p}}\n"),
     "spec.parametersRef: parametersRef is not supported"),
])
def test_invalid_objects_are_rejected_with_the_reason(doc: str, reason: str):
    with pytest.raises(InvalidObject) as e:
        parse_object(yaml.safe_load(doc))
    assert reason in e.value.reason, e.value.reason


def test_status_written_by_controllers_is_accepted_and_cors_is_parsed():
    """`status` is ours to write (kept, never strict); a CORS filter is parsed (it becomes the
    route's CORS policy: tests/e2e/test_gateway_api_http.py)."""
    doc = yaml.safe_load(route("r", "rules: [{filters: [{type: CORS, cors: {allowOrigins: ['*'], "
                                    "maxAge: 5}}]}]"))
    doc["status"] = {"parents": [{"controllerName": "other.io/x", "parentRef": {"name": "gw"},
                                  "conditions": []}]}
    obj = parse_object(doc)
    assert obj.status["parents"][0]["controllerName"] == "other.io/x"
    assert obj.spec.rules[0].filters[0].cors.allow_origins == ["*"]


def test_both_gateway_kinds_live_side_by_side():
    store = store_of(gateway("- {name: http, port: 80, protocol: HTTP}\n"), """\
        apiVersion: networking.istio.io/v1
        kind: Gateway
        metadata: {name: web, namespace: infra}
        spec: {servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ["*"]}]}
        """)
    assert store.get(ConfigKey("KubernetesGateway", "infra", "web")).obj.api_version == f"{API}/v1"
    assert store.get(ConfigKey("Gateway", "infra", "web")).obj.api_version == "networking.istio.io/v1"


# --- listeners ----------------------------------------------------------------------------------
def test_listener_conditions_for_protocols_conflicts_kinds_and_certificates():
    ca = make_ca()
    store = store_of(CLASS, tls_secret_yaml("good", "infra", issue(ca, ["a.example.com"])), """\
        apiVersion: v1
        kind: Secret
        metadata: {name: empty, namespace: infra}
        type: kubernetes.io/tls
        data: {}
        """, gateway("""\
        - {name: http, port: 80, protocol: HTTP}
        - {name: tcp-on-80, port: 80, protocol: TCP}
        - {name: udp, port: 53, protocol: UDP}
        - {name: https, port: 443, protocol: HTTPS, hostname: a.example.com, tls: {certificateRefs: [{name: good}]}}
        - {name: tls-same-host, port: 443, protocol: TLS, hostname: a.example.com, tls: {mode: Passthrough}}
        - {name: missing, port: 8443, protocol: HTTPS, tls: {certificateRefs: [{name: nope}]}}
        - {name: no-keys, port: 8444, protocol: HTTPS, tls: {certificateRefs: [{name: empty}]}}
        - {name: not-a-secret, port: 8445, protocol: HTTPS, tls: {certificateRefs: [{kind: ConfigMap, name: good}]}}
        - name: kinds
          port: 8080
          protocol: HTTP
          allowedRoutes: {kinds: [{kind: TCPRoute}, {kind: HTTPRoute}]}
        """))
    result = translate(store, "cluster.local")
    ls = listeners(result)
    ok = {"Accepted": ("True", "Accepted"), "Conflicted": ("False", "NoConflicts"),
          "Programmed": ("True", "Programmed"), "ResolvedRefs": ("True", "ResolvedRefs")}
    assert conds(ls["http"]) == ok and conds(ls["https"]) == ok
    assert conds(ls["tcp-on-80"]) == {"Accepted": ("False", "ProtocolConflict"), "Conflicted": ("True", "ProtocolConflict"),
                                      "Programmed": ("False", "ProtocolConflict"),
                                      "ResolvedRefs": ("True", "ResolvedRefs")}
    assert conds(ls["tls-same-host"])["Conflicted"] == ("True", "ProtocolConflict")  # istiod: protocols differ
    # istiod: an unsupported protocol is refused by Accepted alone (Programmed stays True), and
    # the listener is not served.
    assert conds(ls["udp"])["Accepted"] == ("False", "UnsupportedProtocol") and ls["udp"]["supportedKinds"] == []
    assert conds(ls["udp"])["Programmed"] == ("True", "Programmed")
    for name in ("missing", "no-keys", "not-a-secret"):
        assert conds(ls[name])["ResolvedRefs"] == ("False", "InvalidCertificateRef"), name
        assert conds(ls[name])["Programmed"] == ("False", "Invalid"), name
    assert conds(ls["kinds"])["ResolvedRefs"] == ("False", "InvalidRouteKinds")
    assert ls["kinds"]["supportedKinds"] == [{"group": API, "kind": "HTTPRoute"}]
    assert all(c["observedGeneration"] == 3 for x in ls.values() for c in x["conditions"])
    # Only programmed listeners become config.
    assert sorted(e.key.name.rsplit("-", 1)[-1] for e in result.gateways) == ["http", "https", "kinds"]


def test_gateway_addresses_and_other_classes():
    store = store_of(CLASS, gateway("- {name: http, port: 80, protocol: HTTP}\n", name="ips",
                                    extra="  addresses: [{type: IPAddress, value: 1.2.3.4}, "
                                          "{type: IPAddress, value: 1.2.3.5}]\n"),
                     gateway("- {name: http, port: 80, protocol: HTTP}\n", name="theirs", class_name="other"))
    result = translate(store, "cluster.local")
    gw = result.statuses[ConfigKey("KubernetesGateway", "infra", "ips")]
    assert conds(gw) == {"Accepted": ("False", "UnsupportedAddress"), "Programmed": ("False", "UnsupportedAddress")}
    # No usable address at all: refused whole, as istiod does: no listener status, nothing served.
    assert "listeners" not in gw and not any("ips" in e.key.name for e in result.gateways)
    assert gw["conditions"][0]["message"] == "only Hostname is supported, ignoring [1.2.3.4 1.2.3.5]"
    assert ConfigKey("KubernetesGateway", "infra", "theirs") not in result.statuses
    assert all("theirs" not in e.key.name for e in result.gateways)


# --- routes -------------------------------------------------------------------------------------
def test_route_parent_reasons_and_backend_problems():
    store = store_of(CLASS, SVC, gateway("""\
        - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
        """), gateway("- {name: http, port: 80, protocol: HTTP}\n", name="theirs", class_name="other"),
        route("bad-port", "parentRefs: [{name: web, namespace: infra, port: 81}]"),
        route("bad-kind", """\
            parentRefs: [{name: web, namespace: infra}]
            rules: [{backendRefs: [{group: storage.example.com, kind: Bucket, name: b}]}]
            """),
        route("elsewhere", "parentRefs: [{name: theirs, namespace: infra}, {name: nobody, namespace: infra}]"),
        route("no-port", """\
            parentRefs: [{name: web, namespace: infra}]
            rules: [{backendRefs: [{name: alpha, port: 81}]}]
            """))
    result = translate(store, "cluster.local")

    def parent(name):
        (p,) = result.statuses[ConfigKey("HTTPRoute", "default", name)]["parents"]
        return p

    assert conds(parent("bad-port"))["Accepted"] == ("False", "NoMatchingParent")
    assert parent("bad-port")["conditions"][0]["message"] == "port 81 not found"
    # group and kind as the apiserver stores them (CRD defaults), though the route left them out
    assert parent("bad-port")["parentRef"] == {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                               "name": "web", "namespace": "infra", "port": 81}
    assert conds(parent("bad-kind")) == {"Accepted": ("True", "Accepted"), "ResolvedRefs": ("False", "InvalidKind")}
    # A port the Service lacks is not a resolution error for istiod (the route answers 500).
    assert conds(parent("no-port"))["ResolvedRefs"] == ("True", "ResolvedRefs")
    assert ConfigKey("HTTPRoute", "default", "elsewhere") not in result.statuses  # not ours to report on
    assert listeners(result)["http"]["attachedRoutes"] == 2  # bad-kind and no-port attached


@pytest.mark.parametrize(("listener", "route_hosts", "want"), [
    (None, [], ["*"]),
    ("a.example.com", [], ["a.example.com"]),
    ("*.example.com", ["a.example.com", "b.other.org", "*.example.com"], ["a.example.com", "*.example.com"]),
    ("*.example.com", ["example.com"], []),
    ("a.b.example.com", ["*.example.com"], ["a.b.example.com"]),
    ("*.example.com", ["*.b.example.com"], ["*.b.example.com"]),
    (None, ["x.example.com"], ["x.example.com"]),
])
def test_hostname_intersection(listener, route_hosts, want):
    assert intersect(listener, route_hosts) == want


# GatewayHTTPListenerIsolation (upstream's gateway-http-listener-isolation-with-hostname-intersection):
# listeners "", *.example.com, *.foo.example.com, abc.foo.example.com on one port.
SIBLINGS = [None, "*.example.com", "*.foo.example.com", "abc.foo.example.com"]


@pytest.mark.parametrize(("own", "hosts", "want"), [
    (None, ["bar.com", "*.example.com", "*.foo.example.com"], ["bar.com"]),
    (None, ["*"], ["*"]),  # any host: Envoy still picks the more specific virtual hosts first
    ("*.example.com", ["*.example.com", "*.foo.example.com"], ["*.example.com"]),
    ("*.foo.example.com", ["*.foo.example.com"], ["*.foo.example.com"]),  # broader than abc.foo: kept
    ("abc.foo.example.com", ["abc.foo.example.com"], ["abc.foo.example.com"]),
])
def test_listener_isolation_keeps_hostnames_off_broader_listeners(own, hosts, want):
    assert isolate(own, hosts, [s for s in SIBLINGS if s != own]) == want


def test_precedence_across_routes_and_wildcard_hosts():
    rules = """\
        parentRefs: [{{name: web, namespace: infra}}]
        hostnames: [{host}]
        rules:
        - matches: [{matches}]
          backendRefs: [{{name: alpha, port: 80}}]
        """
    store = store_of(CLASS, SVC, gateway("- {name: http, port: 80, protocol: HTTP, "
                                         "allowedRoutes: {namespaces: {from: All}}}\n"),
                     route("catchall", rules.format(host="a.example.com", matches="{}"), created="2020-01-01T00:00:00Z"),
                     route("regex", rules.format(host="a.example.com", matches="{path: {type: RegularExpression, "
                                                                                 "value: /r.*}}")),
                     route("short", rules.format(host="a.example.com", matches="{path: {value: /a}}")),
                     route("long", rules.format(host="a.example.com", matches="{path: {value: /a/b}}")),
                     route("exact", rules.format(host="a.example.com", matches="{path: {type: Exact, value: /a}}")),
                     route("method", rules.format(host="a.example.com", matches="{path: {value: /a}, method: GET}"),
                           created="2030-01-01T00:00:00Z"),
                     route("wild", rules.format(host="'*.example.com'", matches="{path: {value: /w}}")))
    result = translate(store, "cluster.local")
    vs = {e.obj.spec.hosts[0]: e for e in result.virtual_services}
    order = [r.name.split(".")[1] for r in vs["a.example.com"].obj.spec.http]
    # exact, longer prefix, method beats none (even if newer), prefix, regex, "/" last; then the wildcard's.
    assert order == ["exact", "long", "method", "short", "regex", "catchall", "wild"]
    assert [r.name.split(".")[1] for r in vs["*.example.com"].obj.spec.http] == ["wild"]
    assert vs["a.example.com"].obj.metadata.annotations["internal.istio.io/parents"].split(",")[0] == \
        "HTTPRoute/default/exact"


def test_route_names_are_istiods_the_rule_name_or_namespace_name_index():
    """istiod's convertHTTPRoute: a rule's `name` names its routes; an unnamed rule's are
    NAMESPACE.NAME.RULE_INDEX, the same for each of its matches (split into one route each)."""
    store = store_of(CLASS, SVC, gateway("- {name: http, port: 80, protocol: HTTP}\n"),
                     route("r", """\
                         parentRefs: [{name: web, namespace: infra}]
                         rules:
                         - name: login
                           matches: [{path: {value: /login}}]
                           backendRefs: [{name: alpha, port: 80}]
                         - matches: [{path: {value: /a}}, {path: {value: /b}}]
                           backendRefs: [{name: alpha, port: 80}]
                         """, namespace="infra"))
    result = translate(store, "cluster.local")
    (vs,) = result.virtual_services
    assert sorted(r.name for r in vs.obj.spec.http) == ["infra.r.1", "infra.r.1", "login"]


def test_generated_entries_are_stable_cache_inputs_and_namespace_scoped():
    base = [CLASS, SVC.replace("default", "infra"), gateway("- {name: http, port: 80, protocol: HTTP}\n"),
            route("r", "parentRefs: [{name: web, namespace: infra}]\nrules: [{backendRefs: [{name: alpha, port: 80}]}]",
                  namespace="infra")]
    first = translate(store_of(*base), "cluster.local")
    again = translate(store_of(*base), "cluster.local")
    assert first.gateways == again.gateways and first.virtual_services == again.virtual_services
    changed = translate(store_of(*base[:-1], base[-1].replace("port: 80}]}]", "port: 80, weight: 2}, "
                                                                           "{name: alpha, port: 80}]}]")),
                        "cluster.local")
    assert changed.gateways == first.gateways
    assert changed.virtual_services[0] != first.virtual_services[0]  # new content, new revision

    index = GatewayIndex.build(Store(), "cluster.local", first.gateways, first.virtual_services)
    labels = {"gateway.networking.k8s.io/gateway-name": "web"}
    assert index.select_for(labels, "infra") == first.gateways
    assert index.select_for(labels, "other") == ()  # a same-named Gateway elsewhere is not this one
    assert index.select_for({}, "infra") == ()


def test_stamp_keeps_transition_times_of_unchanged_conditions():
    def c(t, s):
        return {"type": t, "status": s, "reason": "R", "message": "m", "observedGeneration": 1}

    first = stamp(None, {"conditions": [c("Accepted", "True")], "listeners": [
        {"name": "a", "conditions": [c("Programmed", "True")]}]}, "T1")
    second = stamp(first, {"conditions": [c("Accepted", "True")], "listeners": [
        {"name": "a", "conditions": [c("Programmed", "False")]}, {"name": "b", "conditions": [c("Accepted", "True")]}]},
        "T2")
    assert second["conditions"][0]["lastTransitionTime"] == "T1"
    assert [ls["conditions"][0]["lastTransitionTime"] for ls in second["listeners"]] == ["T2", "T2"]
    assert stamp(second, {k: v for k, v in second.items()}, "T3") == second


# --- Envoy accepts what it all becomes ------------------------------------------------------------
def test_generated_gateway_api_config_passes_envoy_validate(tmp_path):
    from pilot.config.mesh import MeshConfig
    from pilot.model.mesh import MeshHolder
    from pilot.model.proxy import Proxy, parse_node_id
    from pilot.model.push_context import PushContext
    from tests.support.envoy import envoy_validate
    from tests.support.static_config import static_bootstrap

    ca = make_ca()
    store = store_of(CLASS, SVC, SVC.replace("alpha", "grpc").replace("name: http", "name: grpc"),
                     tls_secret_yaml("cert", "infra", issue(ca, ["a.example.com"])), gateway("""\
        - {name: http, port: 8080, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
        - name: https
          port: 8443
          protocol: HTTPS
          hostname: a.example.com
          tls: {certificateRefs: [{name: cert}]}
          allowedRoutes: {namespaces: {from: All}}
        - name: https-any
          port: 8443
          protocol: HTTPS
          tls: {certificateRefs: [{name: cert}]}
          allowedRoutes: {namespaces: {from: All}}
        - {name: pass, port: 9443, protocol: TLS, tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}
        - {name: tcp, port: 9000, protocol: TCP, allowedRoutes: {namespaces: {from: All}}}
        """), route("web", """\
        parentRefs: [{name: web, namespace: infra}]
        hostnames: [a.example.com, "*.example.com"]
        rules:
        - matches: [{path: {value: /a}, headers: [{name: x, type: RegularExpression, value: "v[0-9]"}],
                     queryParams: [{name: q, value: "1"}], method: POST}]
          filters:
          - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: a, value: b}], remove: [c]}}
          - {type: RequestMirror, requestMirror: {backendRef: {name: alpha, port: 80}, percent: 10}}
          - {type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}
          backendRefs: [{name: alpha, port: 80, weight: 7}, {name: missing, port: 80, weight: 3}]
          timeouts: {request: 10s, backendRequest: 2s}
        - matches: [{path: {value: /r}}]
          filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]
        - matches: [{path: {value: /f}}]
          filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplaceFullPath, replaceFullPath: /x},
                                                              port: 8443, scheme: https, statusCode: 308}}]
        - matches: [{path: {type: RegularExpression, value: "/re/.*"}}]
          filters: [{type: ExtensionRef, extensionRef: {group: g, kind: K, name: n}}]
        - backendRefs: [{name: missing, port: 80}]
        """), route("rpc", """\
        parentRefs: [{name: web, namespace: infra, sectionName: http}]
        rules:
        - matches: [{method: {service: a.B, method: C}}, {method: {type: RegularExpression, method: "Get.*"}}]
          backendRefs: [{name: grpc, port: 80}]
        """, kind="GRPCRoute"), route("pass", """\
        parentRefs: [{name: web, namespace: infra, sectionName: pass}]
        hostnames: [p.example.com]
        rules: [{backendRefs: [{name: alpha, port: 80}]}]
        """, kind="TLSRoute", version="v1alpha2"), route("tcp", """\
        parentRefs: [{name: web, namespace: infra, sectionName: tcp}]
        rules: [{backendRefs: [{name: alpha, port: 80, weight: 1}, {name: missing, port: 80, weight: 1}]}]
        """, kind="TCPRoute", version="v1alpha2"))
    mesh = MeshHolder(MeshConfig(), "istio-system")
    mesh.refresh(store)
    ctx = PushContext.build(store, mesh.current, mesh.version, "cluster.local", "v1")
    node = "router~127.0.0.1~web-1.infra~infra.svc.cluster.local"
    t, ips, pod, ns, domain = parse_node_id(node)
    router = Proxy(node, t, ips, pod, ns, domain, "web.infra", {"NAMESPACE": "infra",
                                                               "LABELS": {"gateway.networking.k8s.io/gateway-name": "web"}},
                   identity="spiffe://cluster.local/ns/infra/sa/web-istio")  # proven: it may get credentials
    config = static_bootstrap(ctx, router)
    names = {ld["name"] for ld in config["static_resources"]["listeners"]}
    assert names == {"0.0.0.0_8080", "0.0.0.0_8443", "0.0.0.0_9443", "0.0.0.0_9000"}
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the generated Gateway API config:\n{output}"


def test_session_persistence_becomes_the_routes_stateful_session(tmp_path):
    """Each rule's sessionPersistence is its routes' stateful-session override (cookie: name, path
    `/`, a TTL only for a Permanent cookie; header: its name); the router's HTTP filter chain holds
    the filter, empty (off) for every other route; Envoy accepts it all."""
    from pilot.config.mesh import MeshConfig
    from pilot.model.mesh import MeshHolder
    from pilot.model.proxy import Proxy, parse_node_id
    from pilot.model.push_context import PushContext
    from tests.support.envoy import envoy_validate
    from tests.support.static_config import static_bootstrap

    store = store_of(CLASS, SVC, gateway("- {name: http, port: 8080, protocol: HTTP, "
                                         "allowedRoutes: {namespaces: {from: All}}}\n"), route("web", """\
        parentRefs: [{name: web, namespace: infra}]
        hostnames: [a.example.com]
        rules:
        - matches: [{path: {value: /named}}]
          sessionPersistence: {sessionName: sid}
          backendRefs: [{name: alpha, port: 80}]
        - matches: [{path: {value: /permanent}}]
          sessionPersistence: {absoluteTimeout: 1h, cookieConfig: {lifetimeType: Permanent}}
          backendRefs: [{name: alpha, port: 80}]
        - matches: [{path: {value: /header}}]
          sessionPersistence: {type: Header, sessionName: x-session}
          backendRefs: [{name: alpha, port: 80}]
        - matches: [{path: {value: /plain}}]
          backendRefs: [{name: alpha, port: 80}]
        """))
    mesh = MeshHolder(MeshConfig(), "istio-system")
    mesh.refresh(store)
    ctx = PushContext.build(store, mesh.current, mesh.version, "cluster.local", "v1")
    node = "router~127.0.0.1~web-1.infra~infra.svc.cluster.local"
    t, ips, pod, ns, domain = parse_node_id(node)
    router = Proxy(node, t, ips, pod, ns, domain, "web.infra",
                   {"NAMESPACE": "infra", "LABELS": {"gateway.networking.k8s.io/gateway-name": "web"}})
    config = static_bootstrap(ctx, router)
    (hcm,) = [f["typed_config"] for ld in config["static_resources"]["listeners"]
              for fc in ld["filter_chains"] for f in fc["filters"]]
    session_filter = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.stateful_session")
    assert "session_state" not in session_filter["typed_config"]  # off unless a route turns it on
    assert hcm["http_filters"][-1]["name"] == "envoy.filters.http.router"
    (vhost,) = hcm["route_config"]["virtual_hosts"]

    def state(path: str):
        r = next(r for r in vhost["routes"] if path in str(r["match"]))
        per_route = r.get("typed_per_filter_config", {}).get("envoy.filters.http.stateful_session")
        return per_route and per_route["stateful_session"]["session_state"]

    named, permanent, header = state("/named"), state("/permanent"), state("/header")
    assert named["name"] == "envoy.http.stateful_session.cookie"
    assert named["typed_config"]["cookie"] == {"name": "sid", "path": "/"}  # a Session cookie: no TTL
    assert permanent["typed_config"]["cookie"]["ttl"] == "3600s"
    assert permanent["typed_config"]["cookie"]["name"].startswith("gw-session-")  # one of the rule's own
    assert header["name"] == "envoy.http.stateful_session.header"
    assert header["typed_config"]["name"] == "x-session"
    assert state("/plain") is None
    ok, output = envoy_validate(config, tmp_path)
    assert ok, f"envoy rejected the stateful session config:\n{output}"


def test_the_memo_reuses_only_what_no_input_of_it_changed():
    """Each input a route's translation reads, changed alone, changes the result; nothing
    changed reuses the very same generated Entries."""
    store = store_of(CLASS, SVC, gateway("- {name: http, port: 80, protocol: HTTP, "
                                         "allowedRoutes: {namespaces: {from: All}}}\n"),
                     route("r", """\
                         parentRefs: [{name: web, namespace: infra}]
                         hostnames: [a.example.com]
                         rules: [{backendRefs: [{name: alpha, port: 80}, {name: remote, namespace: far, port: 80}]}]
                         """),
                     route("other", """\
                         parentRefs: [{name: web, namespace: infra}]
                         hostnames: [b.example.com]
                         rules: [{backendRefs: [{name: alpha, port: 80}]}]
                         """))
    first = translate(store, "cluster.local")
    again = translate(store, "cluster.local", first)
    assert all(a is b for a, b in zip(first.virtual_services, again.virtual_services, strict=True))

    def vs(result, host):
        return next(e for e in result.virtual_services if e.obj.spec.hosts == [host])

    def resolved(result):
        return conds(result.statuses[ConfigKey("HTTPRoute", "default", "r")]["parents"][0])["ResolvedRefs"]

    assert resolved(again) == ("False", "RefNotPermitted")
    steps = [
        SVC.replace("alpha", "remote").replace("default", "far"),  # the remote Service appears
        f"""\
        apiVersion: {API}/v1beta1
        kind: ReferenceGrant
        metadata: {{name: g, namespace: far}}
        spec:
          from: [{{group: {API}, kind: HTTPRoute, namespace: default}}]
          to: [{{group: "", kind: Service}}]
        """,
    ]
    previous = again
    key = (ConfigKey("HTTPRoute", "default", "r"), False)  # (route, for mesh parents)
    for doc in steps:
        store.apply(parse_object(yaml.safe_load(textwrap.dedent(doc))))
        now = translate(store, "cluster.local", previous)
        assert vs(now, "b.example.com") is vs(previous, "b.example.com")  # untouched: reused
        assert now.memo.routes[key][1] is not previous.memo.routes[key][1]  # an input changed: redone
        previous = now
    assert vs(previous, "a.example.com") != vs(again, "a.example.com")  # the grant let `remote` in
    assert resolved(previous) == ("True", "ResolvedRefs")
    store.delete(ConfigKey("Service", "default", "alpha"))
    gone = translate(store, "cluster.local", previous)
    assert resolved(gone) == ("False", "BackendNotFound")
    assert vs(gone, "b.example.com") != vs(previous, "b.example.com")


@pytest.mark.parametrize("api_version, kind", [
    ("gateway.networking.x-k8s.io/v1alpha1", "XListenerSet"),
    ("inference.networking.k8s.io/v1", "InferencePool"),
])
def test_kinds_istiod_serves_but_not_built_here_are_refused_by_name(api_version: str, kind: str):
    doc = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x", "namespace": "default"}, "spec": {}}
    with pytest.raises(InvalidObject) as e:
        parse_object(doc)
    assert e.value.reason.startswith(f"{kind} is not supported by this control plane: ")
