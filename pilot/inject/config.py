"""The injector's configuration, from the `istio-sidecar-injector` ConfigMap as istiod reads it:
`config` (YAML: policy, alwaysInjectSelector, neverInjectSelector, injectedAnnotations,
templates, defaultTemplates, aliases) and `values` (JSON: the chart values the templates read).

`InjectorConfigHolder` keeps the last good configuration: a new one that does not parse or whose
templates do not compile (or fail on a sample pod) is reported and the old one keeps serving.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jinja2
import yaml
from pydantic import ValidationError

from pilot import logging as plog
from pilot.config.mesh import LabelSelector
from pilot.inject.template import RenderInputs, TemplateError, compile_template, default_template_text, render

log = plog.get("inject")

CONFIGMAP_NAME = "istio-sidecar-injector"

# The chart values the default template reads, with istiod's chart defaults (values.yaml), except
# hub/tag, which point at Istio's proxy image: our pilot-agent flags and paths are istio-agent's.
DEFAULT_VALUES: dict[str, Any] = {
    "revision": "",
    "global": {
        "hub": "docker.io/istio",
        "tag": "1.28.0",
        "variant": "",
        "imagePullPolicy": "",
        "imagePullSecrets": [],
        "istioNamespace": "istio-system",
        "caAddress": "",
        "pilotCertProvider": "istiod",
        "logAsJson": False,
        "logging": {"level": "default:info"},
        "meshID": "",
        "network": "",
        "trustDomain": "",
        "trustBundleName": "",
        "multiCluster": {"clusterName": ""},
        "sds": {"token": {"aud": "istio-ca"}},
        "nativeNftables": False,
        "proxy": {
            "image": "proxyv2",
            "autoInject": "enabled",
            "clusterDomain": "cluster.local",
            "componentLogLevel": "misc:error",
            "logLevel": "warning",
            "excludeInboundPorts": "",
            "includeInboundPorts": "*",
            "includeIPRanges": "*",
            "excludeIPRanges": "",
            "includeOutboundPorts": "",
            "excludeOutboundPorts": "",
            "privileged": False,
            "holdApplicationUntilProxyStarts": False,
            "lifecycle": {},
            "readinessFailureThreshold": 4,
            "readinessInitialDelaySeconds": 0,
            "readinessPeriodSeconds": 15,
            "startupProbe": {"enabled": True, "failureThreshold": 600},
            "resources": {
                "requests": {"cpu": "100m", "memory": "128Mi"},
                "limits": {"cpu": "2000m", "memory": "1024Mi"},
            },
            "statusPort": 15020,
        },
        "proxy_init": {"image": "proxyv2", "forceApplyIptables": False},
    },
    "pilot": {"cni": {"enabled": False}, "crlConfigMapName": ""},
    "sidecarInjectorWebhook": {"rewriteAppHTTPProbe": True},
}


class InjectorConfigError(ValueError):
    """The ConfigMap cannot be used; the message names the key and the reason."""


def merge_values(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge_values(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


@dataclass(frozen=True)
class InjectorConfig:
    policy: str = "enabled"
    always: tuple[LabelSelector, ...] = ()
    never: tuple[LabelSelector, ...] = ()
    injected_annotations: Mapping[str, str] = field(default_factory=dict)
    templates: Mapping[str, jinja2.Template] = field(default_factory=dict)
    default_templates: tuple[str, ...] = ("sidecar",)
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_VALUES))


def _selectors(where: str, raw: Any) -> tuple[LabelSelector, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InjectorConfigError(f"config.{where}: must be a list of label selectors")
    out = []
    for i, s in enumerate(raw):
        try:
            out.append(LabelSelector.model_validate(s or {}))
        except ValidationError as e:
            raise InjectorConfigError(f"config.{where}[{i}]: {e.errors()[0]['msg']}") from None
    return tuple(out)


SAMPLE_POD = {
    "metadata": {
        "name": "sample-5d8f7c9b6-abcde",
        "namespace": "default",
        "labels": {"app": "sample"},
        "annotations": {},
    },
    "spec": {
        "serviceAccountName": "default",
        "containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 8080}]}],
    },
}


def parse(config_text: str, values_text: str = "") -> InjectorConfig:
    """Parse the ConfigMap's `config` and `values`; compile and try every template on a sample pod."""
    try:
        doc = yaml.safe_load(config_text) if config_text.strip() else {}
    except yaml.YAMLError as e:
        raise InjectorConfigError(f"config: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise InjectorConfigError("config: must be a mapping")
    try:
        user_values = json.loads(values_text) if values_text.strip() else {}
    except ValueError as e:
        raise InjectorConfigError(f"values: not valid JSON: {e}") from None
    if not isinstance(user_values, dict):
        raise InjectorConfigError("values: must be a JSON object")
    values = merge_values(DEFAULT_VALUES, user_values)
    if (values.get("pilot") or {}).get("cni", {}).get("enabled"):
        raise InjectorConfigError(
            "values.pilot.cni.enabled: the Istio CNI plugin is not supported; "
            "traffic capture uses the istio-init container"
        )
    policy = doc.get("policy", values["global"]["proxy"].get("autoInject", "enabled"))
    if policy not in ("enabled", "disabled"):
        raise InjectorConfigError(f"config.policy: must be enabled or disabled, got {policy!r}")
    raw_templates = doc.get("templates") or {}
    if not isinstance(raw_templates, dict) or not all(isinstance(v, str) for v in raw_templates.values()):
        raise InjectorConfigError("config.templates: must map template names to template text")
    templates = {name: compile_template(name, text) for name, text in raw_templates.items()}
    default_templates = tuple(doc.get("defaultTemplates") or ("sidecar",))
    aliases = {k: tuple(v) for k, v in (doc.get("aliases") or {}).items()}
    for name in default_templates:
        for t in aliases.get(name, (name,)):
            if t not in templates:
                raise InjectorConfigError(
                    f"config.defaultTemplates: template {t!r} is not in config.templates "
                    f"(have {', '.join(sorted(templates)) or 'none'})"
                )
    injected = doc.get("injectedAnnotations") or {}
    if not isinstance(injected, dict):
        raise InjectorConfigError("config.injectedAnnotations: must be a map of strings")
    cfg = InjectorConfig(
        policy=policy,
        always=_selectors("alwaysInjectSelector", doc.get("alwaysInjectSelector")),
        never=_selectors("neverInjectSelector", doc.get("neverInjectSelector")),
        injected_annotations={str(k): str(v) for k, v in injected.items()},
        templates=templates,
        default_templates=default_templates,
        aliases=aliases,
        values=values,
    )
    sample = RenderInputs(
        proxy_config={"discoveryAddress": "istiod.istio-system.svc:15012", "statusPort": 15020},
        mesh={},
        values=values,
        revision="default",
        native_sidecars=False,
        proxy_image="img",
        proxy_init_image="img",
        status_port=15020,
        interception_mode="REDIRECT",
        deployment={"name": "sample", "namespace": "default"},
        type_meta={"apiVersion": "apps/v1", "kind": "Deployment"},
    )
    for name, t in templates.items():
        try:
            render(t, name, SAMPLE_POD, sample)
        except TemplateError as e:
            raise InjectorConfigError(f"config.templates.{name}: fails on a sample pod: {e}") from None
    return cfg


def default_config_text() -> str:
    """The `config` key of the ConfigMap we ship (deploy/injection-configmap.yaml), written by hand
    so the template stays a readable literal block."""
    template = default_template_text()
    body = "".join(
        ("    " + line if line.strip() else "\n") if line.endswith("\n") else "    " + line
        for line in template.splitlines(keepends=True)
    )
    return (
        "policy: enabled\n"
        "alwaysInjectSelector: []\n"
        "neverInjectSelector: []\n"
        "injectedAnnotations: {}\n"
        "defaultTemplates: [sidecar]\n"
        "templates:\n"
        "  sidecar: |\n" + body
    )


def default_values_text() -> str:
    return json.dumps(DEFAULT_VALUES, indent=2)


def default_config() -> InjectorConfig:
    return parse(default_config_text(), default_values_text())


class InjectorConfigHolder:
    """The configuration being served. `update` swaps it only when the new one is good."""

    def __init__(self, initial: InjectorConfig | None = None) -> None:
        self.current = initial if initial is not None else default_config()
        self.last_error: str | None = None

    def update(self, config_text: str, values_text: str = "") -> str | None:
        """Returns None when applied, else the error (logged; the previous config keeps serving)."""
        try:
            self.current = parse(config_text, values_text)
        except (InjectorConfigError, TemplateError) as e:
            self.last_error = str(e)
            log.error(
                "injection config rejected; the previous one keeps serving",
                configmap=CONFIGMAP_NAME,
                error=str(e),
            )
            return self.last_error
        self.last_error = None
        log.info(
            "injection config loaded", configmap=CONFIGMAP_NAME, templates=sorted(self.current.templates)
        )
        return None

    def update_from_configmap(self, data: Mapping[str, str]) -> str | None:
        return self.update(data.get("config", ""), data.get("values", ""))
