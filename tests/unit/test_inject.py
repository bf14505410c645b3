"""The sidecar injector's core, through its entry point `review()` with real AdmissionReview v1
documents; each answer's JSONPatch is applied with the real `jsonpatch` library and the stored pod
checked field by field, as a user would `kubectl get pod -o yaml` it."""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from pilot.inject import annotations as anno
from pilot.inject.config import InjectorConfigHolder, default_config, default_config_text, default_values_text
from pilot.inject.review import InjectionContext, parse_inject_path, review, review_bytes
from tests.support.admission import apply, container, deployment_pod, env, review_request

NS_LABELS = {
    "shop": {"istio-injection": "enabled"},
    "plain": {},
    "off": {"istio-injection": "disabled"},
    "rev-default": {"istio.io/rev": "default"},
    "rev-canary": {"istio.io/rev": "canary"},
    "kube-system": {"istio-injection": "enabled"},
}
CONFIG = default_config()


def ctx(**kw) -> InjectionContext:
    kw.setdefault("config", CONFIG)
    kw.setdefault("namespace_labels", NS_LABELS.get)
    return InjectionContext(**kw)


def inject(pod: dict, c: InjectionContext | None = None, path: str = "/inject") -> tuple[dict, dict]:
    resp = review(review_request(pod), c or ctx(), path)
    return resp, apply(resp, pod)


def skipped(pod: dict, c: InjectionContext | None = None) -> bool:
    r = review(review_request(pod), c or ctx())["response"]
    assert r["allowed"] is True, r
    return "patch" not in r


def refused(pod: dict, c: InjectionContext | None = None) -> str:
    r = review(review_request(pod), c or ctx())["response"]
    assert r["allowed"] is False and "patch" not in r, r
    return r["status"]["message"]


