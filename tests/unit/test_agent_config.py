"""pilot-agent's configuration, node metadata, bootstrap (checked by the real Envoy in validate mode),
CSR and renewal schedule."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from pilot.agent import config
from pilot.agent.bootstrap import envoy_bootstrap, node_metadata, parse_downward_api
from pilot.agent.ca_client import new_key_and_csr
from pilot.agent.config import ConfigError
from pilot.agent.secrets import WorkloadSecret, renewal_delay
from pilot.security.pki import ROOT_CERT_FILE, generate_root
from tests.support.envoy import envoy_binary

BASE_ENV = {"POD_NAME": "reviews-v1-5b7f9c8d6d-abcde", "POD_NAMESPACE": "bookinfo", "SERVICE_ACCOUNT": "reviews",
            "INSTANCE_IP": "10.1.2.3"}


def load(env: dict | None = None, *, mesh: str = "", proxy_type: str = "sidecar", **overrides):
    files = {config.MESH_CONFIG_PATH: mesh}
    return config.load(proxy_type=proxy_type, env={**BASE_ENV, **(env or {})}, overrides=overrides,
                       find_envoy=config.find_envoy, read_file=lambda p: files.get(p, ""))


def test_defaults_follow_istio_agent():
    cfg, warnings = load()
    assert warnings == []
    assert cfg.node_id == "sidecar~10.1.2.3~reviews-v1-5b7f9c8d6d-abcde.bookinfo~bookinfo.svc.cluster.local"
    assert cfg.spiffe_id == "spiffe://cluster.local/ns/bookinfo/sa/reviews"
    assert cfg.discovery_address == cfg.ca_address == "istiod.istio-system.svc:15012"
    assert cfg.istiod_san == "istiod.istio-system.svc"
    assert (cfg.proxy.proxy_admin_port, cfg.proxy.status_port, cfg.proxy.concurrency) == (15000, 15020, 2)
    assert (cfg.secret_ttl, cfg.grace_ratio, cfg.grace_jitter) == (86400.0, 0.5, 0.01)
    assert cfg.envoy_binary.endswith("envoy")
    router, _ = load(proxy_type="router", domain="istio-system.svc.example.org")
    assert router.node_id == "router~10.1.2.3~reviews-v1-5b7f9c8d6d-abcde.bookinfo~istio-system.svc.example.org"
    with pytest.raises(ConfigError, match="unknown proxy type 'ztunnel'"):
        load(proxy_type="ztunnel")


def test_proxy_config_layers_flags_and_proxy_metadata():
    mesh = ("defaultConfig:\n  discoveryAddress: istiod.mesh.svc:15012\n  proxyAdminPort: 15001\n  statNameLength: 189\n"
            "  gatewayTopology: {numTrustedProxies: 1, proxyProtocol: {}}\n")
    cfg, warnings = load({
        "PROXY_CONFIG": json.dumps({"proxyAdminPort": 0, "concurrency": 4,
                                    "proxyMetadata": {"SECRET_TTL": "1h", "ISTIO_META_DNS_CAPTURE": "true"}}),
        "CA_ADDR": "ca.example:443", "ISTIOD_SAN": "istiod.custom"}, mesh=mesh, statusPort=0, concurrency=1)
    assert cfg.discovery_address == "istiod.mesh.svc:15012"  # from the mesh's defaultConfig
    assert cfg.proxy.proxy_admin_port == 0  # PROXY_CONFIG over the mesh
    assert cfg.proxy.concurrency == 1 and cfg.proxy.status_port == 0  # flags over both
    assert cfg.secret_ttl == 3600.0  # proxyMetadata configures the agent, as istio-agent's env does
    assert cfg.ca_address == "ca.example:443" and cfg.istiod_san == "istiod.custom"
    # numTrustedProxies is read by the control plane (gateway listeners), from PROXY_CONFIG.
    assert warnings == ["./etc/istio/config/mesh defaultConfig: field 'statNameLength' is not used by pilot-agent",
                        "./etc/istio/config/mesh defaultConfig: field 'gatewayTopology.proxyProtocol' is not used"]
    md, _ = node_metadata(cfg)
    assert md["PROXY_CONFIG"]["gatewayTopology"]["numTrustedProxies"] == 1
    assert md["DNS_CAPTURE"] == "true"
    # An IP discovery address: istiod's default service name is verified.
    cfg, _ = load({"PROXY_CONFIG": "discoveryAddress: 127.0.0.1:15012"})
    assert cfg.istiod_san == "istiod.istio-system.svc"


@pytest.mark.parametrize(("env", "overrides", "message"), [
    ({"PROXY_CONFIG": "proxyAdminPort: [1"}, {}, "PROXY_CONFIG: not valid YAML"),
    ({"PROXY_CONFIG": "- a"}, {}, "PROXY_CONFIG: must be a ProxyConfig object"),
    ({"PROXY_CONFIG": "proxyAdminPort: 70000"}, {}, "ProxyConfig.proxyAdminPort: must be a port number"),
    ({"PROXY_CONFIG": "drainDuration: soon"}, {}, "ProxyConfig.drainDuration: invalid duration"),
    ({"PROXY_CONFIG": "terminationDrainDuration: -1s"}, {}, "ProxyConfig.terminationDrainDuration: must not be negative"),
    ({"TERMINATION_DRAIN_DURATION_SECONDS": "5s"}, {}, "TERMINATION_DRAIN_DURATION_SECONDS='5s'"),
    ({"PROXY_CONFIG": "discoveryAddress: istiod"}, {}, "discoveryAddress 'istiod' must be HOST:PORT"),
    ({"PROXY_CONFIG": "binaryPath: /nonexistent/envoy"}, {}, "binaryPath '/nonexistent/envoy' is not an executable"),
    ({"SECRET_TTL": "forever"}, {}, "SECRET_TTL='forever'"),
    ({"SECRET_GRACE_PERIOD_RATIO": "2"}, {}, "SECRET_GRACE_PERIOD_RATIO='2': must be between 0 and 1"),
    ({"INSTANCE_IP": "pod-1"}, {}, "INSTANCE_IP 'pod-1' is not an IP address"),
    ({}, {"statusPort": -1}, "--statusPort: must be a port number"),
])
def test_bad_configuration_is_refused_with_the_reason(env, overrides, message):
    with pytest.raises(ConfigError) as e:
        load(env, **overrides)
    assert message in str(e.value)


def test_termination_drain_duration_from_proxy_config_else_the_env():
    assert load()[0].termination_drain == 5.0  # istio-agent's default
    assert load({"TERMINATION_DRAIN_DURATION_SECONDS": "9"})[0].termination_drain == 9.0
    cfg, warnings = load({"TERMINATION_DRAIN_DURATION_SECONDS": "9",
                          "PROXY_CONFIG": "terminationDrainDuration: 1500ms"})
    assert cfg.termination_drain == 1.5 and warnings == []
    assert load({"PROXY_CONFIG": "terminationDrainDuration: 0s"})[0].termination_drain == 0.0


def test_node_metadata_as_istio_agent_sends_it():
    cfg, _ = load({"ISTIO_META_CLUSTER_ID": "east", "ISTIO_META_INTERCEPTION_MODE": "NONE",
                   "ISTIO_META_NAMESPACE": "spoofed", "ISTIO_METAJSON_LABELS": '{"app": "reviews", "version": "v0"}',
                   "ISTIO_METAJSON_POD_PORTS": '[{"containerPort": 9080}]', "ISTIO_METAJSON_BROKEN": "{"})
    labels = 'version="v1"\npod-template-hash="5b7f9c8d6d"\nnote="a \\"quoted\\" value"\n'
    md, warnings = node_metadata(cfg, labels, 'sidecar.istio.io/status="{}"\n')
    assert md["NAMESPACE"] == "bookinfo"  # the agent's own knowledge wins over ISTIO_META_
    assert (md["NAME"], md["SERVICE_ACCOUNT"]) == ("reviews-v1-5b7f9c8d6d-abcde", "reviews")
    assert md["INSTANCE_IPS"].split(",")[0] == "10.1.2.3"  # INSTANCE_IP first, then the host's others
    assert md["CLUSTER_ID"] == "east" and md["INTERCEPTION_MODE"] == "NONE"
    # The labels file (downward API) over ISTIO_METAJSON_LABELS, without pod-template-hash.
    assert md["LABELS"] == {"app": "reviews", "version": "v1", "note": 'a "quoted" value'}
    assert md["POD_PORTS"] == [{"containerPort": 9080}]
    assert md["ANNOTATIONS"] == {"sidecar.istio.io/status": "{}"}
    assert md["WORKLOAD_NAME"] == "reviews-v1"  # the Deployment, from the ReplicaSet pod name
    assert md["PROXY_CONFIG"]["discoveryAddress"] == "istiod.istio-system.svc:15012"
    assert md["ISTIO_VERSION"]
    assert len(warnings) == 1 and "ISTIO_METAJSON_BROKEN" in warnings[0]
    bootstrap = envoy_bootstrap(cfg, md)
    assert bootstrap["node"]["cluster"] == "reviews.bookinfo"
    assert bootstrap["node"]["id"] == cfg.node_id

    defaults, _ = node_metadata(load()[0])
    assert (defaults["CLUSTER_ID"], defaults["INTERCEPTION_MODE"], defaults["LABELS"]) == ("Kubernetes", "REDIRECT", {})
    assert envoy_bootstrap(load()[0], defaults)["node"]["cluster"] == "reviews-v1.bookinfo"


def test_downward_api_values_must_be_quoted():
    assert parse_downward_api('a="1"\nb="x=y"\n\n') == {"a": "1", "b": "x=y"}
    with pytest.raises(ValueError, match="not a quoted string"):
        parse_downward_api("a=1")


@pytest.mark.parametrize("discovery", ["127.0.0.1:15012", "istiod.istio-system.svc:15012"])
def test_the_bootstrap_passes_envoy_validation_and_keeps_the_sds_contract(tmp_path, discovery):
    cfg, _ = load({"PROXY_CONFIG": f"discoveryAddress: {discovery}", "ISTIO_DELTA_XDS": "true"})
    md, _ = node_metadata(cfg)
    bootstrap = envoy_bootstrap(cfg, md)
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    # THE CONTRACT: generated config references `default` and `ROOTCA` through `sds-grpc`.
    sds = clusters["sds-grpc"]
    assert sds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {
        "pipe": {"path": "./var/run/secrets/workload-spiffe-uds/socket"}}
    # ADS goes to the agent's xDS proxy (which holds the mTLS connection to istiod), not to istiod.
    xds = clusters["xds-grpc"]
    assert xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {
        "pipe": {"path": "./etc/istio/proxy/XDS"}}
    assert "transport_socket" not in xds
    assert bootstrap["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"

    # Envoy resolves the bootstrap's relative paths from its working directory, as the agent runs it.
    root = tmp_path / "var/run/secrets/istio/root-cert.pem"
    root.parent.mkdir(parents=True)
    root.write_text(generate_root(org="cluster.local", key_type="EC")[ROOT_CERT_FILE])
    (tmp_path / "bootstrap.json").write_text(json.dumps(bootstrap))
    result = subprocess.run([envoy_binary(), "--mode", "validate", "-c", "bootstrap.json", "--use-dynamic-base-id",
                             "-l", "warning"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning" not in result.stdout + result.stderr


def test_the_csr_names_only_the_spiffe_identity():
    kc = new_key_and_csr("spiffe://example.org/ns/shop/sa/cart")
    csr = x509.load_pem_x509_csr(kc.csr_pem.encode())
    assert csr.is_signature_valid
    assert isinstance(csr.public_key(), ec.EllipticCurvePublicKey) and csr.public_key().curve.name == "secp256r1"
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert list(san.value) == [x509.UniformResourceIdentifier("spiffe://example.org/ns/shop/sa/cart")]
    assert len(csr.subject) == 0


def test_renewal_at_the_grace_period_with_jitter():
    now = time.time()
    secret = WorkloadSecret(key_pem="", chain_pem="", root_pem="", identity="", serial=1, issued_at=now,
                            not_after=now + 86400)
    assert renewal_delay(secret, 0.5, 0.01, now, rand=lambda: 0.5) == pytest.approx(43200)
    earliest = renewal_delay(secret, 0.5, 0.01, now, rand=lambda: 1.0)  # grace ratio 0.51
    latest = renewal_delay(secret, 0.5, 0.01, now, rand=lambda: 0.0)  # 0.49
    assert earliest == pytest.approx(43200 - 864) and latest == pytest.approx(43200 + 864)
    assert renewal_delay(secret, 0.5, 0.01, now + 50000) == 0  # overdue: at once


def _host_addresses(skip: frozenset[str] = frozenset()) -> list[str]:
    """What psutil sees: the addresses of interfaces that are up and not loopback, less link-local."""
    import ipaddress

    import psutil

    stats = psutil.net_if_stats()
    out = []
    for name, addrs in psutil.net_if_addrs().items():
        st = stats.get(name)
        if name in skip or st is None or not st.isup or "loopback" in st.flags.split(","):
            continue
        for a in addrs:
            if a.family.name in ("AF_INET", "AF_INET6"):
                ip = ipaddress.ip_address(a.address.split("%")[0])
                if not (ip.is_link_local or ip.is_loopback):
                    out.append(str(ip))
    return out


def test_instance_ips_are_every_address_of_the_host_instance_ip_first():
    """As istio-agent: INSTANCE_IP, then the addresses of every interface that is up (not
    loopback or link-local), so a dual-stack pod's sidecar reports both families."""
    cfg, _ = load()
    md, _ = node_metadata(cfg)
    ips = md["INSTANCE_IPS"].split(",")
    assert ips[0] == "10.1.2.3" and cfg.node_id.split("~")[1] == "10.1.2.3"
    host = _host_addresses()
    want = sorted(set(host) - {"10.1.2.3"}) if host else ["127.0.0.1", "::1"]  # istio-agent's fallback
    assert sorted(ips[1:]) == sorted(want)
    # Its own address is listed once.
    if host:
        again, _ = load({"INSTANCE_IP": host[0]})
        assert again.instance_ips[0] == host[0] and again.instance_ips.count(host[0]) == 1


