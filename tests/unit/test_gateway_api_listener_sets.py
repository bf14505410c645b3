"""ListenerSet (gateway.networking.k8s.io/v1), pure: parsing, which Gateway lets it in, how its
listeners merge (and conflict) with the Gateway's, routes attaching to it, and the status istiod
writes on both (gateway_collection.go ListenerSetCollection, gatewaycommon ReportListenerSetStatus)."""

from __future__ import annotations

import pytest
import yaml

from pilot.config.validation import InvalidObject, parse_object
from pilot.model.gateway_api import translate
from pilot.model.store import ConfigKey
from tests.unit.test_gateway_api import API, CLASS, SVC, conds, gateway, route, store_of
from tests.unit.test_gateway_api_status import service

GW_KEY = ConfigKey("KubernetesGateway", "infra", "web")


def listener_set(name: str, listeners: str, namespace: str = "infra", parent: str = "{name: web, namespace: infra}",
                 created: str = "2026-01-01T00:00:00Z") -> str:
    return (f"apiVersion: {API}/v1\nkind: ListenerSet\n"
            f"metadata: {{name: {name}, namespace: {namespace}, generation: 2, creationTimestamp: '{created}'}}\n"
            f"spec:\n  parentRef: {parent}\n  listeners:\n"
            + "".join(f"  {line}\n" for line in listeners.strip().splitlines()))


def ls_key(name: str, namespace: str = "infra") -> ConfigKey:
    return ConfigKey("ListenerSet", namespace, name)


def ls_listeners(result, name: str, namespace: str = "infra") -> dict:
    return {ls["name"]: ls for ls in result.statuses[ls_key(name, namespace)]["listeners"]}


GW_SAME = gateway("- {name: http, port: 80, protocol: HTTP, hostname: a.example.com, "
                  "allowedRoutes: {namespaces: {from: All}}}\n",
                  extra="  allowedListeners: {namespaces: {from: Same}}\n")
EXTRA = "- {name: extra, port: 8080, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}"
EXAMPLE = listener_set("ls", EXTRA)  # (module level: tests/test_crds.py checks it against the CRD too)


def ports(result) -> set[int]:
    return {g.obj.spec.servers[0].port.number for g in result.gateways}


# --- parsing ------------------------------------------------------------------------------------
def test_a_listener_set_parses_strictly():
    obj = parse_object(yaml.safe_load(EXAMPLE))
    assert obj.spec.parent_ref.kind == "Gateway" and obj.spec.listeners[0].port == 8080
    # The ListenerSet CRD lets an HTTPS listener omit tls (a Gateway's may not).
    parse_object(yaml.safe_load(listener_set("ls", "- {name: s, port: 443, protocol: HTTPS}")))
    for listeners, reason in [
        ("- {name: a, port: 80, protocol: HTTP}\n- {name: a, port: 81, protocol: HTTP}",
         "Listener name must be unique"),
        ("- {name: a, port: 80, protocol: HTTP, tls: {certificateRefs: [{name: c}]}}", "tls must not be specified"),
        ("- {name: a, port: 80, protocol: TCP, hostname: a.example.com}", "hostname must not be specified"),
        ("- {name: a, port: 80, protocol: HTTP, bogus: 1}", "bogus"),
    ]:
        with pytest.raises(InvalidObject) as e:
            parse_object(yaml.safe_load(listener_set("ls", listeners)))
        assert reason in e.value.reason, e.value.reason
    with pytest.raises(InvalidObject) as e:
        parse_object({"apiVersion": f"{API}/v1", "kind": "ListenerSet", "metadata": {"name": "x"},
                      "spec": {"parentRef": {"name": "web"}, "listeners": []}})
    assert "spec.listeners" in e.value.reason


# --- which Gateway lets it in -------------------------------------------------------------------
def test_a_gateway_allows_no_listener_set_by_default():
    store = store_of(CLASS, service("web-istio", "infra", 80, 8080),
                     gateway("- {name: http, port: 80, protocol: HTTP}\n"), listener_set("ls", EXTRA))
    result = translate(store, "cluster.local")
    status = result.statuses[ls_key("ls")]
    assert conds(status) == {"Accepted": ("False", "NotAllowed"), "Programmed": ("False", "NotAllowed")}
    assert "listeners" not in status
    assert ports(result) == {80}  # nothing of it served
    assert "attachedListenerSets" not in result.statuses[GW_KEY]


