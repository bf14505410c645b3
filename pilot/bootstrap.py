"""Wire everything from parsed options and run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from aiohttp import web

from pilot import features as feat
from pilot import logging as plog
from pilot.autoregistration import AutoRegistration, KubeWriter
from pilot.cli import Options
from pilot.config.core import Service
from pilot.config.mesh import MeshConfig, MeshConfigError, parse_mesh_config
from pilot.config.networking.proxy_config import ProxyConfig
from pilot.http.debug_xds import http_view
from pilot.http.server import build_app
from pilot.loop_lag import lag_metrics, sample_lag
from pilot.model import push_request as push_reasons
from pilot.model.ingress import service_addresses
from pilot.model.mesh import MeshHolder
from pilot.model.push_request import PushRequest
from pilot.model.store import ConfigKey, Store
from pilot.security import authn
from pilot.security.ca_errors import CAError, CAStorageError
from pilot.security.jwks import JwksResolver
from pilot.security.node_auth import NodeAuthorizer
from pilot.security.secret_access import SecretAccess
from pilot.sources.files import FileSource
from pilot.sources.kube.client import Kube, in_cluster, load_api_client
from pilot.sources.kube.ingress_status import IngressStatusWriter
from pilot.sources.kube.leader import LeaderElection
from pilot.sources.kube.source import KubeSource
from pilot.sources.kube.status_writer import StatusWriter
from pilot.sources.kube.tags import TagWatcher
from pilot.sources.kube.writers import RootCertWriter
from pilot.status.view import GatewayStatusView
from pilot.webhook.ca_bundle import CABundleWriter, InjectorBundleWriter
from pilot.xds.ads import AdsService
from pilot.xds.discovery import DiscoveryServer
from pilot.xds.state_metrics import StateCollector

if TYPE_CHECKING:  # imported where they start: file mode without --secureGRPCAddr uses none of
    # them, and they cost ~14 MB of RSS (cryptography; jinja2 and the injection templates).
    from pilot.gateway_deploy.controller import DeploymentController
    from pilot.gateway_deploy.render import Inputs as GatewayInputs
    from pilot.inject.config import InjectorConfigHolder
    from pilot.security.ca import CertificateAuthority
    from pilot.security.ca_server import SecureServer
    from pilot.webhook.server import WebhookServer

log = plog.get("bootstrap")

# istiod's lease name for its namespace controller, which writes istio-ca-root-cert.
LEADER_LEASE = "istio-namespace-controller-election"
# Per revision, suffixed -REVISION: istiod's name for its gateway deployment controller's lease.
REVISION_LEASE = "istio-gateway-deployment"
# Per revision too (istiod's NewPerRevisionLeaderElection of its GatewayStatusController): each
# revision's leader writes the status of its own Gateways and of the route parents naming them.
STATUS_LEASE = "istio-gateway-status-leader"


def split_addr(addr: str, default_host: str = "0.0.0.0") -> tuple[str, int] | None:
    """Go-style `host:port` (`:15010` means every interface); empty disables the listener."""
    if not addr:
        return None
    host, sep, port = addr.rpartition(":")
    if not sep:
        raise ValueError(f"address {addr!r} must be host:port")
    return (host.strip("[]") or default_host), int(port)


def load_mesh_file(path: str) -> MeshConfig:
    p = Path(path)
    if not p.exists():
        log.info("no mesh config file; using defaults", path=path)
        return MeshConfig()
    try:
        return parse_mesh_config(p.read_text())
    except MeshConfigError as e:
        raise SystemExit(f"--meshConfig {path}: {e}") from None


class StartupError(Exception):
    """Start cannot go on; the message says what to change. Raised as an ordinary exception (not
    SystemExit) so the start task ends normally and asyncio has nothing left to complain about."""


class ControlPlane:
    def __init__(self, opts: Options, features: feat.Features) -> None:
        self.opts = opts
        self.features = features
        self.store = Store()
        if features.unknown_env:
            log.warning("environment variables no knob of this control plane reads are ignored",
                        names=list(features.unknown_env))
        self.mesh = MeshHolder(load_mesh_file(opts.mesh_config), features.pod_namespace,
                               revision=features.revision)
        self.discovery = DiscoveryServer(self.store, self.mesh, features, opts.domain)
        self.discovery.metrics.registry.register(StateCollector(self.discovery))  # pilot_services, ...
        self.jwks = JwksResolver(self.store, self._jwks_changed, refresh_interval=features.jwt_pub_key_refresh_interval)
        self.discovery.jwks = self.jwks.snapshot
        self.gateway_status = GatewayStatusView()
        self.discovery.context_listeners.append(self.gateway_status.update)
        self.ads = AdsService(self.discovery)
        # `istio.io/debug` pages come from the same handlers as the HTTP port's.
        pages = build_app(self.discovery, self.ready, None, features.pod_namespace, self.gateway_status)
        self.ads.debug.http_view = http_view(pages, self.discovery)
        self.files = (FileSource(opts.config_dir, self.store, rescan_interval=features.config_rescan_interval)
                      if opts.config_dir else None)
        # File mode keeps auto-registered WorkloadEntries in memory; Kubernetes mode writes them
        # (its writer is set in _start_kube).
        self.autoregistration: AutoRegistration | None = None
        if features.enable_workload_entry_autoregistration:
            self.autoregistration = AutoRegistration(self.store, features.workload_entry_grace_period,
                                                     health_checks=features.enable_workload_entry_healthchecks)
            self.discovery.connection_listeners.append(self.autoregistration)
            if features.enable_workload_entry_healthchecks:
                self.discovery.health_listener = self.autoregistration.health
        self.kube: Kube | None = None
        self.kube_source: KubeSource | None = None
        self.leaders: list[LeaderElection] = []
        self.root_cert_writer: RootCertWriter | None = None
        self.status_writer: StatusWriter | None = None
        self.ingress_status_writer: IngressStatusWriter | None = None
        self.ca: CertificateAuthority | None = None
        self.secure: SecureServer | None = None
        self.webhook: WebhookServer | None = None
        self.ca_bundle_writer: CABundleWriter | None = None
        self.injector_bundle_writer: CABundleWriter | None = None
        self.tag_watcher: TagWatcher | None = None
        self.injector_config: InjectorConfigHolder | None = None
        self.gateway_deployer: DeploymentController | None = None
        try:
            self.jwt_rules = authn.parse_jwt_rules(features.jwt_rule)
        except authn.JwtRuleError as e:
            raise SystemExit(str(e)) from None
        self.loaded = False
        self.draining = False
        self.identity = os.environ.get("POD_NAME") or socket.gethostname()
        self.ports: dict[str, int] = {}
        self._grpc: grpc.aio.Server | None = None
        self._grpc_stopping: asyncio.Future | None = None  # its graceful stop, begun by drain()
        self._runners: list[web.AppRunner] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def _jwks_changed(self) -> None:
        """Fetched RequestAuthentication keys changed: every proxy's jwt_authn may embed them."""
        req = PushRequest(full=True, config_keys={ConfigKey("JWKS", "", "keys")})
        req.reasons[push_reasons.CONFIG_UPDATE] += 1
        self.discovery.debouncer.enqueue(req)

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "shutting down"
        if self.kube_source is not None:
            synced, why = self.kube_source.synced()
            if not synced:
                return False, why
        if not self.loaded:
            return False, "initial config not loaded"
        if self.files is not None:
            running, why = self.files.watch_status()
            if not running:  # config changes would not be seen: another replica should serve
                return False, f"config directory watcher is not running: {why}"
        return True, "ok"

    async def start(self) -> None:
        if self.files is not None:
            await self.files.reload()  # parsed off the event loop; a bad file is only its rejection
            self._tasks.append(asyncio.create_task(self.files.watch(self._stop), name="file-watch"))
        elif self.opts.kubeconfig or in_cluster():
            await self._start_kube()
        else:
            raise StartupError("no config source: pass --configDir DIR (file mode) or --kubeconfig PATH, "
                             "or run in a cluster")
        await self._start_http()  # /ready answers 503 with the reason while informers sync
        self._write_ports()
        if self.kube_source is not None:
            await self.kube_source.wait_synced()
        if self.tag_watcher is not None:
            await self.tag_watcher.wait_synced()
        await self._start_ca()  # after the sync: the mesh's trust domain may come from the ConfigMap
        await self._start_webhook()
        self._write_ports()
        if self.kube_source is not None:
            self._start_leader_election()
        # The first context is built from what is loaded now; everything after goes through debounce.
        self.discovery.rebuild()
        self.discovery.start()
        self._tasks.append(asyncio.create_task(sample_lag(*lag_metrics(self.discovery.metrics), self._stop,
                                                          samples=self.discovery.loop_lag),
                                               name="loop-lag"))
        self.jwks.start()
        await self._start_grpc()
        await self._start_secure_grpc()
        self.loaded = True
        self._write_ports()
        # Startup objects (config, protos, caches) live for the whole run: keep the cyclic GC from
        # walking them on every full collection, which otherwise stalls large pushes.
        gc.freeze()
        log.info("ready", ports=self.ports, config_dir=self.opts.config_dir, kubeconfig=self.opts.kubeconfig)

    def _write_ports(self) -> None:
        """--portsFile: HTTP ports as soon as they listen, then all of them once serving xDS.
        Written atomically: a reader never sees a half-written file."""
        if self.opts.ports_file:
            tmp = Path(self.opts.ports_file + ".tmp")
            tmp.write_text(json.dumps(self.ports))
            os.replace(tmp, self.opts.ports_file)

    async def _start_kube(self) -> None:
        self.kube = Kube(await load_api_client(self.opts.kubeconfig, identity=self.identity))
        if self.autoregistration is not None:
            self.autoregistration.writer = KubeWriter(self.kube)
        self.kube_source = KubeSource(self.kube, self.store, self.mesh.configmap_key,
                                      selectors_of=lambda: self.mesh.peek(self.store).discovery_selectors,
                                      revision=self.features.revision)
        self.kube_source.start()
        self.tag_watcher = TagWatcher(self.kube, self.features.revision)
        self.tag_watcher.start()
        # Credentials go to proven proxies whose service account RBAC lets read Secrets (istiod's rule).
        self.discovery.credential_access = SecretAccess(self.kube).refusal

    async def _start_ca(self) -> None:
        """The CA, when something needs it: the secure port, or the istio-ca-root-cert writer.
        A plugged-in CA in ROOT_CA_DIR wins; otherwise the self-signed root is kept in the
        Secret istio-ca-secret (Kubernetes mode) or in PILOT_SELF_SIGNED_CA_DIR (file mode)."""
        if not self.opts.secure_grpc_addr and self.kube is None:
            return
        from pilot.security.ca import PLUGGED_IN, CAOptions, CertificateAuthority
        from pilot.security.ca_reload import watch_plugged_in_ca
        from pilot.security.ca_storage import DirectoryStorage, KubeSecrets, KubeSecretStorage

        try:
            options = CAOptions.from_env(trust_domain=self.mesh.peek(self.store).trust_domain)
        except ValueError as e:
            raise CAError(str(e)) from None
        if self.kube is not None:
            storage = KubeSecretStorage(KubeSecrets(self.kube), self.features.pod_namespace)
        else:
            storage = DirectoryStorage(self.features.self_signed_ca_dir)
        delay = 0.5
        while True:
            try:
                self.ca = await CertificateAuthority.create(options, storage)
                break
            except CAStorageError as e:  # the apiserver may be briefly unavailable: retry a while
                if self.kube is None or delay > 8:
                    raise
                log.warning("cannot load or store the CA root yet; retrying", error=e.message, retry_in=delay)
                await asyncio.sleep(delay)
                delay *= 2
        m = self.discovery.metrics
        m.root_cert_expiry.set(self.ca.root_expiry.timestamp())
        m.cert_chain_expiry.set(self.ca.cert_chain_expiry.timestamp())
        log.info("CA ready", mode=self.ca.mode, source=(self.features.root_ca_dir if self.ca.mode == "plugged-in"
                                                        else storage.description),
                 root_expires=self.ca.root_expiry.isoformat(timespec="seconds"))
        if self.ca.mode == PLUGGED_IN and options.root_ca_dir is not None:
            self._tasks.append(asyncio.create_task(
                watch_plugged_in_ca(self.ca, options.root_ca_dir, self._on_ca_reload, self._stop), name="ca-reload"))

    async def _on_ca_reload(self) -> None:
        """A new signing chain: istiod's own certificate and the root ConfigMaps follow it."""
        assert self.ca is not None  # its watcher calls this
        m = self.discovery.metrics
        m.root_cert_expiry.set(self.ca.root_expiry.timestamp())
        m.cert_chain_expiry.set(self.ca.cert_chain_expiry.timestamp())
        if self.secure is not None:
            await self.secure.reissue()
        if self.webhook is not None:
            await self.webhook.reissue()
        if self.root_cert_writer is not None:
            self.root_cert_writer.set_root(self.ca.root_cert_pem)
        for writer in (self.ca_bundle_writer, self.injector_bundle_writer):
            if writer is not None:
                writer.set_root(self.ca.root_cert_pem)

    def _debug_authenticators(self) -> authn.Authenticators | None:
        """Tokens that may read /debug off localhost: the CA's (TokenReview, JWT_RULE)."""
        if self.kube is None and not self.jwt_rules:
            return None
        return authn.build(jwt_rules=self.jwt_rules, kube=self.kube, token_audiences=self.features.token_audiences)

    async def _start_secure_grpc(self) -> None:
        addr = split_addr(self.opts.secure_grpc_addr)
        if addr is None or self.ca is None:
            return
        from pilot.security.ca_server import SecureServer, istiod_dns_names

        chain = authn.build(jwt_rules=self.jwt_rules, kube=self.kube, token_audiences=self.features.token_audiences)
        ns = self.features.pod_namespace
        self.secure = SecureServer(
            self.ca, self.ads, chain, trust_domain=lambda: self.mesh.current.trust_domain,
            dns_names=istiod_dns_names(ns, self.opts.domain, self.features.revision),
            metrics=self.discovery.metrics, trusted_node_accounts=self.features.trusted_node_accounts,
            node_authorizer=NodeAuthorizer(self.store), grpc_options=self._grpc_options())
        try:
            self.ports["secure_grpc"] = await self.secure.start(*addr)
        except OSError as e:
            raise OSError(e.errno, f"--secureGRPCAddr {self.opts.secure_grpc_addr}: cannot listen ({e})") from None
        log.info("serving TLS xDS and the CA", port=self.ports["secure_grpc"],
                 authenticators=[a.name for a in chain.authenticators])

    async def _start_webhook(self) -> None:
        """The validation webhook on --httpsAddr, whenever there is a CA to certify it (Kubernetes
        mode, or file mode with the secure port); empty --httpsAddr disables it."""
        addr = split_addr(self.opts.https_addr)
        if addr is None or self.ca is None:
            if addr is not None:
                log.info("no CA in this mode (--secureGRPCAddr is empty): not serving the webhook port")
            return
        from pilot.security.ca_server import istiod_dns_names
        from pilot.webhook.server import WebhookServer

        ns = self.features.pod_namespace
        self.webhook = WebhookServer(self.ca, istiod_dns_names(ns, self.opts.domain, self.features.revision),
                                     registry=self.discovery.metrics.registry, mount=[self._injector()])
        try:
            self.ports["https"] = await self.webhook.start(*addr)
        except OSError as e:
            raise OSError(e.errno, f"--httpsAddr {self.opts.https_addr}: cannot listen ({e.strerror})") from None
        log.info("serving the validation webhook", port=self.ports["https"])

    def _injector(self) -> Callable[[web.Application], None]:
        """The sidecar injector (/inject on the webhook port): its template and values from the
        `istio-sidecar-injector[-REV]` ConfigMap as it changes, Namespace labels from the Store."""
        from pilot.inject.config import InjectorConfigHolder
        from pilot.inject.handler import add_routes as add_inject_routes
        from pilot.inject.metrics import InjectionMetrics
        from pilot.inject.review import InjectionContext
        from pilot.inject.store import follow_configmap, namespace_labels

        holder = self.injector_config = InjectorConfigHolder()
        follow_configmap(self.store, holder, namespace=self.features.pod_namespace, revision=self.features.revision)
        ctx = InjectionContext.from_env(
            holder, namespace_labels(self.store), mesh=self._mesh_for_injection,
            metrics=InjectionMetrics(self.discovery.metrics.registry))
        if self.tag_watcher is not None:
            ctx.tags = self.tag_watcher.current
        ctx.proxy_configs = lambda: [e.obj for e in self.store.list(ProxyConfig)]
        return lambda app: add_inject_routes(app, ctx)

    def _mesh_for_injection(self, mesh: MeshConfig | None = None) -> dict:
        """The MeshConfig as the template reads it. A discoveryAddress nobody wrote is left out,
        so the injector's own default applies: this revision's Service (istiod-REV), the one
        the injected proxy must reach to be served by the revision that injected it."""
        mesh = mesh or self.mesh.current
        out = mesh.model_dump(mode="json", by_alias=True, exclude_none=True)
        if "discovery_address" not in mesh.default_config.model_fields_set:
            out.get("defaultConfig", {}).pop("discoveryAddress", None)
        return out

    def _gateway_inputs(self) -> GatewayInputs:
        from pilot.gateway_deploy.render import Inputs as GatewayInputs

        values = self.injector_config.current.values if self.injector_config is not None else {}
        # The Store's MeshConfig, not the last pushed one: a mesh ConfigMap change redeploys at once.
        return GatewayInputs(revision=self.features.revision, values=values,
                             mesh=self._mesh_for_injection(self.mesh.peek(self.store)))

    def _leader_workers(self) -> list:
        return self._shared_workers() + self._revision_workers() + self._status_workers()

    def _shared_workers(self) -> list:
        """One leader among every revision (istiod's namespace controller lease)."""
        return [w for w in (self.root_cert_writer,) if w is not None]

    def _status_workers(self) -> list:
        return [w for w in (self.status_writer, self.ingress_status_writer) if w is not None]

    def _gateway_is_mine(self, namespace: str, name: str) -> bool:
        """Is this Gateway this revision's (its `istio.io/rev` label, else its namespace's,
        against this revision and its tags)? Every revision reads every Gateway."""
        if self.tag_watcher is None:
            return True
        gw = self.store.get(ConfigKey("KubernetesGateway", namespace, name))
        ns = self.store.get(ConfigKey("Namespace", "", namespace))
        return self.tag_watcher.current().is_mine(gw.obj.metadata.labels if gw is not None else {},
                                                  ns.obj.metadata.labels if ns is not None else None)

    def _revision_workers(self) -> list:
        """One leader per revision (a per-revision lease, as istiod's gateway deployment
        controller): each revision keeps its own webhooks' caBundle and deploys its own Gateways."""
        return [w for w in (self.ca_bundle_writer, self.injector_bundle_writer, self.gateway_deployer)
                if w is not None]

    def _start_leader_election(self) -> None:
        assert self.kube is not None and self.kube_source is not None  # Kubernetes mode
        if self.ca is not None:
            self.root_cert_writer = RootCertWriter(self.kube, self.store, self.ca.root_cert_pem,
                                                   namespace_selected=self._namespace_selected)
        if self.webhook is not None and self.ca is not None:  # (a webhook has a CA)
            self.injector_bundle_writer = InjectorBundleWriter(
                self.kube, self.features.pod_namespace, self.features.revision, self.ca.root_cert_pem)
            self.ca_bundle_writer = CABundleWriter(self.kube, self.features.pod_namespace, self.features.revision,
                                                   self.ca.root_cert_pem)
        if self.tag_watcher is not None:
            from pilot.gateway_deploy.controller import DeploymentController
            from pilot.inject.store import configmap_name

            deployer = self.gateway_deployer = DeploymentController(
                self.kube, self.store, self.tag_watcher.current, self._gateway_inputs,
                resync_keys=frozenset({self.mesh.configmap_key, ConfigKey(
                    "ConfigMap", self.features.pod_namespace, configmap_name(self.features.revision))}))
            self.tag_watcher.listeners.append(lambda _state: deployer.resync())
        source = self.kube_source
        status = self.status_writer = StatusWriter(self.kube, source.latest, source.objects_of,
                                                   owns_gateway=self._gateway_is_mine)
        self.gateway_status.listeners.append(status.offer)
        status.offer(self.gateway_status.desired)
        ingress = self.ingress_status_writer = IngressStatusWriter(self.kube, source.latest,
                                                                   self._ingress_service_addresses)
        source.informers["Service"].on_object.append(
            lambda svc: ingress.poke() if self._is_ingress_service(svc) else None)
        self.discovery.context_listeners.append(lambda ctx: ingress.offer(ctx.ingress.statuses))
        ingress.offer(self.discovery.push_context.ingress.statuses)
        if self.tag_watcher is not None:  # a tag moved: which Gateways are ours may have changed
            self.tag_watcher.listeners.append(lambda _state: status.offer(self.gateway_status.desired))
        f = self.features
        revision = f.revision or "default"
        for lease, workers in ((LEADER_LEASE, self._shared_workers()),
                               (f"{REVISION_LEASE}-{revision}", self._revision_workers()),
                               (f"{STATUS_LEASE}-{revision}", self._status_workers())):
            self._elect(lease, workers)

    def _elect(self, lease: str, workers: list) -> None:
        async def started() -> None:
            for w in workers:
                await w.start()

        async def stopped() -> None:
            for w in workers:
                await w.stop()

        if not self.features.enable_leader_election:
            self._tasks.append(asyncio.create_task(started(), name=f"always-leader-{lease}"))
            return
        f = self.features
        assert self.kube is not None  # Kubernetes mode
        election = LeaderElection(self.kube, f.pod_namespace, lease, self.identity,
                                  lease_duration=f.leader_lease_duration, renew_deadline=f.leader_renew_deadline,
                                  retry_period=f.leader_retry_period, on_started=started, on_stopped=stopped)
        self.leaders.append(election)
        self._tasks.append(asyncio.create_task(election.run(), name=f"leader-election-{lease}"))

    def _is_ingress_service(self, svc) -> bool:
        name = self.mesh.current.ingress_service
        return bool(name) and (svc.metadata.namespace, svc.metadata.name) == (self.features.ingress_namespace, name)

    def _ingress_service_addresses(self):
        """MeshConfig ingressService's addresses from its informer (None without one)."""
        name = self.mesh.current.ingress_service
        if not name or self.kube_source is None:
            return None
        svc = self.kube_source.latest(ConfigKey("Service", self.features.ingress_namespace, name))
        return service_addresses(svc if isinstance(svc, Service) else None)

    def _namespace_selected(self, namespace: str) -> bool:
        selectors = self.mesh.peek(self.store).discovery_selectors
        if not selectors:
            return True
        entry = self.store.get(ConfigKey("Namespace", "", namespace))
        labels = entry.obj.metadata.labels if entry else {}
        return any(s.matches(labels) for s in selectors)

    def _grpc_options(self) -> list[tuple[str, int]]:
        # grpcio sets SO_REUSEPORT by default: a second server on the same --grpcAddr would then
        # share the port (and its proxies) silently instead of failing to start.
        options = [("grpc.so_reuseport", 0), ("grpc.max_send_message_length", 64 << 20),
                   ("grpc.max_receive_message_length", self.features.max_recv_msg_size),
                   ("grpc.keepalive_time_ms", 30_000), ("grpc.http2.max_pings_without_data", 0)]
        if self.opts.keepalive_max_server_connection_age:
            # gRPC adds +-10% jitter to the age; like istiod, streams then get 10 s to finish.
            options += [("grpc.max_connection_age_ms", int(self.opts.keepalive_max_server_connection_age * 1000)),
                        ("grpc.max_connection_age_grace_ms", 10_000)]
        return options

    async def _start_grpc(self) -> None:
        addr = split_addr(self.opts.grpc_addr)
        if addr is None:
            return
        self._grpc = grpc.aio.server(options=self._grpc_options())
        self._grpc.add_generic_rpc_handlers((self.ads.handler(),))
        host, port = addr
        try:
            self.ports["grpc"] = self._grpc.add_insecure_port(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
        except RuntimeError as e:
            raise OSError(98, f"--grpcAddr {self.opts.grpc_addr}: cannot listen ({e})") from None
        await self._grpc.start()

    async def _start_http(self) -> None:
        seen: dict[tuple[str, int], None] = {}
        for name, addr_text in (("http", self.opts.http_addr), ("monitoring", self.opts.monitoring_addr)):
            addr = split_addr(addr_text)
            if addr is None:
                continue
            if addr in seen and addr[1] != 0:  # the same fixed address twice: serve both roles on one
                self.ports[name] = self.ports["http"]
                continue
            seen[addr] = None
            runner = web.AppRunner(build_app(self.discovery, self.ready, self._debug_authenticators(),
                                             self.features.pod_namespace, self.gateway_status), access_log=None)
            await runner.setup()
            self._runners.append(runner)
            site = web.TCPSite(runner, addr[0], addr[1])
            try:
                await site.start()
            except OSError as e:
                raise OSError(e.errno, f"--{name}Addr {addr_text}: {e.strerror}") from None
            self.ports[name] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp: bound port is private

    async def drain(self, duration: float) -> None:
        """SIGTERM: /ready turns 503, new streams are refused, and existing streams are closed
        spread over `duration` so proxies do not all reconnect to the other replicas at once."""
        self.draining = True
        # GOAWAY on both xDS servers now (gRPC's graceful stop: open streams go on until the drain
        # below ends them, new ones go elsewhere), as istiod's GracefulStop of grpcServer and
        # secureGrpcServer. Without it a proxy whose stream was closed opens the next one on the
        # same connection, which behind a TCP load balancer (a Service) still leads here:
        # refused, again and again, until the process exits.
        if self._grpc is not None and self._grpc_stopping is None:
            self._grpc_stopping = asyncio.ensure_future(self._grpc.stop(grace=duration + 1.0))
        if self.secure is not None:
            self.secure.begin_stop(grace=duration + 1.0)
        await self.ads.drain(duration)
        if self.leaders:
            for election in self.leaders:
                await election.release()
        else:
            for w in self._leader_workers():
                await w.stop()

    async def stop(self) -> None:
        self.loaded = False
        self._stop.set()
        if self.autoregistration is not None:
            self.autoregistration.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._leader_workers():
            await w.stop()
        if self.kube_source is not None:
            await self.kube_source.stop()
        if self.tag_watcher is not None:
            await self.tag_watcher.stop()
        servers = ([self.secure.stop(grace=1.0)] if self.secure is not None else []) + \
            ([self._grpc_stopping or self._grpc.stop(grace=1.0)] if self._grpc is not None else [])
        await asyncio.gather(*servers)
        if self.webhook is not None:
            await self.webhook.stop()
        await self.jwks.stop()
        await self.discovery.stop()
        for r in self._runners:
            await r.cleanup()
        if self.kube is not None:
            await self.kube.close()

    async def run_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        starting = asyncio.create_task(self.start())
        waiter = asyncio.create_task(done.wait())
        await asyncio.wait({starting, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            try:
                starting.result()
            except (OSError, CAError, StartupError) as e:
                waiter.cancel()
                await self.stop()
                raise SystemExit(f"cannot start: {e}") from None
            await waiter
        else:  # a signal while still starting (e.g. informers waiting for the apiserver)
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        log.info("shutting down", drain_seconds=self.features.drain_duration)
        await self.drain(self.features.drain_duration)
        await self.stop()


def run(opts: Options) -> int:
    plog.configure(plog.parse_levels(opts.log_output_level), opts.log_as_json)
    # Pushes allocate many short-lived objects; the default gen-0 threshold (700) makes the
    # cyclic GC run thousands of times per large push for almost no garbage cycles.
    gc.set_threshold(50_000, 20, 20)
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    try:
        features = feat.Features.from_env(dict(os.environ))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    asyncio.run(ControlPlane(opts, features).run_until_signalled())
    return 0
