"""Gateway spec.tls.frontend as istiod's buildTLS judges it: which CA each terminating listener
verifies clients with (perPort over default), the modes it becomes, and the references refused
in status (never reaching Envoy)."""

from __future__ import annotations

import textwrap

from pilot.model.events import push_request_for
from pilot.model.gateway_api import translate
from pilot.model.gateways import ServerRef
from pilot.model.store import ConfigKey, Event
from pilot.networking.gateway import _tls_plan as tls_plan  # the plan the router's listener is built from
from pilot.networking.gateway import downstream_tls_context
from tests.support.certs import issue, make_ca, tls_secret_yaml
from tests.unit.test_gateway_api import CLASS, conds, listeners, store_of
from tests.unit.test_gateway_api_status import message, service

CA = make_ca("client CA")
SERVER = tls_secret_yaml("server", "infra", issue(make_ca(), ["a.example.com"]))
MODE = "gateway.istio.io/tls-terminate-mode"


def configmap(name: str, data: str, namespace: str = "infra") -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {namespace}}}\ndata:\n{data}"


GOOD_CM = configmap("ca", "  ca.crt: |\n" + textwrap.indent(CA.cert_pem.decode(), "    "))


def frontend_gateway(default_refs: str, per_port: str = "", listeners_: str = "", mode: str = "") -> str:
    mode_line = f"          mode: {mode}\n" if mode else ""
    return ("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n"
            "metadata: {name: web, namespace: infra, generation: 3}\n"
            "spec:\n  gatewayClassName: istio\n  tls:\n    frontend:\n      default:\n        validation:\n"
            f"{mode_line}          caCertificateRefs: {default_refs}\n"
            + (f"      perPort:\n{per_port}" if per_port else "")
            + "  listeners:\n"
            + (listeners_ or "  - {name: a, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: server}]}}\n"))


def servers(result) -> dict:
    return {e.key.name.rsplit("-", 1)[-1]: e.obj.spec.servers[0] for e in result.gateways}


def envoy_tls(result, listener: str):
    """The downstream TLS context the router's listener gets for this listener's server."""
    entry = next(e for e in result.gateways if e.key.name.endswith(f"-{listener}"))
    return downstream_tls_context(tls_plan(ServerRef(entry, 0), ()))


def test_default_validation_makes_terminating_listeners_mutual_with_the_configmap_ca():
    store = store_of(CLASS, service("web-istio", "infra", 443), SERVER, GOOD_CM,
                     frontend_gateway('[{group: "", kind: ConfigMap, name: ca}]'))
    result = translate(store, "cluster.local")
    assert conds(listeners(result)["a"])["ResolvedRefs"] == ("True", "ResolvedRefs")
    ctx = envoy_tls(result, "a")
    assert ctx.require_client_certificate.value is True
    combined = ctx.common_tls_context.combined_validation_context
    assert combined.validation_context_sds_secret_config.name == "configmap://infra/ca-cacert"
    assert combined.default_validation_context.trust_chain_verification == 0  # VERIFY_TRUST_CHAIN
    # The SDS answer for that name is the ConfigMap's CA, for this namespace's routers only.
    assert result.client_cas == {("infra", "configmap://infra/ca-cacert"): CA.cert_pem}
    gw = result.statuses[ConfigKey("KubernetesGateway", "infra", "web")]
    assert "InsecureFrontendValidationMode" not in conds(gw)


def test_per_port_wins_and_insecure_fallback_accepts_untrusted_clients():
    store = store_of(CLASS, service("web-istio", "infra", 443, 444, 445), SERVER, GOOD_CM,
                     frontend_gateway('[{group: "", kind: ConfigMap, name: ca}]',
                                      per_port="      - port: 444\n        tls:\n          validation:\n"
                                               "            mode: AllowInsecureFallback\n"
                                               '            caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}]\n'
                                               "      - port: 445\n        tls: {}\n",
                                      listeners_="  - {name: a, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: server}]}}\n"
                                                 "  - {name: b, port: 444, protocol: HTTPS, tls: {certificateRefs: [{name: server}]}}\n"
                                                 "  - {name: c, port: 445, protocol: HTTPS, tls: {certificateRefs: [{name: server}]}}\n"))
    result = translate(store, "cluster.local")
    s = servers(result)
    assert {k: v.tls.mode for k, v in s.items()} == {"a": "MUTUAL", "b": "OPTIONAL_MUTUAL", "c": "SIMPLE"}
    fallback = envoy_tls(result, "b")
    assert fallback.require_client_certificate.value is False
    assert fallback.common_tls_context.combined_validation_context.default_validation_context \
        .trust_chain_verification == 1  # ACCEPT_UNTRUSTED, as istiod's insecureSkipVerify
    plain = envoy_tls(result, "c")  # perPort without validation: none
    assert not plain.common_tls_context.HasField("combined_validation_context")
    gw = result.statuses[ConfigKey("KubernetesGateway", "infra", "web")]
    assert conds(gw)["InsecureFrontendValidationMode"] == ("True", "ConfigurationChanged")