def test_a_listener_set_of_a_gateway_not_ours_or_missing_gets_no_status():
    other = gateway("- {name: http, port: 80, protocol: HTTP}\n", class_name="other",
                    extra="  allowedListeners: {namespaces: {from: All}}\n")
    store = store_of(CLASS, other, listener_set("ls", EXTRA), listener_set("lost", EXTRA, parent="{name: nope}"))
    result = translate(store, "cluster.local")
    assert ls_key("ls") not in result.statuses and ls_key("lost") not in result.statuses


def test_allowed_listeners_from_same_selector_and_all():
    team = "apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {shared: 'yes'}}\n"
    lonely = "apiVersion: v1\nkind: Namespace\nmetadata: {name: lonely}\n"
    for rule, allowed in [("{from: Same}", {"infra"}), ("{from: All}", {"infra", "team", "lonely"}),
                          ("{from: Selector, selector: {matchLabels: {shared: 'yes'}}}", {"team"}),
                          ("{from: None}", set())]:
        gw = gateway("- {name: http, port: 80, protocol: HTTP}\n", extra=f"  allowedListeners: {{namespaces: {rule}}}\n")
        sets = [listener_set("ls", f"- {{name: x, port: 8080, protocol: HTTP, hostname: {ns}.example.com}}",
                             namespace=ns) for ns in ("infra", "team", "lonely")]
        result = translate(store_of(CLASS, team, lonely, service("web-istio", "infra", 80, 8080), gw, *sets),
                           "cluster.local")
        got = {ns for ns in ("infra", "team", "lonely")
               if conds(result.statuses[ls_key("ls", ns)])["Accepted"] == ("True", "Accepted")}
        assert got == allowed, rule
        assert result.statuses[GW_KEY].get("attachedListenerSets", 0) == len(allowed)


# --- merged listeners and routes ----------------------------------------------------------------
def test_listeners_merge_into_the_gateway_and_routes_attach_by_listener_set_parent():
    to_set = route("to-set", f"""\
        parentRefs: [{{group: {API}, kind: ListenerSet, name: ls, namespace: infra, sectionName: extra}}]
        rules: [{{backendRefs: [{{name: alpha, port: 80}}]}}]
        """)
    to_gateway = route("to-gw", """\
        parentRefs: [{name: web, namespace: infra}]
        rules: [{backendRefs: [{name: alpha, port: 80}]}]
        """)
    store = store_of(CLASS, SVC, service("web-istio", "infra", 80, 8080), GW_SAME, listener_set("ls", EXTRA),
                     to_set, to_gateway)
    result = translate(store, "cluster.local")
    assert ports(result) == {80, 8080}
    internal = next(g for g in result.gateways if g.obj.spec.servers[0].port.number == 8080)
    # served by the Gateway's routers: in its namespace, selecting them
    assert internal.key.namespace == "infra"
    assert internal.obj.spec.selector == {"gateway.networking.k8s.io/gateway-name": "web"}
    bound = {vs.obj.spec.gateways[0]: vs.obj.metadata.annotations["internal.istio.io/parents"]
             for vs in result.virtual_services}
    assert bound[f"infra/{internal.key.name}"] == "HTTPRoute/default/to-set"
    assert "HTTPRoute/default/to-set" not in bound["infra/web-istio-autogenerated-k8s-gateway-http"]

    status = result.statuses[ls_key("ls")]
    assert conds(status) == {"Accepted": ("True", "Accepted"), "Programmed": ("True", "Programmed")}
    assert status["conditions"][0]["observedGeneration"] == 2
    assert ls_listeners(result, "ls")["extra"]["attachedRoutes"] == 1
    gw = result.statuses[GW_KEY]
    assert gw["attachedListenerSets"] == 1
    assert gw["listeners"][0]["attachedRoutes"] == 1  # to-gw only
    (parent,) = result.statuses[ConfigKey("HTTPRoute", "default", "to-set")]["parents"]
    assert parent["parentRef"] == {"group": API, "kind": "ListenerSet", "name": "ls", "namespace": "infra",
                                   "sectionName": "extra"}
    assert conds(parent)["Accepted"] == ("True", "Accepted")

    # A sectionName the ListenerSet lacks (the Gateway's listener name) is NoMatchingParent.
    wrong = route("to-set", f"""\
        parentRefs: [{{group: {API}, kind: ListenerSet, name: ls, namespace: infra, sectionName: http}}]
        rules: [{{backendRefs: [{{name: alpha, port: 80}}]}}]
        """)
    result = translate(store_of(CLASS, SVC, service("web-istio", "infra", 80, 8080), GW_SAME,
                                listener_set("ls", EXTRA), wrong), "cluster.local")
    (parent,) = result.statuses[ConfigKey("HTTPRoute", "default", "to-set")]["parents"]
    assert conds(parent)["Accepted"] == ("False", "NoMatchingParent")


