"""Injecting one pod: render the templates, merge them onto the pod, then istiod's post-processing
(merged metrics, probe rewriting, status annotation, container order). Pure: dicts in, dict out.

The merge is the subset of Kubernetes' strategic merge patch a Pod fragment needs: maps merge,
lists of containers and volumes merge by name, other lists are replaced. A container the user wrote
under the same name as an injected one (`istio-proxy`) is a customisation and its fields win, as
istiod re-applies it (reapplyOverwrittenContainers); `image: auto` keeps the injected image.
"""

from __future__ import annotations

import copy
import json
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from pilot.agent.config import ConfigError, parse_proxy_config
from pilot.inject import probes
from pilot.inject.config import InjectorConfig
from pilot.inject.selection import PROXY_CONTAINER, STATUS_ANNOTATION
from pilot.inject.template import RenderInputs, TemplateError, render

INIT_CONTAINER = "istio-init"
VALIDATION_CONTAINER = "istio-validation"
ENABLE_CORE_DUMP = "enable-core-dump"
PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
STATUS_PORT_ANNOTATION = "status.sidecar.istio.io/port"
TEMPLATES_ANNOTATION = "inject.istio.io/templates"
PROMETHEUS_ANNOTATIONS_ENV = "ISTIO_PROMETHEUS_ANNOTATIONS"

# Ports the sidecar binds in the pod's network namespace (istio-agent's istioReservedPorts).
RESERVED_PORTS = {
    15000: "Envoy admin",
    15001: "outbound traffic capture",
    15004: "pilot debug",
    15006: "inbound traffic capture",
    15008: "HBONE tunnel",
    15020: "pilot-agent status / merged Prometheus",
    15021: "Envoy health",
    15053: "DNS proxy",
    15090: "Envoy Prometheus",
}
_NAMED_LISTS = {"containers", "initContainers", "volumes", "imagePullSecrets", "env", "volumeMounts"}
_LIST_KEYS = {"ports": "containerPort", "volumeMounts": "mountPath"}


class InjectionError(ValueError):
    """The pod cannot be injected; the message says why (it becomes the AdmissionResponse's status)."""


@dataclass(frozen=True)
class Inputs:
    config: InjectorConfig
    mesh: Mapping[str, Any]
    revision: str
    native_sidecars: bool
    path_envs: Mapping[str, str]  # from /inject/cluster/X/net/Y


# --- merging ----------------------------------------------------------------------------------


def _key(item: Any, list_name: str) -> Any:
    if not isinstance(item, dict):
        return None
    return item.get(_LIST_KEYS.get(list_name, "name"))


def _merge_lists(base: list, patch: list, name: str) -> list:
    out = list(base)  # elements are shared, never mutated: merge() builds new dicts where it changes
    index = {_key(x, name): i for i, x in enumerate(out) if _key(x, name) is not None}
    for item in patch:
        k = _key(item, name)
        if k is not None and k in index:
            out[index[k]] = merge(out[index[k]], item)
        else:
            out.append(item)
    return out


def merge(base: Any, patch: Any) -> Any:
    """Strategic-merge-lite: `patch` over `base`."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if (
                k in out
                and isinstance(out[k], list)
                and isinstance(v, list)
                and (k in _NAMED_LISTS or k in _LIST_KEYS)
            ):
                out[k] = _merge_lists(out[k], v, k)
            elif k in out:
                out[k] = merge(out[k], v)
            elif v == [] and k in _NAMED_LISTS:
                continue  # an empty merge list adds nothing (`initContainers: []` with interception NONE)
            else:
                out[k] = v
        return out
    return patch


def _overlay(pod: dict[str, Any], fragment: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    """Apply a rendered fragment, then re-apply the user's own versions of injected containers."""
    out = merge(pod, {k: v for k, v in fragment.items() if v is not None})
    spec = out.setdefault("spec", {})
    for field in ("containers", "initContainers"):
        injected = {
            c.get("name") for c in (fragment.get("spec") or {}).get(field) or [] if isinstance(c, dict)
        }
        mine = {c.get("name"): c for c in (user.get("spec") or {}).get(field) or [] if isinstance(c, dict)}
        if not (injected & mine.keys()):
            continue
        spec[field] = list(spec[field])  # may be the (cached, shared) fragment's own list
        for i, c in enumerate(spec[field]):
            name = c.get("name")
            if name in injected and name in mine:
                override = {k: v for k, v in mine[name].items() if not (k == "image" and v == "auto")}
                spec[field][i] = merge(c, override)
    return out


