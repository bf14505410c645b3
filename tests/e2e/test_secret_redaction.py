"""No private key appears in any debug view, metric or log line, in file and Kubernetes mode.

The Secrets carry their key everywhere `kubectl` and users put it: `data`, `stringData`, the
`kubectl.kubernetes.io/last-applied-configuration` annotation (the whole object, as `kubectl
apply` stores it), managedFields; plus a Secret that is rejected and a file that is not YAML.
A gateway that proved its identity is connected and is served the key over SDS (so the key is
live in the server), then every path /debug lists is fetched, with that proxy's id where a
path takes one, and the bodies, /metrics and the whole log are searched for the key's bytes.
"""

from __future__ import annotations

import base64
import json
import textwrap

import pytest

from tests.fakes.apiserver import FakeApiServer
from tests.support.certs import Issued, b64, issue, make_ca
from tests.support.control_plane import ControlPlane
from tests.support.verified_router import ask_secrets_as
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)

NS, SA = "istio-system", "istio-ingressgateway"
ROUTER = f"router~127.0.0.1~ingress-1.{NS}~{NS}.svc.cluster.local"


def needles(leaf: Issued) -> dict[str, str]:
    """Forms the key takes: base64 of the PEM (Secret data), a line of the PEM body, the DER's
    base64 without line breaks (what a JSON dump of bytes would show)."""
    pem = leaf.key_pem.decode()
    body_line = next(line for line in pem.splitlines() if line and not line.startswith("-----"))
    der = base64.b64decode("".join(line for line in pem.splitlines() if not line.startswith("-----")))
    return {"data": b64(leaf.key_pem)[:48], "pem line": body_line[:48],
            "der base64": base64.b64encode(der).decode()[20:68]}


def secret_object(name: str, leaf: Issued) -> dict:
    obj = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
           "metadata": {"name": name, "namespace": NS},
           "data": {"tls.crt": b64(leaf.cert_pem), "tls.key": b64(leaf.key_pem)},
           "stringData": {"tls.key": leaf.key_pem.decode()}}
    obj["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj)}
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Apply",
                                         "fieldsV1": {"f:data": {"f:tls.key": {}}}, "note": b64(leaf.key_pem)}]
    return obj


async def hold_sds_stream(cp: ControlPlane, issuer: Issuer, root: str):
    """A proven gateway's ADS stream that was served the credential; returns (channel, call)."""
    got, channel, call = await ask_secrets_as(cp, root, issuer, namespace=NS, service_account=SA, node_id=ROUTER,
                                              names=["kubernetes://cred"], labels={"istio": "ingressgateway"})
    assert len(got) == 1, "the proven gateway must be served the key (else the scan proves nothing)"
    return channel, call


async def scan(cp: ControlPlane, forms: dict[str, str]) -> list[str]:
    """Every /debug path (with the gateway's id where one is taken), /metrics, the log: where a form appears."""
    index = await cp.debug("/debug")
    found = []
    bodies = {}
    for entry in index["endpoints"]:
        path = entry["path"]
        query = f"?proxyID={ROUTER}&type=secret&name=kubernetes://cred" if path in (
            "/debug/config_dump", "/debug/explain") else f"?proxyID={ROUTER}"
        for port in ("http", "monitoring"):
            status, text = await cp.get(path + query, port)
            bodies[f"{port}:{path}"] = (status, text)
    bodies["metrics"] = (200, await cp.metrics())
    bodies["log"] = (200, cp.log_path.read_text(errors="replace"))
    for where, (_, text) in bodies.items():
        for form, needle in forms.items():
            if needle in text:
                found.append(f"{form} in {where}")
    assert bodies["http:/debug/configz"][0] == 200 and "cred" in bodies["http:/debug/configz"][1]
    return found


async def test_no_private_key_in_debug_metrics_or_logs_file_mode(tmp_path):
    issuer = Issuer("ES256")
    ca = make_ca()
    leaf, rejected_leaf, broken_leaf = (issue(ca, ["a.example.com"]) for _ in range(3))
    # Debug logging: the scan covers every line the server can write.
    cp = ControlPlane(tmp_path, secure_grpc=True, env={"JWT_RULE": issuer.rule()},
                      extra_args=["--log_output_level", "default:debug"])
    cp.write("secret.json", json.dumps(secret_object("cred", leaf)))
    # Rejected: data values must be strings (the whole object is refused, the key is not quoted).
    bad = secret_object("bad", rejected_leaf)
    bad["data"]["tls.crt"] = 12
    cp.write("bad.json", json.dumps(bad))
    # Not YAML at all, with a key inside: the rejection names the place, never the content.
    cp.write("broken.yaml", textwrap.dedent(f"""\
        apiVersion: v1
        kind: Secret
        metadata: {{name: broken, namespace: {NS}}}
        data:
          tls.key: {b64(broken_leaf.key_pem)}
          tls.crt: [unclosed {b64(broken_leaf.key_pem)}
        """))
    try:
        await cp.start()
        ch, call = await hold_sds_stream(cp, issuer, cp.root_cert())
        try:
            configz = await cp.debug("/debug/configz")
            rejected = {r["name"] or r["source"].rsplit("/", 1)[-1] for r in configz["rejected"]}
            assert {"bad", "broken.yaml"} <= rejected, configz["rejected"]
            found = []
            for leaf_ in (leaf, rejected_leaf, broken_leaf):
                found += await scan(cp, needles(leaf_))
            assert found == []
        finally:
            call.cancel()
            await ch.close()
    finally:
        await cp.stop()


async def test_no_private_key_in_debug_or_logs_kubernetes_mode(tmp_path):
    issuer = Issuer("ES256")
    leaf = issue(make_ca(), ["a.example.com"])
    fake = await FakeApiServer().start()
    fake.access_reviewer = lambda spec: spec["user"] == f"system:serviceaccount:{NS}:{SA}"
    fake.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    fake.create(secret_object("cred", leaf))
    cp = ControlPlane(tmp_path, kubeconfig=fake.write_kubeconfig(tmp_path / "kc"), secure_grpc=True,
                      env={"ENABLE_LEADER_ELECTION": "false", "JWT_RULE": issuer.rule()},
                      extra_args=["--log_output_level", "default:debug"])
    try:
        await cp.start()
        root = await wait_for(
            lambda: (fake.get("configmaps", "istio-ca-root-cert", namespace=NS) or {}).get("data", {})
            .get("root-cert.pem"), 20, message="root ConfigMap")

        async def loaded() -> bool:
            return any(c["kind"] == "Secret" and c["name"] == "cred"
                       for c in (await cp.debug("/debug/configz"))["configs"])

        await wait_for(loaded, 20, message="the Secret reached the Store")
        ch, call = await hold_sds_stream(cp, issuer, root)
        try:
            assert await scan(cp, needles(leaf)) == []
            # Kubernetes RBAC decides too: another service account of that namespace, proven
            # and posing as the gateway, may not list Secrets there, so it gets nothing.
            got, other_ch, other_call = await ask_secrets_as(
                cp, root, issuer, namespace=NS, service_account="app", node_id=ROUTER.replace("ingress-1", "app-1"),
                names=["kubernetes://cred"], labels={"istio": "ingressgateway"})
            other_call.cancel()
            await other_ch.close()
            assert got == []
            assert fake.counters["subjectaccessreviews"] == 2  # one per identity: the verdicts are cached
            assert "system:serviceaccount:istio-system:app may not list secrets" in cp.log_tail(200)
        finally:
            call.cancel()
            await ch.close()
    finally:
        await cp.stop()
        await fake.stop()