def test_conflicts_across_the_gateway_and_listener_sets_in_precedence_order():
    gw = gateway("- {name: http, port: 80, protocol: HTTP, hostname: a.example.com}\n",
                 extra="  allowedListeners: {namespaces: {from: Same}}\n")
    first = listener_set("first", "- {name: b, port: 80, protocol: HTTP, hostname: b.example.com}\n"
                                  "- {name: clash, port: 80, protocol: TCP}", created="2026-01-01T00:00:00Z")
    # created later: loses b.example.com to `first` (HostnameConflict) and has nothing valid left
    second = listener_set("second", "- {name: b, port: 80, protocol: HTTP, hostname: b.example.com}",
                          created="2026-01-02T00:00:00Z")
    result = translate(store_of(CLASS, service("web-istio", "infra", 80), gw, second, first), "cluster.local")
    first_ls = ls_listeners(result, "first")
    assert conds(first_ls["b"])["Accepted"] == ("True", "Accepted")
    assert conds(first_ls["clash"]) == {"Accepted": ("False", "ProtocolConflict"),
                                        "Conflicted": ("True", "ProtocolConflict"),
                                        "Programmed": ("False", "ProtocolConflict"),
                                        "ResolvedRefs": ("True", "ResolvedRefs")}
    assert conds(result.statuses[ls_key("first")])["Accepted"] == ("True", "Accepted")
    assert conds(ls_listeners(result, "second")["b"])["Conflicted"] == ("True", "HostnameConflict")
    assert conds(result.statuses[ls_key("second")]) == {"Accepted": ("False", "ListenersNotValid"),
                                                        "Programmed": ("False", "ListenersNotValid")}
    assert result.statuses[GW_KEY]["attachedListenerSets"] == 1  # only `first` has a valid listener
    hosts = sorted(g.obj.spec.servers[0].hosts[0] for g in result.gateways)
    assert hosts == ["*/a.example.com", "*/b.example.com"]


def test_an_https_listener_without_tls_is_refused_alone():
    store = store_of(CLASS, service("web-istio", "infra", 80, 443), GW_SAME,
                     listener_set("ls", "- {name: s, port: 443, protocol: HTTPS}"))
    result = translate(store, "cluster.local")
    (s,) = result.statuses[ls_key("ls")]["listeners"]
    assert conds(s)["Accepted"] == ("False", "UnsupportedProtocol")
    assert conds(s)["Programmed"] == ("False", "Invalid")
    assert conds(result.statuses[ls_key("ls")])["Accepted"] == ("False", "ListenersNotValid")
    assert ports(result) == {80}


def test_certificates_of_another_namespace_need_a_grant_from_the_listener_set():
    from tests.support.certs import issue, make_ca, tls_secret_yaml
    cert = tls_secret_yaml("cert", "certs", issue(make_ca(), ["s.example.com"]))
    https = "- {name: s, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: cert, namespace: certs}]}}"

    def grant(kind: str) -> str:
        return (f"apiVersion: {API}/v1\nkind: ReferenceGrant\nmetadata: {{name: g, namespace: certs}}\n"
                f"spec: {{from: [{{group: {API}, kind: {kind}, namespace: infra}}], to: [{{group: '', kind: Secret}}]}}\n")

    base = (CLASS, cert, service("web-istio", "infra", 80, 443), GW_SAME, listener_set("ls", https))
    for extra, reason in [((), "RefNotPermitted"), ((grant("Gateway"),), "RefNotPermitted"),
                          ((grant("ListenerSet"),), "ResolvedRefs")]:
        result = translate(store_of(*base, *extra), "cluster.local")
        assert conds(ls_listeners(result, "ls")["s"])["ResolvedRefs"][1] == reason
    # granted: the Gateway's routers may present it (SDS), and its server names it across namespaces
    assert result.allows_credential("infra", "certs", "cert")
    (server,) = [g.obj.spec.servers[0] for g in result.gateways if g.obj.spec.servers[0].port.number == 443]
    assert server.tls.credential_name == "certs/cert"
