"""`pilotctl tag set|generate|list|remove`: revision tags, as `istioctl tag` writes and reads them.

A tag is an alias users label namespaces with (`istio.io/rev=prod`, or `default`, which also
takes `istio-injection=enabled`); moving it to another revision moves every such namespace's new
pods there without relabelling. What `tag set TAG --revision REV` writes (istioctl/pkg/tag):

- MutatingWebhookConfiguration `istio-revision-tag-TAG`, labelled `istio.io/tag=TAG` and
  `istio.io/rev=REV`: the chart's revision-tag webhooks (revision-tags-mwc.yaml) with the
  selectors of TAG (pilot/inject/selection.py, the same ones the revision's own webhooks use),
  calling the revision's injector with its caBundle, path and Service, copied from the revision's
  own MutatingWebhookConfiguration (`istio.io/rev=REV` without `istio.io/tag`);
- Service `istiod-revision-tag-TAG` in the control plane's namespace selecting REV's pods;
- for the `default` tag: the ValidatingWebhookConfiguration `istiod-default-validator` (unlabelled
  objects are validated by REV) and the default revision's own injector webhooks turned off with
  istioctl's never-matching selector (kept, so a later `tag set default` can point back).

This is a user's command run with their kubeconfig, not part of the control plane: its calls are
not in deploy/'s RBAC (pilot/sources/kube/rbac.py covers the control plane's).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
from typing import Any

import yaml

from pilot.inject.selection import webhooks as injector_webhooks
from pilot.model.revisions import (
    DEFAULT,
    DEFAULT_VALIDATOR,
    REV_LABEL,
    TAG_LABEL,
    is_default,
    service_name,
    tag_webhook_name,
)
from pilot.pilotctl.client import CtlError
from pilot.sources.kube.client import ApiError, Kube, load_api_client

MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
INJECTOR_SUFFIX = "sidecar-injector.istio.io"
NEVER_MATCH = {"matchLabels": {"istio.io/deactivated": "never-match"}}
SYSTEM_NAMESPACES = ["kube-system", "kube-public", "kube-node-lease", "local-path-storage"]
TAG_CREATED = ("Revision tag {tag!r} created, referencing control plane revision {rev!r}. To enable injection "
               "using this\nrevision tag, use 'kubectl label namespace <NAMESPACE> istio.io/rev={tag}'")


class TagError(Exception):
    pass


def services_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/services"


# --- what is written (pure) -------------------------------------------------------------------
def canonical_injector(webhook_config: dict) -> dict[str, Any]:
    """What a tag copies from its revision's injector configuration (tagWebhookConfigFromCanonicalWebhook)."""
    labels = (webhook_config.get("metadata") or {}).get("labels") or {}
    for wh in webhook_config.get("webhooks") or []:
        if wh.get("name", "").endswith(INJECTOR_SUFFIX):
            client = wh.get("clientConfig") or {}
            service = client.get("service") or {}
            return {"revision": labels.get(REV_LABEL, DEFAULT), "caBundle": client.get("caBundle", ""),
                    "url": client.get("url", ""), "path": service.get("path", ""),
                    "service": service.get("name", ""), "reinvocationPolicy": wh.get("reinvocationPolicy", "Never"),
                    "labels": {k: v for k, v in labels.items() if k != "app"},
                    "annotations": dict((webhook_config.get("metadata") or {}).get("annotations") or {})}
    raise TagError(f"could not find sidecar-injector webhook in canonical webhook {webhook_config['metadata']['name']!r}")


def _user_managed(labels: dict[str, str]) -> dict[str, str]:
    """istioctl's tag commands write user-managed objects: no operator ownership labels."""
    return {k: v for k, v in labels.items() if "operator.istio.io" not in k}


