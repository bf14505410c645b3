"""istiod's listener conflict rule (gatewaycommon listenersDistinct / listenerConflictReason), case
by case, as a user reads it from the Gateway's listener status."""

from __future__ import annotations

import pytest

from pilot.model.gateway_api import translate
from pilot.model.gateway_api.listeners import CONFLICT_MESSAGE
from pilot.model.gateways import GatewayView
from tests.support.certs import issue, make_ca, tls_secret_yaml
from tests.unit.test_gateway_api import CLASS, conds, gateway, listeners, store_of
from tests.unit.test_gateway_api_listener_sets import listener_set, ls_listeners

HTTPS = "protocol: HTTPS, tls: {certificateRefs: [{name: cert}]}"
TLS = "protocol: TLS, tls: {mode: Passthrough}"


def _second(first: str, second: str) -> dict:
    """`second` in a ListenerSet merged after the Gateway's `first` (the Gateway CRD refuses two
    listeners with one port, protocol and hostname, so identical pairs only meet this way)."""
    ca = make_ca()
    store = store_of(CLASS, tls_secret_yaml("cert", "infra", issue(ca, ["*.example.com"])),
                     gateway(f"- {{name: first, port: 8000, {first}}}\n",
                             extra="  allowedListeners: {namespaces: {from: Same}}\n"),
                     listener_set("ls", f"- {{name: second, port: 8000, {second}}}"))
    result = translate(store, "cluster.local")
    assert conds(listeners(result)["first"])["Conflicted"] == ("False", "NoConflicts")  # the earlier one wins
    return ls_listeners(result, "ls")["second"]


def test_within_one_gateway_too():
    store = store_of(CLASS, gateway("- {name: a, port: 80, protocol: HTTP}\n- {name: b, port: 80, protocol: TCP}\n"
                                    "- {name: c, port: 80, protocol: HTTP, hostname: c.example.com}\n"))
    ls = listeners(translate(store, "cluster.local"))
    assert conds(ls["b"])["Conflicted"] == ("True", "ProtocolConflict")
    assert conds(ls["c"])["Conflicted"] == ("False", "NoConflicts")


@pytest.mark.parametrize(("first", "second", "reason"), [
    # HTTP-like against HTTP-like: distinct by hostname alone (unset is `*`), whatever the protocols.
    ("protocol: HTTP, hostname: a.example.com", f"{HTTPS}, hostname: b.example.com", None),
    ("protocol: HTTP, hostname: a.example.com", f"{TLS}, hostname: b.example.com", None),
    (f"{HTTPS}, hostname: a.example.com", f"{TLS}, hostname: b.example.com", None),
    ("protocol: HTTP", f"{HTTPS}, hostname: b.example.com", None),  # `*` is not b.example.com
    ("protocol: HTTP, hostname: a.example.com", "protocol: HTTP, hostname: b.example.com", None),
    # ... and the same hostname: ProtocolConflict when the protocols differ, else HostnameConflict.
    ("protocol: HTTP, hostname: a.example.com", f"{HTTPS}, hostname: a.example.com", "ProtocolConflict"),
    ("protocol: HTTP", HTTPS, "ProtocolConflict"),
    (f"{HTTPS}, hostname: a.example.com", f"{TLS}, hostname: a.example.com", "ProtocolConflict"),
    ("protocol: HTTP, hostname: a.example.com", "protocol: HTTP, hostname: a.example.com", "HostnameConflict"),
    ("protocol: HTTP", "protocol: HTTP", "HostnameConflict"),
    (f"{HTTPS}, hostname: a.example.com", f"{HTTPS}, hostname: a.example.com", "HostnameConflict"),
    # TCP/UDP against anything TCP/UDP/HTTP-like on the port: always ProtocolConflict.
    ("protocol: TCP", "protocol: TCP", "ProtocolConflict"),
    ("protocol: TCP", "protocol: UDP", "ProtocolConflict"),
    ("protocol: UDP", "protocol: HTTP", "ProtocolConflict"),
    ("protocol: HTTP, hostname: a.example.com", "protocol: TCP", "ProtocolConflict"),
    (f"{TLS}, hostname: a.example.com", "protocol: TCP", "ProtocolConflict"),
    # Any other protocol conflicts only with its own kind.
    ("protocol: HTTP", "protocol: http", None),
    ("protocol: TCP", "protocol: example.com/custom", None),
    ("protocol: example.com/custom", "protocol: example.com/custom", "HostnameConflict"),
])
def test_istiod_listener_conflict_rule(first, second, reason):
    status = _second(first, second)
    c = conds(status)
    if reason is None:
        assert c["Conflicted"] == ("False", "NoConflicts")
        return
    assert {k: c[k] for k in ("Accepted", "Conflicted", "Programmed")} == {
        "Accepted": ("False", reason), "Conflicted": ("True", reason), "Programmed": ("False", reason)}
    assert {cond["message"] for cond in status["conditions"] if cond["type"] != "ResolvedRefs"} == {CONFLICT_MESSAGE}


def test_other_ports_never_conflict():
    store = store_of(CLASS, gateway("- {name: a, port: 80, protocol: TCP}\n- {name: b, port: 81, protocol: TCP}\n"))
    ls = listeners(translate(store, "cluster.local"))
    assert conds(ls["b"])["Conflicted"] == ("False", "NoConflicts")


def test_a_conflicted_listener_frees_its_place():
    """Only winners are compared: a listener that lost holds nothing."""
    store = store_of(CLASS, gateway("""\
        - {name: a, port: 80, protocol: HTTP, hostname: a.example.com}
        - {name: loser, port: 80, protocol: TCP}
        - {name: c, port: 80, protocol: HTTP, hostname: c.example.com}
        """))
    ls = listeners(translate(store, "cluster.local"))
    assert conds(ls["loser"])["Conflicted"] == ("True", "ProtocolConflict")
    assert conds(ls["c"])["Conflicted"] == ("False", "NoConflicts")  # the TCP listener holds nothing


def test_a_conflict_outranks_an_unsupported_protocol():
    store = store_of(CLASS, gateway("- {name: a, port: 53, protocol: UDP}\n- {name: b, port: 53, protocol: TCP}\n"))
    ls = listeners(translate(store, "cluster.local"))
    assert conds(ls["a"])["Accepted"] == ("False", "UnsupportedProtocol")
    assert conds(ls["b"])["Accepted"] == ("False", "ProtocolConflict")  # the UDP listener still won port 53


def test_http_and_https_on_one_port_serve_the_first_class_only():
    """Both are accepted (istiod's status); as istiod's MergeGateways, the router serves the port's
    first server class (HTTP here) and leaves the HTTPS server out, saying why."""
    ca = make_ca()
    store = store_of(CLASS, tls_secret_yaml("cert", "infra", issue(ca, ["*.example.com"])), gateway(f"""\
        - {{name: plain, port: 8000, protocol: HTTP, hostname: a.example.com}}
        - {{name: secure, port: 8000, {HTTPS}, hostname: b.example.com}}
        """))
    result = translate(store, "cluster.local")
    ls = listeners(result)
    assert conds(ls["secure"])["Accepted"] == ("True", "Accepted")
    view = GatewayView.build(result.gateways)
    assert [(p.port, p.kind, len(p.servers)) for p in view.ports] == [(8000, "http", 1)]
    assert any("a HTTPS server cannot share it" in s for s in view.skipped)
