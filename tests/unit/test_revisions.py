"""istiod's revision rules (pkg/config/model.go, pkg/revisions/tag_watcher.go) and the objects
`pilotctl tag` writes (istioctl/pkg/tag), as pure functions."""

from __future__ import annotations

from pilot.inject.deploy import mutating_webhook_configuration
from pilot.model.revisions import labels_in_revision, tag_state
from pilot.pilotctl.tag import canonical_injector, rows_table, tag_rows, tag_webhook


def test_config_objects_are_read_by_their_revision_and_global_ones_by_all():
    assert labels_in_revision({}, "canary") and labels_in_revision({}, "default")
    assert labels_in_revision({"istio.io/rev": "canary"}, "canary")
    assert not labels_in_revision({"istio.io/rev": "canary"}, "default")
    assert not labels_in_revision({"istio.io/rev": "default"}, "canary")
    assert labels_in_revision({"istio.io/rev": "anything"}, "")  # no REVISION: everything


def tag(name, rev):
    return {"istio.io/tag": name, "istio.io/rev": rev}


def test_is_mine_follows_the_object_then_its_namespace_then_the_default_tag():
    canary = tag_state("canary", [tag("prod", "canary")], None)
    assert canary.tags == {"prod"}
    assert canary.is_mine({"istio.io/rev": "prod"}, None)
    assert canary.is_mine({}, {"istio.io/rev": "canary"})
    assert not canary.is_mine({"istio.io/rev": "default"}, {"istio.io/rev": "canary"})  # object wins
    assert not canary.is_mine({}, {})  # unlabelled: the default revision's
    assert tag_state("default", [tag("prod", "canary")], None).is_mine({}, {})
    # The default tag moves unlabelled objects to the canary, away from the default revision.
    tags = [tag("default", "canary")]
    assert tag_state("canary", tags, None).is_mine({}, {})
    moved = tag_state("default", tags, None)
    assert moved.other_default_tag and not moved.is_mine({}, {})
    # istiod-default-validator names the default revision when there is no default tag.
    assert tag_state("canary", [], {"istio.io/rev": "canary"}).is_mine({}, {})
    assert not tag_state("stable", [], {"istio.io/rev": "canary"}).is_mine({}, {})


def test_a_tag_webhook_copies_the_revision_injector_and_uses_the_tag_selectors():
    canon = canonical_injector(mutating_webhook_configuration("canary"))
    prod = tag_webhook("prod", canon, "istio-system")
    assert prod["metadata"]["name"] == "istio-revision-tag-prod"
    assert prod["metadata"]["labels"] == {"istio.io/tag": "prod", "istio.io/rev": "canary",
                                          "app": "sidecar-injector", "app.kubernetes.io/name": "istiod"}
    assert [w["name"] for w in prod["webhooks"]] == ["rev.namespace.sidecar-injector.istio.io",
                                                     "rev.object.sidecar-injector.istio.io"]
    assert prod["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["prod"]
    assert prod["webhooks"][1]["objectSelector"]["matchExpressions"][1]["values"] == ["prod"]
    assert {w["clientConfig"]["service"]["name"] for w in prod["webhooks"]} == {"istiod-canary"}
    auto = tag_webhook("default", canon, "istio-system", auto_inject_namespaces=True)
    assert auto["webhooks"][-1]["name"] == "auto.sidecar-injector.istio.io"
    assert tag_webhook("prod", canon, "mesh")["metadata"]["name"] == "istio-revision-tag-prod-mesh"


def test_tag_list_rows_and_table_as_istioctl_prints_them():
    objs = [{"metadata": {"labels": {"istio.io/rev": "canary"}}},  # the revision's own: dropped (tagged)
            {"metadata": {"labels": tag("prod", "canary")}},
            {"metadata": {"labels": {"istio.io/rev": "default"}}}]
    rows = tag_rows(objs, [], lambda t: ["shop", "web"] if t == "prod" else [])
    assert [(r["tag"], r["revision"]) for r in rows] == [("prod", "canary"), ("", "default")]
    assert rows_table(rows).splitlines() == ["TAG  REVISION NAMESPACES", "prod canary   shop,web", "     default"]
