"""Every environment knob the control plane reads, declared once with its default and help text.

Names and semantics follow istiod so existing Deployments and runbooks keep working.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pilot import logging as plog
from pilot.durations import parse_duration
from pilot.model.mesh_settings import GenerationKnobs

T = TypeVar("T")


@dataclass(frozen=True)
class Knob(Generic[T]):
    name: str
    default: str
    parse: Callable[[str], T]
    help: str

    def get(self, environ: dict[str, str] | None = None) -> T:
        env = os.environ if environ is None else environ
        raw = env.get(self.name, self.default)
        try:
            return self.parse(raw)
        except ValueError as e:
            raise ValueError(f"environment variable {self.name}={raw!r}: {e}") from None


def _bool(text: str) -> bool:
    # Go's strconv.ParseBool accepts exactly these.
    t = text.strip()
    if t in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if t in ("0", "f", "F", "false", "FALSE", "False", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise ValueError("must be >= 0")
    return v


KNOBS: dict[str, Knob] = {}


def _knob(name: str, default: str, parse: Callable[[str], T], help: str) -> Knob[T]:
    k = Knob(name, default, parse, help)
    KNOBS[name] = k
    return k


DEBOUNCE_AFTER = _knob(
    "PILOT_DEBOUNCE_AFTER", "100ms", parse_duration,
    "Quiet period after the last config event before a push starts.")
DEBOUNCE_MAX = _knob(
    "PILOT_DEBOUNCE_MAX", "10s", parse_duration,
    "Longest a push may be delayed by continuing events.")
ENABLE_EDS_DEBOUNCE = _knob(
    "PILOT_ENABLE_EDS_DEBOUNCE", "true", _bool,
    "Debounce endpoint-only updates too; when false they are pushed at once.")
PUSH_THROTTLE = _knob(
    "PILOT_PUSH_THROTTLE", "100", _positive_int,
    "How many proxy pushes may run concurrently.")
def _optional_rate(text: str) -> float | None:
    if not text.strip():
        return None
    v = float(text)
    if v < 0:
        raise ValueError("must be >= 0")
    return v


MAX_REQUESTS_PER_SECOND = _knob(
    "PILOT_MAX_REQUESTS_PER_SECOND", "", _optional_rate,
    "Rate limit for new xDS connections per second (0: none). Unset: new connections are "
    "admitted as fast as the server keeps up (they wait while its queue of stream work is long).")
XDS_CACHE_SIZE = _knob(
    "PILOT_XDS_CACHE_SIZE", "60000", _positive_int,
    "Maximum number of serialised resources held in the xDS cache.")
POD_NAMESPACE = _knob(
    "POD_NAMESPACE", "istio-system", str,
    "The control plane's own namespace; the mesh ConfigMap `istio` is read from it.")
REVISION = _knob("REVISION", "default", str, "Control plane revision.")
ENABLE_LEADER_ELECTION = _knob(
    "ENABLE_LEADER_ELECTION", "true", _bool, "Use leader election for singleton controllers.")
DEFAULT_WORKLOAD_CERT_TTL = _knob(
    "DEFAULT_WORKLOAD_CERT_TTL", "24h", parse_duration, "TTL of workload certificates when unspecified.")
MAX_WORKLOAD_CERT_TTL = _knob(
    "MAX_WORKLOAD_CERT_TTL", "2160h", parse_duration, "Longest workload certificate TTL accepted.")
SELF_SIGNED_CA_CERT_TTL = _knob(
    "CITADEL_SELF_SIGNED_CA_CERT_TTL", "87600h", parse_duration, "TTL of the self-signed root.")
ROOT_CA_DIR = _knob("ROOT_CA_DIR", "./etc/cacerts", str, "Directory of a plugged-in CA.")
SELF_SIGNED_CA_RSA_KEY_SIZE = _knob(
    "CITADEL_SELF_SIGNED_CA_RSA_KEY_SIZE", "2048", _positive_int,
    "RSA key size of the self-signed root (when CA_KEY_TYPE is RSA).")


def _ca_key_type(text: str) -> str:
    t = text.strip().upper()
    if t not in ("RSA", "EC"):
        raise ValueError("must be RSA or EC")
    return t


# Not an istiod knob (istiod's self-signed root is always RSA).
CA_KEY_TYPE = _knob(
    "CA_KEY_TYPE", "RSA", _ca_key_type,
    "Key type of the self-signed root and of istiod's own serving key: RSA, or EC (P-256). "
    "A plugged-in CA keeps the type of its key.")
# Not istiod knobs (istiod hard-codes client-go's defaults); exposed so small clusters and tests
# can fail over faster. The defaults are istiod's.
LEADER_LEASE_DURATION = _knob("PILOT_LEADER_LEASE_DURATION", "30s", parse_duration,
                              "How long a leader's Lease is valid without renewal.")
LEADER_RENEW_DEADLINE = _knob("PILOT_LEADER_RENEW_DEADLINE", "15s", parse_duration,
                              "A leader that cannot renew for this long steps down.")
LEADER_RETRY_PERIOD = _knob("PILOT_LEADER_RETRY_PERIOD", "7.5s", parse_duration,
                            "How often candidates try to take the Lease (with jitter).")
DRAIN_DURATION = _knob(
    "PILOT_DRAIN_DURATION", "5s", parse_duration,
    "On SIGTERM, xDS streams are closed spread over this long so proxies reconnect gradually; the "
    "xDS ports (15010 and 15012) say GOAWAY at once, so each reconnects on a new connection "
    "(another replica).")
XDS_SEND_TIMEOUT = _knob(
    "PILOT_XDS_SEND_TIMEOUT", "0s", parse_duration,
    "Longest one xDS response may take to be written to a proxy; a proxy that does not read it "
    "in time has its stream closed (it reconnects) and pilot_xds_write_timeout counts it. 0 waits "
    "forever, as istiod's default; a stuck proxy then holds only its own stream, never another's push.")
MAX_RECV_MSG_SIZE = _knob(
    "ISTIO_GPRC_MAXRECVMSGSIZE", str(4 << 20), _positive_int,
    "Largest gRPC message (bytes) accepted from a client; larger ones end the stream with "
    "RESOURCE_EXHAUSTED (istiod's name, typo included).")
# Not istiod knobs: istiod has no bound here; a hostile client must not be able to hold a stream
# (or the event loop) with these.
XDS_FIRST_REQUEST_TIMEOUT = _knob(
    "PILOT_XDS_FIRST_REQUEST_TIMEOUT", "10s", parse_duration,
    "A stream that sends no first DiscoveryRequest within this long is closed with DEADLINE_EXCEEDED "
    "(0 disables).")
XDS_MAX_RESOURCE_NAMES = _knob(
    "PILOT_XDS_MAX_RESOURCE_NAMES", "100000", _positive_int,
    "Most resource names (or delta initial_resource_versions) one request may carry; more ends the "
    "stream with RESOURCE_EXHAUSTED.")

ENABLE_AMBIENT = _knob("PILOT_ENABLE_AMBIENT", "false", _bool,
                       "Serve ztunnel (ambient mode): WDS and L4 authorization over delta xDS, waypoints. "
                       "Without it ztunnel connections are refused.")

ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION = _knob(
    "PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION", "true", _bool,
    "A proxy connecting with node metadata AUTO_REGISTER_GROUP gets a WorkloadEntry made from that "
    "WorkloadGroup of its namespace (file mode: kept in memory; istiod's default: on).")
ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS = _knob(
    "PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS", "true", _bool,
    "An auto-registered proxy whose ProxyConfig has a readinessProbe reports its health (istio.io/health "
    "requests); its WorkloadEntry's Healthy condition follows and an unhealthy one is no endpoint.")
WORKLOAD_ENTRY_GRACE_PERIOD = _knob(
    "PILOT_WORKLOAD_ENTRY_GRACE_PERIOD", "10s", parse_duration,
    "How long an auto-registered WorkloadEntry outlives its proxy's last connection.")
ENABLE_K8S_SELECT_WORKLOAD_ENTRIES = _knob(
    "PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES", "true", _bool,
    "Kubernetes Services select WorkloadEntries in their namespace by their selector, as they "
    "select Pods: the WorkloadEntries become endpoints of the Service (istiod's default: on).")

# Not an istiod knob: the switch the push benchmark measures recording's cost with. Off, every
# change pushes every watched type to every connected proxy (correct, and wasteful).
RECORD_DEPENDENCIES = _knob(
    "PILOT_RECORD_DEPENDENCIES", "true", _bool,
    "Record what each generated result read and push a change only to the proxies and types whose "
    "config read it (pilot/model/dependencies.py). Off: every change pushes everything.")


def _native_sidecar_mode(text: str) -> str:
    t = text.strip()
    if t not in ("true", "false", "auto"):
        raise ValueError("must be true, false or auto")
    return t


ENABLE_NATIVE_SIDECARS = _knob(
    "ENABLE_NATIVE_SIDECARS", "auto", _native_sidecar_mode,
    "Inject istio-proxy as a Kubernetes native sidecar (an init container with restartPolicy: Always): "
    "true or false; auto, istiod's default, checks node kubelet versions there, and here behaves as false "
    "(Nodes are not watched). The sidecar.istio.io/nativeSidecar annotation overrides it per pod.")
# Not an istiod knob (istiod's file source relies on its watcher alone): a full rescan of
# --configDir every interval heals events the watcher missed; a rescan re-parses only files whose
# content changed.
CONFIG_RESCAN_INTERVAL = _knob(
    "PILOT_CONFIG_RESCAN_INTERVAL", "60s", parse_duration,
    "File mode: how often --configDir is rescanned in full, whatever the watcher reported (0 disables).")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _node_accounts(text: str) -> tuple[str, ...]:
    accounts = _csv(text)
    for a in accounts:
        ns, slash, sa = a.partition("/")
        if not slash or not ns or not sa or "/" in sa:
            raise ValueError(f"{a!r} is not NAMESPACE/SERVICEACCOUNT")
    return accounts


# Not an istiod knob: istiod without Kubernetes keeps its self-signed root in memory only. Here
# file mode stores it (key included, 0600) so a restart keeps the mesh's root. Kubernetes mode
# uses the Secret istio-ca-secret in POD_NAMESPACE instead. A plugged-in CA in ROOT_CA_DIR wins
# over both.
SELF_SIGNED_CA_DIR = _knob(
    "PILOT_SELF_SIGNED_CA_DIR", "./etc/cacerts-self-signed", str,
    "File mode: directory holding the self-signed root CA (created on first start, reused after).")
JWT_RULE = _knob(
    "JWT_RULE", "", str,
    "JSON JWT rule(s) trusted to authenticate CA and secure xDS callers: an object or a list of "
    "{issuer, audiences, jwks_uri | jwks}; `jwks` is the JWKS document inline (see pilot/security/authn.py).")
JWT_PUB_KEY_REFRESH_INTERVAL = _knob(
    "PILOT_JWT_PUB_KEY_REFRESH_INTERVAL", "20m", parse_duration,
    "How often the keys of RequestAuthentication jwksUri (or issuer discovery) are fetched again.")
TOKEN_AUDIENCES = _knob(
    "TOKEN_AUDIENCES", "istio-ca", _csv,
    "Audiences a Kubernetes service-account token must carry (TokenReview), comma-separated.")
CA_TRUSTED_NODE_ACCOUNTS = _knob(
    "CA_TRUSTED_NODE_ACCOUNTS", "istio-system/ztunnel", _node_accounts,
    "NAMESPACE/SERVICEACCOUNT list allowed to request certificates for other identities "
    "(ImpersonatedIdentity, as ztunnel does), comma-separated.")
ENABLE_DEBUG_ENDPOINT_AUTH = _knob(
    "ENABLE_DEBUG_ENDPOINT_AUTH", "true", _bool,
    "Debug xDS types (istio.io/debug/*, what istioctl proxy-status asks) need an identity proved on the "
    "secure port; identities outside the system namespace see only their own namespace's proxies.")
DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES = _knob(
    "DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES", "", _csv,
    "Namespaces whose identities may read every proxy's debug info, as the system namespace can.")


def _optional_duration(text: str) -> float | None:
    return parse_duration(text) if text.strip() else None


# --- knobs that change generated config (istiod's names, defaults and meaning) -----------------
SNIFF_OUTBOUND = _knob(
    "PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_OUTBOUND", "true", _bool,
    "Outbound ports that name no protocol (no prefix, no appProtocol) are sniffed: HTTP gets L7 "
    "routing, anything else TCP. Off: such ports are plain TCP.")
SNIFF_INBOUND = _knob(
    "PILOT_ENABLE_PROTOCOL_SNIFFING_FOR_INBOUND", "true", _bool,
    "Inbound ports that name no protocol are sniffed (HTTP filters for HTTP, TCP otherwise). Off: "
    "such ports are plain TCP.")
INBOUND_PROTOCOL_DETECTION_TIMEOUT = _knob(
    "PILOT_INBOUND_PROTOCOL_DETECTION_TIMEOUT", "", _optional_duration,
    "When set, the inbound listeners' protocol detection timeout instead of MeshConfig "
    "protocolDetectionTimeout (istiod's default when set is 1s; unset, the MeshConfig value applies).")
SEND_UNHEALTHY_ENDPOINTS = _knob(
    "PILOT_SEND_UNHEALTHY_ENDPOINTS", "false", _bool,
    "EDS carries endpoints that are not ready, marked UNHEALTHY (Envoy does not balance to them, but "
    "counts them for panic threshold and outlier detection); off, they are left out. Terminating "
    "endpoints are left out either way.")
SCOPE_GATEWAY_TO_NAMESPACE = _knob(
    "PILOT_SCOPE_GATEWAY_TO_NAMESPACE", "false", _bool,
    "A gateway workload is configured only by the Gateway resources of its own namespace: "
    "Gateways with a matching selector in other namespaces do not apply to it.")
FILTER_GATEWAY_CLUSTER_CONFIG = _knob(
    "PILOT_FILTER_GATEWAY_CLUSTER_CONFIG", "false", _bool,
    "A gateway gets only the clusters of hosts its servers' VirtualServices route to, not every "
    "service's (every one still when it has an AUTO_PASSTHROUGH server).")
INGRESS_NAMESPACE = _knob(
    "K8S_INGRESS_NS", "istio-system", str,
    "The namespace of the ingress gateway Kubernetes Ingresses are translated for: their Gateways "
    "live there (so their TLS secretNames are Secrets of that namespace), and MeshConfig "
    "ingressService / ingressSelector are looked up there for Ingress status.")
CLUSTER_ID = _knob(
    "CLUSTER_ID", "Kubernetes", str,
    "The name of the cluster this control plane runs in: the cluster of every workload it discovers "
    "(ztunnel's WDS), and what a proxy that sends no CLUSTER_ID metadata is taken to be in.")
def _prefix(version: int) -> Callable[[str], str]:
    def parse(text: str) -> str:
        net = ipaddress.ip_network(text.strip(), strict=True)
        if net.version != version or net.num_addresses < 4:
            raise ValueError(f"{text!r} is not an IPv{version} prefix with room for addresses")
        return str(net)
    return parse


IP_AUTOALLOCATE = _knob(
    "PILOT_ENABLE_IP_AUTOALLOCATE", "true", _bool,
    "ServiceEntries without `addresses` (resolution not NONE, label "
    "networking.istio.io/enable-autoallocate-ip not \"false\") get an address per non-wildcard host "
    "from PILOT_IP_AUTOALLOCATE_IPV4_PREFIX and _IPV6_PREFIX; proxies that capture DNS "
    "(ISTIO_META_DNS_CAPTURE) get outbound listener chains for TCP ports on them, as istiod's.")
IP_AUTOALLOCATE_IPV4_PREFIX = _knob(
    "PILOT_IP_AUTOALLOCATE_IPV4_PREFIX", "240.240.0.0/16", _prefix(4),
    "Where auto-allocated IPv4 ServiceEntry addresses come from.")
IP_AUTOALLOCATE_IPV6_PREFIX = _knob(
    "PILOT_IP_AUTOALLOCATE_IPV6_PREFIX", "2001:2::/48", _prefix(6),
    "Where auto-allocated IPv6 ServiceEntry addresses come from.")
def _sampling(text: str) -> float:
    """istiod's: a percentage 0.0-100.0; anything else falls back to the default 1.0 (with a
    warning at start, as istiod logs one)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 100.0:
        plog.get("features").warning("PILOT_TRACE_SAMPLING out of range 0.0-100.0; using 1.0", value=text)
        return 1.0
    return value