def test_exclude_interfaces_annotation_leaves_their_addresses_out():
    """traffic.sidecar.istio.io/excludeInterfaces (the pod annotations file), as istio-agent;
    with no address left, 127.0.0.1 and ::1 (istio-agent's fallback)."""
    import psutil

    names = sorted(n for n, st in psutil.net_if_stats().items() if "loopback" not in st.flags.split(","))
    if not _host_addresses():
        pytest.skip("no non-loopback interface with an address here")
    files = {config.POD_ANNOTATIONS_PATH: f'{config.EXCLUDE_INTERFACES_ANNOTATION}="{names[0]}"\n'}
    cfg, _ = config.load(proxy_type="sidecar", env=BASE_ENV, overrides={}, find_envoy=config.find_envoy,
                         read_file=lambda p: files.get(p, ""))
    rest = sorted(set(_host_addresses(frozenset({names[0]}))) - {"10.1.2.3"}) or ["127.0.0.1", "::1"]
    assert sorted(cfg.instance_ips[1:]) == sorted(rest)
    files[config.POD_ANNOTATIONS_PATH] = f'{config.EXCLUDE_INTERFACES_ANNOTATION}="{",".join(names)}"\n'
    cfg, _ = config.load(proxy_type="sidecar", env=BASE_ENV, overrides={}, find_envoy=config.find_envoy,
                         read_file=lambda p: files.get(p, ""))
    assert cfg.instance_ips == ("10.1.2.3", "127.0.0.1", "::1")


