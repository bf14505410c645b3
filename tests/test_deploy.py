"""The Kubernetes manifests (deploy/) and the Dockerfile agree with the code. Fast; no cluster.

`kubectl kustomize deploy/` is rendered once and checked against what the code actually does:
the container args go through the real CLI parser, env values through the real knob parsers,
the mesh ConfigMap through the real MeshConfig parser, and the RBAC must equal
`required_rules()`, which is itself checked against the requests the informers, the leader
election and the root-cert writer make (recorded from a fake client).
"""

from __future__ import annotations

import ast
import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pilot import cli
from pilot import features as feat
from pilot.config.kinds import KINDS, Kind
from pilot.config.mesh import parse_mesh_config
from pilot.durations import parse_duration
from pilot.sources.kube import rbac

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SYSTEM_NS = "istio-system"

# docs/architecture.md, Contracts, "Ports": 8080 /ready + debug, 15010 xDS, 15012 TLS xDS + CA,
# 15014 metrics, 15017 webhooks. The Service exposes the webhooks on 443 as istiod's does.
PORTS = {8080, 15010, 15012, 15014, 15017}
SERVICE_PORTS = {"grpc-xds": (15010, 15010), "https-dns": (15012, 15012),
                 "https-webhook": (443, 15017), "http-monitoring": (15014, 15014)}
# API groups served by kube-apiserver itself; kinds in any other group need a CRD in deploy/crds.
BUILTIN_GROUPS = {"", "apps", "discovery.k8s.io", "coordination.k8s.io", "networking.k8s.io", "policy",
                  "batch", "autoscaling", "rbac.authorization.k8s.io", "admissionregistration.k8s.io",
                  "certificates.k8s.io", "apiextensions.k8s.io", "storage.k8s.io", "node.k8s.io"}


def _kubectl() -> str:
    path = shutil.which("kubectl") or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").exists() else None)
    if path is None:
        pytest.skip("kubectl is not installed: cannot render the kustomize base (deploy/)")
    return path


