"""WasmPlugins -> the HTTP Wasm filters of a proxy, per listener class (istiod's
pilot/pkg/model/extensions.go and PushContext.WasmPluginsByListenerInfo), pure.

Selection as istiod: the root namespace's plugins without selector reach every proxy; a
namespace's plugins reach its proxies when their selector (or, for a gateway, a Gateway
targetRef) selects the proxy. A targetRef names a Gateway of the plugin's own namespace, so a root
namespace plugin with targetRefs reaches only the root namespace's gateways (istiod's
ShouldAttachPolicy; its one root-namespace exception, GatewayClass istio-waypoint, is for waypoints). Order as istiod: by phase where the filter chain has a slot for it,
within a phase by priority (higher first), then oldest first, then namespace/name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from pilot.config.extensions import WasmPlugin, fetch_url, is_local
from pilot.model.labels import selects, targets_gateway_of
from pilot.model.store import Entry


@dataclass(frozen=True, slots=True)
class WasmFilter:
    """One plugin as the filter builder needs it (hashable: part of the listener cache key)."""

    name: str  # "NS.NAME", the HTTP filter's and its ECDS resource's name, as istiod's
    phase: str
    url: str  # file:///path, read by Envoy; http(s):// or oci:// (also for a URL without scheme), by the agent
    sha256: str  # "" for file:// (refused there) or an unpinned module; for an image, its manifest digest
    pull_policy: str  # imagePullPolicy, for the agent ("UNSPECIFIED_POLICY" for file://)
    # When the agent may pull again (Always, or no policy and an image tagged :latest): the
    # plugin's revision, which it re-fetches on (istiod's WASM_PLUGIN_RESOURCE_VERSION); ""
    # otherwise, so a revision without a spec change leaves the resource's bytes alone.
    resource_version: str
    pull_secret: str  # imagePullSecret: a Secret of the plugin's namespace ("" none)
    root_id: str
    config: str  # pluginConfig as JSON ("" when absent)
    fail_open: bool
    env_host: tuple[str, ...]
    env_inline: tuple[tuple[str, str], ...]
    ports: frozenset[int]  # empty: every port
    origin: str  # "WasmPlugin/NS/NAME"

    def applies_to_port(self, port: int) -> bool:
        return not self.ports or port in self.ports

    @property
    def is_local(self) -> bool:
        return is_local(self.url)

    @property
    def path(self) -> str:
        return self.url.partition("://")[2]

    @property
    def namespace(self) -> str:
        return self.name.partition(".")[0]


@dataclass(frozen=True, slots=True)
class WasmPlan:
    client: tuple[WasmFilter, ...] = ()  # outbound listeners and gateways
    server: tuple[WasmFilter, ...] = ()  # inbound listeners

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.origin for f in (*self.client, *self.server)))

    def by_name(self, name: str) -> WasmFilter | None:
        """The plugin whose ECDS resource is `name` (its client and server filters share it)."""
        return next((f for f in (*self.client, *self.server) if f.name == name), None)


NO_WASM = WasmPlan()


def _attaches(e: Entry[WasmPlugin], namespace: str, labels: Mapping[str, str]) -> bool:
    spec = e.obj.spec
    refs = spec.target_references
    if not refs:
        return selects(spec.selector.match_labels if spec.selector else {}, labels)
    return targets_gateway_of(refs, e.key.namespace, namespace, labels)


def _filter(e: Entry[WasmPlugin], ports: frozenset[int]) -> WasmFilter:
    spec = e.obj.spec
    env = spec.vm_config.env if spec.vm_config else []
    url = fetch_url(spec.url)
    refetches = spec.image_pull_policy == "Always" or (
        spec.image_pull_policy == "UNSPECIFIED_POLICY" and url.startswith("oci://") and url.endswith(":latest"))
    return WasmFilter(
        name=f"{e.key.namespace}.{e.key.name}", phase=spec.phase, url=url, sha256=spec.sha256,
        pull_policy=spec.image_pull_policy, root_id=spec.plugin_name,
        resource_version=str(e.revision) if refetches else "", pull_secret=spec.image_pull_secret,
        config=json.dumps(spec.plugin_config, sort_keys=True, separators=(",", ":"))
        if spec.plugin_config is not None else "",
        fail_open=spec.fail_strategy == "FAIL_OPEN",
        env_host=tuple(v.name for v in env if v.value_from == "HOST"),
        env_inline=tuple((v.name, v.value) for v in env if v.value_from == "INLINE"),
        ports=ports, origin=f"WasmPlugin/{e.key.namespace}/{e.key.name}")


def _modes(e: Entry[WasmPlugin]) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """(client ports, server ports): None where the plugin does not apply; an empty set = every port.
    istiod: a plugin applies when any `match` entry matches (none = everything)."""
    matches = e.obj.spec.match
    if not matches:
        return frozenset(), frozenset()
    client: set[int] | None = None
    server: set[int] | None = None
    every_client = every_server = False
    for m in matches:
        ports = {p.number for p in m.ports}
        if m.mode in ("UNDEFINED", "CLIENT_AND_SERVER", "CLIENT"):
            client = (client or set()) | ports
            every_client |= not ports
        if m.mode in ("UNDEFINED", "CLIENT_AND_SERVER", "SERVER"):
            server = (server or set()) | ports
            every_server |= not ports
    return (None if client is None else frozenset() if every_client else frozenset(client),
            None if server is None else frozenset() if every_server else frozenset(server))


def plan_for(by_namespace: Mapping[str, tuple[Entry[WasmPlugin], ...]], root_namespace: str, namespace: str,
             labels: Mapping[str, str]) -> WasmPlan:
    chosen = [e for e in by_namespace.get(root_namespace, ()) if _attaches(e, namespace, labels)]
    if namespace != root_namespace:
        chosen += [e for e in by_namespace.get(namespace, ()) if _attaches(e, namespace, labels)]
    if not chosen:
        return NO_WASM
    chosen.sort(key=lambda e: (-(e.obj.spec.priority or 0), e.obj.metadata.creation_timestamp,
                               e.key.namespace, e.key.name))
    client: list[WasmFilter] = []
    server: list[WasmFilter] = []
    for e in chosen:
        c, s = _modes(e)
        if c is not None:
            client.append(_filter(e, c))
        if s is not None:
            server.append(_filter(e, s))
    return WasmPlan(tuple(client), tuple(server))