def test_the_terminate_mode_option_still_wins():
    store = store_of(CLASS, service("web-istio", "infra", 443), SERVER, GOOD_CM,
                     frontend_gateway('[{group: "", kind: ConfigMap, name: ca}]', mode="AllowInsecureFallback",
                                      listeners_="  - {name: a, port: 443, protocol: HTTPS, tls: {certificateRefs: "
                                                 f"[{{name: server}}], options: {{{MODE}: OPTIONAL_MUTUAL}}}}}}\n"))
    result = translate(store, "cluster.local")
    tls = servers(result)["a"].tls
    assert (tls.mode, tls.ca_cert_credential_name, tls.insecure_skip_verify) == \
        ("OPTIONAL_MUTUAL", "configmap://infra/ca-cacert", False)


def test_bad_references_are_refused_in_status_and_never_served():
    cases = {
        "missing": ('[{group: "", kind: ConfigMap, name: nope}]', "InvalidCACertificateRef",
                    "configmap infra/nope not found"),
        "kind": ('[{group: "", kind: Service, name: ca}]', "InvalidCACertificateKind",
                 "only secret and configmap are allowed"),
        "secret-missing": ('[{group: "", kind: Secret, name: nope}]', "InvalidCACertificateRef",
                           "secret infra/nope not found"),
        "secret-no-ca": ('[{group: "", kind: Secret, name: server}]', "InvalidCACertificateRef", "found no ca.crt"),
        "two": ('[{group: "", kind: ConfigMap, name: ca}, {group: "", kind: ConfigMap, name: ca}]',
                "InvalidCACertificateRef", "only one caCertificateRef is supported"),
        "elsewhere": ('[{group: "", kind: ConfigMap, name: ca, namespace: certs}]', "RefNotPermitted",
                      "missing a ReferenceGrant"),
        "no-key": ('[{group: "", kind: ConfigMap, name: empty}]', "InvalidCACertificateRef", "found no ca.crt"),
        "malformed": ('[{group: "", kind: ConfigMap, name: junk}]', "InvalidCACertificateRef",
                      "the bundle is malformed"),
    }
    for case, (refs, reason, why) in cases.items():
        store = store_of(CLASS, service("web-istio", "infra", 443), SERVER, GOOD_CM,
                         configmap("ca", GOOD_CM.split("data:\n", 1)[1], namespace="certs"),
                         configmap("empty", "  other: x\n"),
                         configmap("junk", "  ca.crt: '-----BEGIN CERTIFICATE-----\n\n    @@@\n\n"
                                           "    -----END CERTIFICATE-----'\n"),
                         frontend_gateway(refs))
        result = translate(store, "cluster.local")
        ls = listeners(result)["a"]
        assert conds(ls)["ResolvedRefs"] == ("False", reason), case
        assert why in message(ls, "ResolvedRefs"), (case, message(ls, "ResolvedRefs"))
        assert conds(ls)["Programmed"] == ("False", "Invalid"), case
        assert conds(ls)["Accepted"] == ("False", "NoValidCACertificate"), case
        assert result.gateways == () and result.client_cas == {}, case


def test_a_secrets_ca_is_served_under_its_own_sds_name():
    store = store_of(CLASS, service("web-istio", "infra", 443), SERVER,
                     tls_secret_yaml("with-ca", "infra", issue(CA, ["x"]), CA),
                     frontend_gateway('[{group: "", kind: Secret, name: with-ca}]'))
    result = translate(store, "cluster.local")
    assert conds(listeners(result)["a"])["ResolvedRefs"] == ("True", "ResolvedRefs")
    ctx = envoy_tls(result, "a")
    assert ctx.common_tls_context.combined_validation_context.validation_context_sds_secret_config.name == \
        "kubernetes-gateway://infra/with-ca-cacert"
    assert result.client_cas == {("infra", "kubernetes-gateway://infra/with-ca-cacert"): CA.cert_pem}


