"""Gateway API status as istiod writes it (pilot/pkg/config/kube/gateway), pure: each test pins
one place where the reasons, messages or what is served follow istiod's conversion.go,
conditions.go and gatewaycommon rather than a literal reading of the spec."""

from __future__ import annotations

import base64
import dataclasses

from pilot.config.mesh import MeshConfig
from pilot.model.gateway_api import translate
from pilot.model.gateway_api.conditions import merge_parents, stamp
from pilot.model.push_context import PushContext
from pilot.model.store import ConfigKey
from tests.support.certs import issue, make_ca, tls_secret_yaml
from tests.unit.test_gateway_api import API, CLASS, SVC, conds, gateway, listeners, route, store_of

GW_KEY = ConfigKey("KubernetesGateway", "infra", "web")


def service(name: str, namespace: str, *ports: int) -> str:
    return (f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {namespace}}}\n"
            f"spec: {{ports: [{', '.join(f'{{name: p{p}, port: {p}}}' for p in ports)}]}}\n")


def parent_of(result, name: str, kind: str = "HTTPRoute", namespace: str = "default") -> dict:
    (p,) = result.statuses[ConfigKey(kind, namespace, name)]["parents"]
    return p


def message(status: dict, type_: str) -> str:
    return next(c["message"] for c in status["conditions"] if c["type"] == type_)


# --- Gateway -----------------------------------------------------------------------------------
def test_programmed_needs_every_listener_port_on_every_hostname_address():
    listeners_ = "- {name: a, port: 80, protocol: HTTP}\n- {name: b, port: 8080, protocol: HTTP}\n"
    # The managed Service exposes 80 only: 8080 is not usable.
    result = translate(store_of(CLASS, service("web-istio", "infra", 80), gateway(listeners_)), "cluster.local")
    gw = result.statuses[GW_KEY]
    assert conds(gw)["Programmed"] == ("False", "AddressNotUsable")
    assert message(gw, "Programmed") == (
        "Assigned to service(s) web-istio.infra.svc.cluster.local:80, but failed to assign to all requested "
        'addresses: port 8080 not found for hostname "web-istio.infra.svc.cluster.local"')
    assert gw["addresses"] == [{"type": "Hostname", "value": "web-istio.infra.svc.cluster.local"}]
    # Both ports exposed: Programmed, naming both.
    result = translate(store_of(CLASS, service("web-istio", "infra", 80, 8080), gateway(listeners_)), "cluster.local")
    gw = result.statuses[GW_KEY]
    assert conds(gw)["Programmed"] == ("True", "Programmed")
    assert message(gw, "Programmed") == ("Resource programmed, assigned to service(s) "
                                         "web-istio.infra.svc.cluster.local:80 and web-istio.infra.svc.cluster.local:8080")

    # Every Hostname address is checked, not only the first: the second is missing, a third
    # lives in another namespace (istiod binds Services of the Gateway's namespace only).
    addresses = ("  addresses: [{type: Hostname, value: gw-a}, {type: Hostname, value: gw-b.infra.svc.cluster.local},"
                 " {type: Hostname, value: gw-c.other.svc.cluster.local}]\n")
    store = store_of(CLASS, service("gw-a", "infra", 80, 8080), service("gw-c", "other", 80, 8080),
                     gateway(listeners_, extra=addresses))
    gw = translate(store, "cluster.local").statuses[GW_KEY]
    assert conds(gw)["Programmed"] == ("False", "AddressNotUsable")
    assert message(gw, "Programmed") == (
        "Assigned to service(s) gw-a.infra.svc.cluster.local:80 and gw-a.infra.svc.cluster.local:8080, but failed "
        'to assign to all requested addresses: hostname "gw-b.infra.svc.cluster.local" not found; hostname '
        '"gw-c.other.svc.cluster.local" not found in namespace "infra", but it was found in namespace(s) "other"')
    assert conds(gw)["Accepted"] == ("True", "Accepted")