def _client_config(canon: dict[str, Any], namespace: str, path: str) -> dict[str, Any]:
    if canon["url"]:
        return {"url": canon["url"], **({"caBundle": canon["caBundle"]} if canon["caBundle"] else {})}
    service = canon["service"] or service_name(canon["revision"])
    out: dict[str, Any] = {"service": {"name": service, "namespace": namespace, "path": path, "port": 443}}
    if canon["caBundle"]:
        out["caBundle"] = canon["caBundle"]
    return out


def tag_webhook(tag: str, canon: dict[str, Any], namespace: str, *, name: str = "",
                auto_inject_namespaces: bool = False) -> dict:
    """The chart's revision-tag MutatingWebhookConfiguration for `tag`, pointing at canon's revision."""
    hooks = []
    selectors = [(w.name, w.namespace_selector, w.object_selector) for w in injector_webhooks(tag)]
    if tag == DEFAULT and auto_inject_namespaces:
        selectors.append(("auto.sidecar-injector.istio.io",
                          {"matchExpressions": [{"key": "istio-injection", "operator": "DoesNotExist"},
                                                {"key": REV_LABEL, "operator": "DoesNotExist"},
                                                {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                 "values": SYSTEM_NAMESPACES}]},
                          {"matchExpressions": [{"key": "sidecar.istio.io/inject", "operator": "DoesNotExist"},
                                                {"key": REV_LABEL, "operator": "DoesNotExist"}]}))
    for hook_name, ns_sel, obj_sel in selectors:
        hooks.append({
            "name": hook_name,
            "clientConfig": _client_config(canon, namespace, canon["path"] or "/inject"),
            "sideEffects": "None",
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "failurePolicy": "Fail",
            "reinvocationPolicy": canon["reinvocationPolicy"] or "Never",
            "admissionReviewVersions": ["v1"],
            "namespaceSelector": copy.deepcopy(ns_sel),
            "objectSelector": copy.deepcopy(obj_sel),
        })
    labels = {TAG_LABEL: tag, REV_LABEL: canon["revision"], "app": "sidecar-injector",
              "app.kubernetes.io/name": "istiod", **canon["labels"]}
    labels[TAG_LABEL], labels[REV_LABEL] = tag, canon["revision"]
    meta: dict[str, Any] = {"name": name or tag_webhook_name(tag, namespace), "labels": _user_managed(labels)}
    if canon["annotations"]:
        meta["annotations"] = canon["annotations"]
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": meta, "webhooks": hooks}


def default_validator(canon: dict[str, Any], namespace: str, existing: dict | None) -> dict:
    """istiod-default-validator for the revision the default tag points at (charts/default). A
    failurePolicy the control plane already switched to Fail is left to it (not reset to Ignore)."""
    failure = "Ignore"
    for wh in (existing or {}).get("webhooks") or []:
        if wh.get("name") == "validation.istio.io" and wh.get("failurePolicy") == "Fail":
            failure = ""
    client = _client_config(canon, namespace, "/validate")
    if "url" in client:  # istioctl points the validator at the injector URL's host, path /validate
        scheme, _, rest = client["url"].partition("://")
        client["url"] = f"{scheme}://{rest.split('/', 1)[0]}/validate"
    hook: dict[str, Any] = {
        "name": "validation.istio.io", "clientConfig": client,
        "rules": [{"operations": ["CREATE", "UPDATE"],
                   "apiGroups": ["security.istio.io", "networking.istio.io", "telemetry.istio.io",
                                 "extensions.istio.io"],
                   "apiVersions": ["*"], "resources": ["*"]}],
        "sideEffects": "None", "admissionReviewVersions": ["v1"],
        "objectSelector": {"matchExpressions": [{"key": REV_LABEL, "operator": "DoesNotExist"}]},
    }
    if failure:
        hook["failurePolicy"] = failure
    labels = {"app": "istiod", "istio": "istiod", REV_LABEL: canon["revision"], TAG_LABEL: DEFAULT,
              "app.kubernetes.io/name": "istiod", **canon["labels"]}
    labels[REV_LABEL], labels[TAG_LABEL] = canon["revision"], DEFAULT
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": DEFAULT_VALIDATOR, "labels": _user_managed(labels)}, "webhooks": [hook]}