# --- what a new pod gets ------------------------------------------------------------------------
def test_a_deployment_pod_gets_istio_proxy_istio_init_volumes_and_metadata():
    pod = deployment_pod()
    req = review_request(pod)
    resp = review(req, ctx())
    out = apply(resp, pod)
    assert resp["apiVersion"] == "admission.k8s.io/v1" and resp["kind"] == "AdmissionReview"
    assert resp["response"]["uid"] == req["request"]["uid"]
    spec = out["spec"]
    assert [c["name"] for c in spec["containers"]] == [
        "web",
        "istio-proxy",
    ]  # the proxy last: kubectl exec -> app
    assert [c["name"] for c in spec["initContainers"]] == ["istio-init"]
    assert container(out, "web") == pod["spec"]["containers"][0]  # the app container untouched (no probes)

    proxy = container(out, "istio-proxy")
    assert proxy["image"] == "docker.io/istio/proxyv2:1.28.0"
    assert proxy["command"] == ["pilot-agent"] and proxy["workingDir"] == "/"
    assert proxy["args"] == [
        "proxy",
        "sidecar",
        "--domain",
        "$(POD_NAMESPACE).svc.cluster.local",
        "--proxyLogLevel=warning",
        "--proxyComponentLogLevel=misc:error",
        "--log_output_level=default:info",
    ]
    e = env(proxy)
    assert e["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert e["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert e["INSTANCE_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert e["SERVICE_ACCOUNT"] == {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}
    assert e["CA_ADDR"] == "istiod.istio-system.svc:15012"
    assert json.loads(e["PROXY_CONFIG"]) == {
        "discoveryAddress": "istiod.istio-system.svc:15012",
        "statusPort": 15020,
    }
    assert e["ISTIO_META_WORKLOAD_NAME"] == "web"  # the Deployment, from the ReplicaSet owner
    assert e["ISTIO_META_OWNER"] == "kubernetes://apis/apps/v1/namespaces/shop/deployments/web"
    assert e["ISTIO_META_MESH_ID"] == "cluster.local" and e["TRUST_DOMAIN"] == "cluster.local"
    assert e["ISTIO_META_CLUSTER_ID"] == "Kubernetes" and e["ISTIO_META_INTERCEPTION_MODE"] == "REDIRECT"
    assert e["ISTIO_META_APP_CONTAINERS"] == "web"
    assert json.loads(e["ISTIO_META_POD_PORTS"]) == [
        {"containerPort": 8080, "name": "http", "protocol": "TCP"}
    ]
    assert proxy["ports"] == [{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}]
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/healthz/ready", "port": 15020}
    assert proxy["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "2000m", "memory": "1024Mi"},
    }
    sc = proxy["securityContext"]
    assert sc["runAsUser"] == 1337 and sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in proxy["volumeMounts"]}
    # The agent reads ./var/run/secrets/... relative to its working directory "/".
    assert mounts["/var/run/secrets/tokens"] == "istio-token"
    assert mounts["/var/run/secrets/istio"] == "istiod-ca-cert"
    assert mounts["/var/run/secrets/workload-spiffe-uds"] == "workload-socket"
    assert mounts["/etc/istio/proxy"] == "istio-envoy" and mounts["/etc/istio/pod"] == "istio-podinfo"

    volumes = {v["name"]: v for v in spec["volumes"]}
    token = volumes["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token == {"path": "istio-token", "expirationSeconds": 43200, "audience": "istio-ca"}
    assert volumes["istiod-ca-cert"]["configMap"] == {"name": "istio-ca-root-cert"}
    assert volumes["istio-envoy"]["emptyDir"] == {"medium": "Memory"}
    assert volumes["workload-socket"]["emptyDir"] == {}
    assert [i["path"] for i in volumes["istio-podinfo"]["downwardAPI"]["items"]] == ["labels", "annotations"]

    init = container(out, "istio-init", "initContainers")
    assert init["args"] == [
        "istio-iptables",
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "-m",
        "REDIRECT",
        "-i",
        "*",
        "-x",
        "",
        "-b",
        "*",
        "-d",
        "15090,15021,15020",
        "--log_output_level=default:info",
    ]
    assert init["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_RAW"]
    assert init["securityContext"]["runAsUser"] == 0

    meta = out["metadata"]
    assert meta["labels"]["security.istio.io/tlsMode"] == "istio"
    assert meta["labels"]["service.istio.io/canonical-name"] == "web"
    assert meta["labels"]["service.istio.io/canonical-revision"] == "latest"
    assert meta["annotations"]["kubectl.kubernetes.io/default-container"] == "web"
    assert meta["annotations"]["istio.io/rev"] == "default"
    status = json.loads(meta["annotations"]["sidecar.istio.io/status"])
    assert status == {
        "initContainers": ["istio-init"],
        "containers": ["istio-proxy"],
        "volumes": [
            "workload-socket",
            "credential-socket",
            "workload-certs",
            "istio-envoy",
            "istio-data",
            "istio-podinfo",
            "istio-token",
            "istiod-ca-cert",
            "istio-ca-crl",
        ],
        "imagePullSecrets": None,
        "revision": "default",
    }
    assert meta["managedFields"] == pod["metadata"]["managedFields"]  # never in the patch


def test_existing_init_containers_run_before_istio_init_and_their_volumes_stay():
    pod = deployment_pod(
        init_containers=[{"name": "migrate", "image": "migrate:1"}],
        volumes=[{"name": "data", "emptyDir": {}}],
    )
    _, out = inject(pod)
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["migrate", "istio-init"]
    assert out["spec"]["volumes"][0] == {"name": "data", "emptyDir": {}}


def test_probes_are_rewritten_to_the_agent_and_the_originals_handed_over():
    app = {
        "name": "web",
        "image": "nginx",
        "ports": [{"containerPort": 8080, "name": "http"}],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http", "scheme": "HTTPS"},
            "timeoutSeconds": 2,
        },
        "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 7},
        "startupProbe": {"grpc": {"port": 9090}},
    }
    _, out = inject(deployment_pod(containers=[app]))
    web = container(out, "web")
    assert web["readinessProbe"] == {
        "httpGet": {"path": "/app-health/web/readyz", "port": 15020, "scheme": "HTTP"},
        "timeoutSeconds": 2,
    }
    assert web["livenessProbe"] == {
        "httpGet": {"path": "/app-health/web/livez", "port": 15020},
        "periodSeconds": 7,
    }
    assert web["startupProbe"] == {"httpGet": {"path": "/app-health/web/startupz", "port": 15020}}
    probers = json.loads(env(container(out, "istio-proxy"))["ISTIO_KUBE_APP_PROBERS"])
    assert probers == {
        "/app-health/web/readyz": {
            "httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTPS"},
            "timeoutSeconds": 2,
        },
        "/app-health/web/livez": {"tcpSocket": {"port": 8080}},
        "/app-health/web/startupz": {"grpc": {"port": 9090}},
    }
    # Opting out keeps the probes as written.
    _, kept = inject(
        deployment_pod(containers=[app], annotations={"sidecar.istio.io/rewriteAppHTTPProbers": "false"})
    )
    assert container(kept, "web")["readinessProbe"] == app["readinessProbe"]
    assert "ISTIO_KUBE_APP_PROBERS" not in env(container(kept, "istio-proxy"))