def test_ip_addresses_refused_whole_only_when_no_hostname_is_left():
    one_ip = "  addresses: [{type: IPAddress, value: 1.2.3.4}]\n"
    store = store_of(CLASS, service("web-istio", "infra", 80),
                     gateway("- {name: a, port: 80, protocol: HTTP}\n", extra=one_ip))
    result = translate(store, "cluster.local")
    # One IP: a request to the managed deployment's load balancer (istiod's IsManaged).
    assert conds(result.statuses[GW_KEY]) == {"Accepted": ("True", "Accepted"), "Programmed": ("True", "Programmed")}
    assert len(result.gateways) == 1
    # An IP beside a Hostname: ignored with UnsupportedAddress, the listeners still served and reported.
    mixed = "  addresses: [{type: IPAddress, value: 1.2.3.4}, {type: Hostname, value: web-istio}]\n"
    store = store_of(CLASS, service("web-istio", "infra", 80),
                     gateway("- {name: a, port: 80, protocol: HTTP}\n", extra=mixed))
    result = translate(store, "cluster.local")
    gw = result.statuses[GW_KEY]
    assert conds(gw) == {"Accepted": ("False", "UnsupportedAddress"), "Programmed": ("True", "Programmed")}
    assert message(gw, "Accepted") == "only Hostname is supported, ignoring [1.2.3.4]"
    assert [ls["name"] for ls in gw["listeners"]] == ["a"] and len(result.gateways) == 1


def test_unsupported_protocol_is_programmed_but_not_accepted_nor_served():
    store = store_of(CLASS, service("web-istio", "infra", 80, 81, 82),
                     gateway("- {name: ok, port: 80, protocol: HTTP}\n"
                             "- {name: lower, port: 81, protocol: http, allowedRoutes: {namespaces: {from: All}}}\n"
                             "- {name: udp, port: 82, protocol: UDP}\n"),
                     route("r", "parentRefs: [{name: web, namespace: infra, sectionName: lower}]"))
    result = translate(store, "cluster.local")
    ls = listeners(result)
    for name in ("lower", "udp"):
        assert conds(ls[name])["Accepted"] == ("False", "UnsupportedProtocol")
        assert conds(ls[name])["Programmed"] == ("True", "Programmed")
        assert ls[name]["supportedKinds"] == []
    assert message(ls["lower"], "Accepted") == 'protocol "http" is unsupported. hint: "HTTP" (uppercase) may be supported'
    assert sorted(e.key.name.rsplit("-", 1)[-1] for e in result.gateways) == ["ok"]
    # istiod: one or more invalid listeners make the Gateway's Accepted say so (still True).
    gw = result.statuses[GW_KEY]
    assert conds(gw)["Accepted"] == ("True", "ListenersNotValid")
    # A route naming it: the listener is a parent that takes no kind.
    assert conds(parent_of(result, "r"))["Accepted"] == ("False", "NotAllowedByListeners")
    assert message(parent_of(result, "r"), "Accepted") == f"kind {API}/v1, Kind=HTTPRoute is not allowed"


