"""AdmissionReview in, AdmissionReview out: the injector's one entry point, free of any HTTP
framework so the HTTPS server (and tests, and benchmarks) can call it directly.

Outcomes, as istiod's webhook:
- not for us (namespace/pod selectors, policy, hostNetwork, already injected, not a Pod CREATE):
  `allowed: true`, no patch ("skip");
- injected: `allowed: true` with a base64 JSONPatch (RFC 6902) from the pod as sent to the pod
  as injected;
- cannot be injected (bad annotation, port conflict, unknown template, broken template) or not an
  AdmissionReview: `allowed: false` with the reason in `status.message` — istiod's
  toAdmissionResponse; with the chart's `failurePolicy: Fail` the pod is refused with that message.
No input raises: an unexpected error is turned into a refusal naming it, and logged.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pilot import features
from pilot import logging as plog
from pilot.inject import annotations as anno
from pilot.inject import selection
from pilot.inject.config import InjectorConfig, InjectorConfigHolder
from pilot.inject.metrics import InjectionMetrics
from pilot.inject.patch import diff
from pilot.inject.pod import InjectionError, Inputs, inject
from pilot.model.revisions import DEFAULT, TagState

log = plog.get("inject")

ADMISSION_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
# /inject/cluster/CLUSTER/net/NETWORK (istiod's URLParameterToEnv); other keys become upper-cased env names.
URL_PARAMETER_TO_ENV = {"cluster": "ISTIO_META_CLUSTER_ID", "net": "ISTIO_META_NETWORK"}
MESH_DEFAULTS = {"trustDomain": "cluster.local", "enablePrometheusMerge": True}

NamespaceLabels = Callable[[str], Mapping[str, str] | None]


@dataclass
class InjectionContext:
    """What `review` needs besides the request. `namespace_labels(name)` returns a Namespace's
    labels, None when unknown (then the apiserver's evaluation of the webhook selectors stands, as in
    istiod, which never re-checks them). `mesh` is the MeshConfig as users write it (camelCase), or
    a callable giving it."""

    config: InjectorConfigHolder | InjectorConfig
    namespace_labels: NamespaceLabels
    mesh: Mapping[str, Any] | Callable[[], Mapping[str, Any]] = field(default_factory=dict)
    revision: str = "default"
    native_sidecars: bool = False
    metrics: InjectionMetrics | None = None
    # The revision tags pointing at this revision (pilot/sources/kube/tags.py), None without a
    # cluster: the webhooks of a tag call this revision's /inject with the tag's selectors.
    tags: Callable[[], TagState] | None = None

    def served_revisions(self) -> frozenset[str]:
        """The revision names whose webhook selectors route pods here: mine and my tags'. The
        default revision stops answering for `default` once a `default` tag points elsewhere
        (`tag set default` turns its own webhooks off, as istioctl does)."""
        if self.tags is None:
            return frozenset({self.revision})
        state = self.tags()
        return state.mine_all - {DEFAULT} if state.other_default_tag else state.mine_all

    @classmethod
    def from_env(
        cls,
        config: InjectorConfigHolder | InjectorConfig,
        namespace_labels: NamespaceLabels,
        *,
        mesh: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        metrics: InjectionMetrics | None = None,
        environ: dict[str, str] | None = None,
    ) -> InjectionContext:
        """REVISION and ENABLE_NATIVE_SIDECARS from the environment (pilot/features.py)."""
        return cls(
            config=config,
            namespace_labels=namespace_labels,
            mesh=mesh or {},
            revision=features.REVISION.get(environ) or "default",
            native_sidecars=features.ENABLE_NATIVE_SIDECARS.get(environ) == "true",
            metrics=metrics,
        )

    def current_config(self) -> InjectorConfig:
        return self.config.current if isinstance(self.config, InjectorConfigHolder) else self.config

    def current_mesh(self) -> dict[str, Any]:
        m = self.mesh() if callable(self.mesh) else self.mesh
        return {**MESH_DEFAULTS, **(m or {})}


def parse_inject_path(path: str) -> dict[str, str]:
    """istiod's parseInjectEnvs: /inject/k1/v1/k2/v2 (`--slash--` for `/` in values) or the
    deprecated /inject/:ENV:k=v:ENV:k2=v2."""
    parts = path.rstrip("/").split("/", 2)
    if len(parts) < 3 or not parts[2]:
        return {}
    rest = parts[2]
    pairs: list[str] = []
    if rest.startswith(":ENV:"):
        for kv in rest.split(":ENV:")[1:]:
            k, sep, v = kv.partition("=")
            if k and sep:
                pairs += [k, v]
    else:
        pairs = rest.split("/")
        pairs = [p.replace("--slash--", "/") if i % 2 else p for i, p in enumerate(pairs)]
    out = {}
    for i in range(0, len(pairs) - 1, 2):
        env = URL_PARAMETER_TO_ENV.get(pairs[i], pairs[i].upper())
        if env:
            out[env] = pairs[i + 1]
    return out


def _response(review: Mapping[str, Any] | None, uid: str, resp: dict[str, Any]) -> dict[str, Any]:
    api = review.get("apiVersion") if isinstance(review, Mapping) else None
    return {
        "apiVersion": api if api in ADMISSION_VERSIONS else "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, **resp},
    }


def _refuse(message: str) -> dict[str, Any]:
    return {"allowed": False, "status": {"message": message}}


def _pod_name(meta: Mapping[str, Any]) -> str:
    if meta.get("name"):
        return meta["name"]
    if meta.get("generateName"):
        return meta["generateName"] + "***** (actual name not yet known)"
    return ""


def review(admission_review: Any, ctx: InjectionContext, path: str = "/inject") -> dict[str, Any]:
    """Answer one AdmissionReview (a decoded JSON document)."""
    started = time.perf_counter()
    m = ctx.metrics
    if m is not None:
        m.requests.inc()
    outcome = "failure"
    try:
        resp, outcome = _review(admission_review, ctx, path)
    except Exception as e:  # a request must never take the server down; it is refused, and logged
        log.exception("injection failed unexpectedly", path=path)
        uid = ""
        if isinstance(admission_review, dict) and isinstance(admission_review.get("request"), dict):
            uid = str(admission_review["request"].get("uid", ""))
        resp = _response(
            admission_review, uid, _refuse(f"injection failed: internal error: {type(e).__name__}: {e}")
        )
    if m is not None:
        {"success": m.success, "skip": m.skip, "failure": m.failure}[outcome].inc()
        m.time.observe(time.perf_counter() - started)
    return resp


def _is_map_of_strings(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and all(isinstance(x, str) for x in v.values()))


def _list_of_objects(v: Any) -> bool:
    return v is None or (isinstance(v, list) and all(isinstance(x, dict) for x in v))


def shape_error(pod: Mapping[str, Any]) -> str | None:
    """What Go's unmarshalling into corev1.Pod would reject, for the fields the injector reads:
    the field's path and what it must be, or None."""
    meta = pod.get("metadata") or {}
    for f in ("labels", "annotations"):
        if not _is_map_of_strings(meta.get(f)):
            return f"metadata.{f} must be a map of strings"
    if not _list_of_objects(meta.get("ownerReferences")):
        return "metadata.ownerReferences must be a list of objects"
    spec = pod.get("spec") or {}
    for f in ("volumes", "imagePullSecrets"):
        if not _list_of_objects(spec.get(f)):
            return f"spec.{f} must be a list of objects"
    for f in ("containers", "initContainers"):
        cs = spec.get(f)
        if not _list_of_objects(cs):
            return f"spec.{f} must be a list of objects"
        for i, c in enumerate(cs or []):
            where = f"spec.{f}[{i}]"
            if not isinstance(c.get("name"), str):
                return f"{where}.name must be a string"
            for lf in ("ports", "env", "volumeMounts"):
                if not _list_of_objects(c.get(lf)):
                    return f"{where}.{lf} must be a list of objects"
            for df in (
                "readinessProbe",
                "livenessProbe",
                "startupProbe",
                "lifecycle",
                "securityContext",
                "resources",
            ):
                if c.get(df) is not None and not isinstance(c[df], dict):
                    return f"{where}.{df} must be an object"
            for hook in ("preStop", "postStart"):
                if (c.get("lifecycle") or {}).get(hook) is not None and not isinstance(
                    c["lifecycle"][hook], dict
                ):
                    return f"{where}.lifecycle.{hook} must be an object"
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                for action in ("httpGet", "tcpSocket", "grpc"):
                    v = (c.get(probe) or {}).get(action)
                    if v is not None and not isinstance(v, dict):
                        return f"{where}.{probe}.{action} must be an object"
    return None


