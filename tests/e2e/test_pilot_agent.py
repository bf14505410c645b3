"""pilot-agent end to end: the real control plane (secure port 15012, CA trusting a test JWT issuer),
the real `pilot-agent proxy sidecar` process in its own working directory, and the Envoy it runs."""

from __future__ import annotations

import base64
import datetime as dt
import json
import signal
import statistics
import time

import pytest
from cryptography import x509
from cryptography.x509 import verification

from pilot.security.pki import ROOT_CERT_FILE, generate_root
from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.support.agent import PilotAgent
from tests.support.control_plane import ControlPlane
from tests.support.ports import free_port, free_ports
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)
ENVOY_XDS_MAX_BACKOFF_S = 30  # Envoy's default cap on gRPC xDS stream retries

TRUST_DOMAIN = "example.org"
MESH = f"trustDomain: {TRUST_DOMAIN}\n"
NAMESPACE, SA, POD = "shop", "cart", "cart-7d9f8b6c4d-x2x7q"
NODE_ID = f"sidecar~127.0.0.1~{POD}.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"
SPIFFE = f"spiffe://{TRUST_DOMAIN}/ns/{NAMESPACE}/sa/{SA}"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer("ES256")


def plane(tmp_path, issuer: Issuer) -> ControlPlane:
    return ControlPlane(tmp_path, secure_grpc=True, mesh_config=MESH,
                        env={"JWT_RULE": issuer.rule(), "CA_KEY_TYPE": "EC"})


def agent(tmp_path, cp: ControlPlane, issuer: Issuer, *, token: str | None = None, env: dict | None = None,
          name: str = "agent") -> PilotAgent:
    a = PilotAgent(tmp_path / name, env={
        "POD_NAME": POD, "POD_NAMESPACE": NAMESPACE, "SERVICE_ACCOUNT": SA, "INSTANCE_IP": "127.0.0.1",
        "TRUST_DOMAIN": TRUST_DOMAIN, "ISTIO_META_INTERCEPTION_MODE": "NONE",
        "ISTIO_METAJSON_LABELS": json.dumps({"app": "cart", "version": "v1"}),
        "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}",
                                    "proxyAdminPort": 0, "statusPort": 0, "concurrency": 1}),
        **(env or {})})
    a.write_root_cert(cp.root_cert())
    a.write_token(token if token is not None else issuer.token(namespace=NAMESPACE, sa=SA))
    return a


def mesh_service(cp: ControlPlane) -> None:
    """A service in the mesh: its (auto-mTLS) cluster makes Envoy ask the agent for `default`.
    Nothing else references the certificate: Envoy's own xDS connection goes through the agent."""
    cp.write("backend.yaml", service_yaml("backend", 18080, namespace=NAMESPACE) + "---\n"
             + endpoint_slice_yaml("backend", 18081, namespace=NAMESPACE))


async def held_chain(a: PilotAgent) -> list[x509.Certificate]:
    """The `default` secret's certificate chain as Envoy holds it (config_dump)."""
    dump = await a.admin_json("/config_dump?resource=dynamic_active_secrets")
    for s in dump["configs"]:
        if s["name"] == "default":
            pem = base64.b64decode(s["secret"]["tls_certificate"]["certificate_chain"]["inline_bytes"])
            return x509.load_pem_x509_certificates(pem)
    raise AssertionError(f"no default secret in {dump}")


def verify(chain: list[x509.Certificate], root_pem: str) -> x509.Certificate:
    root = x509.load_pem_x509_certificate(root_pem.encode())
    verifier = verification.PolicyBuilder().store(verification.Store([root])).build_client_verifier()
    verifier.verify(chain[0], [c for c in chain[1:] if c != root])
    return chain[0]


def uris(cert: x509.Certificate) -> list[str]:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
        .get_values_for_type(x509.UniformResourceIdentifier)


