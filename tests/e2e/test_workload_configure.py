"""`pilotctl x workload entry configure` against the fake apiserver (the real kubernetes-asyncio
client in a pilotctl subprocess): the files a VM needs, as istioctl writes them."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pilot.agent.config import mesh_default_config, parse_proxy_config
from tests.fakes.apiserver import FakeApiServer

pytestmark = pytest.mark.timeout(90)
REPO = Path(__file__).resolve().parents[2]
ROOT_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
GROUP = textwrap.dedent("""\
    apiVersion: networking.istio.io/v1
    kind: WorkloadGroup
    metadata: {name: reviews-vm, namespace: vm}
    spec:
      metadata:
        labels: {app: reviews, version: v2}
        annotations:
          proxy.istio.io/config: |
            concurrency: 3
            proxyMetadata: {FROM_GROUP: "yes"}
      template:
        serviceAccount: reviews-sa
        ports: {http: 9080, grpc: 9090}
    """)


async def pilotctl(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pilot.pilotctl", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(REPO))
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_configure_writes_the_files_a_vm_needs_from_a_workload_group(tmp_path):
    async with FakeApiServer() as fake:
        issued: list[tuple[str, str, dict]] = []

        def issue(ns: str, name: str, spec: dict) -> str:
            issued.append((ns, name, spec))
            return f"token-for-{ns}-{name}"

        fake.token_issuer = issue
        for ns in ("istio-system", "vm"):
            fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        fake.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": "istio-system"},
                     "data": {"mesh": "trustDomain: example.org\ndefaultConfig:\n  discoveryAddress: "
                                      "istiod.istio-system.svc:15012\n  proxyMetadata: {FROM_MESH: \"1\"}\n"}})
        fake.create({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "istio-ca-root-cert", "namespace": "vm"}, "data": {"root-cert.pem": ROOT_PEM}})
        fake.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reviews-sa", "namespace": "vm"}})
        kubeconfig = tmp_path / "kubeconfig"
        fake.write_kubeconfig(kubeconfig)
        (tmp_path / "wg.yaml").write_text(GROUP)
        out_dir = tmp_path / "out"

        code, out, err = await pilotctl("x", "workload", "entry", "configure", "-f", str(tmp_path / "wg.yaml"),
                                        "-o", str(out_dir), "--clusterID", "cluster1", "--kubeconfig", str(kubeconfig),
                                        "--ingressIP", "10.0.0.9", "--autoregister")
        assert code == 0, err
        assert "was successful" in out
        assert sorted(p.name for p in out_dir.iterdir()) == ["cluster.env", "hosts", "istio-token", "mesh.yaml",
                                                             "root-cert.pem"]
        env = dict(line.split("=", 1) for line in (out_dir / "cluster.env").read_text().splitlines())
        assert env == {"ISTIO_INBOUND_PORTS": "9080,9090", "ISTIO_LOCAL_EXCLUDE_PORTS": "15090,15021,15020",
                       "ISTIO_NAMESPACE": "vm", "ISTIO_SERVICE": "reviews-vm.vm", "ISTIO_SERVICE_CIDR": "*",
                       "SERVICE_ACCOUNT": "reviews-sa"}
        assert (out_dir / "root-cert.pem").read_text() == ROOT_PEM
        assert (out_dir / "istio-token").read_text() == "token-for-vm-reviews-sa"
        assert issued == [("vm", "reviews-sa", {"audiences": ["istio-ca"], "expirationSeconds": 3600})]
        assert (out_dir / "hosts").read_text() == "10.0.0.9 istiod.istio-system.svc\n"

        mesh_text = (out_dir / "mesh.yaml").read_text()
        proxy = yaml.safe_load(mesh_text)["defaultConfig"]
        md = proxy["proxyMetadata"]
        assert proxy["concurrency"] == 3 and proxy["discoveryAddress"] == "istiod.istio-system.svc:15012"
        assert md["FROM_MESH"] == "1" and md["FROM_GROUP"] == "yes"
        assert (md["CANONICAL_SERVICE"], md["CANONICAL_REVISION"]) == ("reviews", "v2")
        assert (md["POD_NAMESPACE"], md["SERVICE_ACCOUNT"], md["TRUST_DOMAIN"]) == ("vm", "reviews-sa", "example.org")
        assert (md["ISTIO_META_CLUSTER_ID"], md["ISTIO_META_NETWORK"]) == ("cluster1", "")
        assert md["ISTIO_META_AUTO_REGISTER_GROUP"] == "reviews-vm" and md["ISTIO_META_WORKLOAD_NAME"] == "reviews-vm"
        assert json.loads(md["ISTIO_METAJSON_LABELS"])["service.istio.io/canonical-name"] == "reviews"
        # pilot-agent reads this mesh.yaml as its mesh file.
        cfg, _ = parse_proxy_config([("mesh.yaml", mesh_default_config(mesh_text))])
        assert cfg.concurrency == 3 and cfg.proxy_metadata["ISTIO_META_AUTO_REGISTER_GROUP"] == "reviews-vm"

        # A service account the cluster does not have: refused with the apiserver's reason, nothing written.
        (tmp_path / "bad.yaml").write_text(GROUP.replace("reviews-sa", "nobody"))
        code, _, err = await pilotctl("x", "workload", "entry", "configure", "-f", str(tmp_path / "bad.yaml"),
                                      "-o", str(tmp_path / "bad"), "--clusterID", "c", "--kubeconfig", str(kubeconfig))
        assert code == 1 and "nobody" in err and not (tmp_path / "bad").exists()