# --- inputs -----------------------------------------------------------------------------------


def effective_proxy_config(
    mesh: Mapping[str, Any], annotations: Mapping[str, str], revision: str
) -> dict[str, Any]:
    """mesh.defaultConfig, then the pod's proxy.istio.io/config, then status.sidecar.istio.io/port:
    what PROXY_CONFIG carries to the agent."""
    istiod = "istiod" + ("" if revision in ("", "default") else f"-{revision}")
    pc: dict[str, Any] = {"discoveryAddress": f"{istiod}.istio-system.svc:15012", "statusPort": 15020}
    pc.update(copy.deepcopy(dict(mesh.get("defaultConfig") or {})))
    text = annotations.get(PROXY_CONFIG_ANNOTATION, "")
    if text.strip():
        try:
            parse_proxy_config([(PROXY_CONFIG_ANNOTATION, text)])
            pc.update(yaml.safe_load(text) or {})
        except (ConfigError, yaml.YAMLError) as e:
            raise InjectionError(f"invalid value for annotation {PROXY_CONFIG_ANNOTATION!r}: {e}") from None
    if STATUS_PORT_ANNOTATION in annotations:
        pc["statusPort"] = int(annotations[STATUS_PORT_ANNOTATION])
    return pc


def image(values: Mapping[str, Any], name: str, annotations: Mapping[str, str]) -> str:
    override = annotations.get("sidecar.istio.io/proxyImage", "")
    if "/" in override:
        return override
    if "/" in name:
        return name  # values may carry a full image reference
    g = values.get("global") or {}
    tag = str(g.get("tag", ""))
    variant = g.get("variant") or ""
    if variant and variant != "default":
        tag = f"{tag}-{variant}"
    return f"{g.get('hub', '')}/{name}:{tag}"


def deploy_meta(pod: Mapping[str, Any], namespace: str) -> tuple[dict[str, str], dict[str, str]]:
    """istiod's GetDeployMetaFromPod: the owning workload's name and type, from the controller owner
    reference (a ReplicaSet `NAME-HASH` means Deployment NAME), else the pod name."""
    meta = pod.get("metadata") or {}
    name = meta.get("name") or ""
    gen = meta.get("generateName") or ""
    labels = meta.get("labels") or {}
    type_meta = {"apiVersion": "v1", "kind": "Pod"}
    owner = next(
        (o for o in meta.get("ownerReferences") or [] if isinstance(o, dict) and o.get("controller")), None
    )
    if owner:
        type_meta = {"apiVersion": owner.get("apiVersion", ""), "kind": owner.get("kind", "")}
        name = owner.get("name", name)
        hash_ = labels.get("pod-template-hash")
        if owner.get("kind") == "ReplicaSet" and hash_ and name.endswith("-" + hash_):
            name = name[: -len(hash_) - 1]
            type_meta = {"apiVersion": "apps/v1", "kind": "Deployment"}
    elif not name and gen:
        name = gen.rstrip("-")
    return {"name": name, "namespace": namespace}, type_meta


def _templates(cfg: InjectorConfig, annotations: Mapping[str, str]) -> list[str]:
    if TEMPLATES_ANNOTATION in annotations:
        names = [n.strip() for n in annotations[TEMPLATES_ANNOTATION].split(",")]
    else:
        names = list(cfg.default_templates)
    out: list[str] = []
    for n in names:
        out.extend(cfg.aliases.get(n, (n,)))
    for n in out:
        if n not in cfg.templates:
            raise InjectionError(
                f"requested template {n!r} not found; have {', '.join(sorted(cfg.templates))}"
            )
    return out


# --- post-processing --------------------------------------------------------------------------


