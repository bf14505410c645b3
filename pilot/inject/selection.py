"""Which pods get a sidecar: istiod's two stages, as pure functions.

1. The MutatingWebhookConfiguration's selectors (namespace labels, pod labels) decide whether the
   apiserver calls us at all. `WEBHOOKS` holds istiod's chart selectors; deploy/ is generated from
   them and the handler applies the same selectors itself, so a request that reaches `/inject`
   by another route (a broader webhook, a test) gets the same answer.
2. istiod's `injectRequired`: hostNetwork and system namespaces never, then the pod's
   `sidecar.istio.io/inject` label (over the annotation), `neverInjectSelector`,
   `alwaysInjectSelector`, and the config's `policy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pilot.config.mesh import LabelSelector

INJECT_LABEL = "sidecar.istio.io/inject"
REV_LABEL = "istio.io/rev"
NS_INJECTION_LABEL = "istio-injection"
STATUS_ANNOTATION = "sidecar.istio.io/status"
PROXY_CONTAINER = "istio-proxy"

# Namespaces istiod never injects into (pkg/kube/inject/initializer.go).
IGNORED_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "local-path-storage"})


def _expr(key: str, op: str, values: Sequence[str] = ()) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


@dataclass(frozen=True)
class Webhook:
    name: str
    namespace_selector: dict[str, Any]
    object_selector: dict[str, Any]


def webhooks(revision: str) -> tuple[Webhook, ...]:
    """istiod's chart (templates/mutatingwebhook.yaml): two revision webhooks, and for the default
    revision the two legacy ones. `revision` "" or "default" is the default revision."""
    default = revision in ("", "default")
    rev = "default" if default else revision
    not_disabled = _expr(INJECT_LABEL, "NotIn", ["false"])
    hooks = [
        Webhook(
            "rev.namespace.sidecar-injector.istio.io",
            {"matchExpressions": [_expr(REV_LABEL, "In", [rev]), _expr(NS_INJECTION_LABEL, "DoesNotExist")]},
            {"matchExpressions": [not_disabled]},
        ),
        Webhook(
            "rev.object.sidecar-injector.istio.io",
            {
                "matchExpressions": [
                    _expr(REV_LABEL, "DoesNotExist"),
                    _expr(NS_INJECTION_LABEL, "DoesNotExist"),
                ]
            },
            {"matchExpressions": [not_disabled, _expr(REV_LABEL, "In", [rev])]},
        ),
    ]
    if default:
        hooks += [
            Webhook(
                "namespace.sidecar-injector.istio.io",
                {"matchExpressions": [_expr(NS_INJECTION_LABEL, "In", ["enabled"])]},
                {"matchExpressions": [not_disabled]},
            ),
            Webhook(
                "object.sidecar-injector.istio.io",
                {
                    "matchExpressions": [
                        _expr(NS_INJECTION_LABEL, "DoesNotExist"),
                        _expr(REV_LABEL, "DoesNotExist"),
                    ]
                },
                {"matchExpressions": [_expr(INJECT_LABEL, "In", ["true"]), _expr(REV_LABEL, "DoesNotExist")]},
            ),
        ]
    return tuple(hooks)


_SELECTOR_CACHE: dict[str, tuple[tuple[LabelSelector, LabelSelector], ...]] = {}


def _compiled(revision: str) -> tuple[tuple[LabelSelector, LabelSelector], ...]:
    got = _SELECTOR_CACHE.get(revision)
    if got is None:
        got = tuple(
            (
                LabelSelector.model_validate(w.namespace_selector),
                LabelSelector.model_validate(w.object_selector),
            )
            for w in webhooks(revision)
        )
        _SELECTOR_CACHE[revision] = got
    return got


def webhook_matches(
    revision: str, namespace_labels: Mapping[str, str], pod_labels: Mapping[str, str]
) -> bool:
    """Would the apiserver send this pod to one of our webhooks?"""
    ns, pod = dict(namespace_labels), dict(pod_labels)
    return any(n.matches(ns) and o.matches(pod) for n, o in _compiled(revision))


def _selector_matches(sel: LabelSelector, labels: Mapping[str, str]) -> bool:
    # An empty selector selects nothing here (istiod: `!selector.Empty() && Matches`).
    if not sel.match_labels and not sel.match_expressions:
        return False
    return sel.matches(dict(labels))


def inject_required(
    *,
    policy: str,
    never: Sequence[LabelSelector],
    always: Sequence[LabelSelector],
    namespace: str,
    spec: Mapping[str, Any],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
) -> tuple[bool, str]:
    """istiod's injectRequired. Returns (required, reason) — the reason is logged."""
    if spec.get("hostNetwork"):
        return False, "hostNetwork pod"
    if namespace in IGNORED_NAMESPACES:
        return False, f"system namespace {namespace}"
    choice = labels.get(INJECT_LABEL, annotations.get(INJECT_LABEL, ""))
    use_default, inject = False, False
    if choice == "true":
        inject = True
    elif choice != "false":
        use_default = True  # "" or an invalid value: istiod warns and falls back to the policy
    if use_default:
        for sel in never:
            if _selector_matches(sel, labels):
                return False, "labels match neverInjectSelector"
        for sel in always:
            if _selector_matches(sel, labels):
                inject, use_default = True, False
                break
    if policy == "enabled":
        required = True if use_default else inject
    elif policy == "disabled":
        required = False if use_default else inject
    else:
        return False, f"illegal injection policy {policy!r} (want enabled or disabled)"
    return required, ("policy " + policy if use_default else f"{INJECT_LABEL}={choice or 'selector'}")


def already_injected(pod: Mapping[str, Any]) -> bool:
    """The pod carries our status annotation and an istio-proxy container (regular or native)."""
    meta = pod.get("metadata") or {}
    if STATUS_ANNOTATION not in (meta.get("annotations") or {}):
        return False
    spec = pod.get("spec") or {}
    names = {
        c.get("name")
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
        if isinstance(c, dict)
    }
    return PROXY_CONTAINER in names