def test_prometheus_annotations_point_at_the_agent_and_the_app_endpoint_is_kept():
    pod = deployment_pod(
        annotations={
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9102",
            "prometheus.io/path": "/metrics",
        }
    )
    _, out = inject(pod)
    a = out["metadata"]["annotations"]
    assert (a["prometheus.io/port"], a["prometheus.io/path"], a["prometheus.io/scrape"]) == (
        "15020",
        "/stats/prometheus",
        "true",
    )
    assert json.loads(env(container(out, "istio-proxy"))["ISTIO_PROMETHEUS_ANNOTATIONS"]) == {
        "scrape": "true",
        "path": "/metrics",
        "port": "9102",
    }
    # Even without the app's own annotations, merged metrics are advertised, as istiod does.
    _, bare = inject(deployment_pod())
    assert bare["metadata"]["annotations"]["prometheus.io/port"] == "15020"
    _, off = inject(deployment_pod(annotations={"prometheus.istio.io/merge-metrics": "false"}))
    assert "prometheus.io/port" not in off["metadata"]["annotations"]
    assert "reserved for Istio" in refused(deployment_pod(annotations={"prometheus.io/port": "15090"}))


def test_the_annotations_users_set_most():
    pod = deployment_pod(
        annotations={
            "sidecar.istio.io/proxyCPU": "250m",
            "sidecar.istio.io/proxyMemory": "256Mi",
            "sidecar.istio.io/proxyCPULimit": "1",
            "sidecar.istio.io/proxyMemoryLimit": "512Mi",
            "sidecar.istio.io/proxyImage": "registry.example/mesh/proxy:9",
            "sidecar.istio.io/logLevel": "debug",
            "sidecar.istio.io/componentLogLevel": "upstream:debug,misc:error",
            "traffic.sidecar.istio.io/includeOutboundIPRanges": "10.0.0.0/8,172.16.0.0/12",
            "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.96.0.1/32",
            "traffic.sidecar.istio.io/includeInboundPorts": "8080,9090",
            "traffic.sidecar.istio.io/excludeInboundPorts": "9999",
            "traffic.sidecar.istio.io/excludeOutboundPorts": "5432,6379",
            "proxy.istio.io/config": "holdApplicationUntilProxyStarts: true\nconcurrency: 1\n",
        }
    )
    _, out = inject(pod)
    proxy = container(out, "istio-proxy")
    assert proxy["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    assert proxy["image"] == "registry.example/mesh/proxy:9"
    assert "--proxyLogLevel=debug" in proxy["args"]
    assert "--proxyComponentLogLevel=upstream:debug,misc:error" in proxy["args"]
    init = container(out, "istio-init", "initContainers")
    assert init["image"] == "registry.example/mesh/proxy:9"
    args = init["args"]
    pairs = dict(zip(args[1::2], args[2::2], strict=False))
    assert pairs["-i"] == "10.0.0.0/8,172.16.0.0/12" and pairs["-x"] == "10.96.0.1/32"
    assert (
        pairs["-b"] == "8080,9090" and pairs["-d"] == "15090,15021,9999,15020" and pairs["-o"] == "5432,6379"
    )
    # holdApplicationUntilProxyStarts: the proxy first, and the app starts once `pilot-agent wait` returns.
    assert [c["name"] for c in out["spec"]["containers"]] == ["istio-proxy", "web"]
    assert proxy["lifecycle"] == {"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}}
    pc = json.loads(env(proxy)["PROXY_CONFIG"])
    assert pc["holdApplicationUntilProxyStarts"] is True and pc["concurrency"] == 1


def test_status_port_zero_leaves_probes_and_metrics_alone():
    app = {"name": "web", "image": "nginx", "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}}}
    pod = deployment_pod(containers=[app], annotations={"status.sidecar.istio.io/port": "0"})
    _, out = inject(pod)
    assert container(out, "web")["readinessProbe"] == app["readinessProbe"]
    assert "readinessProbe" not in container(out, "istio-proxy")
    assert "prometheus.io/port" not in out["metadata"]["annotations"]
    assert json.loads(env(container(out, "istio-proxy"))["PROXY_CONFIG"])["statusPort"] == 0


def test_interception_modes():
    _, none = inject(deployment_pod(annotations={"sidecar.istio.io/interceptionMode": "NONE"}))
    assert "initContainers" not in none["spec"]  # no iptables: no istio-init
    assert env(container(none, "istio-proxy"))["ISTIO_META_INTERCEPTION_MODE"] == "NONE"
    _, tproxy = inject(deployment_pod(annotations={"sidecar.istio.io/interceptionMode": "TPROXY"}))
    init = container(tproxy, "istio-init", "initContainers")
    assert init["args"][init["args"].index("-m") + 1] == "TPROXY"
    sc = container(tproxy, "istio-proxy")["securityContext"]
    assert sc["capabilities"]["add"] == ["NET_ADMIN"] and sc["runAsUser"] == 0


def test_native_sidecars_put_istio_proxy_among_init_containers():
    pod = deployment_pod(init_containers=[{"name": "migrate", "image": "migrate:1"}])
    _, out = inject(pod, ctx(native_sidecars=True))
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["istio-init", "istio-proxy", "migrate"]
    assert container(out, "istio-proxy", "initContainers")["restartPolicy"] == "Always"
    assert [c["name"] for c in out["spec"]["containers"]] == ["web"]
    # The annotation wins over the knob, both ways.
    _, off = inject(
        deployment_pod(annotations={"sidecar.istio.io/nativeSidecar": "false"}), ctx(native_sidecars=True)
    )
    assert [c["name"] for c in off["spec"]["containers"]] == ["web", "istio-proxy"]
    _, on = inject(deployment_pod(annotations={"sidecar.istio.io/nativeSidecar": "true"}))
    assert "istio-proxy" in [c["name"] for c in on["spec"]["initContainers"]]


def test_a_user_defined_istio_proxy_container_customises_the_injected_one():
    pod = deployment_pod(
        containers=[
            {"name": "web", "image": "nginx"},
            {
                "name": "istio-proxy",
                "image": "auto",
                "resources": {"limits": {"memory": "2Gi"}},
                "env": [{"name": "EXTRA", "value": "1"}],
            },
        ]
    )
    _, out = inject(pod)
    proxy = container(out, "istio-proxy")
    assert proxy["image"] == "docker.io/istio/proxyv2:1.28.0"  # `auto` keeps the injected image
    # The user's fields are merged over the injected ones (istiod re-applies them as a strategic merge).
    assert proxy["resources"]["limits"] == {"cpu": "2000m", "memory": "2Gi"}
    assert env(proxy)["EXTRA"] == "1" and env(proxy)["CA_ADDR"] == "istiod.istio-system.svc:15012"
    assert [c["name"] for c in out["spec"]["containers"]] == ["web", "istio-proxy"]


def test_cluster_and_network_from_the_inject_path():
    assert parse_inject_path("/inject/cluster/east/net/network--slash--1") == {
        "ISTIO_META_CLUSTER_ID": "east",
        "ISTIO_META_NETWORK": "network/1",
    }
    assert parse_inject_path("/inject/:ENV:cluster=west:ENV:net=n2") == {
        "ISTIO_META_CLUSTER_ID": "west",
        "ISTIO_META_NETWORK": "n2",
    }
    assert parse_inject_path("/inject") == parse_inject_path("/inject/") == {}
    _, out = inject(deployment_pod(), path="/inject/cluster/east/net/n1")
    e = env(container(out, "istio-proxy"))
    assert e["ISTIO_META_CLUSTER_ID"] == "east" and e["ISTIO_META_NETWORK"] == "n1"
    assert out["metadata"]["labels"]["topology.istio.io/network"] == "n1"


# --- selection ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("namespace", "pod_labels", "revision", "injected"),
    [
        ("shop", {}, "default", True),
        ("shop", {"sidecar.istio.io/inject": "false"}, "default", False),
        ("off", {"sidecar.istio.io/inject": "true"}, "default", False),
        ("plain", {}, "default", False),
        ("plain", {"sidecar.istio.io/inject": "true"}, "default", True),
        ("plain", {"istio.io/rev": "default"}, "default", True),
        ("plain", {"istio.io/rev": "canary"}, "default", False),
        ("rev-default", {}, "default", True),
        ("rev-canary", {}, "default", False),
        ("rev-canary", {}, "canary", True),
        ("plain", {"istio.io/rev": "canary"}, "canary", True),
        ("shop", {}, "canary", False),  # a revision ignores the legacy istio-injection label
        ("plain", {"sidecar.istio.io/inject": "true"}, "canary", False),
        ("rev-canary", {"sidecar.istio.io/inject": "false"}, "canary", False),
        (
            "nowhere",
            {"sidecar.istio.io/inject": "true"},
            "default",
            True,
        ),  # namespace unknown: object selector only
        ("nowhere", {}, "default", True),
    ],
)
def test_webhook_selection_as_istiod(namespace, pod_labels, revision, injected):
    pod = deployment_pod(namespace=namespace, labels=pod_labels)
    assert skipped(pod, ctx(revision=revision)) is not injected


def test_policy_and_injector_selectors():
    disabled = InjectorConfigHolder()
    assert (
        disabled.update(
            default_config_text().replace("policy: enabled", "policy: disabled"), default_values_text()
        )
        is None
    )
    c = ctx(config=disabled)
    assert skipped(deployment_pod(), c)  # namespace enabled, policy disabled: only opted-in pods
    assert not skipped(deployment_pod(labels={"sidecar.istio.io/inject": "true"}), c)
    assert not skipped(deployment_pod(annotations={"sidecar.istio.io/inject": "true"}), c)
    selectors = (
        default_config_text()
        .replace("alwaysInjectSelector: []", "alwaysInjectSelector: [{matchLabels: {mesh: always}}]")
        .replace(
            "neverInjectSelector: []",
            "neverInjectSelector: [{matchExpressions: [{key: batch, operator: Exists}]}]",
        )
    )
    holder = InjectorConfigHolder()
    assert (
        holder.update(selectors.replace("policy: enabled", "policy: disabled"), default_values_text()) is None
    )
    c = ctx(config=holder)
    assert not skipped(deployment_pod(labels={"mesh": "always"}), c)
    assert skipped(deployment_pod(labels={"mesh": "always", "batch": "yes"}), c)  # never wins
    assert not skipped(
        deployment_pod(labels={"batch": "yes", "sidecar.istio.io/inject": "true"}), c
    )  # the label wins


def test_host_network_system_namespaces_and_injected_pods_are_skipped():
    assert skipped(deployment_pod(hostNetwork=True))
    assert skipped(deployment_pod(namespace="kube-system"))
    _, once = inject(deployment_pod())
    assert skipped(once)


# --- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("annotations", "wanted"),
    [
        ({"sidecar.istio.io/interceptionMode": "IPVS"}, "'sidecar.istio.io/interceptionMode'"),
        ({"sidecar.istio.io/proxyCPU": "lots"}, "'sidecar.istio.io/proxyCPU'"),
        (
            {"traffic.sidecar.istio.io/excludeInboundPorts": "80,http"},
            "'traffic.sidecar.istio.io/excludeInboundPorts'",
        ),
        ({"traffic.sidecar.istio.io/includeOutboundIPRanges": "10.0.0.0/33"}, "includeOutboundIPRanges"),
        ({"sidecar.istio.io/logLevel": "loud"}, "'sidecar.istio.io/logLevel'"),
        ({"proxy.istio.io/config": "statusPort: [1]"}, "ProxyConfig.statusPort"),
        ({"proxy.istio.io/config": "{"}, "proxy.istio.io/config"),
        ({"sidecar.istio.io/bootstrapOverride": "my-bootstrap"}, "is not supported"),
        ({"inject.istio.io/templates": "sidecar,gateway"}, "requested template 'gateway' not found"),
    ],
)
def test_a_bad_annotation_is_refused_naming_it(annotations, wanted):
    message = refused(deployment_pod(annotations=annotations))
    assert message.startswith("Pod injection failed: ") and wanted in message, message


def test_an_app_port_the_sidecar_needs_is_refused():
    pod = deployment_pod(containers=[{"name": "web", "image": "x", "ports": [{"containerPort": 15090}]}])
    assert "container 'web' port 15090 conflicts" in refused(pod)


_AR = b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", '
_REQ = _AR + b'"request": {"uid": "u", "namespace": "shop", '


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"[]",
        b'"x"',
        b"null",
        b'{"kind": "AdmissionReview"}',
        _AR[:-2] + b"}",
        _AR + b'"request": {"uid": "u"}}',
        _AR + b'"request": {"uid": "u", "object": []}}',
        _REQ + b'"object": {"metadata": {"labels": []}, "spec": {}}}}',
        _REQ + b'"object": {"metadata": {"labels": {"a": 1}}, "spec": {}}}}',
        _REQ + b'"object": {"metadata": {}, "spec": {"containers": {"a": 1}}}}}',
        _REQ + b'"object": {"metadata": {}, "spec": {"containers": [1, "x", null]}}}}',
        _REQ + b'"object": {"metadata": {}, "spec": {"containers": [{"name": "a", "readinessProbe": 3}]}}}}',
        b"\xff\xfe",
    ],
)
def test_a_malformed_review_is_refused_with_a_message_never_a_crash(body):
    resp = review_bytes(body, ctx())
    assert resp["kind"] == "AdmissionReview" and resp["apiVersion"] == "admission.k8s.io/v1"
    r = resp["response"]
    assert r["allowed"] is False and r["status"]["message"], r
    assert "internal error" not in r["status"]["message"], r