def test_a_dual_stack_pods_metadata_makes_a_dual_stack_proxy():
    """What istiod reads of INSTANCE_IPS: both families, whatever the node id's one IP."""
    from pilot.model.proxy import Proxy

    cfg, _ = config.load(proxy_type="sidecar", env=BASE_ENV, overrides={}, find_envoy=config.find_envoy,
                         read_file=lambda p: "", host_ips=lambda _skip: ["10.1.2.3", "fd00:1::3"])
    md, _ = node_metadata(cfg)
    assert md["INSTANCE_IPS"] == "10.1.2.3,fd00:1::3"
    p = Proxy(cfg.node_id, "sidecar", ("10.1.2.3",), cfg.pod_name, cfg.pod_namespace, "cluster.local", metadata=md)
    assert p.ip_families == (True, True)


@pytest.mark.parametrize(("ips", "dual_stack", "want"), [
    (["10.1.2.3"], "true", "V4_ONLY"), (["10.1.2.3", "fd00:1::3"], "false", "V4_ONLY"),
    (["10.1.2.3", "fd00:1::3"], "true", "ALL"), (["fd00:1::3"], "false", "V6_ONLY")])
def test_the_bootstraps_dns_cluster_resolves_the_pods_families(ips, dual_stack, want):
    """istio-agent's bootstrap DNSLookupFamily for the tracer's STRICT_DNS cluster."""
    env = {**BASE_ENV, "INSTANCE_IP": ips[0], "ISTIO_DUAL_STACK": dual_stack,
           "PROXY_CONFIG": json.dumps({"tracing": {"zipkin": {"address": "zipkin.istio-system:9411"}}})}
    cfg, _ = config.load(proxy_type="sidecar", env=env, overrides={}, find_envoy=config.find_envoy,
                         read_file=lambda p: "", host_ips=lambda _skip: ips)
    md, _ = node_metadata(cfg)
    (zipkin,) = [c for c in envoy_bootstrap(cfg, md)["static_resources"]["clusters"] if c["name"] == "zipkin"]
    assert zipkin["type"] == "STRICT_DNS" and zipkin["dns_lookup_family"] == want