def test_a_reference_grant_admits_another_namespaces_configmap():
    grant = ("apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\n"
             "metadata: {name: g, namespace: certs}\n"
             "spec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]\n"
             '  to: [{group: "", kind: ConfigMap}]\n')
    store = store_of(CLASS, service("web-istio", "infra", 443), SERVER, grant,
                     configmap("ca", GOOD_CM.split("data:\n", 1)[1], namespace="certs"),
                     frontend_gateway('[{group: "", kind: ConfigMap, name: ca, namespace: certs}]'))
    result = translate(store, "cluster.local")
    assert conds(listeners(result)["a"])["ResolvedRefs"] == ("True", "ResolvedRefs")
    assert result.client_cas == {("infra", "configmap://certs/ca-cacert"): CA.cert_pem}


def test_only_configmaps_holding_a_ca_bundle_trigger_a_push():
    mesh = ConfigKey("ConfigMap", "istio-system", "istio")
    store = store_of(GOOD_CM, configmap("other", "  key: value\n"))
    ca, other = (store.get(ConfigKey("ConfigMap", "infra", n)) for n in ("ca", "other"))
    assert push_request_for([Event("update", ca.key, ca, ca)], mesh) is not None
    assert push_request_for([Event("update", other.key, other, other)], mesh) is None


def test_upstream_invalid_client_certificate_validation_touches_only_the_affected_listeners():
    """gateway-api v1.5.1 GatewayInvalidFrontendClientCertificateValidation, its manifest's
    references: per port a missing ConfigMap, a Service, another namespace's ConfigMap without a
    ReferenceGrant; the default's valid CA keeps its listener served."""
    def ref(kind: str, name: str, ns: str = "") -> str:
        return f'[{{group: "", kind: {kind}, name: {name}{", namespace: " + ns if ns else ""}}}]'

    per_port = "".join(f"      - port: {port}\n        tls:\n          validation:\n            caCertificateRefs: {r}\n"
                       for port, r in ((7443, ref("ConfigMap", "non-exisitng-cm")),
                                       (8443, ref("Service", "infra-backend-v2")),
                                       (6443, ref("ConfigMap", "web-backend-cm", "web-backend"))))
    listeners_ = "".join(f"  - {{name: {n}, port: {p}, protocol: HTTPS, tls: {{certificateRefs: [{{name: server}}]}}}}\n"
                         for n, p in (("https", 443), ("https-unresolved", 7443), ("https-invalid-kind", 8443),
                                      ("https-grant-missing", 6443)))
    store = store_of(CLASS, service("web-istio", "infra", 443, 7443, 8443, 6443), SERVER, GOOD_CM,
                     configmap("web-backend-cm", GOOD_CM.split("data:\n", 1)[1], namespace="web-backend"),
                     frontend_gateway(ref("ConfigMap", "ca"), per_port=per_port, listeners_=listeners_))
    ls = listeners(translate(store, "cluster.local"))
    assert {c: conds(ls["https"])[c][0] for c in ("ResolvedRefs", "Accepted", "Programmed")} == \
        {"ResolvedRefs": "True", "Accepted": "True", "Programmed": "True"}
    for name, reason in (("https-unresolved", "InvalidCACertificateRef"), ("https-invalid-kind", "InvalidCACertificateKind"),
                         ("https-grant-missing", "RefNotPermitted")):
        assert conds(ls[name])["ResolvedRefs"] == ("False", reason), name
        assert conds(ls[name])["Accepted"] == ("False", "NoValidCACertificate"), name
        assert conds(ls[name])["Programmed"][0] == "False", name


def test_a_configmap_ca_under_cacert_is_read_as_backend_tls_policy_reads_it():
    # istiod's ExtractRootFromString: `ca.crt`, else `cacert` (one reader for both kinds' ConfigMaps).
    cm = configmap("ca", "  cacert: |\n" + textwrap.indent(CA.cert_pem.decode(), "    "))
    store = store_of(CLASS, service("web-istio", "infra", 443), SERVER, cm,
                     frontend_gateway('[{group: "", kind: ConfigMap, name: ca}]'))
    result = translate(store, "cluster.local")
    assert conds(listeners(result)["a"])["ResolvedRefs"] == ("True", "ResolvedRefs")
    assert result.client_cas == {("infra", "configmap://infra/ca-cacert"): CA.cert_pem}