def test_not_a_pod_create_is_allowed_untouched():
    req = review_request(deployment_pod(), operation="UPDATE")
    assert review(req, ctx())["response"] == {"uid": req["request"]["uid"], "allowed": True}


# --- the configuration --------------------------------------------------------------------------
def test_a_broken_template_is_reported_and_the_last_good_one_keeps_serving():
    holder = InjectorConfigHolder()
    c = ctx(config=holder)
    broken = default_config_text().replace("{%- if native %}", "{%- if native %", 1)
    error = holder.update(broken, default_values_text())
    assert error is not None and "'sidecar'" in error and "line" in error, error
    assert holder.last_error == error
    assert not skipped(deployment_pod(), c)  # still injecting with the previous template
    bad_output = default_config_text().replace(
        "  sidecar: |\n", "  sidecar: |\n    {{ Values.nope | j }}\n", 1
    )
    assert "fails on a sample pod" in holder.update(bad_output, default_values_text())
    assert holder.update("policy: sometimes", "") is not None
    assert holder.update(default_config_text(), "{not json") is not None
    # A good edit is applied.
    custom = (
        default_config_text()
        .replace('"--proxyLogLevel=" ~', '"--proxyLogLevel=" ~ "" ~', 1)
        .replace("injectedAnnotations: {}", "injectedAnnotations: {team: mesh}")
    )
    assert holder.update(custom, json.dumps({"global": {"hub": "registry.example", "tag": "2"}})) is None
    _, out = inject(deployment_pod(), c)
    assert container(out, "istio-proxy")["image"] == "registry.example/proxyv2:2"
    assert out["metadata"]["annotations"]["team"] == "mesh"


