"""EnvoyFilter (networking.istio.io v1alpha3): patches applied to generated Envoy config.

Validation follows istiod's ValidateEnvoyFilter, and, as istiod does with its JSON-to-proto
(xds.BuildXDSObjectFromStruct), every patch `value` is turned into the Envoy
message its `applyTo` names here, once per object revision: a `typed_config` of a type the
descriptor pool does not know, or a field the message lacks, refuses the object with the patch's
path and the protobuf parser's reason. The converted message rides on the (frozen) patch, so
generation never parses a Struct per proxy, and its identity is stable while the revision lives
(cache keys use it).

Where this is stricter than istiod, on purpose: an unknown field in a value is refused (istiod
only warns, its strict pass being a warning); operations istiod accepts but never performs (an
insert into clusters, ADD of a route configuration, REPLACE outside filters and virtual hosts)
are refused; of `targetRefs`, only the kind istiod ever attaches to a proxy we patch (a Gateway
API Gateway of the filter's namespace) is accepted (see EnvoyFilterSpec).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Annotated, Any, Literal

from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import extension_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import descriptor_pool, json_format
from google.protobuf.message import Message
from pydantic import Field, PrivateAttr, field_validator, model_validator

from pilot.config.base import UNSUPPORTED_MARK, K8sObject, StrictModel, refused_because
from pilot.config.networking.common import NetworkingWorkloadSelector
from pilot.config.networking.validation import _fail, validate_regex
from pilot.config.security.common import PolicyTargetReference

ApplyTo = Literal["LISTENER", "FILTER_CHAIN", "NETWORK_FILTER", "HTTP_FILTER", "ROUTE_CONFIGURATION",
                  "VIRTUAL_HOST", "HTTP_ROUTE", "CLUSTER", "LISTENER_FILTER", "EXTENSION_CONFIG", "BOOTSTRAP"]
PatchContext = Literal["ANY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND", "GATEWAY"]
Operation = Literal["MERGE", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST", "REPLACE"]

# What each applyTo's `value` is (istiod's xds.BuildXDSObjectFromStruct).
VALUE_TYPES: dict[str, type[Message]] = {
    "LISTENER": listener_pb2.Listener,
    "FILTER_CHAIN": listener_components_pb2.FilterChain,
    "NETWORK_FILTER": listener_components_pb2.Filter,
    "HTTP_FILTER": hcm_pb2.HttpFilter,
    "ROUTE_CONFIGURATION": route_pb2.RouteConfiguration,
    "VIRTUAL_HOST": route_components_pb2.VirtualHost,
    "HTTP_ROUTE": route_components_pb2.Route,
    "CLUSTER": cluster_pb2.Cluster,
    "LISTENER_FILTER": listener_components_pb2.ListenerFilter,
    "EXTENSION_CONFIG": extension_pb2.TypedExtensionConfig,
    "BOOTSTRAP": bootstrap_pb2.Bootstrap,
}
HCM = "envoy.filters.network.http_connection_manager"
# The insert operations exist only for ordered lists, REPLACE only where istiod implements it;
# istiod accepts the others and ignores them: refused here (applied or refused, never dropped).
_INSERTS = {"INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST"}
_ORDERED = {"LISTENER_FILTER", "NETWORK_FILTER", "HTTP_FILTER", "HTTP_ROUTE"}
_LISTENER_KINDS = {"LISTENER", "FILTER_CHAIN", "NETWORK_FILTER", "HTTP_FILTER", "LISTENER_FILTER"}
_ROUTE_KINDS = {"ROUTE_CONFIGURATION", "VIRTUAL_HOST", "HTTP_ROUTE"}
GATEWAY_API_GROUP = "gateway.networking.k8s.io"

# Fields istiod's API documents and its generation never reads (pilot/pkg/networking/core/envoyfilter
# has no reference to them): accepted there and without effect, refused here saying so.
_PORT_NAME = ("istiod does not implement it (the API marks listener portName \"Not implemented\"); "
              "match the listener by portNumber or name")
_FILTER_CLASS = ("istiod never reads filterClass (an added filter is not placed relative to the authn, "
                 "authz or stats filters); place it with INSERT_BEFORE, INSERT_AFTER or INSERT_FIRST and a "
                 "filter match")
ListenerPortName = Annotated[Any, refused_because(_PORT_NAME),
                             Field(json_schema_extra={UNSUPPORTED_MARK: True}, description=_PORT_NAME)]
FilterClass = Annotated[Any, refused_because(_FILTER_CLASS),
                        Field(json_schema_extra={UNSUPPORTED_MARK: True}, description=_FILTER_CLASS)]


class SubFilterMatch(StrictModel):
    name: str = ""


class FilterMatch(StrictModel):
    name: str = ""
    sub_filter: SubFilterMatch | None = None


class FilterChainMatch(StrictModel):
    name: str = ""
    sni: str = ""
    transport_protocol: str = ""
    application_protocols: str = ""
    filter: FilterMatch | None = None
    destination_port: int = Field(default=0, ge=0, le=65535)


class ListenerMatch(StrictModel):
    port_number: int = Field(default=0, ge=0, le=65535)
    port_name: ListenerPortName = None
    filter_chain: FilterChainMatch | None = None
    listener_filter: str = ""
    name: str = ""


class RouteMatch(StrictModel):
    name: str = ""
    action: Literal["ANY", "ROUTE", "REDIRECT", "DIRECT_RESPONSE"] = "ANY"


class VirtualHostMatch(StrictModel):
    name: str = ""
    route: RouteMatch | None = None
    # istiod: the virtual host's `domains` list holds it (exactly; no wildcard matching).
    domain_name: str = ""


class RouteConfigurationMatch(StrictModel):
    port_number: int = Field(default=0, ge=0, le=65535)
    port_name: str = ""
    gateway: str = ""
    vhost: VirtualHostMatch | None = None
    name: str = ""


class ClusterMatch(StrictModel):
    port_number: int = Field(default=0, ge=0, le=65535)
    service: str = ""
    subset: str = ""
    name: str = ""


class ProxyMatch(StrictModel):
    proxy_version: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _regex(self) -> ProxyMatch:
        if self.proxy_version and (err := validate_regex(self.proxy_version, "proxyVersion")):
            _fail(f"Envoy filter: invalid regex for proxy version, [{err}]")
        return self

    def compiled(self) -> re.Pattern[str] | None:
        return re.compile(self.proxy_version) if self.proxy_version else None


class EnvoyConfigObjectMatch(StrictModel):
    context: PatchContext = "ANY"
    proxy: ProxyMatch | None = None
    listener: ListenerMatch | None = None
    route_configuration: RouteConfigurationMatch | None = None
    cluster: ClusterMatch | None = None


class Patch(StrictModel):
    operation: Operation
    value: dict[str, Any] | None = None
    filter_class: FilterClass = None


class EnvoyConfigObjectPatch(StrictModel):
    apply_to: ApplyTo = Field(description="BOOTSTRAP (MERGE only, not `node`) reaches Envoy when pilot-agent "
                                          "runs with BOOTSTRAP_XDS_AGENT=true, at its next start")
    match: EnvoyConfigObjectMatch = Field(default_factory=EnvoyConfigObjectMatch)
    patch: Patch

    # The patch value as the Envoy message (None for REMOVE), converted once per revision.
    _message: Message | None = PrivateAttr(default=None)
    _version: re.Pattern[str] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _valid(self) -> EnvoyConfigObjectPatch:
        m, op, to = self.match, self.patch.operation, self.apply_to
        if to in _LISTENER_KINDS and (m.route_configuration is not None or m.cluster is not None):
            _fail(f"Envoy filter: applyTo {to} can have only a listener match")
        if to in _ROUTE_KINDS and (m.listener is not None or m.cluster is not None):
            _fail(f"Envoy filter: applyTo {to} can have only a routeConfiguration match")
        if to == "CLUSTER" and (m.listener is not None or m.route_configuration is not None):
            _fail("Envoy filter: applyTo CLUSTER can have only a cluster match")
        if to in ("EXTENSION_CONFIG", "BOOTSTRAP") and (
                m.listener is not None or m.route_configuration is not None or m.cluster is not None):
            _fail(f"Envoy filter: applyTo {to} can have only a proxy match")
        # istiod only ever adds extension configs (InsertedExtensionConfigurations) and merges
        # into the bootstrap (ApplyBootstrapPatches); it accepts other operations and ignores them.
        if to == "EXTENSION_CONFIG" and op != "ADD":
            _fail(f"Envoy filter: applyTo EXTENSION_CONFIG supports ADD only, not {op}")
        if to == "BOOTSTRAP":
            # Merged into the bootstrap pilot-agent fetches over xDS (BOOTSTRAP_XDS_AGENT; see
            # pilot/networking/envoy_filters.py patch_bootstrap): istiod accepted the other
            # operations and counted them as errors, never applying them.
            if op != "MERGE":
                _fail(f"Envoy filter: applyTo BOOTSTRAP supports MERGE only, not {op}")
            if isinstance(self.patch.value, dict) and "node" in self.patch.value:
                # The node is the agent's identity (its certificate, its metadata): a merged id
                # or namespace would make Envoy speak for another workload.
                _fail("Envoy filter: a BOOTSTRAP patch cannot change `node`: it is the proxy's identity, "
                      "written by pilot-agent")
        fm = m.listener.filter_chain.filter if m.listener is not None and m.listener.filter_chain else None
        if fm is not None:  # istiod's rules for filter and sub-filter matches
            if not fm.name:
                _fail("Envoy filter: filter match has no name to match on")
            if fm.sub_filter is not None:
                if to != "HTTP_FILTER":
                    _fail("Envoy filter: subfilter match can be used with applyTo HTTP_FILTER only")
                if fm.name not in (HCM, "envoy.http_connection_manager"):
                    _fail(f"Envoy filter: subfilter match requires filter match with {HCM}")
                if not fm.sub_filter.name:
                    _fail("Envoy filter: subfilter match has no name to match on")
        if op in _INSERTS and to not in _ORDERED:
            _fail(f"Envoy filter: {op} is supported only for LISTENER_FILTER, NETWORK_FILTER, HTTP_FILTER "
                  f"and HTTP_ROUTE, not {to}")
        if op == "REPLACE" and to not in {"LISTENER_FILTER", "NETWORK_FILTER", "HTTP_FILTER", "VIRTUAL_HOST"}:
            _fail(f"Envoy filter: REPLACE is supported only for LISTENER_FILTER, NETWORK_FILTER, HTTP_FILTER "
                  f"and VIRTUAL_HOST, not {to}")
        if op == "ADD" and to == "ROUTE_CONFIGURATION":
            _fail("Envoy filter: ROUTE_CONFIGURATION supports MERGE only (routes come from RDS names)")
        if op in ("ADD", "MERGE", "REPLACE") or op in _INSERTS:
            value = self.patch.value
            if value is None:
                _fail(f"Envoy filter: missing patch value for non-remove operation ({op} of {to})")
            self._message = to_message(to, value or {})
            if op == "ADD" and to in ("LISTENER", "CLUSTER") and not getattr(self._message, "name", ""):
                _fail(f"Envoy filter: an added {to.lower()} needs a name")
            if to == "EXTENSION_CONFIG":
                ec = self._message
                assert isinstance(ec, extension_pb2.TypedExtensionConfig)
                if not ec.name:
                    _fail("Envoy filter: an added extension config needs a name (filters reference it by name)")
                if not ec.HasField("typed_config"):
                    _fail("Envoy filter: an added extension config needs a typed_config")
        if m.proxy is not None:
            self._version = m.proxy.compiled()
        return self

    def __setstate__(self, state: dict[Any, Any]) -> None:
        # Parsed in the file source's worker process and unpickled here: the types its value
        # names must be known to this process's pool too (config dumps render them as JSON).
        super().__setstate__(state)
        if self.patch.value is not None:
            load_types(self.patch.value)

    @property
    def message(self) -> Message | None:
        return self._message

    @property
    def version_regex(self) -> re.Pattern[str] | None:
        return self._version


def target_ref_problems(refs: list[PolicyTargetReference]) -> list[str]:
    """What istiod's EnvoyFilter selection (WorkloadPolicyMatcher.ShouldAttachPolicy, given a
    proxy and no services) can attach, and the CRD's rules (kind and name required, no namespace).
    istiod accepts any kind and matches only some; a kind it never attaches, or attaches only to
    proxies that get no patches here, would be accepted and never applied: refused, saying why."""
    errs = []
    for i, r in enumerate(refs):
        at = f"targetRefs[{i}]"
        group = "" if r.group in ("", "core") else r.group
        if not r.kind:
            errs.append(f"{at}.kind: required")
        if not r.name:
            errs.append(f"{at}.name: required")
        if r.namespace:
            errs.append(f"{at}.namespace: cross namespace referencing is not currently supported")
        if (group, r.kind) == (GATEWAY_API_GROUP, "Gateway") or not r.kind:
            continue
        if (group, r.kind) == (GATEWAY_API_GROUP, "GatewayClass"):
            errs.append(f"{at}: kind GatewayClass is not supported: istiod attaches it only to waypoints "
                        "(istio-waypoint, from the root namespace), and waypoints get no EnvoyFilter patches here")
        elif (group, r.kind) in (("", "Service"), ("networking.istio.io", "ServiceEntry")):
            errs.append(f"{at}: kind {r.kind} is not supported: istiod selects EnvoyFilters per proxy without "
                        "its services, so a Service or ServiceEntry target never attaches (it would do nothing)")
        else:
            errs.append(f"{at}: kind {r.group or 'core'}/{r.kind} is not supported: an EnvoyFilter attaches to "
                        f"a {GATEWAY_API_GROUP} Gateway of its namespace")
    return errs


class EnvoyFilterSpec(StrictModel):
    workload_selector: NetworkingWorkloadSelector | None = None
    # A Gateway API Gateway of this namespace: its proxies (gateway-name label), and nothing else
    # (istiod's ShouldAttachPolicy: targetRefs never select a proxy without its gateway-name label).
    target_refs: list[PolicyTargetReference] = Field(
        default_factory=list, max_length=16,
        description="kind Gateway (gateway.networking.k8s.io) of the filter's namespace: that Gateway's proxies; "
                    "GatewayClass, Service, ServiceEntry and other kinds are refused with the reason")
    config_patches: list[EnvoyConfigObjectPatch] = Field(default_factory=list)  # empty: valid, no effect
    priority: int = 0

    @field_validator("target_refs")
    @classmethod
    def _refs(cls, refs: list[PolicyTargetReference]) -> list[PolicyTargetReference]:
        if errs := target_ref_problems(refs):
            _fail(errs)
        return refs

    @model_validator(mode="after")
    def _one_of(self) -> EnvoyFilterSpec:
        if self.workload_selector is not None and self.target_refs:
            _fail("only one of targetRefs or workloadSelector can be set")  # the CRD's oneof rule
        return self


class EnvoyFilter(K8sObject):
    kind: Literal["EnvoyFilter"] = "EnvoyFilter"
    spec: EnvoyFilterSpec


# --- JSON to proto ------------------------------------------------------------------------------
_POOL = descriptor_pool.Default()
_TYPE_PREFIX = "type.googleapis.com/"


def to_message(apply_to: str, value: dict[str, Any]) -> Message:
    """The patch value as the message `apply_to` names, as istiod's JSON-to-proto does: every
    `@type` is resolved in the protobuf descriptor pool (the xds-protos modules of its package are
    imported on first use); an unknown type or field is a refusal with the parser's reason."""
    load_types(value)
    msg = VALUE_TYPES[apply_to]()
    try:
        json_format.ParseDict(value, msg)
    except json_format.ParseError as e:
        _fail(f"Envoy filter: invalid {apply_to} value: {e}")
    except (AttributeError, TypeError, KeyError) as e:
        # protobuf's parser fails this way on some shapes (an Any without "@type").
        _fail(f"Envoy filter: invalid {apply_to} value: {type(e).__name__}: {e} (is an \"@type\" missing?)")
    return msg