def _sanitize(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _prometheus_merge(
    pod: dict[str, Any], mesh: Mapping[str, Any], status_port: int, sidecar: dict | None
) -> None:
    ann = pod["metadata"]["annotations"]
    if mesh.get("enablePrometheusMerge", True) is False:
        return
    if ann.get("prometheus.istio.io/merge-metrics", "true").lower() in ("false", "0", "f"):
        return
    found: dict[str, str] = {}
    for k, v in ann.items():
        s = _sanitize(k)
        if s in ("prometheus_io_scrape", "prometheus_io_port", "prometheus_io_path"):
            found[s[len("prometheus_io_") :]] = v
    if found.get("scrape", "true").lower() in ("false", "0", "f"):
        return
    target = str(status_port)
    if found.get("port") == target:
        return  # already pointing at the agent (re-injection, or the user did it)
    if found.get("port"):
        port = found["port"]
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise InjectionError(f"invalid prometheus scrape configuration: invalid port {port!r}")
        if int(port) in RESERVED_PORTS:
            raise InjectionError(
                f"invalid prometheus scrape configuration: port {port} is reserved for Istio "
                f"({RESERVED_PORTS[int(port)]}) and cannot be scraped"
            )
    if sidecar is not None and found:
        scrape = {
            "scrape": found.get("scrape", ""),
            "path": found.get("path", ""),
            "port": found.get("port", ""),
        }
        sidecar.setdefault("env", []).append(
            {"name": PROMETHEUS_ANNOTATIONS_ENV, "value": json.dumps(scrape, separators=(",", ":"))}
        )
    for k in [
        k for k in ann if _sanitize(k) in ("prometheus_io_scrape", "prometheus_io_port", "prometheus_io_path")
    ]:
        del ann[k]
    ann["prometheus.io/port"] = target
    ann["prometheus.io/path"] = "/stats/prometheus"
    ann["prometheus.io/scrape"] = "true"


def _check_ports(pod: Mapping[str, Any], status_port: int, admin_port: int) -> None:
    """An app container declaring a port the sidecar binds cannot work in the same network
    namespace: refused, naming both, rather than admitted to crash-loop."""
    taken = {**RESERVED_PORTS, status_port: "pilot-agent status", admin_port: "Envoy admin"}
    spec = pod.get("spec") or {}
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        if c.get("name") in (PROXY_CONTAINER, INIT_CONTAINER):
            continue
        for p in c.get("ports") or []:
            port = p.get("containerPort")
            if (p.get("protocol") or "TCP") == "TCP" and port in taken and port != 0:
                raise InjectionError(
                    f"container {c.get('name')!r} port {port} conflicts with the sidecar's "
                    f"{taken[port]} port; move the application off {port}"
                )


def _move(containers: list[dict], name: str, first: bool) -> list[dict]:
    hit = [c for c in containers if c.get("name") == name]
    rest = [c for c in containers if c.get("name") != name]
    return hit + rest if first else rest + hit


def _reorder(spec: dict[str, Any], hold: bool) -> None:
    if spec.get("containers"):
        spec["containers"] = _move(spec["containers"], PROXY_CONTAINER, first=hold)
    inits = spec.get("initContainers")
    if not inits:
        return
    if any(c.get("name") == PROXY_CONTAINER for c in inits):
        # Native sidecar: istio-init, then the proxy, then the app's init containers (inside the mesh).
        for name in (ENABLE_CORE_DUMP, PROXY_CONTAINER, VALIDATION_CONTAINER, INIT_CONTAINER):
            inits = _move(inits, name, first=True)
    else:
        # iptables last, so the app's init containers are not black-holed before Envoy runs.
        inits = _move(inits, VALIDATION_CONTAINER, first=True)
        inits = _move(inits, INIT_CONTAINER, first=False)
        inits = _move(inits, ENABLE_CORE_DUMP, first=False)
    spec["initContainers"] = inits


def _status(fragment_spec: Mapping[str, Any], revision: str) -> str:
    def names(key: str) -> list[str | None] | None:
        got = [x.get("name") for x in fragment_spec.get(key) or [] if isinstance(x, dict)]
        return got or None

    return json.dumps(
        {
            "initContainers": names("initContainers"),
            "containers": names("containers"),
            "volumes": names("volumes"),
            "imagePullSecrets": names("imagePullSecrets"),
            "revision": revision or "default",
        },
        separators=(",", ":"),
    )


def _clone(value: Any) -> Any:
    # Decoded JSON only (dicts, lists, scalars): pickle round-trips it several times faster than deepcopy.
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _find(spec: Mapping[str, Any], name: str) -> dict | None:
    for field in ("containers", "initContainers"):
        for c in spec.get(field) or []:
            if c.get("name") == name:
                return c
    return None


def _set_envs(container: dict, envs: Mapping[str, str]) -> None:
    kept = [e for e in container.get("env") or [] if e.get("name") not in envs]
    container["env"] = kept + [{"name": k, "value": envs[k]} for k in sorted(envs)]


# --- the whole thing --------------------------------------------------------------------------


def inject(pod: Mapping[str, Any], namespace: str, inputs: Inputs) -> dict[str, Any]:
    """The injected pod. Raises InjectionError (refuse, with the message) when it cannot be done."""
    cfg = inputs.config
    # `pod` is never mutated (the patch is computed against it): work on copies of what changes.
    meta = dict(pod.get("metadata") or {})
    if not meta.get("namespace"):
        meta["namespace"] = namespace
    meta["annotations"] = dict(meta["annotations"]) if isinstance(meta.get("annotations"), dict) else {}
    meta["labels"] = dict(meta["labels"]) if isinstance(meta.get("labels"), dict) else {}
    annotations = meta["annotations"]
    spec = pod.get("spec") or {}
    if not isinstance(spec, dict) or not isinstance(spec.get("containers") or [], list):
        raise InjectionError("pod spec.containers must be a list")
    original = {**pod, "metadata": meta, "spec": dict(spec)}

    pc = effective_proxy_config(inputs.mesh, annotations, inputs.revision)
    status_port = int(pc.get("statusPort", 15020))
    mode = annotations.get("sidecar.istio.io/interceptionMode") or pc.get("interceptionMode") or "REDIRECT"
    if mode not in ("REDIRECT", "TPROXY", "NONE"):
        raise InjectionError(f"ProxyConfig.interceptionMode {mode!r}: use REDIRECT, TPROXY or NONE")
    values = cfg.values
    g = values.get("global") or {}
    deployment, type_meta = deploy_meta(original, meta["namespace"])
    native = inputs.native_sidecars
    if annotations.get("sidecar.istio.io/nativeSidecar") in ("true", "false"):
        native = annotations["sidecar.istio.io/nativeSidecar"] == "true"
    render_inputs = RenderInputs(
        proxy_config=pc,
        mesh=inputs.mesh,
        values=values,
        revision=inputs.revision,
        native_sidecars=native,
        proxy_image=image(values, (g.get("proxy") or {}).get("image", "proxyv2"), annotations),
        proxy_init_image=image(values, (g.get("proxy_init") or {}).get("image", "proxyv2"), annotations),
        status_port=status_port,
        interception_mode=mode,
        deployment=deployment,
        type_meta=type_meta,
    )

    merged = original
    template_spec: dict[str, Any] = {}
    for name in _templates(cfg, annotations):
        try:
            fragment = render(cfg.templates[name], name, merged, render_inputs)
        except TemplateError as e:
            raise InjectionError(f"failed to run injection template: {e}") from None
        fspec = fragment.get("spec") or {}
        if native and _find({"initContainers": fspec.get("initContainers")}, PROXY_CONTAINER) is not None:
            # The user's istio-proxy customisation lives under containers; the proxy is now an init container.
            mine = [c for c in merged["spec"].get("containers") or [] if c.get("name") == PROXY_CONTAINER]
            if mine:
                merged["spec"]["containers"] = [
                    c for c in merged["spec"]["containers"] if c.get("name") != PROXY_CONTAINER
                ]
                merged["spec"]["initContainers"] = list(merged["spec"].get("initContainers") or []) + mine
        merged = _overlay(merged, fragment, merged)
        template_spec = merge(template_spec, fspec)

    # Everything above shared structure with `pod` and the (cached) fragments; what follows edits
    # in place, so it works on a private copy.
    merged = _clone(merged)
    mspec = merged["spec"]
    _check_ports(merged, status_port, int(pc.get("proxyAdminPort", 15000)))
    sidecar = _find(mspec, PROXY_CONTAINER)
    if sidecar is not None and inputs.path_envs:
        _set_envs(sidecar, inputs.path_envs)
    # Status port 0 turns the agent's status server off: nothing may be pointed at it.
    if status_port != 0:
        _prometheus_merge(merged, inputs.mesh, status_port, sidecar)
    rewrite_default = bool((values.get("sidecarInjectorWebhook") or {}).get("rewriteAppHTTPProbe", True))
    if (
        status_port != 0
        and sidecar is not None
        and probes.should_rewrite(merged["metadata"]["annotations"], rewrite_default)
    ):
        found = probes.app_probers(merged, status_port)
        if found:
            sidecar["env"] = probes.merge_probers_env(list(sidecar.get("env") or []), found)
        probes.rewrite_probes(merged, status_port)
    merged["metadata"]["annotations"][STATUS_ANNOTATION] = _status(template_spec, inputs.revision)
    merged["metadata"]["annotations"].update(cfg.injected_annotations)
    hold = bool(
        pc.get("holdApplicationUntilProxyStarts")
        or (g.get("proxy") or {}).get("holdApplicationUntilProxyStarts")
    )
    _reorder(mspec, hold and not native)
    if inputs.path_envs.get("ISTIO_META_NETWORK"):
        merged["metadata"]["labels"]["topology.istio.io/network"] = inputs.path_envs["ISTIO_META_NETWORK"]
    return merged
