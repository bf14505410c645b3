"""App probe rewriting (istiod's app_probe.go): the kubelet cannot reach an app behind the
sidecar's mTLS-only inbound, so the app's HTTP, TCP and gRPC probes (and HTTP/TCP lifecycle
hooks) are pointed at the agent's status port, `/app-health/CONTAINER/readyz|livez|startupz|
prestopz|poststartz`, and the originals travel in `ISTIO_KUBE_APP_PROBERS` for the agent to run."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from pilot.inject.selection import PROXY_CONTAINER

KUBE_APP_PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"
REWRITE_ANNOTATION = "sidecar.istio.io/rewriteAppHTTPProbers"

_PROBES = (("readinessProbe", "readyz"), ("livenessProbe", "livez"), ("startupProbe", "startupz"))
_HOOKS = (("preStop", "prestopz"), ("postStart", "poststartz"))


def prober_url(container: str, kind: str) -> str:
    return f"/app-health/{container}/{kind}"


def should_rewrite(annotations: Mapping[str, str], default: bool) -> bool:
    v = annotations.get(REWRITE_ANNOTATION)
    if v in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if v in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    return default


def _internal(handler: Mapping[str, Any] | None, with_timeout: bool) -> dict[str, Any] | None:
    if not isinstance(handler, Mapping):
        return None
    for kind in ("httpGet", "tcpSocket", "grpc") if with_timeout else ("httpGet", "tcpSocket"):
        if isinstance(handler.get(kind), Mapping):
            out: dict[str, Any] = {kind: copy.deepcopy(dict(handler[kind]))}
            if with_timeout and handler.get("timeoutSeconds"):
                out["timeoutSeconds"] = handler["timeoutSeconds"]
            return out
    return None


def _resolve_port(
    prober: dict[str, Any], named: Mapping[str, int], status_port: int
) -> dict[str, Any] | None:
    if "grpc" in prober:
        return prober  # gRPC probe ports are always numbers
    # _internal kept exactly one of httpGet and tcpSocket here (an empty `httpGet: {}` too)
    action = prober["httpGet"] if "httpGet" in prober else prober["tcpSocket"]
    port = action.get("port")
    if isinstance(port, str) and not port.isdigit():
        if port not in named:
            return None  # a named port no container declares: the kubelet would fail it too
        action["port"] = named[port]
    elif port is not None and int(port) == status_port:
        return None  # already points at the agent (re-injection)
    return prober


def app_probers(pod: Mapping[str, Any], status_port: int) -> dict[str, Any]:
    """istiod's DumpAppProbers: the probes to hand to the agent, keyed by their rewritten path."""
    spec = pod.get("spec") or {}
    out: dict[str, Any] = {}
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        name = c.get("name", "")
        if name == PROXY_CONTAINER:
            continue
        named = {p["name"]: p.get("containerPort") for p in c.get("ports") or [] if p.get("name")}
        for field, kind in _PROBES:
            p = _internal(c.get(field), with_timeout=True)
            if p is not None and (p := _resolve_port(p, named, status_port)) is not None:
                out[prober_url(name, kind)] = p
        for hook, kind in _HOOKS:
            p = _internal((c.get("lifecycle") or {}).get(hook), with_timeout=False)
            if p is not None and (p := _resolve_port(p, named, status_port)) is not None:
                out[prober_url(name, kind)] = p
    return out


def _converted(handler: Mapping[str, Any], url: str, status_port: int) -> dict:
    h = copy.deepcopy(dict(handler))
    if isinstance(h.get("httpGet"), dict):
        get = h["httpGet"]
        get["port"] = status_port
        get["path"] = url
        if get.get("scheme") == "HTTPS":
            get["scheme"] = "HTTP"  # kubelet -> HTTP -> agent -> HTTPS -> app
        return h
    h.pop("tcpSocket", None)
    h.pop("grpc", None)
    h["httpGet"] = {"path": url, "port": status_port}
    return h


def rewrite_probes(pod: dict[str, Any], status_port: int) -> None:
    """istiod's patchRewriteProbe, in place: every app probe/hook with an HTTP, TCP or gRPC action
    now asks the agent."""
    spec = pod.get("spec") or {}
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        name = c.get("name", "")
        if name == PROXY_CONTAINER:
            continue
        for field, kind in _PROBES:
            probe = c.get(field)
            if isinstance(probe, dict) and any(
                isinstance(probe.get(k), dict) for k in ("httpGet", "tcpSocket", "grpc")
            ):
                c[field] = _converted(probe, prober_url(name, kind), status_port)
        lifecycle = c.get("lifecycle")
        if isinstance(lifecycle, dict):
            for hook, kind in _HOOKS:
                h = lifecycle.get(hook)
                if isinstance(h, dict) and any(isinstance(h.get(k), dict) for k in ("httpGet", "tcpSocket")):
                    lifecycle[hook] = _converted(h, prober_url(name, kind), status_port)


def merge_probers_env(env: list[dict[str, Any]], probers: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Add ISTIO_KUBE_APP_PROBERS, merging with an existing value (re-injection keeps old entries)."""
    for i, e in enumerate(env):
        if e.get("name") == KUBE_APP_PROBERS_ENV:
            try:
                old = json.loads(e.get("value") or "{}")
            except ValueError:
                old = {}
            merged = {**probers, **(old if isinstance(old, dict) else {})}
            env[i] = {
                "name": KUBE_APP_PROBERS_ENV,
                "value": json.dumps(merged, sort_keys=True, separators=(",", ":")),
            }
            return env
    env.append(
        {
            "name": KUBE_APP_PROBERS_ENV,
            "value": json.dumps(dict(probers), sort_keys=True, separators=(",", ":")),
        }
    )
    return env
