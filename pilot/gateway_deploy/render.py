"""What istiod's Gateway API deployment controller creates for a Gateway, as pure functions.

The shapes follow istiod's `kube-gateway` template (istio-discovery/files/kube-gateway.yaml) and
deploymentcontroller.go: a ServiceAccount, a Deployment and a Service named `NAME-CLASS`
(`NAME-istio`), each owned by the Gateway (ownerReferences: the garbage collector removes them
with it) and labelled `gateway.istio.io/managed`; the pods run `pilot-agent proxy router` with the
env and volumes the sidecar gets (token for audience istio-ca, the istio-ca-root-cert ConfigMap,
pod info), pointing at this revision's Service for xDS and certificates.

Differences from istiod, deliberate: readiness is pilot-agent's own status port (15020, as for
injected sidecars), so the Service's `status-port` (15021) targets it; no `--stsPort`; no
HorizontalPodAutoscaler/PodDisruptionBudget (istiod renders those only from ConfigMap overlays,
which are refused: `parametersRef`); `gateway.istio.io/name-override` is not honoured (the
Gateway's status addresses name `NAME-CLASS`, pilot/model/gateway_api/listeners.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pilot.inject.pod import PROXY_CONFIG_ANNOTATION, effective_proxy_config, image, image_type

MANAGED_LABEL = "gateway.istio.io/managed"
MANAGED_VALUE = "istio.io-gateway-controller"  # the controller name with / as -
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
GATEWAY_CLASS_LABEL = "gateway.networking.k8s.io/gateway-class-name"
SERVICE_ACCOUNT_ANNOTATION = "gateway.istio.io/service-account"
SERVICE_TYPE_ANNOTATION = "networking.istio.io/service-type"
CONTROLLER_VERSION_ANNOTATION = "gateway.istio.io/controller-version"
CONTROLLER_VERSION = 5  # istiod 1.18+: a Gateway marked with a larger version is someone else's
DATAPLANE_MODE_LABEL = "istio.io/dataplane-mode"
# Never copied onto the deployed objects (kube-gateway.yaml's omit list).
OMITTED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration", "gateway.istio.io/name-override",
                       SERVICE_ACCOUNT_ANNOTATION, CONTROLLER_VERSION_ANNOTATION)
STATUS_PORT = 15020  # pilot-agent's readiness and merged metrics


@dataclass(frozen=True)
class Inputs:
    """Everything the objects depend on besides the Gateway."""

    revision: str = "default"
    values: Mapping[str, Any] = field(default_factory=dict)  # the injector's chart values
    mesh: Mapping[str, Any] = field(default_factory=dict)  # MeshConfig as users write it
    cluster_id: str = "Kubernetes"
    ambient_waypoints: bool = True


def default_name(name: str, class_name: str) -> str:
    return f"{name}-{class_name}"


def is_managed(spec: Any) -> bool:
    """istiod's IsManaged: a Gateway naming a Hostname address points at an existing deployment."""
    addresses = spec.addresses
    if not addresses:
        return True
    return len(addresses) == 1 and addresses[0].type == "IPAddress"


def controller_version_allows(annotations: Mapping[str, str]) -> bool:
    """Not ours when a newer (or unknown) controller version manages the Gateway."""
    cur = annotations.get(CONTROLLER_VERSION_ANNOTATION)
    if cur is None:
        return True
    try:
        return int(cur) <= CONTROLLER_VERSION
    except ValueError:
        return False


def _infra(gw: Any, labels: bool) -> dict[str, str]:
    """spec.infrastructure's labels/annotations (gateway.networking.k8s.io/ keys dropped), else the
    Gateway's own (istiod's default, PILOT_ENABLE_GATEWAY_API_COPY_LABELS_ANNOTATIONS)."""
    infra = gw.spec.infrastructure
    chosen = (infra.labels if labels else infra.annotations) if infra is not None else None
    if chosen:
        return {k: v for k, v in chosen.items() if not k.startswith("gateway.networking.k8s.io/")}
    return dict(gw.metadata.labels if labels else gw.metadata.annotations)


def service_ports(gw: Any, status_port: int = STATUS_PORT, merged: tuple = ()) -> list[dict[str, Any]]:
    """extractServicePorts: the status port, then one port per distinct listener port (the
    Gateway's, then `merged`: those of the ListenerSets it allows)."""
    ports = [{"name": "status-port", "port": 15021, "targetPort": status_port, "protocol": "TCP",
              "appProtocol": "tcp"}]
    used, seen = {"status-port"}, set()
    for i, listener in enumerate((*gw.spec.listeners, *merged)):
        if listener.port in seen:
            continue
        seen.add(listener.port)
        name = listener.name.replace(".", "-")[:63] or f"{listener.protocol.lower()}-{i}"
        candidate, suffix = name, f"-{listener.port}"
        while candidate in used:
            candidate = name[:63 - len(suffix)] + suffix
            suffix += "x"
        used.add(candidate)
        ports.append({"name": candidate, "port": listener.port, "protocol": "TCP",
                      "appProtocol": listener.protocol.lower()})
    return ports


