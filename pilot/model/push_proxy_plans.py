"""Per-proxy plans a PushContext works out once per push and shares between proxies that agree
on what the plan reads: EnvoyFilter patches, inbound ports and their mTLS, telemetry, Wasm, and
a router's Service port map. A mixin of PushContext (the methods stay on the class).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pilot.config.extensions import WasmPlugin
from pilot.config.proxy_tracing import ProxyTracing, parse_proxy_tracing
from pilot.model import dependencies as dep
from pilot.model import envoy_filters as ef
from pilot.model.inbound import NO_INBOUND, InboundPlan, plan_inbound
from pilot.model.labels import selects
from pilot.model.proxy import Proxy
from pilot.model.push_endpoints import EndpointQueries
from pilot.model.services import MeshService
from pilot.model.store import Entry
from pilot.model.telemetry import ProxyInfo, TelemetryIndex, TelemetryPlan, plan_for
from pilot.model.traffic import effective_policy
from pilot.model.wasm import NO_WASM, WasmPlan
from pilot.model.wasm import plan_for as wasm_plan_for

if TYPE_CHECKING:
    from pilot.config.networking import DestinationRule, EnvoyFilter, Sidecar
    from pilot.model.security_policies import WorkloadPolicies


class ProxyPlans(EndpointQueries):
    """PushContext's per-proxy plans, each memoized per push by what it reads."""

    # PushContext's fields and config accessors these read (declared for the type checker only;
    # see push_context.py)
    envoy_filters: Mapping[str, tuple[Entry[EnvoyFilter], ...]]
    telemetry: TelemetryIndex
    wasm_plugins: Mapping[str, tuple[Entry[WasmPlugin], ...]]

    if TYPE_CHECKING:
        def service(self, hostname: str) -> MeshService | None:
            raise NotImplementedError

        def services_in(self, namespace: str) -> tuple[MeshService, ...]:
            raise NotImplementedError

        def destination_rule(self, host: str, client_namespace: str, service_namespace: str,
                             client_labels: Mapping[str, str] | None = None) -> Entry[DestinationRule] | None:
            raise NotImplementedError

        def sidecar_for(self, namespace: str, labels: Mapping[str, str]) -> Entry[Sidecar] | None:
            raise NotImplementedError

        def mtls_mode(self, namespace: str, labels: Mapping[str, str], port: int) -> str:
            raise NotImplementedError

        def workload_policies(self, namespace: str, labels: Mapping[str, str]) -> WorkloadPolicies:
            raise NotImplementedError

    def envoy_patches(self, proxy: Proxy) -> ef.ProxyPatches:
        """The EnvoyFilter patches for this proxy, in application order (once per proxy and push)."""
        root = self.mesh.root_namespace
        if self._rec:  # an EnvoyFilter of these namespaces may select it, before or after a change
            facets = self._rec[-1].facets
            facets.update((dep.envoy_filters(proxy.namespace), dep.envoy_filters(root)))
            gateway = ef.gateway_name(proxy)
            if gateway is not None:  # and, a Gateway API Gateway's proxy, those targeting its Gateway
                facets.add(dep.envoy_filters_for_gateway(proxy.namespace, gateway))
        if not self.envoy_filters:
            return ef.NO_PATCHES
        hit = self._memo.get(("envoy-patches", id(proxy)))
        if hit is not None and hit[0] is proxy and hit[1] is proxy.metadata:
            return hit[2]
        # Proxies that agree on what selection reads (namespace, labels, version, the metadata
        # keys some patch matches on) get the same patches: worked out once for all of them.
        meta_keys = self._memo.get("envoy-meta-keys")
        if meta_keys is None:
            meta_keys = self._memo["envoy-meta-keys"] = ef.metadata_keys(self.envoy_filters)
        meta = proxy.metadata
        key = ("envoy-select", proxy.namespace, frozenset(proxy.labels.items()), proxy.istio_version,
               tuple(str(meta.get(k, "")) for k in meta_keys))
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = ef.select(self.envoy_filters, root, proxy)
        self._memo[("envoy-patches", id(proxy))] = (proxy, proxy.metadata, out)
        return out


    def inbound_plan(self, proxy: Proxy) -> InboundPlan:
        """The ports the proxy's workload serves and their mTLS modes; shared by proxies whose
        inputs match (replicas of one deployment in iptables mode). A proxy without a mesh
        identity and without a Sidecar `ingress` serves nothing inbound: it gets the one empty
        plan at once (the common case of plaintext proxies costs no per-proxy work)."""
        labels = proxy.labels
        mesh_tls = proxy.mesh_tls
        sidecar = self.sidecar_for(proxy.namespace, labels)
        if not mesh_tls and (sidecar is None or not sidecar.obj.spec.ingress):
            return NO_INBOUND
        # The families too (INSTANCE_IPS, not only the node id's IPs): an IPv6-only proxy's app is at [::1].
        key = ("inbound", proxy.namespace, frozenset(labels.items()), proxy.ip_addresses, proxy.ip_families,
               proxy.interception_mode, mesh_tls)

        def plan() -> InboundPlan:
            made = plan_inbound(proxy, self.services_in(proxy.namespace), self.service_slices, sidecar,
                                lambda port: self.mtls_mode(proxy.namespace, labels, port), mesh_tls,
                                self.workload_policies(proxy.namespace, labels),
                                lambda svc, port: self._inbound_rule_pool(proxy.namespace, svc, port),
                                self.settings.listeners.sniff_inbound)
            return self._memo.setdefault(("plan", made), made)  # equal plans: one object

        return self.memoized(key, plan)

    def telemetry_plan(self, proxy: Proxy) -> TelemetryPlan:
        """What the proxy logs and traces, per listener class (pilot/model/telemetry.py); shared by
        proxies of one namespace with the same labels and traits."""
        index, root = self.telemetry, self.mesh.root_namespace
        defaults = self.mesh.default_providers
        tracing_raw = self._proxy_tracing_raw(proxy)
        if not (index.by_namespace.get(root) or index.by_namespace.get(proxy.namespace)
                or defaults.access_logging or defaults.tracing or (tracing_raw is not None and self.mesh.enable_tracing)):
            # The common case, no Telemetry for this proxy: MeshConfig's plan, without per-proxy work.
            self._note(dep.telemetry(root), dep.telemetry(proxy.namespace))
            shared = self._memo.get("telemetry-mesh")
            if shared is None:
                legacy = self.settings.listeners.telemetry
                shared = self._memo["telemetry-mesh"] = TelemetryPlan(legacy, legacy, ())
            return shared
        labels = proxy.labels
        md = proxy.metadata
        tracing_key = json.dumps(tracing_raw, sort_keys=True) if tracing_raw is not None else None
        info = ProxyInfo(proxy.namespace, labels, proxy.type == "router", str(md.get("CLUSTER_ID") or ""),
                         str(md.get("MESH_ID") or ""), proxy.cluster, self._proxy_tracing(tracing_key, tracing_raw))
        key = ("telemetry", info.namespace, frozenset(labels.items()), info.is_router, info.cluster_id,
               info.mesh_id, info.node_cluster, tracing_key)

        def plan() -> TelemetryPlan:
            self._note(dep.telemetry(self.mesh.root_namespace), dep.telemetry(proxy.namespace))
            return plan_for(self.telemetry, self.mesh, info, self._provider_cluster, [], self.settings.listeners.telemetry,
                            self.settings.knobs.trace_sampling)

        return self.memoized(key, plan)

    def _proxy_tracing_raw(self, proxy: Proxy) -> Any:
        """istiod's ProxyConfigOrDefault(mesh.defaultConfig).tracing: the proxy's PROXY_CONFIG
        when it sent one, else MeshConfig's defaultConfig (as written)."""
        pc = proxy.metadata.get("PROXY_CONFIG")
        if isinstance(pc, str):  # a JSON string, as istio-agent's ISTIO_META_PROXY_CONFIG may be
            try:
                pc = json.loads(pc)
            except ValueError:
                pc = None
        if isinstance(pc, Mapping):
            return pc.get("tracing")
        return (self.mesh.default_config.model_extra or {}).get("tracing")

    def _proxy_tracing(self, key: str | None, raw: Any) -> ProxyTracing | None:
        if key is None:
            return None
        memo_key = ("proxy-tracing", key)
        if memo_key not in self._memo:
            # Invalid PROXY_CONFIG tracing is refused by pilot-agent before Envoy starts; the mesh's
            # is reported with the MeshConfig (TelemetryIndex.problems). Either way: as if absent.
            self._memo[memo_key] = parse_proxy_tracing(raw, "PROXY_CONFIG tracing")[0]
        return self._memo[memo_key]

    def wasm_plan(self, proxy: Proxy) -> WasmPlan:
        """The WasmPlugins selecting the proxy, per listener class (pilot/model/wasm.py); shared
        by proxies of one namespace with the same labels."""
        root = self.mesh.root_namespace
        self._note(dep.wasm(root), dep.wasm(proxy.namespace))
        if not (self.wasm_plugins.get(root) or self.wasm_plugins.get(proxy.namespace)):
            return NO_WASM
        labels = proxy.labels
        key = ("wasm", proxy.namespace, frozenset(labels.items()))
        return self.memoized(key, lambda: wasm_plan_for(self.wasm_plugins, root, proxy.namespace, labels))

    def _provider_cluster(self, service: str, port: int) -> tuple[str, str] | None:
        """istiod's LookupCluster: `host` or `namespace/host` -> (hostname, outbound cluster)."""
        namespace, _, hostname = service.rpartition("/")
        svc = self.service(hostname)
        if svc is None or (namespace and svc.namespace != namespace):
            return None
        return svc.hostname, f"outbound|{port}||{svc.hostname}"

    @property
    def telemetry_problems(self) -> tuple[dict, ...]:
        """Telemetry (and defaultProviders) that cannot be applied, and providers whose service is
        not in the registry (shown in /debug/configz)."""
        out = list(self.telemetry.problems)
        for p in self.mesh.providers.values():
            settings = getattr(p, p.provider_kind)
            service, port = getattr(settings, "service", None), getattr(settings, "port", None)
            if isinstance(service, str) and isinstance(port, int) and self._provider_cluster(service, port) is None:
                out.append({"kind": "MeshConfig", "namespace": "", "name": "mesh",
                            "reason": f"extensionProviders {p.name!r}: service {service} is not in the registry; "
                                      "what uses it is not configured"})
        return tuple(out)

    def _inbound_rule_pool(self, namespace: str, svc: MeshService, port: int):
        """istiod's SidecarScope.DestinationRule(inbound, ...): the rule without a workloadSelector
        (selectors are honoured outbound only), its connection pool for the service port."""
        rule = self.destination_rule(svc.hostname, namespace, svc.namespace)
        if rule is None:
            return None
        return effective_policy(rule.obj.spec, "", port)["connection_pool"]

    def gateway_port_map(self, proxy: Proxy) -> tuple[tuple[int, int], ...]:
        """(port, targetPort) of the Services in a router's namespace that select it."""
        if self._rec:
            self._rec[-1].facets.add(("ns-services", proxy.namespace))
        key = ("gw-ports", proxy.namespace, frozenset(proxy.labels.items()))
        out = self._memo.get(key)
        if out is None:
            labels, ports = proxy.labels, dict[int, int]()
            for svc in self.services_in(proxy.namespace):
                if svc.kind == "Service" and svc.selector and selects(svc.selector, labels):
                    for p in svc.ports:
                        if isinstance(p.target_port, int) and p.target_port != p.port:
                            ports.setdefault(p.port, p.target_port)
            out = self._memo[key] = tuple(sorted(ports.items()))
        return out