def _render(directory: Path) -> list[dict]:
    out = subprocess.run([_kubectl(), "kustomize", str(directory)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, f"kubectl kustomize {directory} failed:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    docs = _render(DEPLOY)
    index: dict[tuple[str, str], dict] = {}
    for d in docs:
        key = (d["kind"], d["metadata"]["name"])
        assert key not in index, f"{key} rendered twice"
        index[key] = d
    return index


@pytest.fixture(scope="module")
def deployment(objects) -> dict:
    return objects[("Deployment", "istiod")]


@pytest.fixture(scope="module")
def container(deployment) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, "one container: the control plane"
    return containers[0]


def _argv(container: dict) -> list[str]:
    """What the container runs after the `pilot-discovery` entrypoint."""
    command = list(container.get("command") or ["pilot-discovery"])
    assert command[0] == "pilot-discovery", command
    return command[1:] + list(container.get("args") or [])


def _parse_argv(argv: list[str]) -> cli.Options:
    try:
        command, opts = cli.parse(argv)
    except SystemExit as e:  # argparse reports the bad flag on stderr and exits
        pytest.fail(f"the container's args do not parse with pilot-discovery's CLI: {argv} (exit {e.code})")
    assert command == "discovery" and opts is not None
    return opts


def _port(addr: str) -> int | None:
    return int(addr.rpartition(":")[2]) if addr else None


# --- the objects ------------------------------------------------------------------------------
def test_every_expected_object_is_rendered(objects):
    expected = {("Namespace", SYSTEM_NS), ("ServiceAccount", "istiod"), ("ClusterRole", "istiod-istio-system"),
                ("ClusterRoleBinding", "istiod-istio-system"), ("Role", "istiod"), ("RoleBinding", "istiod"),
                ("ConfigMap", "istio"), ("Deployment", "istiod"), ("Service", "istiod"),
                ("PodDisruptionBudget", "istiod"), ("HorizontalPodAutoscaler", "istiod"),
                ("ConfigMap", "istio-sidecar-injector"), ("MutatingWebhookConfiguration", "istio-sidecar-injector")}
    assert expected <= set(objects), f"missing: {sorted(expected - set(objects))}"
    for (kind, name), obj in objects.items():
        if kind not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                        "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            assert obj["metadata"].get("namespace") == SYSTEM_NS, f"{kind}/{name} is not in {SYSTEM_NS}"


def test_selectors_and_references_line_up(objects, deployment):
    spec = deployment["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert spec["replicas"] == 2
    assert spec["template"]["spec"]["serviceAccountName"] == "istiod"
    assert objects[("Service", "istiod")]["spec"]["selector"].items() <= pod_labels.items()
    pdb = objects[("PodDisruptionBudget", "istiod")]
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = objects[("HorizontalPodAutoscaler", "istiod")]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "istiod"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
    assert hpa["spec"]["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
    keys = {c["topologyKey"] for c in spec["template"]["spec"]["topologySpreadConstraints"]}
    assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    for c in spec["template"]["spec"]["topologySpreadConstraints"]:
        assert c["labelSelector"]["matchLabels"].items() <= pod_labels.items()


# --- the container ------------------------------------------------------------------------------
def test_container_args_parse_with_the_real_cli(container):
    argv = _argv(container)
    assert argv[0] == "discovery"
    opts = _parse_argv(argv)
    assert opts.config_dir is None and opts.kubeconfig is None, "in-cluster mode: no --configDir/--kubeconfig"
    assert opts.monitoring_addr == ":15014"
    assert opts.domain == "cluster.local"
    assert opts.keepalive_max_server_connection_age == parse_duration("30m")
    assert opts.log_output_level == "default:info"


def test_mesh_config_flag_points_at_the_mounted_configmap(deployment, container):
    opts = _parse_argv(_argv(container))
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = [m for m in container["volumeMounts"] if volumes[m["name"]].get("configMap", {}).get("name") == "istio"]
    assert mounts, "the istio ConfigMap is mounted"
    assert any(opts.mesh_config == f"{m['mountPath'].rstrip('/')}/mesh" for m in mounts), opts.mesh_config


def test_ports_match_the_architecture_and_the_cli(objects, container):
    container_ports = {p["containerPort"] for p in container["ports"]}
    assert container_ports == PORTS
    assert all(p.get("protocol", "TCP") == "TCP" for p in container["ports"])
    opts = _parse_argv(_argv(container))
    listening = {_port(a) for a in (opts.grpc_addr, opts.secure_grpc_addr, opts.http_addr,
                                    opts.monitoring_addr, opts.https_addr)} - {None}
    assert listening == PORTS, "the flags (or their defaults) listen where the manifest says"
    svc = {p["name"]: (p["port"], p["targetPort"]) for p in objects[("Service", "istiod")]["spec"]["ports"]}
    assert svc == SERVICE_PORTS
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for port, target in svc.values():
        assert (named.get(target) if isinstance(target, str) else target) in container_ports


def test_probes(container):
    ready = container["readinessProbe"]["httpGet"]
    assert (ready["path"], ready["port"]) == ("/ready", 8080)
    live = container["livenessProbe"]
    assert "httpGet" in live or "tcpSocket" in live
    if "httpGet" in live:  # must answer non-localhost callers (debug paths are localhost-only)
        assert live["httpGet"]["path"] in ("/ready", "/version") and live["httpGet"]["port"] == 8080
    # Generous: a liveness failure restarts the pod, which must never happen during a slow sync.
    assert live.get("failureThreshold", 3) * live.get("periodSeconds", 10) >= 60


def test_security_context(deployment, container):
    pod = deployment["spec"]["template"]["spec"].get("securityContext", {})
    ctr = container["securityContext"]

    def effective(key):
        return ctr.get(key, pod.get(key))

    assert effective("runAsNonRoot") is True
    assert effective("runAsUser") == 1337
    assert effective("seccompProfile") == {"type": "RuntimeDefault"}
    assert ctr["readOnlyRootFilesystem"] is True
    assert ctr["allowPrivilegeEscalation"] is False
    assert ctr.get("privileged", False) is False
    assert ctr["capabilities"]["drop"] == ["ALL"] and not ctr["capabilities"].get("add")
    res = container["resources"]
    assert {"cpu", "memory"} <= set(res["requests"]) and "memory" in res["limits"]


def test_writable_paths_are_empty_dirs(deployment, container):
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert "/tmp" in writable
    for m in container["volumeMounts"]:
        if not m.get("readOnly"):
            assert "emptyDir" in volumes[m["name"]], f"{m['mountPath']} is writable but not an emptyDir"


def test_env_knobs_parse_and_drain_fits_the_grace_period(deployment, container):
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    values = {name: e["value"] for name, e in env.items() if "value" in e}
    for name, value in values.items():
        if name in feat.KNOBS:
            feat.KNOBS[name].get({name: value})  # raises on a value the code would reject
        else:
            assert name in ("PYTHONUNBUFFERED",), f"{name} is not a knob pilot/features.py reads"
    features = feat.Features.from_env({**values, "POD_NAMESPACE": deployment["metadata"]["namespace"]})
    assert features.pod_namespace == SYSTEM_NS
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > features.drain_duration + 5, "drain, release the lease and exit before SIGKILL"
    assert features.root_ca_dir in {m["mountPath"] for m in container["volumeMounts"]}


# --- MeshConfig -------------------------------------------------------------------------------------
def test_mesh_configmap_parses(objects):
    data = objects[("ConfigMap", "istio")]["data"]
    mesh = parse_mesh_config(data["mesh"])
    raw = yaml.safe_load(data["mesh"])
    for field in ("trustDomain", "rootNamespace", "connectTimeout", "outboundTrafficPolicy", "enableAutoMtls",
                  "defaultHttpRetryPolicy", "accessLogFile", "defaultConfig", "discoverySelectors"):
        assert field in raw, f"the default MeshConfig spells out {field}"
    assert mesh.root_namespace == SYSTEM_NS
    host, _, port = mesh.default_config.discovery_address.rpartition(":")
    assert host in (f"istiod.{SYSTEM_NS}.svc", f"istiod.{SYSTEM_NS}.svc.cluster.local")
    assert int(port) in {p["port"] for p in objects[("Service", "istiod")]["spec"]["ports"]}


# --- RBAC -------------------------------------------------------------------------------------------
def _triples(rules: list[dict]) -> set[tuple[str, str, str]]:
    out = set()
    for r in rules:
        assert set(r) <= {"apiGroups", "resources", "verbs"}, f"no resourceNames/nonResourceURLs here: {r}"
        for group in r["apiGroups"]:
            for resource in r["resources"]:
                for verb in r["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {r}"
                    out.add((group, resource, verb))
    return out


def _required(scope: str) -> set[tuple[str, str, str]]:
    return {(r.api_group, r.resource, v) for r in rbac.required_rules() if r.scope == scope for v in r.verbs}


def test_cluster_role_is_exactly_the_required_rules(objects):
    granted = _triples(objects[("ClusterRole", "istiod-istio-system")]["rules"])
    required = _required("cluster")
    assert granted - required == set(), "granted but never used (least privilege)"
    assert required - granted == set(), "used by the code but not granted"


def test_role_is_exactly_the_required_rules(objects):
    role = objects[("Role", "istiod")]
    assert role["metadata"]["namespace"] == SYSTEM_NS
    granted = _triples(role["rules"])
    required = _required("namespace")
    assert granted - required == set(), "granted but never used (least privilege)"
    assert required - granted == set(), "used by the code but not granted"
    # Nothing else grants anything to the service account.
    roles = [k for k in objects if k[0] in ("Role", "ClusterRole")]
    assert sorted(roles) == [("ClusterRole", "istiod-istio-system"), ("Role", "istiod")]


def test_bindings_bind_the_service_account(objects):
    subject = [{"kind": "ServiceAccount", "name": "istiod", "namespace": SYSTEM_NS}]
    crb = objects[("ClusterRoleBinding", "istiod-istio-system")]
    assert crb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": "istiod-istio-system"}
    assert crb["subjects"] == subject
    rb = objects[("RoleBinding", "istiod")]
    assert rb["metadata"]["namespace"] == SYSTEM_NS
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "istiod"}
    assert rb["subjects"] == subject


# The declarations behind required_rules() are checked against the requests the code really makes.
class _Stream:
    async def readline(self) -> bytes:
        return b""


class _Response:
    content = _Stream()

    def release(self) -> None:
        pass


class RecordingKube:
    """Stands in for client.Kube: records (method, path, query) and answers from `handler`."""

    def __init__(self, handler) -> None:
        self.handler = handler
        self.calls: list[tuple[str, str, dict]] = []

    async def request(self, method, path, *, query=None, body=None, timeout=30.0, content_type=""):
        self.calls.append((method, path, dict(query or {})))
        return self.handler(method, path, body)

    async def open(self, method, path, *, query=None, body=None, timeout=30.0, content_type=""):
        self.calls.append((method, path, dict(query or {})))
        return _Response()


def _rbac_of(method: str, path: str, query: dict) -> tuple[str | None, str, str, str]:
    """(namespace or None, apiGroup, resource, verb) that the apiserver authorizes a request as."""
    m = re.fullmatch(r"/api/v1/(.*)", path) or re.fullmatch(r"/apis/([^/]+)/[^/]+/(.*)", path)
    assert m, path
    group, rest = ("", m.group(1)) if path.startswith("/api/") else (m.group(1), m.group(2))
    segs = rest.split("/")
    namespace = None
    if segs[0] == "namespaces" and len(segs) >= 3:
        namespace, segs = segs[1], segs[2:]
    resource, name = segs[0], (segs[1] if len(segs) > 1 else None)
    assert len(segs) <= 3, path
    if len(segs) == 3:  # a subresource is authorized as `resource/subresource`
        resource = f"{resource}/{segs[2]}"
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch") in ("true", "1") else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection"}[method]
    return namespace, group, resource, verb


def _allowed(namespace: str | None, group: str, resource: str, verb: str) -> bool:
    for r in rbac.required_rules():
        if ((r.api_group, r.resource) == (group, resource) and verb in r.verbs
                and (r.scope == "cluster" or namespace == SYSTEM_NS)):
            return True
    return False


async def test_required_rules_cover_every_request_the_code_makes_and_nothing_more():
    from pilot.config.validation import parse_object
    from pilot.model.store import Store
    from pilot.sources.kube.client import ApiError
    from pilot.sources.kube.informer import Informer
    from pilot.sources.kube.leader import LeaderElection
    from pilot.sources.kube.source import watched_kinds
    from pilot.sources.kube.writers import CONFIGMAP, KEY, RootCertWriter

    calls: list[tuple[str, str, dict]] = []

    # Informers: LIST then WATCH of every watched kind, cluster-wide.
    for kind in watched_kinds():
        kube = RecordingKube(lambda *_: {"items": [], "metadata": {"resourceVersion": "7"}})
        informer = Informer(kube, kind, Store())
        await informer._list()
        await informer._watch()
        calls += kube.calls

    # Leader election: create the lease when absent, take over an expired one, release it.
    state = {"lease": None}

    def leases(method, path, body):
        if method == "GET":
            if state["lease"] is None:
                raise ApiError(404, "NotFound")
            return state["lease"]
        state["lease"] = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
        return state["lease"]

    kube = RecordingKube(leases)
    election = LeaderElection(kube, SYSTEM_NS, "istio-namespace-controller-election", "me")
    assert await election._try_acquire_or_renew()
    state["lease"]["spec"] = {"holderIdentity": "other", "leaseDurationSeconds": 1,
                              "renewTime": "2000-01-01T00:00:00.000000Z"}
    assert await election._try_acquire_or_renew()
    election.is_leader = True
    await election.release()
    calls += kube.calls

    # Root-cert writer in an ordinary namespace: create, and on conflict read and update.
    def configmaps(method, path, body):
        if method == "POST":
            raise ApiError(409, "AlreadyExists")
        if method == "GET":
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIGMAP},
                    "data": {KEY: "stale"}}
        return body

    store = Store()
    store.apply(parse_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bookinfo"}}))
    kube = RecordingKube(configmaps)
    await RootCertWriter(kube, store, "PEM")._reconcile("bookinfo")
    assert kube.calls[-1][0] == "PUT"
    calls += kube.calls

    # The CA's root Secret: absent (404), create loses a race (409), read the winner's.
    from pilot.security.ca import CA_SECRET_NAME, KubeSecrets, KubeSecretStorage

    def secrets(method, path, body):
        if method == "POST":
            raise ApiError(409, "AlreadyExists")
        if not secrets.created:
            secrets.created = True
            raise ApiError(404, "NotFound")
        return {"data": {"ca-cert.pem": "Y2VydA==", "ca-key.pem": "a2V5"}}

    secrets.created = False
    kube = RecordingKube(secrets)
    storage = KubeSecretStorage(KubeSecrets(kube), SYSTEM_NS, CA_SECRET_NAME)
    assert await storage.load() is None
    assert (await storage.create({"ca-cert.pem": "x", "ca-key.pem": "y"}))["ca-key.pem"] == "key"
    calls += kube.calls

    # The CA's Kubernetes JWT authenticator: a TokenReview per token.
    from pilot.security.authn import Credentials, KubeJWTAuthenticator

    kube = RecordingKube(lambda *_: {"status": {"authenticated": True,
                                                "user": {"username": "system:serviceaccount:default:sleep"}}})
    assert (await KubeJWTAuthenticator(kube).authenticate(Credentials(bearer_token="t"))).namespace == "default"
    calls += kube.calls

    # Credentials: a SubjectAccessReview per gateway identity (cached).
    from pilot.model.proxy import Proxy
    from pilot.security.secret_access import SecretAccess

    kube = RecordingKube(lambda *_: {"status": {"allowed": True}})
    gateway = Proxy("router~10.0.0.1~gw-1.istio-system~istio-system.svc.cluster.local", "router", ("10.0.0.1",),
                    "gw-1", "istio-system", "cluster.local", identity="spiffe://cluster.local/ns/istio-system/sa/gw")
    assert await SecretAccess(kube).refusal(gateway) is None
    calls += kube.calls

    # The Gateway API status writer: a status PUT for each kind that has a status.
    from pilot.config.kinds import BY_NAME
    from pilot.model.store import ConfigKey
    from pilot.sources.kube.status_writer import STATUS_KINDS, StatusWriter

    objs = {}
    # One valid spec per kind (the specs are strict: each kind gets only its own fields).
    specs = {"GatewayClass": {"controllerName": "example.net/c"},
             "KubernetesGateway": {"gatewayClassName": "c",
                                   "listeners": [{"name": "l", "port": 80, "protocol": "HTTP"}]},
             "ListenerSet": {"parentRef": {"name": "x"}, "listeners": [{"name": "l", "port": 81, "protocol": "HTTP"}]},
             "BackendTLSPolicy": {"targetRefs": [{"group": "", "kind": "Service", "name": "s"}],
                                  "validation": {"hostname": "s.example.com", "wellKnownCACertificates": "System"}}}
    for kind_name in STATUS_KINDS:
        kind = BY_NAME[kind_name]
        obj = parse_object({"apiVersion": kind.api_version, "kind": kind.kind,
                            "metadata": {"name": "x", "namespace": "apps", "resourceVersion": "3"},
                            "spec": specs.get(kind_name, {"rules": [{}]})})
        objs[ConfigKey.of(obj)] = obj
    kube = RecordingKube(lambda method, path, body: body)
    writer = StatusWriter(kube, objs.get, lambda _kind: [])
    writer.offer({k: {"conditions": []} if k.kind not in ("HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute")
                  else {"parents": [{"controllerName": "istio.io/gateway-controller"}]} for k in objs})
    assert await writer.reconcile_all() and writer.writes == len(STATUS_KINDS)
    calls += kube.calls

    # The Ingress status writer: a status PUT with the gateway's addresses.
    from pilot.sources.kube.ingress_status import IngressStatusWriter

    ing = parse_object({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                        "metadata": {"name": "web", "namespace": "apps", "resourceVersion": "3"}, "spec": {}})
    kube = RecordingKube(lambda method, path, body: body)
    ingress_writer = IngressStatusWriter(kube, {ConfigKey.of(ing): ing}.get)
    ingress_writer.offer({ConfigKey.of(ing): ({"ip": "192.0.2.1"},)})
    assert await ingress_writer.reconcile_all() and ingress_writer.writes == 1
    calls += kube.calls

    # The webhook's caBundle writer: watch and read its configuration, probe with a dry-run
    # Gateway (denied: ready to fail closed), write the bundle back.
    from pilot.webhook.ca_bundle import CABundleWriter

    def webhooks(method, path, body):
        if method == "POST":
            raise ApiError(400, 'admission webhook "validation.istio.io" denied the request')
        if method == "GET":
            return {"metadata": {"name": "istio-validator-istio-system"}, "webhooks": [{"name": "w"}]}
        return body

    kube = RecordingKube(webhooks)
    bundle_writer = CABundleWriter(kube, SYSTEM_NS, "default", "PEM")
    assert await bundle_writer._reconcile() is False and bundle_writer.writes == 1
    watch = asyncio.create_task(bundle_writer._watch())
    while not any(q.get("watch") for _m, _p, q in kube.calls):
        await asyncio.sleep(0)
    watch.cancel()
    calls += kube.calls

    # The injector's configuration: the same writer, caBundle only.
    from pilot.webhook.ca_bundle import InjectorBundleWriter

    def injector_configs(method, path, body):
        if method == "GET":  # every configuration labelled with the revision: its own and its tags'
            return {"items": [{"metadata": {"name": n}, "webhooks": [{"name": "rev.object.sidecar-injector.istio.io"}]}
                              for n in ("istio-sidecar-injector", "istio-revision-tag-prod")]}
        return body

    kube = RecordingKube(injector_configs)
    injector_writer = InjectorBundleWriter(kube, SYSTEM_NS, "default", "PEM")
    assert await injector_writer._reconcile() is False and injector_writer.writes == 2
    watch = asyncio.create_task(injector_writer._watch())
    while not any(q.get("watch") for _m, _p, q in kube.calls):
        await asyncio.sleep(0)
    watch.cancel()
    calls += kube.calls

    # The revision-tag watcher: LIST then WATCH of the tag webhooks and istiod-default-validator.
    from pilot.sources.kube.tags import TagWatcher

    kube = RecordingKube(lambda *_: {"items": [], "metadata": {"resourceVersion": "7"}})
    tags = TagWatcher(kube, "canary")
    for labels in (tags._webhooks, tags._validator):
        await labels._watch(await labels._list())  # the watch ends at once (empty stream)
    calls += kube.calls

    # The Gateway deployment controller: create the istio GatewayClass, then for a Gateway read
    # each of its objects (absent) and apply it.
    from pilot.gateway_deploy.controller import DeploymentController
    from pilot.gateway_deploy.render import Inputs
    from pilot.model.revisions import TagState

    def deployments(method, path, body):
        if method == "GET":
            raise ApiError(404, "NotFound")
        return body

    store = Store()
    store.apply(parse_object({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                              "metadata": {"name": "gw", "namespace": "apps", "uid": "u-1"},
                              "spec": {"gatewayClassName": "istio",
                                       "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}))
    kube = RecordingKube(deployments)
    deployer = DeploymentController(kube, store, lambda: TagState("default"), Inputs)
    assert await deployer._create_class()
    await deployer._reconcile(ConfigKey("KubernetesGateway", "apps", "gw"))
    assert deployer.applies == 3
    calls += kube.calls

    # Auto-registration's writer: POST an entry (409: GET and PUT it), DELETE it.
    from pilot.autoregistration import KubeWriter
    from pilot.config.networking import WorkloadEntry
    from pilot.config.networking.service_entry import IstioCondition, WorkloadEntryStatus

    def entries(method, path, body):
        if method == "POST":
            raise ApiError(409, "AlreadyExists")
        return {"metadata": {"resourceVersion": "3"}} if method == "GET" else body

    kube = RecordingKube(entries)
    writer = KubeWriter(kube)
    entry = WorkloadEntry.model_validate({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
                                          "metadata": {"name": "vm-10.0.0.1", "namespace": "vms"},
                                          "spec": {"address": "10.0.0.1"}})
    writer.put(entry)
    # A health report: the Healthy condition goes through the status subresource.
    writer.put(entry.model_copy(update={"status": WorkloadEntryStatus(conditions=(
        IstioCondition(type="Healthy", status="True"),))}))
    writer.remove(ConfigKey.of(entry))
    assert writer._task is not None
    await writer._task
    assert [m for m, _p, _q in kube.calls] == ["POST", "GET", "PUT", "POST", "GET", "PUT", "PUT", "DELETE"]
    assert kube.calls[6][1].endswith("/vm-10.0.0.1/status")
    calls += kube.calls

    used = {_rbac_of(*c) for c in calls}
    denied = sorted(u for u in used if not _allowed(*u))
    assert denied == [], f"requests the code makes that required_rules() does not grant: {denied}"
    exercised = {(g, r, v) for _ns, g, r, v in used}
    declared = {(r.api_group, r.resource, v) for r in rbac.required_rules() for v in r.verbs}
    assert declared - exercised == set(), "declared but never requested (least privilege)"


def test_every_module_that_calls_the_apiserver_declares_its_rbac():
    declaring = {name.rsplit(".", 1)[1] + ".py" for name in rbac.RBAC_MODULES}
    informer_modules = {"informer.py"}  # list+watch comes from the kind registry
    offenders = []
    for path in sorted((ROOT / "pilot").rglob("*.py")):
        # pilotctl lists istiod pods with the user's own kubeconfig, never istiod's service account.
        if {"gen", "pilotctl"} & set(path.relative_to(ROOT / "pilot").parts):
            continue
        text = path.read_text()
        if re.search(r"\bkube\.(request|open)\(", text) and path.name not in declaring | informer_modules:
            offenders.append(str(path.relative_to(ROOT)))
        if path.name in declaring:
            tree = ast.parse(text)
            assert any(isinstance(n, (ast.Assign, ast.AnnAssign)) and "RBAC" in ast.unparse(n).split("=")[0]
                       for n in tree.body), f"{path.name} is in RBAC_MODULES but declares no RBAC"
    assert offenders == [], f"call the apiserver without an RBAC declaration in rbac.RBAC_MODULES: {offenders}"


def test_rbac_module_rejects_wildcards_and_merges():
    with pytest.raises(ValueError):
        rbac.Rule("cluster", "", "*", frozenset({"get"}))
    with pytest.raises(ValueError):
        rbac.Rule("cluster", "", "pods", frozenset({"*"}))
    merged = rbac.merge([rbac.Rule("cluster", "", "pods", frozenset({"list"})),
                         rbac.Rule("cluster", "", "pods", frozenset({"watch"})),
                         rbac.Rule("namespace", "", "pods", frozenset({"list"}))])
    assert merged == [rbac.Rule("cluster", "", "pods", frozenset({"list", "watch"}))]


# --- the validation webhook -----------------------------------------------------------------------
def test_the_webhook_configuration_routes_exactly_our_kinds_to_the_webhook_port(objects):
    from pilot.webhook.admission import rules
    from pilot.webhook.ca_bundle import config_name

    name = config_name(SYSTEM_NS)
    assert name == "istio-validator-istio-system"
    assert config_name(SYSTEM_NS, "canary") == "istio-validator-canary-istio-system"
    config = objects[("ValidatingWebhookConfiguration", name)]
    assert config["metadata"]["labels"]["istio.io/rev"] == "default"
    [webhook] = config["webhooks"]
    assert webhook["rules"] == rules()
    # Fail open until the leader has written the bundle and seen the probe refused.
    assert webhook["failurePolicy"] == "Ignore" and "caBundle" not in webhook["clientConfig"]
    assert webhook["sideEffects"] == "None" and webhook["admissionReviewVersions"] == ["v1"]
    ref = webhook["clientConfig"]["service"]
    assert (ref["namespace"], ref["path"]) == (SYSTEM_NS, "/validate")
    service = objects[("Service", ref["name"])]
    [port] = [p for p in service["spec"]["ports"] if p["port"] == ref.get("port", 443)]
    assert port["targetPort"] == 15017


# --- CRDs -----------------------------------------------------------------------------------------
def _structural_errors(schema: dict, where: str) -> list[str]:
    errors = []
    if "type" not in schema and not (schema.get("x-kubernetes-int-or-string")
                                     or schema.get("x-kubernetes-preserve-unknown-fields")):
        errors.append(f"{where}: no type")
    for name, sub in (schema.get("properties") or {}).items():
        errors += _structural_errors(sub, f"{where}.{name}")
    if isinstance(schema.get("items"), dict):
        errors += _structural_errors(schema["items"], f"{where}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        errors += _structural_errors(schema["additionalProperties"], f"{where}{{}}")
    return errors


def _crd_problems(kinds: tuple[Kind, ...], crds: list[dict]) -> list[str]:
    """Why `crds` do not serve every custom kind in `kinds` (empty: they do)."""
    problems = []
    by_name = {(c["spec"]["group"], c["spec"]["names"]["kind"]): c for c in crds}
    for kind in kinds:
        if kind.group in BUILTIN_GROUPS:
            continue
        crd = by_name.get((kind.group, kind.kind))
        if crd is None:
            problems.append(f"{kind.kind}.{kind.group}: no CRD in deploy/crds")
            continue
        spec = crd["spec"]
        if crd["metadata"]["name"] != f"{kind.plural}.{kind.group}" or spec["names"]["plural"] != kind.plural:
            problems.append(f"{kind.kind}: CRD name/plural do not match {kind.plural}.{kind.group}")
        if spec["scope"] != ("Namespaced" if kind.namespaced else "Cluster"):
            problems.append(f"{kind.kind}: scope {spec['scope']}")
        versions = {v["name"]: v for v in spec["versions"]}
        if sum(1 for v in versions.values() if v.get("storage")) != 1:
            problems.append(f"{kind.kind}: exactly one storage version")
        for version in kind.versions:
            v = versions.get(version)
            if v is None or not v.get("served"):
                problems.append(f"{kind.kind}: version {version} not served")
                continue
            schema = (v.get("schema") or {}).get("openAPIV3Schema")
            if not schema or schema.get("type") != "object":
                problems.append(f"{kind.kind} {version}: no structural openAPIV3Schema")
            else:
                problems += [f"{kind.kind} {version}: {e}" for e in _structural_errors(schema, "")]
    return problems


def test_every_custom_kind_in_the_registry_has_a_crd(objects):
    crds = _render(DEPLOY / "crds")
    assert all(c["kind"] == "CustomResourceDefinition" for c in crds)
    assert _crd_problems(KINDS, crds) == []
    rendered = {n for (k, n) in objects if k == "CustomResourceDefinition"}
    assert {c["metadata"]["name"] for c in crds} == rendered, "the base includes deploy/crds"


def test_the_crd_check_fails_for_a_custom_kind_without_one():
    from pilot.config.core import Service

    custom = Kind("networking.istio.io", ("v1",), "VirtualService", "virtualservices", True, Service)
    assert _crd_problems((custom,), []) == ["VirtualService.networking.istio.io: no CRD in deploy/crds"]
    crd = {"metadata": {"name": "virtualservices.networking.istio.io"},
           "spec": {"group": "networking.istio.io", "scope": "Namespaced",
                    "names": {"kind": "VirtualService", "plural": "virtualservices"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {"type": "object", "properties": {
                            "hosts": {"type": "array", "items": {"type": "string"}}}}}}}}]}}
    assert _crd_problems((custom,), [crd]) == []
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["x"] = {}
    assert _crd_problems((custom,), [crd]) == ["VirtualService v1: .spec.x: no type"]


# --- Dockerfile -----------------------------------------------------------------------------------
def _dockerfile_stages() -> list[list[str]]:
    """Instructions (continuations joined, comments dropped) grouped by FROM."""
    text = (ROOT / "Dockerfile").read_text()
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    stages: list[list[str]] = [[]]
    for line in lines:
        if line.split()[0].upper() == "FROM":
            stages.append([])
        stages[-1].append(line)
    return stages


def test_dockerfile_final_stage_is_small_and_non_root():
    stages = _dockerfile_stages()
    args = {m.group(1): m.group(2) for line in stages[0]
            if (m := re.fullmatch(r"ARG (\w+)=(\S+)", line))}
    assert len(stages) >= 3, "multi-stage: a builder and the final image"
    final = stages[-1]
    base = final[0].split()[1]
    base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), base)
    assert base == "python:3.11-slim"
    users = [line.split()[1] for line in final if line.upper().startswith("USER ")]
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) == 1337, "numeric, so the kubelet can verify runAsNonRoot"
    body = "\n".join(final).lower()
    for tool in ("gcc", "g++", "build-essential", "clang", "make ", "python3-dev", "libc6-dev"):
        assert tool not in body, f"{tool} in the final stage"
    assert not any(line.upper().startswith(("COPY . ", "ADD ")) for line in final), "no source tree in the image"
    assert 'ENTRYPOINT ["pilot-discovery"]' in final and 'CMD ["discovery"]' in final
    exposed = {int(p) for line in final if line.upper().startswith("EXPOSE ") for p in line.split()[1:]}
    assert exposed == PORTS
    assert any("pip wheel" in line for stage in stages[1:-1] for line in stage), "the builder builds wheels"