def test_template_values_cannot_break_the_document():
    tricky = 'x"\n  evil: {y: 1}\n#'
    _, out = inject(deployment_pod(labels={"service.istio.io/canonical-revision": tricky}))
    assert out["metadata"]["labels"]["service.istio.io/canonical-revision"] == tricky
    assert "evil" not in out["metadata"]


def test_the_shipped_configmap_and_webhooks_are_generated_from_the_code():
    from pilot.inject import deploy

    assert deploy.CONFIGMAP_PATH.read_text() == deploy.configmap_yaml(), "run python -m pilot.inject.deploy"
    assert deploy.WEBHOOK_PATH.read_text() == deploy.webhook_yaml(), "run python -m pilot.inject.deploy"
    cm = yaml.safe_load(deploy.CONFIGMAP_PATH.read_text())
    holder = InjectorConfigHolder()
    assert holder.update_from_configmap(cm["data"]) is None
    mwc = yaml.safe_load(deploy.WEBHOOK_PATH.read_text())
    assert [w["name"] for w in mwc["webhooks"]] == [
        "rev.namespace.sidecar-injector.istio.io",
        "rev.object.sidecar-injector.istio.io",
        "namespace.sidecar-injector.istio.io",
        "object.sidecar-injector.istio.io",
    ]
    for w in mwc["webhooks"]:
        assert w["clientConfig"]["caBundle"] == "" and w["clientConfig"]["service"]["path"] == "/inject"
        assert w["failurePolicy"] == "Fail" and w["admissionReviewVersions"] == ["v1"]