def test_invalid_certificates_are_refused_in_status_and_never_configured():
    ca = make_ca()
    good, other = issue(ca, ["a.example.com"]), issue(ca, ["b.example.com"])
    mismatched = dataclasses.replace(good, key_pem=other.key_pem)
    hello = base64.b64encode(b"Hello world").decode()
    store = store_of(CLASS, service("web-istio", "infra", 443, 444, 445),
                     tls_secret_yaml("good", "infra", good), tls_secret_yaml("mismatched", "infra", mismatched),
                     f"apiVersion: v1\nkind: Secret\nmetadata: {{name: hello, namespace: infra}}\n"
                     f"type: kubernetes.io/tls\ndata: {{tls.crt: {hello}, tls.key: {hello}}}\n",
                     gateway("- {name: good, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: good}]}}\n"
                             "- {name: hello, port: 444, protocol: HTTPS, tls: {certificateRefs: [{name: hello}]}, "
                             "allowedRoutes: {namespaces: {from: All}}}\n"
                             "- {name: mismatched, port: 445, protocol: HTTPS, "
                             "tls: {certificateRefs: [{name: mismatched}]}}\n"),
                     route("r", "parentRefs: [{name: web, namespace: infra, sectionName: hello}]"))
    result = translate(store, "cluster.local")
    ls = listeners(result)
    assert conds(ls["good"])["ResolvedRefs"] == ("True", "ResolvedRefs")
    for name, why in (("hello", "no PEM block found"), ("mismatched", "private key does not match public key")):
        assert conds(ls[name])["ResolvedRefs"] == ("False", "InvalidCertificateRef"), name
        assert conds(ls[name])["Programmed"] == ("False", "Invalid")
        assert message(ls[name], "Programmed") == "Bad TLS configuration"
        assert message(ls[name], "ResolvedRefs").startswith(
            f"invalid certificate reference core/Secret/infra/{name}, the certificate is malformed: ")
        assert why in message(ls[name], "ResolvedRefs")
    # Only the good listener is a server: the broken Secrets are never named for SDS.
    assert [e.obj.spec.servers[0].tls.credential_name for e in result.gateways] == ["good"]
    # The listener still takes routes in status (istiod's parent), serving none of them.
    assert conds(parent_of(result, "r"))["Accepted"] == ("True", "Accepted")
    assert ls["hello"]["attachedRoutes"] == 1


# --- route parents -------------------------------------------------------------------------------
def test_parent_checks_in_istiods_order_and_ranking():
    store = store_of(CLASS, SVC, service("web-istio", "infra", 80, 81), gateway("""\
        - {name: named, port: 80, protocol: HTTP, hostname: a.example.com}
        - name: grpc-only
          port: 81
          protocol: HTTP
          hostname: g.example.com
          allowedRoutes: {kinds: [{kind: GRPCRoute}], namespaces: {from: All}}
        """),
        # Wrong kind *and* no matching hostname on one listener: the hostname is checked first.
        route("wrong-both", "parentRefs: [{name: web, namespace: infra, sectionName: grpc-only}]\n"
                            "hostnames: [z.example.com]"),
        # The hostname matches but the namespace is not allowed (Same): NotAllowedByListeners.
        route("wrong-ns", "parentRefs: [{name: web, namespace: infra, sectionName: named}]\n"
                          "hostnames: [a.example.com]"),
        # Across listeners: a NotAllowedByListeners outranks a NoMatchingListenerHostname.
        route("mixed", "parentRefs: [{name: web, namespace: infra}]\nhostnames: [g.example.com]"))
    result = translate(store, "cluster.local")
    p = parent_of(result, "wrong-both")
    assert conds(p)["Accepted"] == ("False", "NoMatchingListenerHostname")
    assert message(p, "Accepted") == 'no hostnames matched parent hostname "g.example.com"'
    p = parent_of(result, "wrong-ns")
    assert conds(p)["Accepted"] == ("False", "NotAllowedByListeners")
    assert message(p, "Accepted") == ('hostnames matched parent hostname "a.example.com", but namespace "default" '
                                      "is not allowed by the parent")
    p = parent_of(result, "mixed")
    assert conds(p)["Accepted"] == ("False", "NotAllowedByListeners")
    assert message(p, "Accepted") == f"kind {API}/v1, Kind=HTTPRoute is not allowed"