def _jwks_mode(text: str) -> str:
    """istiod's ConvertToJwksFetchMode: false/istiod, true/hybrid, envoy; anything else istiod."""
    return {"hybrid": "hybrid", "true": "hybrid", "envoy": "envoy"}.get(text.strip(), "istiod")


JWT_ENABLE_REMOTE_JWKS = _knob(
    "PILOT_JWT_ENABLE_REMOTE_JWKS", "false", _jwks_mode,
    "Who fetches a RequestAuthentication jwksUri's keys: istiod/false, the control plane (inlined "
    "into the jwt_authn filter); hybrid/true, Envoy (remote_jwks) when the URI names a mesh service "
    "(a ServiceEntry for an external server), else the control plane; envoy, always Envoy.")
ENHANCED_DESTINATIONRULE_MERGE = _knob(
    "ENABLE_ENHANCED_DESTINATIONRULE_MERGE", "true", _bool,
    "DestinationRules of one host and namespace with different exportTo are not merged (one whose "
    "exportTo is a superset of another's merges into it and also stands alone); off, exportTo does "
    "not keep them apart.")
TRACE_SAMPLING = _knob(
    "PILOT_TRACE_SAMPLING", "1.0", _sampling,
    "The percentage of requests traced (0.0-100.0, precision 0.01) when no Telemetry resource sets "
    "randomSamplingPercentage.")
