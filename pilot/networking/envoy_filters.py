"""Applying EnvoyFilter patches to generated listeners, route configurations and clusters.

Pure, as istiod's pilot/pkg/networking/core/envoyfilter (listener_patch.go, rc_patch.go,
cluster_patch.go): the same matching (context, listener name and port, filter chain name, SNI,
transport and application protocols, destination port, network filter and HTTP sub-filter names;
route configuration port, name, gateway server; virtual host and route names and action; cluster
name, service, subset, port) and the same operations in the same order. Patches arrive already
filtered by proxy (pilot/model/envoy_filters.py), so the result depends on the resource, its
context and the patch list only: the caller caches it under exactly those.

MERGE is istio's pkg/proto/merge: proto merge semantics (singular fields replaced, messages merged
recursively, repeated fields appended, map entries replaced) except that a Duration is replaced
whole; a filter's `typed_config` is merged as the message it holds (istio's MergeAnyWithAny), not
as opaque bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import any_pb2, descriptor_pool, duration_pb2, message_factory
from google.protobuf.message import Message

from pilot.config.networking.envoy_filter import ensure_type
from pilot.model.envoy_filters import PatchRef
from pilot.networking.protos import pack

HCM = "envoy.filters.network.http_connection_manager"
VIRTUAL_INBOUND = "virtualInbound"
VIRTUAL_OUTBOUND = "virtualOutbound"
LISTENER_KINDS = frozenset({"LISTENER", "FILTER_CHAIN", "NETWORK_FILTER", "HTTP_FILTER", "LISTENER_FILTER"})
ROUTE_KINDS = frozenset({"ROUTE_CONFIGURATION", "VIRTUAL_HOST", "HTTP_ROUTE"})
CLUSTER_KINDS = frozenset({"CLUSTER"})

T = TypeVar("T", bound=Message)


# --- merge (istio pkg/proto/merge) --------------------------------------------------------------
def merge(dst: Message, src: Message | None) -> None:
    if src is None:  # a patch without a value: nothing to merge
        return
    for fd, value in src.ListFields():
        if fd.is_repeated:
            target = getattr(dst, fd.name)
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                value_fd = fd.message_type.fields_by_name["value"]
                for k, v in value.items():
                    if value_fd.message_type is not None:
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif fd.message_type is not None:
                for v in value:
                    target.add().CopyFrom(v)
            else:
                target.extend(value)
        elif fd.message_type is not None:
            if fd.message_type.full_name == duration_pb2.Duration.DESCRIPTOR.full_name:
                getattr(dst, fd.name).CopyFrom(value)
            elif fd.message_type.full_name == any_pb2.Any.DESCRIPTOR.full_name and dst.HasField(fd.name):
                getattr(dst, fd.name).CopyFrom(merge_any(getattr(dst, fd.name), value))
            else:
                merge(getattr(dst, fd.name), value)
        else:
            setattr(dst, fd.name, value)


def _message_for(type_url: str) -> Message | None:
    if not ensure_type(type_url):
        return None
    desc = descriptor_pool.Default().FindMessageTypeByName(type_url.rsplit("/", 1)[-1])
    return message_factory.GetMessageClass(desc)()


def merge_any(dst: any_pb2.Any, src: any_pb2.Any) -> any_pb2.Any:
    """istio's MergeAnyWithAny: both read as dst's type (a user's differing type URL is taken to
    mean the same message), merged, packed again. Undecodable: dst unchanged, as istiod keeps it."""
    msg = _message_for(dst.type_url)
    if msg is None:
        return dst
    try:
        msg.ParseFromString(dst.value)
        patch = type(msg)()
        patch.ParseFromString(src.value)
    except Exception:  # noqa: BLE001 - a patch of another shape leaves the filter as it was, as in istiod
        return dst
    merge(msg, patch)
    out = any_pb2.Any()
    out.Pack(msg)
    return out


def _clone(msg: T) -> T:
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _value(ref: PatchRef) -> Message:
    v = ref.patch.message
    assert v is not None
    return _clone(v)


# --- list operations (istiod's insertBeforeFunc & co.) ------------------------------------------
def _named(name: str) -> Callable[[Any], bool]:
    return lambda item: bool(item.name == name)


def _ordered_op(items: list, ref: PatchRef, has_match: bool, matches: Callable[[Any], bool],
                first_needs_match: bool = False) -> list:
    op = ref.patch.patch.operation
    if op == "ADD":
        return [*items, _value(ref)]
    if op == "INSERT_FIRST":
        # istiod: a route inserted first needs its match to exist; filters go first regardless.
        if first_needs_match and has_match and not any(matches(e) for e in items):
            return items
        return [_value(ref), *items]
    if op == "INSERT_AFTER":
        if not has_match:
            return [*items, _value(ref)]
        for i, e in enumerate(items):
            if matches(e):
                return [*items[:i + 1], _value(ref), *items[i + 1:]]
        return items
    if op == "INSERT_BEFORE":
        if not has_match:
            return [_value(ref), *items]
        for i, e in enumerate(items):
            if matches(e):
                return [*items[:i], _value(ref), *items[i:]]
        return items
    if op == "REPLACE":
        if not has_match:
            return items
        for i, e in enumerate(items):
            if matches(e):
                return [*items[:i], _value(ref), *items[i + 1:]]
        return items
    if op == "REMOVE":
        if not has_match:
            return items
        return [e for e in items if not matches(e)]
    return items


def _set_repeated(msg: Message, field: str, items: list) -> None:
    target = getattr(msg, field)
    del target[:]
    for e in items:
        target.add().CopyFrom(e)


# --- contexts -----------------------------------------------------------------------------------
def context_matches(ref: PatchRef, context: str) -> bool:
    c = ref.patch.match.context
    return c == "ANY" or c == context


def add_context_matches(ref: PatchRef, context: str) -> bool:
    """A LISTENER/CLUSTER ADD without a context adds only for sidecar outbound and gateways."""
    c = ref.patch.match.context
    if c == "ANY":
        return context in ("SIDECAR_OUTBOUND", "GATEWAY")
    return c == context


# --- listeners ----------------------------------------------------------------------------------
def listener_matches(ref: PatchRef, name: str, port: int) -> bool:
    lm = ref.patch.match.listener
    if lm is None:
        return True
    if lm.name and lm.name != name:
        return False
    if ref.patch.apply_to != "LISTENER" and name in (VIRTUAL_INBOUND, VIRTUAL_OUTBOUND):
        return True  # the port is matched per filter chain (its destination port)
    return not lm.port_number or lm.port_number == port


def _chain_matches(ref: PatchRef, listener: listener_pb2.Listener, fc: listener_components_pb2.FilterChain) -> bool:
    lm = ref.patch.match.listener
    if lm is None:
        return True
    fcm = fc.filter_chain_match if fc.HasField("filter_chain_match") else None
    if listener.name in (VIRTUAL_INBOUND, VIRTUAL_OUTBOUND) and lm.port_number and (
            fcm is None or fcm.destination_port.value != lm.port_number):
        return False
    m = lm.filter_chain
    if m is None:
        return True
    if m.name and m.name != fc.name:
        return False
    if m.sni and (fcm is None or m.sni not in fcm.server_names):
        return False
    if m.transport_protocol and (fcm is None or fcm.transport_protocol != m.transport_protocol):
        return False
    if m.application_protocols and (
            fcm is None or any(p not in fcm.application_protocols for p in m.application_protocols.split(","))):
        return False
    return not m.destination_port or (fcm is not None and fcm.HasField("destination_port")
                                      and fcm.destination_port.value == m.destination_port)


def _has_filter_match(ref: PatchRef) -> bool:
    lm = ref.patch.match.listener
    return lm is not None and lm.filter_chain is not None and lm.filter_chain.filter is not None


def _filter_matches(ref: PatchRef, name: str) -> bool:
    if not _has_filter_match(ref):
        return True
    return ref.patch.match.listener.filter_chain.filter.name == name  # type: ignore[union-attr]


def _filter_matches_msg(ref: PatchRef, f: Any) -> bool:
    return _filter_matches(ref, f.name)


def _has_sub_filter_match(ref: PatchRef) -> bool:
    return _has_filter_match(ref) and ref.patch.match.listener.filter_chain.filter.sub_filter is not None  # type: ignore[union-attr]


def _sub_filter_matches(ref: PatchRef, name: str) -> bool:
    if not _has_sub_filter_match(ref):
        return True
    return ref.patch.match.listener.filter_chain.filter.sub_filter.name == name  # type: ignore[union-attr]


def _sub_filter_matches_msg(ref: PatchRef, h: Any) -> bool:
    return _sub_filter_matches(ref, h.name)


def _by(refs: Iterable[PatchRef], kind: str) -> list[PatchRef]:
    return [r for r in refs if r.patch.apply_to == kind]


def patch_listener(listener: listener_pb2.Listener, refs: Iterable[PatchRef]) -> listener_pb2.Listener:
    """`refs`: the patches whose context and listener match this listener (LISTENER REMOVE and
    ADD are the caller's: they decide whether the resource exists at all)."""
    port = listener.address.socket_address.port_value
    for ref in _by(refs, "LISTENER"):
        if ref.patch.patch.operation == "MERGE" and listener_matches(ref, listener.name, port):
            merge(listener, ref.patch.message)
    _patch_listener_filters(listener, _by(refs, "LISTENER_FILTER"))
    chains = list(listener.filter_chains)
    kept = [fc for fc in chains if _patch_chain(listener, fc, refs)]
    for ref in _by(refs, "FILTER_CHAIN"):
        if ref.patch.patch.operation == "ADD":
            kept.append(_value(ref))
    if len(kept) != len(chains) or any(a is not b for a, b in zip(kept, chains, strict=False)):
        _set_repeated(listener, "filter_chains", kept)
    if (listener.HasField("default_filter_chain") and listener.default_filter_chain.filters
            and not _patch_chain(listener, listener.default_filter_chain, refs)):
        listener.ClearField("default_filter_chain")
    return listener


def _patch_listener_filters(listener: listener_pb2.Listener, refs: list[PatchRef]) -> None:
    if not refs:
        return
    items = list(listener.listener_filters)
    for ref in refs:
        lm = ref.patch.match.listener
        wanted = lm.listener_filter if lm is not None else ""
        items = _ordered_op(items, ref, bool(wanted), _named(wanted))
    _set_repeated(listener, "listener_filters", items)


def _patch_chain(listener: listener_pb2.Listener, fc: listener_components_pb2.FilterChain,
                 refs: Iterable[PatchRef]) -> bool:
    """Patch one filter chain in place; False when a patch removes it."""
    for ref in _by(refs, "FILTER_CHAIN"):
        if not _chain_matches(ref, listener, fc):
            continue
        op = ref.patch.patch.operation
        if op == "REMOVE":
            return False
        if op == "MERGE":
            merge(fc, ref.patch.message)
    network = [r for r in _by(refs, "NETWORK_FILTER") if _chain_matches(r, listener, fc)]
    if network:
        items = list(fc.filters)
        for ref in network:
            if ref.patch.patch.operation != "MERGE":
                items = _ordered_op(items, ref, _has_filter_match(ref), partial(_filter_matches_msg, ref))
        _set_repeated(fc, "filters", items)
        for f in fc.filters:
            for ref in network:
                if ref.patch.patch.operation == "MERGE" and _filter_matches(ref, f.name):
                    _merge_filter(f, ref.patch.message)
    http = [r for r in _by(refs, "HTTP_FILTER") if _chain_matches(r, listener, fc)]
    if http:
        for f in fc.filters:
            if f.name == HCM and f.HasField("typed_config"):
                _patch_http_filters(f, [r for r in http if _filter_matches(r, f.name)])
    routes = [r for r in refs if r.patch.apply_to in ROUTE_KINDS]
    if routes:  # only inbound listeners get these (the caller's choice): their route config is inline
        for f in fc.filters:
            if f.name == HCM and f.HasField("typed_config"):
                _patch_inline_routes(f, routes)
    return True


def _patch_inline_routes(f: listener_components_pb2.Filter, refs: list[PatchRef]) -> None:
    """istiod patches an inbound HCM's own route configuration (`inbound|PORT||`) in the
    SIDECAR_INBOUND context, as it patches RDS route configurations for outbound."""
    hcm = hcm_pb2.HttpConnectionManager()
    if not f.typed_config.Unpack(hcm) or not hcm.HasField("route_config"):
        return
    rel = tuple(r for r in refs if route_config_matches(r, hcm.route_config.name, "SIDECAR_INBOUND"))
    if rel:
        patch_route_config(hcm.route_config, rel)
        f.typed_config.CopyFrom(pack(hcm))


def _merge_filter(f: Any, patch: Any) -> None:
    """A network or HTTP filter MERGE: the name may be replaced, the typed config merged as the
    message it holds (istiod skips filters without a typed config)."""
    if not f.HasField("typed_config"):
        return
    if patch.name:
        f.name = patch.name
    if patch.HasField("typed_config"):
        f.typed_config.CopyFrom(merge_any(f.typed_config, patch.typed_config))


def _patch_http_filters(f: listener_components_pb2.Filter, refs: list[PatchRef]) -> None:
    if not refs:
        return
    hcm = hcm_pb2.HttpConnectionManager()
    if not f.typed_config.Unpack(hcm):
        return
    items = list(hcm.http_filters)
    for ref in refs:
        if ref.patch.patch.operation != "MERGE":
            items = _ordered_op(items, ref, _has_sub_filter_match(ref), partial(_sub_filter_matches_msg, ref))
    _set_repeated(hcm, "http_filters", items)
    for h in hcm.http_filters:
        for ref in refs:
            if ref.patch.patch.operation == "MERGE" and _sub_filter_matches(ref, h.name):
                _merge_filter(h, ref.patch.message)
    f.typed_config.CopyFrom(pack(hcm))


# --- route configurations -----------------------------------------------------------------------
def route_config_matches(ref: PatchRef, name: str, context: str) -> bool:
    rm = ref.patch.match.route_configuration
    if rm is None:
        return True
    if rm.name and rm.name != name:
        return False
    if context != "GATEWAY":
        if rm.port_number:
            port = name.rsplit("|", 2)[0].rsplit("|", 1)[-1] if name.startswith("inbound|") else name
            if not port.isdigit() or int(port) != rm.port_number:
                return False
        return True
    port, port_name, gateway = parse_gateway_route_name(name)
    if rm.port_number and rm.port_number != port:
        return False
    if rm.port_name and rm.port_name != port_name:
        return False
    return not rm.gateway or rm.gateway == gateway


def parse_gateway_route_name(name: str) -> tuple[int, str, str]:
    """istiod's ParseGatewayRDSRouteName: `http.PORT` or `https.PORT.PORTNAME.GATEWAY.NAMESPACE`
    -> (port, port name, "namespace/gateway")."""
    parts = name.split(".")
    port = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    if parts[0] == "https" and len(parts) >= 5:
        return port, parts[2], f"{parts[4]}/{parts[3]}"
    return port, "", ""


def _vhost_matches(ref: PatchRef, vh: route_components_pb2.VirtualHost) -> bool:
    rm = ref.patch.match.route_configuration
    if rm is None or rm.vhost is None:
        return True
    m = rm.vhost
    # istiod's virtualHostMatch: the name, and a domain the virtual host lists (exactly).
    return (not m.name or m.name == vh.name) and (not m.domain_name or m.domain_name in vh.domains)


def _has_route_match(ref: PatchRef) -> bool:
    rm = ref.patch.match.route_configuration
    return rm is not None and rm.vhost is not None and rm.vhost.route is not None


_ACTIONS = {"route": "ROUTE", "redirect": "REDIRECT", "direct_response": "DIRECT_RESPONSE"}


def _route_matches(ref: PatchRef, r: route_components_pb2.Route) -> bool:
    rm = ref.patch.match.route_configuration
    m = rm.vhost.route if rm is not None and rm.vhost is not None else None
    if m is None:
        return True
    if m.name and m.name != r.name:
        return False
    if m.action != "ANY":
        return _ACTIONS.get(r.WhichOneof("action") or "") == m.action
    return True


def patch_route_config(rc: route_pb2.RouteConfiguration, refs: Iterable[PatchRef]) -> route_pb2.RouteConfiguration:
    """`refs`: the patches whose context and route configuration match this one."""
    for ref in _by(refs, "ROUTE_CONFIGURATION"):
        if ref.patch.patch.operation == "MERGE":
            merge(rc, ref.patch.message)
    vh_refs, route_refs = _by(refs, "VIRTUAL_HOST"), _by(refs, "HTTP_ROUTE")
    if not vh_refs and not route_refs:
        return rc
    hosts: list = []
    for vh in rc.virtual_hosts:
        kept: route_components_pb2.VirtualHost | None = vh
        for ref in vh_refs:
            if kept is None or not _vhost_matches(ref, kept):
                continue
            op = ref.patch.patch.operation
            if op == "REMOVE":
                kept = None
            elif op == "MERGE":
                merge(kept, ref.patch.message)
            elif op == "REPLACE":
                kept = _value(ref)
        if kept is not None:
            _patch_routes(kept, [r for r in route_refs if _vhost_matches(r, kept)])
            hosts.append(kept)
    for ref in vh_refs:
        if ref.patch.patch.operation == "ADD":
            hosts.append(_value(ref))
    _set_repeated(rc, "virtual_hosts", hosts)
    return rc


def _patch_routes(vh: route_components_pb2.VirtualHost, refs: list[PatchRef]) -> None:
    if not refs:
        return
    items = []
    for r in vh.routes:
        keep = True
        for ref in refs:
            if not _route_matches(ref, r):
                continue
            op = ref.patch.patch.operation
            if op == "REMOVE":
                keep = False
                break
            if op == "MERGE":
                merge(r, ref.patch.message)
        if keep:
            items.append(r)
    for ref in refs:
        if ref.patch.patch.operation in ("ADD", "INSERT_AFTER", "INSERT_BEFORE", "INSERT_FIRST"):
            items = _ordered_op(items, ref, _has_route_match(ref), partial(_route_matches, ref),
                                first_needs_match=True)
    _set_repeated(vh, "routes", items)


# --- clusters -----------------------------------------------------------------------------------
def cluster_matches(ref: PatchRef, name: str) -> bool:
    """istiod's clusterMatch on the cluster name (`outbound|PORT|SUBSET|HOST`)."""
    cm = ref.patch.match.cluster
    if cm is None:
        return True
    if cm.name:
        return cm.name == name
    parts = name.split("|")
    if len(parts) != 4:
        return not (cm.subset or cm.service or cm.port_number)
    _direction, port, subset, hostname = parts
    if cm.subset and cm.subset != subset:
        return False
    if cm.service and cm.service != hostname:
        return False
    return not cm.port_number or (port.isdigit() and int(port) == cm.port_number)


def patch_cluster(c: cluster_pb2.Cluster, refs: Iterable[PatchRef]) -> cluster_pb2.Cluster:
    """MERGE patches in order (REMOVE and ADD are the caller's). A transport socket is merged as
    istiod's mergeTransportSocketCluster does: into the one with the same name, else replaced."""
    for ref in refs:
        if ref.patch.patch.operation != "MERGE":
            continue
        value: cluster_pb2.Cluster = ref.patch.message
        if value.HasField("transport_socket"):
            if c.transport_socket_matches:
                same = [m.transport_socket for m in c.transport_socket_matches
                        if m.transport_socket.name == value.transport_socket.name]
                if not same:
                    continue  # both a socket and socket matches would be invalid: istiod drops it
                _merge_socket(same[0], value.transport_socket)
            elif c.HasField("transport_socket") and c.transport_socket.name == value.transport_socket.name:
                _merge_socket(c.transport_socket, value.transport_socket)
            else:
                c.transport_socket.CopyFrom(value.transport_socket)
            continue
        merge(c, value)
    return c


def _merge_socket(dst: Any, src: Any) -> None:
    if dst.HasField("typed_config") and src.HasField("typed_config"):
        dst.typed_config.CopyFrom(merge_any(dst.typed_config, src.typed_config))


# --- bootstrap ----------------------------------------------------------------------------------
def patch_bootstrap(bs: Any, refs: Iterable[PatchRef]) -> Any:
    """istiod's BootstrapGenerator.applyPatches: each BOOTSTRAP MERGE in order (validation refuses
    the other operations). istiod used plain proto.Merge here, which merges a Duration field by
    field ("5s" over "0.5s" gives 5.5 s); the merge of the other patches replaces it, so a patch
    gets what it wrote."""
    for ref in refs:
        if ref.patch.apply_to == "BOOTSTRAP" and ref.patch.patch.operation == "MERGE":
            merge(bs, ref.patch.message)
    return bs