async def test_envoy_gets_its_certificate_and_config_over_15012(tmp_path, issuer):
    async with plane(tmp_path, issuer) as cp:
        mesh_service(cp)
        a = agent(tmp_path, cp, issuer)
        started = time.monotonic()
        async with a:
            await a.wait_ready()
            print(f"pilot-agent start to ready: {time.monotonic() - started:.2f}s")
            # Config came from the secure port: the control plane saw this node and it ACKed.
            row = await cp.wait_synced(NODE_ID, types=("cluster", "listener"))
            assert row["proxy"] == NODE_ID
            # Envoy's ADS goes to the agent's xDS proxy over its Unix socket; the agent holds the
            # mTLS connection to the secure port (the only one this node was given).
            stats = await a.admin_json("/stats?format=json&filter=^cluster\\.xds-grpc\\.upstream_cx_total$")
            assert stats["stats"][0]["value"] >= 1
            assert (a.workdir / "etc/istio/proxy/XDS").is_socket()
            leaf = verify(await held_chain(a), cp.root_cert())
            assert uris(leaf) == [SPIFFE]
            # Node metadata as istio-agent sends it.
            adsz = await cp.debug("/debug/adsz")
            (client,) = [c for c in adsz["clients"] if c["metadata"].get("NAME") == POD]
            md = client["metadata"]
            assert md["NAMESPACE"] == NAMESPACE and md["SERVICE_ACCOUNT"] == SA
            assert md["LABELS"] == {"app": "cart", "version": "v1"}
            assert md["INTERCEPTION_MODE"] == "NONE" and md["CLUSTER_ID"] == "Kubernetes"
            assert md["WORKLOAD_NAME"] == "cart" and md["ISTIO_VERSION"]


@pytest.mark.timeout(150)
async def test_short_lived_certificates_rotate_without_restarting_envoy(tmp_path, issuer):
    # A fixed secure port, so Envoy's bootstrap still points at the control plane after its restart.
    cp = ControlPlane(tmp_path, secure_grpc=True, mesh_config=MESH,
                      env={"JWT_RULE": issuer.rule(), "CA_KEY_TYPE": "EC"},
                      extra_args=["--secureGRPCAddr", f"127.0.0.1:{free_port()}"])
    mesh_service(cp)
    await cp.start()
    try:
        # 4 s certificates: renewed about every 2 s (SECRET_GRACE_PERIOD_RATIO 0.5).
        async with agent(tmp_path, cp, issuer, env={"SECRET_TTL": "4s"}) as a:
            await a.wait_ready()
            pid = a.envoy_pid()
            first = (await held_chain(a))[0]
            assert (first.not_valid_after_utc - first.not_valid_before_utc).total_seconds() < 4 + 61  # 1 min backdating
            seen = {first.serial_number}

            async def rotated(times: int) -> bool:
                seen.add((await held_chain(a))[0].serial_number)
                return len(seen) > times

            await wait_for(lambda: rotated(2), timeout=20, interval=0.2, message=f"two rotations\n{a.log_tail()}")
            assert "workload certificate renewed" in a.log_text()

            # The CA goes away: renewals fail, are retried and logged, and succeed once it is back.
            await cp.stop()
            await wait_for(lambda: "workload certificate renewal failed; retrying" in a.log_text(), timeout=10,
                           message=a.log_tail())
            await cp.start()
            before = len(seen)
            await wait_for(lambda: rotated(before), timeout=20, interval=0.2, message=f"renewed\n{a.log_tail()}")
            # The agent's xDS proxy reconnected to the restarted control plane over TLS with a renewed
            # certificate
            # (the first one has expired by now) and is in sync again.
            assert first.not_valid_after_utc < dt.datetime.now(dt.UTC)
            # Envoy's ADS reconnect backoff grows to 30 s (jittered) while the control plane is
            # away and its certificate has expired: the reconnect may take that long.
            await cp.wait_synced(NODE_ID, types=("cluster", "listener"), timeout=ENVOY_XDS_MAX_BACKOFF_S + 15)
            leaf = verify(await held_chain(a), cp.root_cert())
            assert uris(leaf) == [SPIFFE]
            assert a.envoy_pid() == pid, "Envoy was restarted"
            assert a.log_text().count("envoy started") == 1
            assert (await a.get("status", "/healthz/ready"))[0] == 200
    finally:
        await cp.stop()


async def test_a_killed_envoy_is_restarted_and_sigterm_stops_everything(tmp_path, issuer):
    async with plane(tmp_path, issuer) as cp:
        a = agent(tmp_path, cp, issuer)
        async with a:
            await a.wait_ready()
            envoy = a.envoy_processes()[0]
            envoy.send_signal(signal.SIGKILL)
            await wait_for(lambda: a.envoy_processes() and a.envoy_processes()[0].pid != envoy.pid,
                           timeout=15, message=f"envoy restarted\n{a.log_tail()}")
            await a.wait_ready()
            assert "envoy exited unexpectedly; restarting it" in a.log_text()
            assert "killed by SIGKILL" in a.log_text()

            second = a.envoy_processes()[0]
            a.signal(signal.SIGTERM)
            assert await a.wait_exit() == 0
            assert not second.is_running() or second.status() == "zombie"
            assert "pilot-agent exiting" in a.log_text()