def tag_service(tag: str, revision: str, namespace: str) -> dict:
    """istiod-revision-tag-TAG (revision-tags-svc.yaml): istiod's ports, selecting REV's pods."""
    selector = {"app": "istiod", **({"istio": "pilot"} if is_default(revision) else {REV_LABEL: revision})}
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"istiod-revision-tag-{tag}", "namespace": namespace,
                         "labels": {REV_LABEL: revision or DEFAULT, TAG_LABEL: tag, "app": "istiod",
                                    "istio": "pilot", "app.kubernetes.io/name": "istiod"}},
            "spec": {"ports": [{"port": 15010, "name": "grpc-xds", "protocol": "TCP"},
                               {"port": 15012, "name": "https-dns", "protocol": "TCP"},
                               {"port": 443, "name": "https-webhook", "targetPort": 15017, "protocol": "TCP"},
                               {"port": 15014, "name": "http-monitoring", "protocol": "TCP"}],
                     "selector": selector}}


def deactivated(webhook_config: dict) -> dict:
    """The default revision's injector configuration with every webhook matching nothing."""
    out = copy.deepcopy(webhook_config)
    for wh in out.get("webhooks") or []:
        wh["namespaceSelector"] = copy.deepcopy(NEVER_MATCH)
        wh["objectSelector"] = copy.deepcopy(NEVER_MATCH)
    return out


def tag_rows(webhook_configs: list[dict], services: list[dict], namespaces_of) -> list[dict[str, Any]]:
    """istioctl's listTags: (tag, revision) from labelled webhooks and Services; a revision's
    untagged entry is dropped once one of its tags is listed."""
    pairs: set[tuple[str, str]] = set()
    for obj in [*webhook_configs, *services]:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if REV_LABEL in labels:
            pairs.add((labels.get(TAG_LABEL, ""), labels[REV_LABEL]))
    tagged_revisions = {rev for tag, rev in pairs if tag}
    pairs = {(t, r) for t, r in pairs if t or r not in tagged_revisions}
    return [{"tag": t, "revision": r, "namespaces": namespaces_of(t)}
            for t, r in sorted(pairs, key=lambda p: (p[1], p[0]))]


def rows_table(rows: list[dict[str, Any]]) -> str:
    """Go's tabwriter (padding 1) as istioctl prints it."""
    cells = [["TAG", "REVISION", "NAMESPACES"]] + [[r["tag"], r["revision"], ",".join(r["namespaces"])] for r in rows]
    widths = [max(len(c[i]) for c in cells) + 1 for i in range(2)]
    return "\n".join((c[0].ljust(widths[0]) + c[1].ljust(widths[1]) + c[2]).rstrip() for c in cells)


# --- the apiserver side ----------------------------------------------------------------------
async def _items(kube: Kube, path: str, selector: str) -> list[dict]:
    return (await kube.request("GET", path, query={"labelSelector": selector})).get("items") or []


async def _apply(kube: Kube, collection: str, obj: dict) -> None:
    """Create, or replace what is there (keeping its resourceVersion), as `kubectl apply` would end."""
    name = obj["metadata"]["name"]
    try:
        current = await kube.request("GET", f"{collection}/{name}")
    except ApiError as e:
        if e.status != 404:
            raise
        await kube.request("POST", collection, body=obj)
        return
    body = copy.deepcopy(obj)
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await kube.request("PUT", f"{collection}/{name}", body=body)


