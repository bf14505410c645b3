"""Control plane revisions and revision tags, as istiod scopes by them (pure functions).

istiod's rules (pkg/config/model.go LabelsInRevision, pkg/revisions/tag_watcher.go IsMine):

- Config objects (Istio CRDs, Gateway API kinds except Gateways themselves) carry an optional
  `istio.io/rev` label. Without it an object is global and every revision reads it; with it only
  the control plane of exactly that revision does (an empty REVISION reads everything). Tags do
  not widen this: a VirtualService labelled with a tag name is read by no revision.
- Gateways are read by every revision (their config is generated wherever their pods connect);
  whether a Gateway is *mine* (I deploy it, I write its status) follows its `istio.io/rev`
  label, else its namespace's, against my revision and my tags: the `istio.io/tag` labels of the
  tag MutatingWebhookConfigurations (`istio-revision-tag-TAG`) that point at my revision. An
  unlabelled Gateway in an unlabelled namespace belongs to whoever holds the `default` tag, or,
  with no default tag anywhere, to the default revision (the one `istiod-default-validator`
  points at; a control plane whose REVISION is `default` is that revision when there is none).
- Pods reach a revision through injection: its webhooks (and those of its tags) select them, and
  the injected proxy's discovery address is that revision's Service (`istiod-REV`), so a proxy
  is served by the revision that injected it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

REV_LABEL = "istio.io/rev"
TAG_LABEL = "istio.io/tag"
DEFAULT = "default"
TAG_WEBHOOK_PREFIX = "istio-revision-tag-"
DEFAULT_VALIDATOR = "istiod-default-validator"


def is_default(revision: str) -> bool:
    return revision in ("", DEFAULT)


def suffix(revision: str) -> str:
    """`-REV` for a named revision, nothing for the default one (istiod's object names)."""
    return "" if is_default(revision) else f"-{revision}"


def service_name(revision: str) -> str:
    return "istiod" + suffix(revision)


def tag_webhook_name(tag: str, namespace: str = "istio-system") -> str:
    """istiod's chart: istio-revision-tag-TAG, with -NAMESPACE outside istio-system."""
    return TAG_WEBHOOK_PREFIX + tag + ("" if namespace == "istio-system" else f"-{namespace}")


def labels_in_revision(labels: Mapping[str, str], revision: str) -> bool:
    """Does the control plane of `revision` read a config object with these labels?"""
    rev = labels.get(REV_LABEL)
    if rev is None or revision == "":
        return True
    return rev == revision


@dataclass(frozen=True)
class TagState:
    """What a control plane knows about tags, from the webhook configurations it watches."""

    revision: str
    tags: frozenset[str] = frozenset()  # tags pointing at `revision`
    other_default_tag: bool = False  # a `default` tag exists and points elsewhere
    default_revision: str | None = None  # what istiod-default-validator names, None if absent
    mine_all: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        object.__setattr__(self, "mine_all", frozenset({self.revision, *self.tags}))

    @property
    def we_are_default_revision(self) -> bool:
        if self.default_revision is not None:
            return self.default_revision == self.revision
        return is_default(self.revision)

    def is_mine(self, labels: Mapping[str, str], namespace_labels: Mapping[str, str] | None) -> bool:
        """istiod's IsMine: the object's revision label, else its namespace's, names me or a tag
        of mine; unlabelled means the default tag's, or the default revision's when no default tag
        points elsewhere. An unknown namespace (None) counts as mine, as in istiod. A revision
        literally named `default` gives that name up to a `default` tag pointing elsewhere (istiod's
        stated intent, "the default tag takes precedence"; its set lookup would let both claim)."""
        selected = labels.get(REV_LABEL)
        if selected is None:
            if namespace_labels is None:
                return True
            selected = namespace_labels.get(REV_LABEL, "")
        mine = self.mine_all - {DEFAULT} if self.other_default_tag else self.mine_all
        if selected in mine:
            return True
        return selected == "" and (DEFAULT in mine or (self.we_are_default_revision and not self.other_default_tag))


def tag_state(revision: str, tag_webhooks: Iterable[Mapping[str, str]],
              default_validator_labels: Mapping[str, str] | None) -> TagState:
    """From the labels of the tag MutatingWebhookConfigurations (those with `istio.io/tag`) and of
    istiod-default-validator (None when absent)."""
    mine, other_default = set(), False
    for labels in tag_webhooks:
        tag, rev = labels.get(TAG_LABEL), labels.get(REV_LABEL)
        if not tag or rev is None:
            continue
        if rev == revision:
            mine.add(tag)
        elif tag == DEFAULT:
            other_default = True
    default_rev = None if default_validator_labels is None else default_validator_labels.get(REV_LABEL, DEFAULT)
    return TagState(revision, frozenset(mine), other_default and DEFAULT not in mine, default_rev)