def test_backend_problems_as_istiod_reports_them():
    store = store_of(CLASS, SVC, service("web-istio", "infra", 80), gateway("""\
        - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
        """),
        route("mixed", """\
            parentRefs: [{name: web, namespace: infra}]
            rules: [{backendRefs: [{name: nobody, port: 80}, {group: storage.example.com, kind: Bucket, name: b}]}]
            """),
        route("other-port", """\
            parentRefs: [{name: web, namespace: infra}]
            hostnames: [p.example.com]
            rules: [{backendRefs: [{name: alpha, port: 9999}]}]
            """))
    result = translate(store, "cluster.local")
    # An unknown Service and an unknown kind: InvalidKind wins (the last one, as istiod keeps it).
    assert conds(parent_of(result, "mixed"))["ResolvedRefs"] == ("False", "InvalidKind")
    # A port the Service lacks resolves (istiod), and routes to that port's cluster, which does
    # not exist (the router answers 500).
    assert conds(parent_of(result, "other-port"))["ResolvedRefs"] == ("True", "ResolvedRefs")
    [vs] = [v for v in result.virtual_services if v.obj.spec.hosts == ["p.example.com"]]
    [dest] = vs.obj.spec.http[0].route
    assert (dest.destination.host, dest.destination.port.number) == ("alpha.default.svc.cluster.local", 9999)


def test_backend_kinds_as_istiod_resolves_them_with_its_default_flags():
    """buildDestination: a ServiceImport is its same-named Service (ENABLE_MCS_HOST off); an
    InferencePool is refused as istiod refuses it with ENABLE_GATEWAY_API_INFERENCE_EXTENSION off;
    a Hostname no ServiceEntry declares is BackendNotFound (tests/unit/test_gateway_api_hostname_backends.py);
    a ServiceEntry and any other kind are InvalidKind; a Service named by its hostname
    is InvalidDestination; the ReferenceGrant is checked before the kind."""
    refs = {
        "import": "{group: multicluster.x-k8s.io, kind: ServiceImport, name: alpha, port: 80}",
        "import-no-port": "{group: multicluster.x-k8s.io, kind: ServiceImport, name: alpha}",
        "pool": "{group: inference.networking.k8s.io, kind: InferencePool, name: pool}",
        "hostname": "{group: networking.istio.io, kind: Hostname, name: alpha.example.com, port: 80}",
        "entry": "{group: networking.istio.io, kind: ServiceEntry, name: ext, port: 80}",
        "dotted": "{name: alpha.default, port: 80}",
        "foreign-kind": "{group: networking.istio.io, kind: Hostname, name: h, namespace: other, port: 80}",
    }
    docs = [route(name, f"parentRefs: [{{name: web, namespace: infra}}]\nhostnames: [{name}.example.com]\n"
                        f"rules: [{{backendRefs: [{ref}]}}]") for name, ref in refs.items()]
    store = store_of(CLASS, SVC, service("web-istio", "infra", 80), gateway("""\
        - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
        """), *docs)
    result = translate(store, "cluster.local")
    got = {name: conds(parent_of(result, name))["ResolvedRefs"] for name in refs}
    assert got == {"import": ("True", "ResolvedRefs"), "import-no-port": ("False", "InvalidDestination"),
                   "pool": ("False", "InvalidKind"), "hostname": ("False", "BackendNotFound"),
                   "entry": ("False", "InvalidKind"), "dotted": ("False", "InvalidDestination"),
                   "foreign-kind": ("False", "RefNotPermitted")}
    assert message(parent_of(result, "pool"), "ResolvedRefs") == (
        "InferencePool is not enabled. To enable, set ENABLE_GATEWAY_API_INFERENCE_EXTENSION to true in istiod")
    assert message(parent_of(result, "entry"), "ResolvedRefs") == (
        'referencing unsupported backendRef: group "networking.istio.io" kind "ServiceEntry"')
    assert message(parent_of(result, "foreign-kind"), "ResolvedRefs") == (
        "backendRef h/other not accessible to a HTTPRoute in namespace 'default' (missing a ReferenceGrant?)")
    # The ServiceImport routes to the Service; the refused ones to nothing (the router answers 500).
    dest = {vs.obj.spec.hosts[0]: [r.destination.host for r in vs.obj.spec.http[0].route]
            for vs in result.virtual_services}
    assert dest["import.example.com"] == ["alpha.default.svc.cluster.local"]
    assert "alpha.default.svc.cluster.local" not in dest["pool.example.com"]