def load_types(value: Any) -> None:
    if isinstance(value, dict):
        t = value.get("@type")
        if isinstance(t, str):
            ensure_type(t)
        for v in value.values():
            load_types(v)
    elif isinstance(value, list):
        for v in value:
            load_types(v)


_loaded: set[str] = set()
# The top-level packages of the generated proto modules installed (xds-protos, protobuf).
_PROTO_ROOTS = frozenset({"envoy", "xds", "udpa", "google", "opentelemetry", "opencensus", "cel", "validate"})


def ensure_type(type_url: str) -> bool:
    """Make the message a type URL names known to the default pool, importing the generated
    modules of its proto package (for `a.b.v3.Msg`: every `*_pb2` module of python package
    `a.b.v3`). False when no installed module defines it."""
    full = type_url.rsplit("/", 1)[-1]
    try:
        _POOL.FindMessageTypeByName(full)
        return True
    except KeyError:
        pass
    parts = full.split(".")
    if parts[0] not in _PROTO_ROOTS:
        return False  # a type URL is user input: only proto packages are ever imported for it
    for cut in range(len(parts) - 1, 0, -1):  # nested messages: try shorter packages too
        package = ".".join(parts[:cut])
        if package in _loaded:
            continue
        try:
            mod = importlib.import_module(package)
        except ImportError:
            continue  # (not remembered: the set holds real packages only, not whatever users wrote)
        _loaded.add(package)
        for info in pkgutil.iter_modules(getattr(mod, "__path__", [])):
            if info.name.endswith("_pb2"):
                try:
                    importlib.import_module(f"{package}.{info.name}")
                except Exception:  # noqa: BLE001, S112 - a broken optional module must not refuse other types
                    continue
        try:
            _POOL.FindMessageTypeByName(full)
            return True
        except KeyError:
            continue
    return False