class _Undecodable:
    def __init__(self, error: str) -> None:
        self.error = error


def review_bytes(body: bytes, ctx: InjectionContext, path: str = "/inject") -> dict[str, Any]:
    """`review` for a request body; a body that is not JSON is refused as istiod's decoder does."""
    try:
        doc: Any = json.loads(body)
    except ValueError as e:  # UnicodeDecodeError is a ValueError too
        doc = _Undecodable(f"could not decode body: {e}")
    return review(doc, ctx, path)


def _review(ar: Any, ctx: InjectionContext, path: str) -> tuple[dict[str, Any], str]:
    if isinstance(ar, _Undecodable):
        return _response(None, "", _refuse(ar.error)), "failure"
    if not isinstance(ar, dict):
        return _response(None, "", _refuse("could not decode body: not an AdmissionReview object")), "failure"
    if ar.get("kind") != "AdmissionReview" or ar.get("apiVersion") not in ADMISSION_VERSIONS:
        return _response(
            ar,
            "",
            _refuse(
                f"could not decode body: want kind AdmissionReview, apiVersion "
                f"{' or '.join(ADMISSION_VERSIONS)}; got kind {ar.get('kind')!r}, "
                f"apiVersion {ar.get('apiVersion')!r}"
            ),
        ), "failure"
    req = ar.get("request")
    if not isinstance(req, dict):
        return _response(ar, "", _refuse("could not decode body: AdmissionReview has no request")), "failure"
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        return _response(
            ar, "", _refuse("could not decode body: request.uid must be a non-empty string")
        ), "failure"
    kind = (req.get("kind") or {}).get("kind") if isinstance(req.get("kind"), dict) else None
    if kind not in (None, "Pod") or (req.get("operation") not in (None, "CREATE")):
        log.info("skipping: not a Pod CREATE", uid=uid, kind=kind, operation=req.get("operation"))
        return _response(ar, uid, {"allowed": True}), "skip"
    pod = req.get("object")
    if (
        not isinstance(pod, dict)
        or not isinstance(pod.get("metadata", {}), dict)
        or not isinstance(pod.get("spec", {}), dict)
    ):
        return _response(
            ar, uid, _refuse("could not unmarshal raw object: request.object must be a Pod")
        ), "failure"
    pod = dict(pod)
    meta = dict(pod.get("metadata") or {})
    meta.pop("managedFields", None)  # large, irrelevant to injection, never in the patch
    pod["metadata"] = meta
    namespace = meta.get("namespace") or req.get("namespace") or ""
    problem = shape_error(pod)
    if problem:
        return _response(ar, uid, _refuse(f"could not unmarshal raw object: {problem}")), "failure"
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    where = f"{namespace}/{_pod_name(meta)}"

    ns_labels = ctx.namespace_labels(namespace) if namespace else None
    # A Namespace we do not know (yet: the informer may lag the apiserver) is no reason to skip:
    # the apiserver evaluated the same selectors before calling us, and istiod relies on that alone.
    if ns_labels is not None and not any(selection.webhook_matches(rev, ns_labels, labels)
                                         for rev in ctx.served_revisions()):
        log.debug("skipping: not selected by the webhook selectors", pod=where, revision=ctx.revision)
        return _response(ar, uid, {"allowed": True}), "skip"
    if selection.already_injected(pod):
        log.info("skipping: already injected", pod=where)
        return _response(ar, uid, {"allowed": True}), "skip"
    cfg = ctx.current_config()
    required, reason = selection.inject_required(
        policy=cfg.policy,
        never=cfg.never,
        always=cfg.always,
        namespace=namespace,
        spec=pod.get("spec") or {},
        labels=labels,
        annotations=annotations,
    )
    if not required:
        log.info("skipping due to policy check", pod=where, reason=reason)
        return _response(ar, uid, {"allowed": True}), "skip"
    try:
        anno.validate(annotations)
        injected = inject(
            pod,
            namespace,
            Inputs(
                config=cfg,
                mesh=ctx.current_mesh(),
                revision=ctx.revision,
                native_sidecars=ctx.native_sidecars,
                path_envs=parse_inject_path(path),
            ),
        )
    except (anno.AnnotationError, InjectionError) as e:
        log.warning("pod injection failed", pod=where, error=str(e))
        return _response(ar, uid, _refuse(f"Pod injection failed: {e}")), "failure"
    if namespace and not meta.get("namespace"):
        pod["metadata"] = {**meta, "namespace": namespace}  # as inject() saw it: no patch op for it
    patch = diff(pod, injected)
    body = json.dumps(patch, separators=(",", ":")).encode()
    log.info("injected", pod=where)
    return _response(
        ar, uid, {"allowed": True, "patchType": "JSONPatch", "patch": base64.b64encode(body).decode()}
    ), "success"