def _owner(gw: Any) -> list[dict[str, str]]:
    return [{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "name": gw.metadata.name,
             "uid": gw.metadata.uid}]


def _field(path: str) -> dict:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def render(gw: Any, class_name: str, inputs: Inputs, merged: tuple = (),
           proxy_configs: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """ServiceAccount, Deployment and Service for a Gateway of class `class_name`; `merged`: the
    listeners of the ListenerSets it allows (their ports go on the Service too). `proxy_configs`
    (ProxyConfig resources) apply in istiod's precedence, as the injector applies them to pods:
    mesh defaultConfig, the root namespace's, the Gateway's namespace's, the Gateway's
    `proxy.istio.io/config` annotation, then the one whose selector matches the gateway pod's
    labels (its Gateway's labels plus `gateway.networking.k8s.io/gateway-name`)."""
    ns, name = gw.metadata.namespace, gw.metadata.name
    deployment_name = default_name(name, class_name)
    annotations = gw.metadata.annotations
    service_account = annotations.get(SERVICE_ACCOUNT_ANNOTATION) or deployment_name
    labels = _infra(gw, labels=True)
    if inputs.ambient_waypoints and DATAPLANE_MODE_LABEL not in labels and DATAPLANE_MODE_LABEL not in gw.metadata.labels:
        labels[DATAPLANE_MODE_LABEL] = "none"  # a gateway's pods are never captured by ztunnel
    infra_annotations = {k: v for k, v in _infra(gw, labels=False).items() if k not in OMITTED_ANNOTATIONS}
    base_labels = {**labels, GATEWAY_NAME_LABEL: name, GATEWAY_CLASS_LABEL: class_name}
    managed = {**base_labels, MANAGED_LABEL: MANAGED_VALUE}

    def meta(obj_name: str) -> dict[str, Any]:
        return {"name": obj_name, "namespace": ns, "labels": dict(managed), "annotations": dict(infra_annotations),
                "ownerReferences": _owner(gw)}

    values = inputs.values
    g = values.get("global") or {}
    proxy = g.get("proxy") or {}
    revision = inputs.revision
    istiod = "istiod" + ("" if revision in ("", "default") else f"-{revision}")
    ns_istio = g.get("istioNamespace") or "istio-system"
    proxy_config = effective_proxy_config(
        inputs.mesh, {k: v for k, v in annotations.items() if k == PROXY_CONFIG_ANNOTATION}, revision,
        proxy_configs=proxy_configs, namespace=ns, labels=base_labels)
    status_port = int(proxy_config.get("statusPort") or STATUS_PORT)  # mesh defaultConfig may move it
    trust_domain = inputs.mesh.get("trustDomain") or g.get("trustDomain") or "cluster.local"
    env = [
        {"name": "PILOT_CERT_PROVIDER", "value": g.get("pilotCertProvider") or "istiod"},
        {"name": "CA_ADDR", "value": g.get("caAddress") or f"{istiod}.{ns_istio}.svc:15012"},
        {"name": "POD_NAME", **_field("metadata.name")},
        {"name": "POD_NAMESPACE", **_field("metadata.namespace")},
        {"name": "INSTANCE_IP", **_field("status.podIP")},
        {"name": "SERVICE_ACCOUNT", **_field("spec.serviceAccountName")},
        {"name": "HOST_IP", **_field("status.hostIP")},
        {"name": "ISTIO_CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}}},
        {"name": "PROXY_CONFIG", "value": json.dumps(proxy_config, sort_keys=True)},
        {"name": "ISTIO_META_POD_PORTS", "value": "[]"},
        {"name": "ISTIO_META_APP_CONTAINERS", "value": ""},
        {"name": "ISTIO_META_CLUSTER_ID", "value": (g.get("multiCluster") or {}).get("clusterName") or inputs.cluster_id},
        {"name": "ISTIO_META_NODE_NAME", **_field("spec.nodeName")},
        {"name": "ISTIO_META_INTERCEPTION_MODE", "value": "REDIRECT"},
        {"name": "ISTIO_META_WORKLOAD_NAME", "value": deployment_name},
        {"name": "ISTIO_META_OWNER", "value": f"kubernetes://apis/apps/v1/namespaces/{ns}/deployments/{deployment_name}"},
        {"name": "ISTIO_META_MESH_ID", "value": g.get("meshID") or trust_domain},
        {"name": "TRUST_DOMAIN", "value": trust_domain},
    ]
    network = labels.get("topology.istio.io/network") or g.get("network")
    if network:
        after = next(i for i, e in enumerate(env) if e["name"] == "ISTIO_META_INTERCEPTION_MODE") + 1
        env.insert(after, {"name": "ISTIO_META_NETWORK", "value": network})
    for key, value in sorted((proxy_config.get("proxyMetadata") or {}).items()):
        env.append({"name": key, "value": str(value)})
    probe = {"httpGet": {"path": "/healthz/ready", "port": status_port, "scheme": "HTTP"}, "timeoutSeconds": 1,
             "successThreshold": 1}
    container = {
        "name": "istio-proxy",
        "image": image(values, proxy.get("image") or "proxyv2", annotations,
                       image_type(values, proxy_config, annotations)),
        "securityContext": {"capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": False,
                            "privileged": False, "readOnlyRootFilesystem": True, "runAsUser": 1337,
                            "runAsGroup": 1337, "runAsNonRoot": True},
        "ports": [{"containerPort": status_port, "name": "status-port", "protocol": "TCP"},
                  {"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"}],
        "args": ["proxy", "router", "--domain", f"$(POD_NAMESPACE).svc.{proxy.get('clusterDomain') or 'cluster.local'}",
                 "--proxyLogLevel", annotations.get("sidecar.istio.io/logLevel") or proxy.get("logLevel") or "warning",
                 "--proxyComponentLogLevel",
                 annotations.get("sidecar.istio.io/componentLogLevel") or proxy.get("componentLogLevel") or "misc:error",
                 "--log_output_level",
                 annotations.get("sidecar.istio.io/agentLogLevel") or (g.get("logging") or {}).get("level") or "default:info",
                 "--log_as_json"],
        "env": env,
        "startupProbe": {**probe, "failureThreshold": 30, "initialDelaySeconds": 1, "periodSeconds": 1},
        "readinessProbe": {**probe, "failureThreshold": 4, "initialDelaySeconds": 0, "periodSeconds": 15},
        "volumeMounts": [
            {"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"},
            {"name": "credential-socket", "mountPath": "/var/run/secrets/credential-uds"},
            {"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"},
            {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio"},
            {"name": "istio-data", "mountPath": "/var/lib/istio/data"},
            {"name": "istio-envoy", "mountPath": "/etc/istio/proxy"},
            {"name": "istio-token", "mountPath": "/var/run/secrets/tokens"},
            {"name": "istio-podinfo", "mountPath": "/etc/istio/pod"},
        ],
    }
    if g.get("imagePullPolicy"):
        container["imagePullPolicy"] = g["imagePullPolicy"]
    if proxy.get("resources"):
        container["resources"] = proxy["resources"]
    audience = ((g.get("sds") or {}).get("token") or {}).get("aud") or "istio-ca"
    pod_spec: dict[str, Any] = {
        "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]},
        "serviceAccountName": service_account,
        "containers": [container],
        "volumes": [
            {"name": "workload-socket", "emptyDir": {}},
            {"name": "credential-socket", "emptyDir": {}},
            {"name": "workload-certs", "emptyDir": {}},
            {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
            {"name": "istio-data", "emptyDir": {}},
            {"name": "istio-podinfo", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}},
            {"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
                "path": "istio-token", "expirationSeconds": 43200, "audience": audience}}]}},
            {"name": "istiod-ca-cert", "configMap": {"name": g.get("trustBundleName") or "istio-ca-root-cert"}},
        ],
    }
    if g.get("imagePullSecrets"):
        pod_spec["imagePullSecrets"] = [{"name": s} for s in g["imagePullSecrets"]]
    pod_annotations = {**infra_annotations, "istio.io/rev": revision or "default",
                       "prometheus.io/path": "/stats/prometheus", "prometheus.io/port": str(status_port),
                       "prometheus.io/scrape": "true"}
    pod_labels = {"sidecar.istio.io/inject": "false", "service.istio.io/canonical-name": deployment_name,
                  "service.istio.io/canonical-revision": "latest", **managed}
    service_type = annotations.get(SERVICE_TYPE_ANNOTATION) or "LoadBalancer"
    service_spec: dict[str, Any] = {"ipFamilyPolicy": "PreferDualStack", "ports": service_ports(gw, status_port, merged),
                                    "selector": {GATEWAY_NAME_LABEL: name}, "type": service_type}
    if gw.spec.addresses and service_type == "LoadBalancer":
        service_spec["loadBalancerIP"] = gw.spec.addresses[0].value
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(service_account)},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(deployment_name),
         "spec": {"selector": {"matchLabels": {GATEWAY_NAME_LABEL: name}},
                  "template": {"metadata": {"annotations": pod_annotations, "labels": pod_labels},
                               "spec": pod_spec}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta(deployment_name), "spec": service_spec},
    ]


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def name_problem(gw: Any, class_name: str) -> str | None:
    """Names the objects cannot take (the Service's must be a DNS label)."""
    svc = default_name(gw.metadata.name, class_name)
    if len(svc) > 63 or not _DNS_LABEL.match(svc):
        return f"the Service name {svc!r} is not a DNS label of at most 63 characters"
    return None