DUAL_STACK = _knob(
    "ISTIO_DUAL_STACK", "false", _bool,
    "Dual-stack support, as istiod's: proxies with IPv4 and IPv6 addresses (INSTANCE_IPS) see every "
    "spec.clusterIPs address of a Service (without, those of the first address's family), get "
    "wildcard listeners bound on :: too and DNS clusters resolving both families (dns_lookup_family "
    "ALL; without, V4_ONLY); endpoints of one Pod in both families' EndpointSlices become one "
    "endpoint with an additional address.")
HTTP10 = _knob(
    "PILOT_HTTP10", "false", _bool,
    "Sidecar HTTP listeners accept HTTP/1.0 (and sniffing recognises it as HTTP); off, HTTP/1.0 "
    "requests are refused with 426 (on sniffed ports they pass as TCP).")


@dataclass(frozen=True)
class Features:
    """A snapshot of the knobs, read once at start so a run is reproducible."""

    debounce_after: float
    debounce_max: float
    enable_eds_debounce: bool
    push_throttle: int
    max_requests_per_second: float | None  # None: admission by load (pilot/xds/pace.py)
    xds_cache_size: int
    pod_namespace: str
    revision: str
    enable_leader_election: bool = True
    root_ca_dir: str = "./etc/cacerts"
    drain_duration: float = 5.0
    leader_lease_duration: float = 30.0
    leader_renew_deadline: float = 15.0
    leader_retry_period: float = 7.5
    self_signed_ca_dir: str = "./etc/cacerts-self-signed"
    jwt_rule: str = ""
    jwt_pub_key_refresh_interval: float = 1200.0
    token_audiences: tuple[str, ...] = ("istio-ca",)
    trusted_node_accounts: tuple[str, ...] = ("istio-system/ztunnel",)
    enable_ambient: bool = False
    # PILOT_* variables set in the environment that no knob above declares: istiod has many this
    # control plane does not implement. Tolerated (istiod ignores unknown ones too) but reported
    # at start and in /debug/mesh, so a setting that has no effect is never silent.
    unknown_env: tuple[str, ...] = ()
    xds_send_timeout: float = 0.0
    max_recv_msg_size: int = 4 << 20
    xds_first_request_timeout: float = 10.0
    xds_max_resource_names: int = 100_000
    enable_debug_endpoint_auth: bool = True
    debug_endpoint_auth_allowed_namespaces: tuple[str, ...] = ()
    record_dependencies: bool = True
    config_rescan_interval: float = 60.0
    k8s_select_workload_entries: bool = True
    sniff_outbound: bool = True
    sniff_inbound: bool = True
    inbound_protocol_detection_timeout: float | None = None
    http10: bool = False
    send_unhealthy_endpoints: bool = False
    cluster_id: str = "Kubernetes"
    scope_gateway_to_namespace: bool = False
    filter_gateway_clusters: bool = False
    ingress_namespace: str = "istio-system"
    enable_workload_entry_autoregistration: bool = True
    enable_workload_entry_healthchecks: bool = True
    workload_entry_grace_period: float = 10.0
    ip_autoallocate: bool = True
    ip_autoallocate_prefixes: tuple[str, str] = ("240.240.0.0/16", "2001:2::/48")
    trace_sampling: float = 1.0
    jwks_fetch_mode: str = "istiod"
    enhanced_dr_merge: bool = True
    dual_stack: bool = False

    def generation_knobs(self) -> GenerationKnobs:
        return GenerationKnobs(self.sniff_outbound, self.sniff_inbound, self.http10,
                               self.inbound_protocol_detection_timeout, self.send_unhealthy_endpoints,
                               self.cluster_id, self.scope_gateway_to_namespace, self.filter_gateway_clusters,
                               self.ip_autoallocate_prefixes if self.ip_autoallocate else None,
                               self.trace_sampling, self.jwks_fetch_mode, self.enhanced_dr_merge,
                               dual_stack=self.dual_stack, ingress_namespace=self.ingress_namespace)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Features:
        return cls(
            debounce_after=DEBOUNCE_AFTER.get(environ),
            debounce_max=DEBOUNCE_MAX.get(environ),
            enable_eds_debounce=ENABLE_EDS_DEBOUNCE.get(environ),
            push_throttle=max(1, PUSH_THROTTLE.get(environ)),
            max_requests_per_second=MAX_REQUESTS_PER_SECOND.get(environ),
            xds_cache_size=XDS_CACHE_SIZE.get(environ),
            pod_namespace=POD_NAMESPACE.get(environ),
            revision=REVISION.get(environ),
            enable_leader_election=ENABLE_LEADER_ELECTION.get(environ),
            root_ca_dir=ROOT_CA_DIR.get(environ),
            drain_duration=DRAIN_DURATION.get(environ),
            leader_lease_duration=LEADER_LEASE_DURATION.get(environ),
            leader_renew_deadline=LEADER_RENEW_DEADLINE.get(environ),
            leader_retry_period=LEADER_RETRY_PERIOD.get(environ),
            self_signed_ca_dir=SELF_SIGNED_CA_DIR.get(environ),
            jwt_rule=JWT_RULE.get(environ),
            jwt_pub_key_refresh_interval=JWT_PUB_KEY_REFRESH_INTERVAL.get(environ),
            token_audiences=TOKEN_AUDIENCES.get(environ),
            trusted_node_accounts=CA_TRUSTED_NODE_ACCOUNTS.get(environ),
            enable_ambient=ENABLE_AMBIENT.get(environ),
            unknown_env=unknown_knobs(os.environ if environ is None else environ),
            xds_send_timeout=XDS_SEND_TIMEOUT.get(environ),
            max_recv_msg_size=MAX_RECV_MSG_SIZE.get(environ),
            xds_first_request_timeout=XDS_FIRST_REQUEST_TIMEOUT.get(environ),
            xds_max_resource_names=XDS_MAX_RESOURCE_NAMES.get(environ),
            enable_debug_endpoint_auth=ENABLE_DEBUG_ENDPOINT_AUTH.get(environ),
            debug_endpoint_auth_allowed_namespaces=DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES.get(environ),
            record_dependencies=RECORD_DEPENDENCIES.get(environ),
            config_rescan_interval=CONFIG_RESCAN_INTERVAL.get(environ),
            k8s_select_workload_entries=ENABLE_K8S_SELECT_WORKLOAD_ENTRIES.get(environ),
            sniff_outbound=SNIFF_OUTBOUND.get(environ),
            sniff_inbound=SNIFF_INBOUND.get(environ),
            inbound_protocol_detection_timeout=INBOUND_PROTOCOL_DETECTION_TIMEOUT.get(environ),
            http10=HTTP10.get(environ),
            send_unhealthy_endpoints=SEND_UNHEALTHY_ENDPOINTS.get(environ),
            cluster_id=CLUSTER_ID.get(environ),
            scope_gateway_to_namespace=SCOPE_GATEWAY_TO_NAMESPACE.get(environ),
            filter_gateway_clusters=FILTER_GATEWAY_CLUSTER_CONFIG.get(environ),
            ingress_namespace=INGRESS_NAMESPACE.get(environ),
            enable_workload_entry_autoregistration=ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION.get(environ),
            workload_entry_grace_period=WORKLOAD_ENTRY_GRACE_PERIOD.get(environ),
            enable_workload_entry_healthchecks=ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS.get(environ),
            ip_autoallocate=IP_AUTOALLOCATE.get(environ),
            trace_sampling=TRACE_SAMPLING.get(environ),
            jwks_fetch_mode=JWT_ENABLE_REMOTE_JWKS.get(environ),
            enhanced_dr_merge=ENHANCED_DESTINATIONRULE_MERGE.get(environ),
            dual_stack=DUAL_STACK.get(environ),
            ip_autoallocate_prefixes=(IP_AUTOALLOCATE_IPV4_PREFIX.get(environ),
                                      IP_AUTOALLOCATE_IPV6_PREFIX.get(environ)),
        )


UNKNOWN_PREFIX = "PILOT_"


def unknown_knobs(environ: dict[str, str] | os._Environ) -> tuple[str, ...]:
    return tuple(sorted(n for n in environ if n.startswith(UNKNOWN_PREFIX) and n not in KNOBS))