async def generate(kube: Kube, tag: str, revision: str, namespace: str, *, overwrite: bool = False,
                   webhook_name: str = "", auto_inject_namespaces: bool = False,
                   generate_only: bool = False) -> tuple[list[tuple[str, dict]], dict | None]:
    """The objects `tag set` writes as (collection path, object), and the default revision's
    injector configuration to turn off (None when none is to be). istioctl's checks first."""
    if not generate_only and not overwrite and tag != DEFAULT:
        clash = (await _items(kube, MUTATING, f"{REV_LABEL}={tag},!{TAG_LABEL}")
                 or await _items(kube, services_path(namespace), f"{REV_LABEL}={tag},!{TAG_LABEL},app=istiod"))
        if clash:
            raise TagError(f"cannot create revision tag {tag!r}: found existing control plane revision with same name")
    canonical = await _items(kube, MUTATING, f"{REV_LABEL}={revision},!{TAG_LABEL}")
    if not canonical:
        raise TagError(f"cannot modify tag: cannot find MutatingWebhookConfiguration with revision {revision!r}")
    if len(canonical) > 1:
        raise TagError(f"cannot modify tag: found multiple canonical webhooks with revision {revision!r}")
    if not overwrite and (await _items(kube, MUTATING, f"{TAG_LABEL}={tag}")
                          or await _items(kube, services_path(namespace), f"{TAG_LABEL}={tag}")):
        raise TagError(f"revision tag {tag!r} already exists, and --overwrite is false")
    canon = canonical_injector(canonical[0])
    objects = [(MUTATING, tag_webhook(tag, canon, namespace, name=webhook_name,
                                      auto_inject_namespaces=auto_inject_namespaces))]
    to_deactivate = None
    if tag == DEFAULT:
        try:
            existing = await kube.request("GET", f"{VALIDATING}/{DEFAULT_VALIDATOR}")
        except ApiError as e:
            if e.status != 404:
                raise
            existing = None
        objects.append((VALIDATING, default_validator(canon, namespace, existing)))
        olds = await _items(kube, MUTATING, f"{REV_LABEL}={DEFAULT},!{TAG_LABEL}")
        if len(olds) > 1:
            raise TagError("expected a single webhook for default revision")
        if olds and canon["revision"] != DEFAULT:
            to_deactivate = deactivated(olds[0])
    objects.append((services_path(namespace), tag_service(tag, canon["revision"], namespace)))
    return objects, to_deactivate


async def set_tag(kube: Kube, tag: str, revision: str, namespace: str, **kw: Any) -> str:
    objects, to_deactivate = await generate(kube, tag, revision, namespace, **kw)
    if to_deactivate is not None:
        await kube.request("PUT", f"{MUTATING}/{to_deactivate['metadata']['name']}", body=to_deactivate)
    for collection, obj in objects:
        await _apply(kube, collection, obj)
    return TAG_CREATED.format(tag=tag, rev=revision)


async def namespaces_with(kube: Kube, tag: str) -> list[str]:
    return [n["metadata"]["name"] for n in await _items(kube, "/api/v1/namespaces", f"{REV_LABEL}={tag}")]


async def list_tags(kube: Kube, namespace: str, output: str = "table") -> str:
    webhook_configs = await _items(kube, MUTATING, REV_LABEL)
    services = await _items(kube, services_path(namespace), REV_LABEL)
    tags = {(o["metadata"].get("labels") or {}).get(TAG_LABEL, "") for o in [*webhook_configs, *services]}
    namespaces = {t: await namespaces_with(kube, t) for t in tags}
    rows = tag_rows(webhook_configs, services, lambda t: namespaces.get(t, []))
    if output == "json":
        return json.dumps(rows, indent="\t")
    if output == "yaml":
        return yaml.safe_dump(rows, sort_keys=False).rstrip()
    return rows_table(rows) if rows else "No Istio revision tags found."