def test_dockerignore_keeps_the_context_small_but_buildable():
    patterns = {p.strip().rstrip("/") for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")}
    assert {".git", ".venv", "tests"} <= patterns
    assert "benchmarks" in patterns or "benchmarks/results" in patterns
    copied = {w for line in _dockerfile_stages()[1] if line.upper().startswith("COPY ") and "--from" not in line
              for w in line.split()[1:-1]}
    assert copied and not copied & patterns, f"the builder copies something .dockerignore excludes: {copied}"


def test_a_revision_install_is_named_and_selected_as_istiods_chart_names_it(objects):
    from pilot.config.mesh import parse_mesh_config
    from pilot.deploy_revision import revision_objects
    from pilot.features import Features
    from pilot.model.revisions import labels_in_revision

    docs = {(d["kind"], d["metadata"]["name"]): d for d in revision_objects("canary")}
    assert set(docs) == {
        ("ServiceAccount", "istiod-canary"), ("ClusterRole", "istiod-canary-istio-system"),
        ("ClusterRoleBinding", "istiod-canary-istio-system"), ("Role", "istiod-canary"),
        ("RoleBinding", "istiod-canary"), ("ConfigMap", "istio-canary"),
        ("ConfigMap", "istio-sidecar-injector-canary"), ("Deployment", "istiod-canary"),
        ("Service", "istiod-canary"), ("PodDisruptionBudget", "istiod-canary"),
        ("HorizontalPodAutoscaler", "istiod-canary"), ("MutatingWebhookConfiguration", "istio-sidecar-injector-canary"),
        ("ValidatingWebhookConfiguration", "istio-validator-canary-istio-system")}
    deployment, service = docs[("Deployment", "istiod-canary")], docs[("Service", "istiod-canary")]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    # The default revision's Service and Deployment do not select canary pods.
    base_service = objects[("Service", "istiod")]
    assert not base_service["spec"]["selector"].items() <= pod_labels.items()
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "istiod-canary"
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert Features.from_env(env).revision == "canary"
    assert {"name": "config-volume", "configMap": {"name": "istio-canary", "optional": True}} in pod["volumes"]
    mesh = parse_mesh_config(docs[("ConfigMap", "istio-canary")]["data"]["mesh"])
    assert mesh.default_config.discovery_address == "istiod-canary.istio-system.svc:15012"
    binding = docs[("ClusterRoleBinding", "istiod-canary-istio-system")]
    assert binding["roleRef"]["name"] == "istiod-canary-istio-system"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "istiod-canary", "namespace": "istio-system"}]
    for kind, name in (("MutatingWebhookConfiguration", "istio-sidecar-injector-canary"),
                       ("ValidatingWebhookConfiguration", "istio-validator-canary-istio-system")):
        assert {w["clientConfig"]["service"]["name"] for w in docs[(kind, name)]["webhooks"]} == {"istiod-canary"}
    (validator,) = docs[("ValidatingWebhookConfiguration", "istio-validator-canary-istio-system")]["webhooks"]
    selector = validator["objectSelector"]["matchExpressions"][0]
    assert selector == {"key": "istio.io/rev", "operator": "In", "values": ["canary"]}
    assert labels_in_revision({"istio.io/rev": "canary"}, "canary")