def test_tls_route_attaches_to_a_terminating_tls_listener():
    ca = make_ca()
    store = store_of(CLASS, SVC, service("web-istio", "infra", 443), tls_secret_yaml("cert", "infra",
                                                                                     issue(ca, ["t.example.com"])),
                     gateway("- {name: tls, port: 443, protocol: TLS, hostname: t.example.com, "
                             "tls: {mode: Terminate, certificateRefs: [{name: cert}]}, "
                             "allowedRoutes: {namespaces: {from: All}}}\n"),
                     route("t", "parentRefs: [{name: web, namespace: infra}]\nhostnames: [t.example.com]\n"
                                "rules: [{backendRefs: [{name: alpha, port: 80}]}]", kind="TLSRoute"))
    result = translate(store, "cluster.local")
    ls = listeners(result)["tls"]
    assert ls["supportedKinds"] == [{"group": API, "kind": "TLSRoute"}, {"group": API, "kind": "TCPRoute"}]
    assert ls["attachedRoutes"] == 1
    assert conds(parent_of(result, "t", kind="TLSRoute"))["Accepted"] == ("True", "Accepted")
    [vs] = result.virtual_services
    assert [r.route[0].destination.host for r in vs.obj.spec.tls] == ["alpha.default.svc.cluster.local"]
    assert result.gateways[0].obj.spec.servers[0].tls.mode == "SIMPLE"


# --- GAMMA -----------------------------------------------------------------------------------------
def test_mesh_parents_need_no_reference_grant_and_carry_tcp_and_tls_routes():
    store = store_of(CLASS, service("reviews", "default", 9080, 9443), service("db", "data", 5432),
                     service("web-istio", "infra", 80),
                     gateway("- {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}\n"),
                     # A consumer route (another namespace's Service) to a backend in a third namespace.
                     route("consumer", """\
                         parentRefs: [{group: "", kind: Service, name: reviews, namespace: default},
                                      {name: web, namespace: infra}]
                         rules: [{backendRefs: [{name: db, namespace: data, port: 5432}]}]
                         """, namespace="client"),
                     route("tcp", """\
                         parentRefs: [{group: "", kind: Service, name: reviews, port: 9080}]
                         rules: [{backendRefs: [{name: db, namespace: data, port: 5432}]}]
                         """, kind="TCPRoute", version="v1alpha2"),
                     route("tls", """\
                         parentRefs: [{group: "", kind: Service, name: reviews, port: 9443}]
                         rules: [{backendRefs: [{name: db, namespace: data, port: 5432}]}]
                         """, kind="TLSRoute"))
    result = PushContext.build(store, MeshConfig(), "m", "cluster.local", "1").gateway_api
    mesh_parent, gw_parent = result.statuses[ConfigKey("HTTPRoute", "client", "consumer")]["parents"]
    assert conds(mesh_parent)["ResolvedRefs"] == ("True", "ResolvedRefs")  # mesh: no grant needed
    assert conds(gw_parent)["ResolvedRefs"] == ("False", "RefNotPermitted")  # a Gateway parent: needed
    vss = {(e.key.namespace, tuple(e.obj.spec.export_to)): e for e in result.mesh_virtual_services}
    consumer = vss[("client", (".",))]
    assert consumer.obj.spec.http[0].route[0].destination.host == "db.data.svc.cluster.local"
    producer = vss[("default", ("*",))].obj.spec
    assert [(m.port, r.route[0].destination.host) for r in producer.tcp for m in r.match] == [
        (9080, "db.data.svc.cluster.local")]
    assert [(m.port, m.sni_hosts) for r in producer.tls for m in r.match] == [
        (9443, ["reviews.default.svc.cluster.local"])]
    for name, kind in (("tcp", "TCPRoute"), ("tls", "TLSRoute")):
        assert conds(parent_of(result, name, kind)) == {"Accepted": ("True", "Accepted"),
                                                       "ResolvedRefs": ("True", "ResolvedRefs")}