def test_docs_list_exactly_the_honoured_annotations():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "injection.md").read_text()
    begin, end = "<!-- annotations:begin -->\n", "<!-- annotations:end -->"
    assert docs[docs.index(begin) + len(begin) : docs.index(end)] == anno.markdown_table(), (
        "docs/injection.md is stale: python -m pilot.inject.docs"
    )


def test_patch_is_base64_json_patch():
    resp = review(review_request(deployment_pod()), ctx())
    ops = json.loads(base64.b64decode(resp["response"]["patch"]))
    assert ops and all(op["op"] in ("add", "replace", "remove", "move", "copy") for op in ops)
    assert not any(op["path"].startswith("/metadata/managedFields") for op in ops)


def test_context_from_the_environment_and_metrics():
    from prometheus_client import generate_latest

    from pilot.inject.metrics import InjectionMetrics

    m = InjectionMetrics()
    c = InjectionContext.from_env(
        CONFIG, NS_LABELS.get, metrics=m, environ={"REVISION": "canary", "ENABLE_NATIVE_SIDECARS": "true"}
    )
    assert c.revision == "canary" and c.native_sidecars is True
    assert InjectionContext.from_env(CONFIG, NS_LABELS.get, environ={}).native_sidecars is False  # auto
    canary = deployment_pod(namespace="rev-canary")
    e = env(container(apply(review(review_request(canary), c), canary), "istio-proxy", "initContainers"))
    assert e["CA_ADDR"] == "istiod-canary.istio-system.svc:15012"  # the revision's istiod
    assert json.loads(e["PROXY_CONFIG"])["discoveryAddress"] == "istiod-canary.istio-system.svc:15012"
    review(review_request(deployment_pod(namespace="shop")), c)  # not this revision's
    review_bytes(b"{", c)
    text = generate_latest(m.registry).decode()
    for line in (
        "sidecar_injection_requests_total 3.0",
        "sidecar_injection_success_total 1.0",
        "sidecar_injection_skip_total 1.0",
        "sidecar_injection_failure_total 1.0",
        "sidecar_injection_time_seconds_count 3.0",
    ):
        assert line in text, text


