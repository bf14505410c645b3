"""The published table of supported fields is what the models say, and says what users rely on."""

from __future__ import annotations

import json

from pilot.config import fields_table as ft


def rows_of(title: str) -> dict[str, ft.Row]:
    for t, _versions, _policy, rows in ft.tables():
        if t == title:
            return {r.path: r for r in rows}
    raise AssertionError(f"no table for {title}")


def test_the_committed_table_is_the_generated_one() -> None:
    assert ft.DOC.read_text() == ft.render(), "docs/fields.md is stale: run `make docs`"


def test_every_kind_and_meshconfig_has_a_table() -> None:
    from pilot.config.kinds import KINDS
    titles = [t for t, *_ in ft.tables()]
    assert len(titles) == len(KINDS) + 1 and titles[-1] == "MeshConfig"


def test_statuses_follow_the_marks_on_the_models() -> None:
    ap = rows_of("AuthorizationPolicy")
    assert ap["spec.rules[].from[].source.trustDomains"].status == ft.APPLIED
    assert ap["spec.rules[].from[].source.notTrustDomains"].status == ft.APPLIED
    assert ap["spec.provider"].status == ft.APPLIED and "deny" in ap["spec.provider"].note
    gw = rows_of("Gateway (KubernetesGateway)")
    assert gw["spec.tls.backend"].status == ft.UNSUPPORTED
    assert gw["spec.tls.frontend.perPort[].tls.validation.mode"].status == ft.APPLIED
    assert gw["spec.listeners[].tls.options"].status == ft.APPLIED  # (keys other than tls-terminate-mode refused)
    assert gw["spec.listeners[].tls.certificateRefs[].name"].status == ft.APPLIED
    assert "status" not in gw  # ours to write, not configuration
    route = rows_of("HTTPRoute")
    # a mark is inherited by everything under it
    assert route["spec.rules[].filters[].extensionRef"].status == ft.FAILS_CLOSED
    assert route["spec.rules[].filters[].extensionRef.name"].status == ft.FAILS_CLOSED
    assert route["spec.rules[].filters[].cors.allowOrigins"].status == ft.APPLIED
    assert route["spec.rules[].retry.codes"].status == ft.APPLIED
    assert route["spec.rules[].sessionPersistence.type"].status == ft.APPLIED
    assert route["spec.rules[].sessionPersistence.idleTimeout"].status == ft.UNSUPPORTED
    mesh = rows_of("MeshConfig")
    assert mesh["meshMTLS"].status == ft.UNSUPPORTED
    assert mesh["extensionProviders[].zipkin"].status == ft.APPLIED
    assert mesh["extensionProviders[].envoyExtAuthzHttp.failOpen"].status == ft.APPLIED
    assert mesh["trustDomain"].status == ft.APPLIED


def test_summary_counts_add_up() -> None:
    for _t, _v, _p, rows in ft.tables():
        assert sum(ft.summary(rows)) == len(rows)


def test_the_summary_figures_are_the_tables_counts(capsys) -> None:
    """`python -m pilot.config.fields_table --summary` (the closing note's per-kind figures)."""
    assert ft.main(["--summary"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {t for t, *_ in ft.tables()}
    vs = next(rows for t, _v, _p, rows in ft.tables() if t == "VirtualService")
    assert figures["VirtualService"] == dict(zip(("applied", "unsupported", "fails_closed"), ft.summary(vs), strict=True))
    assert figures["MeshConfig"]["unsupported"] > 0 and figures["DestinationRule"]["applied"] > 0
