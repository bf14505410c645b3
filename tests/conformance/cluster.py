"""What the upstream conformance suite gets from a Kubernetes cluster, made locally: the vendored
manifests go into the file-mode control plane's config directory, each Deployment becomes a local
echo server behind its Service (an EndpointSlice to 127.0.0.1), each Gateway gets the Service
istiod's automated deployment would create (`NAME-istio`, its listener ports) and, when a test
sends it traffic, a real router Envoy under pilot-agent (labelled with the gateway name, as that
deployment's pods are). The Secrets the suite creates at start (suite.go: self-signed and
CA-signed certificates) are generated here.

Listener ports are the manifests' own (80, 443, 8080...): upstream's expectations depend on them
(a redirect to the listener's port, a Host without the default port), so the runner needs
permission to bind them, and only one gateway Envoy runs at a time (the base Gateways share port
80). Its address is 127.0.0.1, whatever the Gateway's status says.
"""

from __future__ import annotations

import base64
import itertools
import ssl
from pathlib import Path
from typing import Any

import yaml

from tests.conformance.echo import EchoServer, GrpcEchoServer, TcpEchoServer
from tests.support import certs
from tests.support.agent import PilotAgent
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.verified_router import start_verified_router
from tests.unit.test_authn import Issuer

GATEWAY_CLASS = "istio"
CONTROLLER = "istio.io/gateway-controller"
GW_LABEL = "gateway.networking.k8s.io/gateway-name"
# Kinds the control plane reads from files; the rest (Deployments, ServiceAccounts)
# is the cluster's business and is stood in for here.
CONFIG_KINDS = {"Namespace", "Service", "Secret", "GatewayClass", "Gateway", "ListenerSet", "HTTPRoute", "GRPCRoute",
                "TCPRoute", "TLSRoute", "ReferenceGrant", "EndpointSlice", "BackendTLSPolicy", "ConfigMap"}

GATEWAY_CLASS_YAML = f"""\
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: {GATEWAY_CLASS}}}
spec: {{controllerName: istio.io/gateway-controller}}
"""


def load_manifests(path: Path) -> list[dict]:
    text = (path.read_text().replace("{GATEWAY_CLASS_NAME}", GATEWAY_CLASS)
            .replace("{GATEWAY_CONTROLLER_NAME}", CONTROLLER))
    return [d for d in yaml.safe_load_all(text) if d]


def key(doc: dict) -> tuple[str, str, str]:
    meta = doc.get("metadata", {})
    return doc["kind"], meta.get("namespace", ""), meta["name"]


def _backend_port(echo, svc_port: dict) -> int:
    """The local port behind a Service port: the TCP echo has a plain and a TLS listener."""
    target = svc_port.get("targetPort", svc_port["port"])
    return echo.port_for(target) if isinstance(echo, TcpEchoServer) and isinstance(target, int) else echo.port


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