def test_wired_to_the_store_namespaces_and_the_configmap():
    from pilot.config.core import ConfigMap, Namespace
    from pilot.inject import store as wiring
    from pilot.model.store import Store

    s = Store()
    s.apply(
        Namespace.model_validate(
            {"apiVersion": "v1", "metadata": {"name": "shop", "labels": {"istio-injection": "enabled"}}}
        )
    )
    holder = InjectorConfigHolder()
    wiring.follow_configmap(s, holder)
    c = ctx(config=holder, namespace_labels=wiring.namespace_labels(s))
    assert not skipped(deployment_pod(namespace="shop"), c)
    assert skipped(deployment_pod(namespace="other", labels={"sidecar.istio.io/inject": "false"}), c)
    s.apply(Namespace.model_validate({"apiVersion": "v1", "metadata": {"name": "other"}}))
    assert skipped(deployment_pod(namespace="other"), c)  # known and not selected

    def configmap(config: str) -> ConfigMap:
        return ConfigMap.model_validate(
            {
                "apiVersion": "v1",
                "metadata": {"name": "istio-sidecar-injector", "namespace": "istio-system"},
                "data": {"config": config, "values": default_values_text()},
            }
        )

    s.apply(configmap(default_config_text().replace("policy: enabled", "policy: disabled")))
    assert skipped(deployment_pod(namespace="shop"), c)
    s.apply(configmap("templates: {sidecar: '{{ oops'}"))  # rejected: the disabled policy stays
    assert holder.last_error and skipped(deployment_pod(namespace="shop"), c)


def test_renders_shared_between_pods_never_leak_one_pods_customisation_into_another():
    custom = deployment_pod(
        containers=[
            {
                "name": "web",
                "image": "nginx",
                "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
            },
            {"name": "istio-proxy", "image": "auto", "env": [{"name": "EXTRA", "value": "1"}]},
        ]
    )
    plain = deployment_pod()
    for _ in range(2):  # the second round hits the parse cache the first one filled
        _, a = inject(custom)
        _, b = inject(plain)
        assert env(container(a, "istio-proxy"))["EXTRA"] == "1"
        assert "EXTRA" not in env(container(b, "istio-proxy"))
        assert b == inject(plain)[1]


def test_a_probe_with_an_empty_http_get_still_gets_the_pod_injected():
    # Mutating admission runs before the apiserver validates the pod, so a probe without a port
    # reaches the injector; it is handed over as written instead of failing the injection.
    app = {"name": "web", "image": "nginx", "livenessProbe": {"httpGet": {}}}
    _, out = inject(deployment_pod(containers=[app]))
    probers = json.loads(env(container(out, "istio-proxy"))["ISTIO_KUBE_APP_PROBERS"])
    assert probers == {"/app-health/web/livez": {"httpGet": {}}}