async def remove_tag(kube: Kube, tag: str, namespace: str, *, skip_confirmation: bool = False) -> str:
    webhook_configs = await _items(kube, MUTATING, f"{TAG_LABEL}={tag}")
    services = await _items(kube, services_path(namespace), f"{TAG_LABEL}={tag}")
    if not webhook_configs and not services:
        raise TagError(f"cannot remove tag {tag!r}: cannot find MutatingWebhookConfiguration or Service for tag")
    pointing = await namespaces_with(kube, tag)
    if pointing and not skip_confirmation:
        raise TagError(f"there are still namespaces pointing to tag {tag!r}: {', '.join(pointing)}; "
                       "pass -y to remove it anyway")
    for obj in webhook_configs:
        await kube.request("DELETE", f"{MUTATING}/{obj['metadata']['name']}")
    for obj in await _items(kube, VALIDATING, f"{TAG_LABEL}={tag}"):
        await kube.request("DELETE", f"{VALIDATING}/{obj['metadata']['name']}")
    for obj in services:
        await kube.request("DELETE", f"{services_path(namespace)}/{obj['metadata']['name']}")
    return f"Revision tag {tag} removed"


# --- the command line ------------------------------------------------------------------------
def add_parser(sub: argparse._SubParsersAction) -> None:
    """`pilotctl tag ...` (hooked into pilotctl's parser). The kubeconfig and namespace may be
    given here or as pilotctl's own `--kubeconfig`/`-i` (separate dests: a subcommand's defaults
    would otherwise overwrite what was given before it)."""
    tag = sub.add_parser("tag", help="revision tags (istioctl tag): set, generate, list, remove")
    tag.add_argument("--kubeconfig", dest="tag_kubeconfig", default=None,
                     help="kubeconfig (default: pilotctl's --kubeconfig, else $KUBECONFIG or ~/.kube/config)")
    tag.add_argument("-i", "--istioNamespace", "--istio-namespace", dest="tag_istio_namespace", default=None,
                     help="the control plane's namespace (default: pilotctl's -i, istio-system)")
    actions = tag.add_subparsers(dest="tag_command", required=True, metavar="ACTION")
    for name, help_text in (("set", "create or modify a revision tag"),
                            ("generate", "print the objects `set` would write")):
        p = actions.add_parser(name, help=help_text)
        p.add_argument("tag")
        p.add_argument("-r", "--revision", required=True, help="control plane revision the tag points at")
        p.add_argument("--overwrite", action="store_true", help="replace an existing tag")
        p.add_argument("--webhook-name", default="", help="name for the tag's MutatingWebhookConfiguration")
        p.add_argument("--auto-inject-namespaces", action="store_true",
                       help="(default tag) inject every namespace without injection labels")
    ls = actions.add_parser("list", help="tags and the namespaces that use them")
    ls.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    rm = actions.add_parser("remove", help="delete a revision tag")
    rm.add_argument("tag")
    rm.add_argument("-y", "--skip-confirmation", action="store_true")
    tag.set_defaults(run=run)


async def _run(args: argparse.Namespace) -> str:
    from kubernetes_asyncio import config

    kubeconfig = args.tag_kubeconfig or getattr(args, "kubeconfig", None) or config.KUBE_CONFIG_DEFAULT_LOCATION
    ns = args.tag_istio_namespace or getattr(args, "istioNamespace", None) or "istio-system"
    kube = Kube(await load_api_client(kubeconfig, identity="pilotctl"))
    try:
        if args.tag_command in ("set", "generate"):
            kw = {"overwrite": args.overwrite, "webhook_name": args.webhook_name,
                  "auto_inject_namespaces": args.auto_inject_namespaces}
            if args.tag_command == "set":
                return await set_tag(kube, args.tag, args.revision, ns, **kw)
            objects, _ = await generate(kube, args.tag, args.revision, ns, generate_only=True, **kw)
            return yaml.safe_dump_all([o for _c, o in objects], sort_keys=False).rstrip()
        if args.tag_command == "list":
            return await list_tags(kube, ns, args.output)
        return await remove_tag(kube, args.tag, ns, skip_confirmation=args.skip_confirmation)
    finally:
        await kube.close()


def run(args: argparse.Namespace, _replicas: Any = None, _warn: Any = None) -> str:
    """pilotctl's command interface: the output, or CtlError (one `error: ...` line, exit 1)."""
    try:
        return asyncio.run(_run(args))
    except (TagError, ApiError) as e:
        raise CtlError(str(e)) from None