class Cluster:
    """The control plane, the echo servers and the gateway Envoys of one conformance run."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.issuer = Issuer("ES256")
        self.cp = ControlPlane(workdir, secure_grpc=True, env={"JWT_RULE": self.issuer.rule()})
        self.echoes: dict[tuple[str, str], EchoServer | GrpcEchoServer | TcpEchoServer] = {}  # (namespace, deployment) -> server
        # The mesh's echo-advanced pods also serve gRPC (`--grpc=PORT`): a gRPC echo beside their HTTP one,
        # behind the Services' grpc ports.
        self.grpc_echoes: dict[tuple[str, str], GrpcEchoServer] = {}
        self.pod_labels: dict[tuple[str, str], dict[str, str]] = {}
        self.objects: dict[tuple[str, str, str], dict] = {}  # everything applied, by kind/ns/name
        self.files: dict[tuple[str, str, str], list[str]] = {}
        self.router: tuple[str, ...] | None = None  # the gateway (or mesh client) whose Envoy runs now
        self.agent: PilotAgent | None = None
        self.envoy: Envoy | None = None
        self._seq = itertools.count()
        self.ca = certs.make_ca("gateway-api conformance CA")
        self.secrets: dict[tuple[str, str], certs.Issued] = {}
        self.suite_objects: list[dict] = []  # suite.go's CA ConfigMaps besides tls-checks'

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        self.cp.write("00-gatewayclass.yaml", GATEWAY_CLASS_YAML)
        self._suite_secrets()
        # The CA ConfigMaps suite.go creates for BackendTLSPolicy: the CA that signed
        # tls-checks-certificate, and one that signed nothing.
        await self.apply([self.ca_config_map("tls-checks-ca-certificate", self.ca),
                          self.ca_config_map("mismatch-ca-certificate", certs.make_ca("unused CA")),
                          *self.suite_objects])
        await self.cp.start()

    @staticmethod
    def ca_config_map(name: str, ca: certs.Issued, namespace: str = "gateway-conformance-infra") -> dict:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
                "data": {"ca.crt": ca.cert_pem.decode()}}

    async def stop(self) -> None:
        await self.stop_router()
        await self.cp.stop()
        for echo in [*self.echoes.values(), *self.grpc_echoes.values()]:
            await echo.stop()

    def _suite_secrets(self) -> None:
        """The Secrets upstream's suite creates before any test (suite.go), same names and hosts."""
        wanted = [("gateway-conformance-web-backend", "certificate", ["*"]),
                  ("gateway-conformance-infra", "tls-validity-checks-certificate", ["*", "*.org", "*.wildcard.org"]),
                  ("gateway-conformance-infra", "tls-checks-certificate",
                   ["abc.example.com", "spiffe://abc.example.com/test-identity", "other.example.com"]),
                  ("gateway-conformance-infra", "tls-passthrough-checks-certificate", ["abc.example.com"]),
                  ("gateway-conformance-app-backend", "tls-passthrough-checks-certificate", ["abc.example.com"]),
                  ("gateway-conformance-infra", "tls-terminate-checks-certificate", ["tls.example.com"])]
        for ns, name, hosts in wanted:
            leaf = certs.issue(self.ca, hosts)
            self.secrets[(ns, name)] = leaf
            self.cp.write(f"01-secret-{ns}-{name}.yaml", certs.tls_secret_yaml(name, ns, leaf))
        # Frontend client certificate validation: a CA ConfigMap and a client certificate it signed,
        # for the default and for the per-port configuration (distinct CAs, so each client is
        # refused by the other's listener)
        for ca_name, client_name in [("tls-validity-checks-ca-certificate", "tls-validity-checks-client-certificate"),
                                     ("tls-validity-checks-per-port-ca-certificate",
                                      "tls-validity-checks-per-port-client-certificate")]:
            ca = certs.make_ca(ca_name)
            self.suite_objects.append(self.ca_config_map(ca_name, ca))
            leaf = certs.issue(ca, [], client=True)
            self.secrets[("gateway-conformance-infra", client_name)] = leaf
            self.cp.write(f"01-secret-gateway-conformance-infra-{client_name}.yaml",
                          certs.tls_secret_yaml(client_name, "gateway-conformance-infra", leaf))
        self.suite_objects.append(self.ca_config_map("web-backend-cm", certs.make_ca("web-backend-cm"),
                                                     "gateway-conformance-web-backend"))

    def tls_files(self, namespace: str, name: str) -> tuple[Path, Path]:
        """tls.crt and tls.key of a TLS Secret (upstream GetTLSSecret) as files, for a client to
        present: one the suite made, or one a manifest applied (read as it is now)."""
        if (namespace, name) in self.secrets:
            cert, key_ = self.secrets[(namespace, name)].cert_pem, self.secrets[(namespace, name)].key_pem
        else:
            doc = self.objects.get(("Secret", namespace, name))
            if doc is None:
                raise KeyError(f"no Secret {namespace}/{name}")
            cert, key_ = (base64.b64decode(doc["data"][f]) for f in ("tls.crt", "tls.key"))
        paths = (self.workdir / f"client-{namespace}-{name}.crt", self.workdir / f"client-{namespace}-{name}.key")
        paths[0].write_bytes(cert)
        paths[1].write_bytes(key_)
        return paths

    # --- manifests ----------------------------------------------------------------------------
    async def apply(self, docs: list[dict]) -> list[tuple[str, str, str]]:
        """Apply manifests as `kubectl apply` would, returning the keys (to delete them later)."""
        applied = []
        for doc in docs:
            k = key(doc)
            applied.append(k)
            # The apiserver's metadata.generation: 1 when created, one more for each spec change.
            prev = self.objects.get(k)
            gen = 1 if prev is None else prev["metadata"].get("generation", 1) + (prev.get("spec") != doc.get("spec"))
            doc.setdefault("metadata", {})["generation"] = gen
            self.objects[k] = doc
            if doc["kind"] == "Deployment":
                await self._deployment(doc)
        for k in applied:
            self._write(k)
        # A Gateway's Service exposes its ListenerSets' ports too: rewritten when they change.
        if any(k[0] == "ListenerSet" for k in applied):
            for k in [k for k in self.objects if k[0] == "Gateway"]:
                self._write(k)
        # A Service's endpoints follow the Deployments it selects, which may come in the same batch.
        for k in self.objects:
            if k[0] == "Service":
                self._write(k)
        return applied

    def delete(self, keys: list[tuple[str, str, str]]) -> None:
        for k in keys:
            self.objects.pop(k, None)
            for f in self.files.pop(k, []):
                self.cp.remove(f)

    def _write(self, k: tuple[str, str, str]) -> None:
        doc = self.objects[k]
        kind, ns, name = k
        if kind not in CONFIG_KINDS:
            return
        out = [doc]
        if kind == "Service":
            out += self._endpoints(doc)
        elif kind == "Gateway":
            out.append(self._gateway_service(doc))
        # The file name keeps its first sequence number: rewriting it replaces the object in place.
        if k in self.files:
            name_ = self.files[k][0]
        else:
            name_ = f"t{next(self._seq):05d}-{kind}-{ns}-{name}.yaml"
            self.files[k] = [name_]
        self.cp.write(name_, yaml.safe_dump_all([d for d in out if d], sort_keys=False))

    async def _deployment(self, doc: dict) -> None:
        ns, name = doc["metadata"].get("namespace", "default"), doc["metadata"]["name"]
        pod = doc["spec"]["template"]
        self.pod_labels[(ns, name)] = pod["metadata"].get("labels", {})
        if (ns, name) in self.echoes:
            return
        env = {e["name"]: e.get("value") for c in pod["spec"]["containers"] for e in c.get("env", [])}
        tls = None
        if "TLS_SERVER_CERT" in env:  # (tcp-backend spells the key TLS_SERVER_PRIV_KEY)
            secret = next((v["secret"]["secretName"] for v in pod["spec"].get("volumes", []) if "secret" in v), None)
            leaf = self.secrets.get((ns, secret)) if secret else None
            if leaf is not None:
                tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                cert_path = self.workdir / f"{ns}-{name}.pem"
                cert_path.write_bytes(leaf.cert_pem + leaf.key_pem)
                tls.load_cert_chain(cert_path)
        if "TCP_ECHO_SERVER" in env:
            self.echoes[(ns, name)] = await TcpEchoServer(ns, name, tls=tls).start()
            return
        if "GRPC_ECHO_SERVER" in env:
            self.echoes[(ns, name)] = await GrpcEchoServer(ns, name).start()
            return
        self.echoes[(ns, name)] = await EchoServer(ns, name, tls=tls).start()
        if any(a.startswith("--grpc=") for c in pod["spec"]["containers"] for a in c.get("args", [])):
            self.grpc_echoes[(ns, name)] = await GrpcEchoServer(ns, name).start()

    def _endpoints(self, svc: dict) -> list[dict]:
        """An EndpointSlice per echo server whose pod labels the Service selects: each listens on
        its own local port, whatever the Service's targetPort, and every Service port reaches it."""
        ns, name = svc["metadata"].get("namespace", "default"), svc["metadata"]["name"]
        selector = svc["spec"].get("selector") or {}
        out = []
        for (ens, dep), e in sorted(self.echoes.items()):
            if ens != ns or not _selects(selector, self.pod_labels.get((ens, dep), {})):
                continue
            e.service = e.service or name
            grpc_echo = self.grpc_echoes.get((ens, dep))
            if grpc_echo is not None:
                grpc_echo.service = grpc_echo.service or name
            out.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                        "metadata": {"name": f"{name}-{dep}", "namespace": ns,
                                     "labels": {"kubernetes.io/service-name": name}},
                        "addressType": "IPv4",
                        "ports": [{"name": p.get("name", ""),
                                   "port": grpc_echo.port if grpc_echo is not None and p.get("appProtocol") == "grpc"
                                   else _backend_port(e, p)} for p in svc["spec"]["ports"]],
                        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]})
        return out

    def _gateway_service(self, gw: dict) -> dict:
        """As istiod's deployment controller (extractServicePorts): the Gateway's listener ports
        and those of the ListenerSets naming it (here whether the Gateway allows them or not: an
        extra port on the Service changes nothing the tests check)."""
        ns, name = gw["metadata"]["namespace"], gw["metadata"]["name"]
        sets = [d for (kind, _, _), d in self.objects.items() if kind == "ListenerSet"
                and (d["spec"]["parentRef"].get("namespace") or d["metadata"]["namespace"], d["spec"]["parentRef"]["name"])
                == (ns, name)]
        ports = sorted({lis["port"] for d in (gw, *sets) for lis in d["spec"].get("listeners", [])})
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": f"{name}-{GATEWAY_CLASS}", "namespace": ns},
                "spec": {"selector": {GW_LABEL: name},
                         "ports": [{"name": f"port-{p}", "port": p} for p in ports]}}

    # --- the gateway's Envoy ------------------------------------------------------------------
    async def router_for(self, namespace: str, name: str) -> Envoy:
        """The Envoy serving Gateway NAME: started if it is not the one running (which is stopped:
        Gateways share listener ports)."""
        if self.router == (namespace, name) and self.envoy is not None:
            return self.envoy
        await self.stop_router()
        self.agent, self.envoy = await start_verified_router(
            self.cp, self.workdir / f"router-{next(self._seq)}", self.issuer, namespace=namespace,
            service_account=f"{name}-{GATEWAY_CLASS}", pod=f"{name}-1", labels={GW_LABEL: name})
        self.router = (namespace, name)
        return self.envoy

    async def client_for(self, namespace: str, deployment: str) -> Envoy:
        """A sidecar Envoy for a pod of DEPLOYMENT (its labels, its namespace) without iptables: its
        outbound listeners bind the Services' ports on 127.0.0.1, so a request to 127.0.0.1:PORT with
        the Service's name as Host is what the pod's own client would send (the mesh tests' client).
        Like the gateway Envoys, one at a time: they bind the same ports."""
        if self.router == ("client", namespace, deployment) and self.envoy is not None:
            return self.envoy
        await self.stop_router()
        labels = self.pod_labels[(namespace, deployment)]
        node = f"sidecar~127.0.0.1~{deployment}-1.{namespace}~{namespace}.svc.cluster.local"
        self.envoy = Envoy()
        await self.envoy.start(Envoy.bootstrap(node, self.cp.xds_port, metadata={
            "NAMESPACE": namespace, "LABELS": labels, "INTERCEPTION_MODE": "NONE"},
            cluster=f"{deployment}.{namespace}"), self.workdir / f"client-{next(self._seq)}")
        await self.envoy.wait_ready(timeout=30)
        self.router = ("client", namespace, deployment)
        return self.envoy

    async def stop_router(self) -> None:
        if self.agent is not None:
            await self.agent.stop()
        elif self.envoy is not None:
            await self.envoy.stop()
        self.agent = self.envoy = None
        self.router = None

    # --- status -------------------------------------------------------------------------------
    async def status(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        for o in (await self.cp.debug("/debug/gatewayz"))["objects"]:
            if (o["kind"], o["namespace"], o["name"]) == (kind, namespace, name):
                return o.get("status") or {}
        return None

    def log_tail(self) -> str:
        envoy = self.envoy.log_tail(10) if self.envoy is not None else ""
        return f"{self.cp.log_tail(15)}\n{envoy}"