# --- the status writer's merge ---------------------------------------------------------------------
def test_other_controllers_conditions_and_parent_entries_are_kept_in_place():
    theirs_parent = {"parentRef": {"name": "web"}, "controllerName": "example.com/mesh",
                     "conditions": [{"type": "Accepted", "status": "False", "reason": "Nope", "message": "",
                                     "lastTransitionTime": "t0"}]}
    ours_before = {"parentRef": {"name": "web"}, "controllerName": "istio.io/gateway-controller",
                   "conditions": [{"type": "example.com/Audited", "status": "True", "reason": "Seen", "message": "",
                                   "lastTransitionTime": "t0"},
                                  {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "m",
                                   "observedGeneration": 1, "lastTransitionTime": "t0"}]}
    gone = {"parentRef": {"name": "old"}, "controllerName": "istio.io/gateway-controller", "conditions": []}
    current = {"parents": [ours_before, theirs_parent, gone]}
    ours = [{"parentRef": {"name": "web"}, "controllerName": "istio.io/gateway-controller",
             "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "m",
                             "observedGeneration": 2},
                            {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "r",
                             "observedGeneration": 2}]}]
    desired = {"parents": merge_parents(current["parents"], ours, "istio.io/gateway-controller")}
    new = stamp(current, desired, "t1")
    mine, theirs = new["parents"]  # ours where it was, theirs untouched, ours for `old` dropped
    assert theirs == theirs_parent
    assert [(c["type"], c["lastTransitionTime"], c.get("observedGeneration")) for c in mine["conditions"]] == [
        ("example.com/Audited", "t0", None),  # another controller's condition type on our entry: kept
        ("Accepted", "t0", 2),  # ours, unchanged status: its transition time carried over
        ("ResolvedRefs", "t1", 2)]  # new
    # Written again with nothing changed: byte-for-byte the same (never rewritten).
    assert stamp(new, {"parents": merge_parents(new["parents"], ours, "istio.io/gateway-controller")}, "t2") == new


def test_tls_terminate_mode_option():
    ca = make_ca()
    leaf = issue(ca, ["m.example.com"])
    mode = "gateway.istio.io/tls-terminate-mode"
    store = store_of(CLASS, service("web-istio", "infra", 443, 444, 445),
                     tls_secret_yaml("with-ca", "infra", leaf, ca), tls_secret_yaml("no-ca", "infra", leaf),
                     gateway(f"- {{name: mutual, port: 443, protocol: HTTPS, tls: {{certificateRefs: [{{name: with-ca}}], "
                             f"options: {{{mode}: MUTUAL}}}}}}\n"
                             f"- {{name: no-ca, port: 444, protocol: HTTPS, tls: {{certificateRefs: [{{name: no-ca}}], "
                             f"options: {{{mode}: OPTIONAL_MUTUAL}}}}}}\n"
                             f"- {{name: mesh, port: 445, protocol: TLS, tls: {{options: {{{mode}: ISTIO_MUTUAL}}}}}}\n"))
    result = translate(store, "cluster.local")
    ls = listeners(result)
    assert conds(ls["mutual"])["ResolvedRefs"] == ("True", "ResolvedRefs")
    # Client verification without a CA to verify with: refused here, not left to Envoy.
    assert conds(ls["no-ca"])["ResolvedRefs"] == ("False", "InvalidCertificateRef")
    assert "has no ca.crt" in message(ls["no-ca"], "ResolvedRefs")
    assert conds(ls["mesh"])["ResolvedRefs"] == ("True", "ResolvedRefs")
    servers = {e.key.name.rsplit("-", 1)[-1]: e.obj.spec.servers[0].tls for e in result.gateways}
    assert set(servers) == {"mutual", "mesh"}
    assert (servers["mutual"].mode, servers["mutual"].credential_name) == ("MUTUAL", "with-ca")
    assert (servers["mesh"].mode, servers["mesh"].credential_name) == ("ISTIO_MUTUAL", None)
