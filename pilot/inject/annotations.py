"""The pod annotations the injector honours, each with its validator: the one table docs/injection.md
is generated from (tests/unit/test_inject_docs.py keeps them equal).

istiod validates a fixed set of annotations before rendering and refuses the pod, naming the
annotation and the reason, when one is bad (pkg/kube/inject/validate.go); we do the same, and also
validate values our pilot-agent would refuse at start (log levels, ProxyConfig), so a pod is never
admitted with a sidecar that cannot run. Injection-time annotations istiod honours that we do not
are refused by name rather than silently dropped (UNSUPPORTED).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from pilot.agent.cli import LOG_LEVELS
from pilot.agent.config import ConfigError, parse_proxy_config
from pilot.config.networking.proxy_config import ProxyImage


class AnnotationError(ValueError):
    """A pod annotation the injector cannot honour; the message names it and the reason."""


def _ports(v: str) -> None:
    for p in v.split(","):
        p = p.strip()
        if not p.isdigit() or not 0 <= int(p) <= 65535:
            raise ValueError(f"failed parsing port {p!r}: must be 0-65535")


def _ports_or_star(v: str) -> None:
    if v.strip() not in ("*", ""):
        _ports(v)


def _port_list(v: str) -> None:
    if v.strip():
        _ports(v)


def _port(v: str) -> None:
    if not v.strip().isdigit() or not 0 <= int(v) <= 65535:
        raise ValueError("must be a port number 0-65535")


def _cidrs(v: str) -> None:
    for c in v.split(","):
        if c:
            try:
                ipaddress.ip_network(c, strict=False)
            except ValueError:
                raise ValueError(f"failed parsing cidr {c!r}") from None


def _cidrs_or_star(v: str) -> None:
    if v != "*":
        _cidrs(v)


def _uint32(v: str) -> None:
    if not v.isdigit() or int(v) > 2**32 - 1:
        raise ValueError("must be a non-negative integer")


_GO_BOOLS = ("1", "t", "T", "true", "TRUE", "True", "0", "f", "F", "false", "FALSE", "False")


def _bool(v: str) -> None:
    if v not in _GO_BOOLS:
        raise ValueError("must be true or false")


def _true_false(v: str) -> None:
    if v not in ("true", "false"):
        raise ValueError("must be 'true' or 'false'")


# Kubernetes resource.Quantity: a signed decimal number with an optional binary/decimal suffix.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def _quantity(v: str) -> None:
    if not _QUANTITY.match(v):
        raise ValueError("not a Kubernetes resource quantity (e.g. 100m, 128Mi, 2)")


def _interception(v: str) -> None:
    if v not in ("REDIRECT", "TPROXY", "NONE"):
        raise ValueError("interceptionMode invalid, use REDIRECT,TPROXY,NONE")


def _log_level(v: str) -> None:
    if v not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")


def _component_levels(v: str) -> None:
    for part in v.split(","):
        name, sep, level = part.partition(":")
        if not sep or not name or level not in LOG_LEVELS:
            raise ValueError(f"{part!r}: must be component:level with level one of {', '.join(LOG_LEVELS)}")


def _scope_levels(v: str) -> None:
    levels = ("debug", "info", "warn", "warning", "error", "fatal", "none")
    for part in v.split(","):
        _, _, level = part.rpartition(":")
        if level not in levels:
            raise ValueError(f"{part!r}: must be [scope:]level with level one of {', '.join(levels)}")


_IFACE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


def _interfaces(v: str) -> None:
    for i in v.split(","):
        if i and not _IFACE.match(i):
            raise ValueError(f"invalid interface name {i!r}")


def _proxy_config(v: str) -> None:
    # The parser pilot-agent itself uses: an annotation the agent would refuse is refused here.
    try:
        parse_proxy_config([("proxy.istio.io/config", v)])
    except ConfigError as e:
        raise ValueError(str(e)) from None


def _image(v: str) -> None:
    if not v.strip() or any(c.isspace() for c in v):
        raise ValueError("must be an image reference without spaces")


def _image_type(v: str) -> None:
    try:
        ProxyImage(image_type=v)
    except ValidationError as e:
        raise ValueError(e.errors()[0]["msg"].removeprefix("Value error, ")) from None


def _templates(v: str) -> None:
    if not all(t.strip() for t in v.split(",")):
        raise ValueError("must be a comma-separated list of template names")


@dataclass(frozen=True)
class Annotation:
    name: str
    effect: str
    validate: Callable[[str], None] | None = None


HONOURED: tuple[Annotation, ...] = (
    Annotation(
        "sidecar.istio.io/inject",
        "Label (preferred) or annotation: `true` injects, `false` skips; "
        "other values fall back to the policy, as istiod.",
    ),
    Annotation(
        "sidecar.istio.io/proxyCPU",
        "istio-proxy `resources.requests.cpu` (replaces the values' resources).",
        _quantity,
    ),
    Annotation("sidecar.istio.io/proxyMemory", "istio-proxy `resources.requests.memory`.", _quantity),
    Annotation("sidecar.istio.io/proxyCPULimit", "istio-proxy `resources.limits.cpu`.", _quantity),
    Annotation("sidecar.istio.io/proxyMemoryLimit", "istio-proxy `resources.limits.memory`.", _quantity),
    Annotation(
        "sidecar.istio.io/proxyImage", "Image of istio-proxy (and istio-init) when it contains a `/`.", _image
    ),
    Annotation(
        "sidecar.istio.io/proxyImageType",
        "Image variant (`default`, `debug`, `distroless`): the tag gets `-TYPE`; wins over the "
        "ProxyConfig's `image.imageType` and `values.global.variant`.",
        _image_type,
    ),
    Annotation(
        "sidecar.istio.io/interceptionMode",
        "`REDIRECT`, `TPROXY` or `NONE` (no istio-init); "
        "`ISTIO_META_INTERCEPTION_MODE` and istio-iptables `-m`.",
        _interception,
    ),
    Annotation("sidecar.istio.io/logLevel", "Envoy log level (`--proxyLogLevel`).", _log_level),
    Annotation(
        "sidecar.istio.io/componentLogLevel",
        "Envoy component levels (`--proxyComponentLogLevel`).",
        _component_levels,
    ),
    Annotation(
        "sidecar.istio.io/agentLogLevel",
        "pilot-agent and istio-iptables `--log_output_level`.",
        _scope_levels,
    ),
    Annotation(
        "sidecar.istio.io/rewriteAppHTTPProbers",
        "`false` keeps the app's probes as written; "
        "otherwise they are sent to the agent's status port (`ISTIO_KUBE_APP_PROBERS`).",
        _bool,
    ),
    Annotation(
        "sidecar.istio.io/nativeSidecar",
        "`true`/`false` overrides `ENABLE_NATIVE_SIDECARS` "
        "(istio-proxy as an init container with `restartPolicy: Always`).",
        _true_false,
    ),
    Annotation(
        "traffic.sidecar.istio.io/includeOutboundIPRanges",
        "istio-iptables `-i` (CIDRs or `*`).",
        _cidrs_or_star,
    ),
    Annotation("traffic.sidecar.istio.io/excludeOutboundIPRanges", "istio-iptables `-x` (CIDRs).", _cidrs),
    Annotation(
        "traffic.sidecar.istio.io/includeInboundPorts", "istio-iptables `-b` (ports or `*`).", _ports_or_star
    ),
    Annotation(
        "traffic.sidecar.istio.io/excludeInboundPorts",
        "istio-iptables `-d`, after 15090,15021 and the status port.",
        _port_list,
    ),
    Annotation("traffic.sidecar.istio.io/includeOutboundPorts", "istio-iptables `-q`.", _port_list),
    Annotation("traffic.sidecar.istio.io/excludeOutboundPorts", "istio-iptables `-o`.", _port_list),
    Annotation("traffic.sidecar.istio.io/kubevirtInterfaces", "istio-iptables `-k`.", _interfaces),
    Annotation(
        "istio.io/reroute-virtual-interfaces",
        "istio-iptables `-k` (wins over kubevirtInterfaces).",
        _interfaces,
    ),
    Annotation("traffic.sidecar.istio.io/excludeInterfaces", "istio-iptables `-c`.", _interfaces),
    Annotation(
        "proxy.istio.io/config",
        "ProxyConfig over the mesh's `defaultConfig`, in `PROXY_CONFIG`; "
        "`holdApplicationUntilProxyStarts: true` puts istio-proxy first with a `pilot-agent wait` "
        "postStart hook; `statusPort`, `interceptionMode`, `proxyMetadata`, `concurrency` and "
        "`image.imageType` are read too. Over namespace and mesh-wide ProxyConfig resources, under "
        "one selecting the workload.",
        _proxy_config,
    ),
    Annotation(
        "status.sidecar.istio.io/port",
        "The agent's status port (ProxyConfig.statusPort): readiness "
        "probe, rewritten app probes, merged metrics; `0` disables the readiness probe.",
        _port,
    ),
    Annotation(
        "readiness.status.sidecar.istio.io/initialDelaySeconds", "istio-proxy readiness probe.", _uint32
    ),
    Annotation("readiness.status.sidecar.istio.io/periodSeconds", "istio-proxy readiness probe.", _uint32),
    Annotation("readiness.status.sidecar.istio.io/failureThreshold", "istio-proxy readiness probe.", _uint32),
    Annotation(
        "prometheus.istio.io/merge-metrics",
        "`false` leaves `prometheus.io/*` alone; otherwise they "
        "point at the agent (`ISTIO_PROMETHEUS_ANNOTATIONS` keeps the app's).",
        _bool,
    ),
    Annotation("inject.istio.io/templates", "Templates to render instead of `defaultTemplates`.", _templates),
    Annotation("security.istio.io/tlsMode", "Label, kept when set (default `istio`)."),
    Annotation(
        "service.istio.io/canonical-name",
        "Label, kept when set (else app.kubernetes.io/name, app, the workload name).",
    ),
    Annotation(
        "service.istio.io/canonical-revision",
        "Label, kept when set (else app.kubernetes.io/version, version, `latest`).",
    ),
    Annotation("service.istio.io/workload-name", "Label: ISTIO_META_WORKLOAD_NAME (else the owner's name)."),
)

# istiod honours these at injection time; our template does not implement them yet. A pod that
# sets one is refused by name instead of being injected without it.
UNSUPPORTED: Mapping[str, str] = {
    "sidecar.istio.io/bootstrapOverride": "a custom Envoy bootstrap is not supported by pilot-agent",
    "sidecar.istio.io/userVolume": "extra volumes for istio-proxy are not supported yet",
    "sidecar.istio.io/userVolumeMount": "extra volume mounts for istio-proxy are not supported yet",
    "sidecar.istio.io/capNetBindService": "NET_BIND_SERVICE for istio-proxy is not supported yet",
}

_VALIDATORS = {a.name: a.validate for a in HONOURED if a.validate is not None}


def validate(annotations: Mapping[str, str]) -> None:
    """Raise AnnotationError naming every bad or unsupported annotation (sorted, all at once)."""
    errors = []
    for name in sorted(annotations):
        value = annotations[name]
        if name in UNSUPPORTED:
            errors.append(f"annotation {name!r} is not supported: {UNSUPPORTED[name]}")
            continue
        check = _VALIDATORS.get(name)
        if check is None:
            continue
        try:
            check(value)
        except ValueError as e:
            errors.append(f"invalid value {value!r} for annotation {name!r}: {e}")
    if errors:
        raise AnnotationError("; ".join(errors))


def markdown_table() -> str:
    rows = ["| Annotation | Effect |", "| --- | --- |"]
    rows += [f"| `{a.name}` | {a.effect} |" for a in HONOURED]
    rows += [
        "",
        "Refused (istiod honours them; this injector does not yet):",
        "",
        "| Annotation | Why |",
        "| --- | --- |",
    ]
    rows += [f"| `{k}` | {v} |" for k, v in UNSUPPORTED.items()]
    return "\n".join(rows) + "\n"