async def test_the_agent_gives_up_on_an_envoy_that_keeps_crashing(tmp_path, issuer):
    crasher = tmp_path / "crashing-envoy"
    crasher.write_text("#!/bin/sh\nexit 3\n")
    crasher.chmod(0o755)
    async with plane(tmp_path, issuer) as cp:
        a = agent(tmp_path, cp, issuer, env={
            "ENVOY_MAX_RESTARTS": "2", "ENVOY_RESTART_BACKOFF": "50ms",
            "PROXY_CONFIG": json.dumps({"discoveryAddress": f"127.0.0.1:{cp.secure_port}",
                                        "statusPort": 0, "binaryPath": str(crasher)})})
        async with a:
            assert await a.wait_exit() == 3
        log = a.log_text()
        assert log.count("envoy exited unexpectedly; restarting it") == 2
        assert "envoy crashed 3 times in a row; giving up" in log


async def test_a_token_the_ca_refuses_stops_the_agent_with_the_reason(tmp_path, issuer):
    async with plane(tmp_path, issuer) as cp:
        a = agent(tmp_path, cp, issuer, token=issuer.token(namespace=NAMESPACE, sa=SA, aud="someone-else"))
        async with a:
            assert await a.wait_exit() == 1
        log = a.log_text()
        assert "cannot get the workload certificate; exiting" in log
        assert "UNAUTHENTICATED" in log and "audience" in log
        assert "envoy started" not in log



@pytest.mark.parametrize(("setup", "status", "message"), [
    ("no root", 1, "cannot read the mesh root certificate ./var/run/secrets/istio/root-cert.pem"),
    ("no token", 1, "cannot read the service-account token ./var/run/secrets/tokens/istio-token"),
    ("no envoy", 2, "ProxyConfig.binaryPath '/nonexistent/envoy' is not an executable file"),
    ("bad PROXY_CONFIG", 2, "ProxyConfig.statusPort: must be a port number 0-65535, got 'x'"),
])
async def test_missing_inputs_fail_fast_with_a_clear_reason(tmp_path, issuer, setup, status, message):
    """No control plane is needed: the agent fails before calling the CA."""
    pc = {"discoveryAddress": "127.0.0.1:9", "statusPort": 0}
    pc.update({"no envoy": {"binaryPath": "/nonexistent/envoy"}, "bad PROXY_CONFIG": {"statusPort": "x"}}.get(setup, {}))
    a = PilotAgent(tmp_path / "agent", env={"POD_NAMESPACE": NAMESPACE, "SERVICE_ACCOUNT": SA,
                                            "INSTANCE_IP": "127.0.0.1", "PROXY_CONFIG": json.dumps(pc)})
    if setup != "no root":
        a.write_root_cert(generate_root(org=TRUST_DOMAIN, key_type="EC")[ROOT_CERT_FILE])
    if setup not in ("no root", "no token"):
        a.write_token(issuer.token(namespace=NAMESPACE, sa=SA))
    async with a:
        assert await a.wait_exit() == status
    assert message in a.log_text()
    assert "envoy started" not in a.log_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_figure_start_to_ready(tmp_path, issuer, capsys):
    """`make bench`: pilot-agent process start -> /healthz/ready 200 (certificate issued, Envoy
    started, config received over 15012), median of several cold starts, empty mesh and 50 services."""
    results = {}
    async with plane(tmp_path, issuer) as cp:
        for mesh, services in (("empty", 0), ("50 services", 50)):
            for i, port in enumerate(free_ports(services)):
                cp.write(f"svc-{i}.yaml", service_yaml(f"svc-{i}", port))
                cp.write(f"eps-{i}.yaml", endpoint_slice_yaml(f"svc-{i}", 19000 + i))
            samples = []
            for run in range(7):
                a = agent(tmp_path, cp, issuer, name=f"agent-{services}-{run}")
                t0 = time.monotonic()
                async with a:
                    await wait_for(lambda a=a: a.ports().get("status"), timeout=30, interval=0.005)

                    async def ready(a=a) -> bool:
                        return (await a.get("status", "/healthz/ready"))[0] == 200

                    await wait_for(ready, timeout=30, interval=0.01, message=a.log_tail())
                    samples.append((time.monotonic() - t0) * 1000)
            results[mesh] = {"runs": len(samples), "median_ms": round(statistics.median(samples)),
                             "min_ms": round(min(samples)), "max_ms": round(max(samples))}
    with capsys.disabled():
        print("\nFIGURES " + json.dumps({"pilot_agent_start_to_ready": results}))
