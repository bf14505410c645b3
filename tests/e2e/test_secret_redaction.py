"""No private key appears in any debug view, metric or log line, in file and Kubernetes mode.

The Secrets carry their key everywhere `kubectl` and users put it: `data`, `stringData`, the
`kubectl.kubernetes.io/last-applied-configuration` annotation (the whole object, as `kubectl
apply` stores it), managedFields; plus a Secret that is rejected and a file that is not YAML.
A gateway that proved its identity is connected and is served the key over SDS (so the key is
live in the server), then every path /debug lists is fetched, with that proxy's id where a
path takes one, and the bodies, /metrics and the whole log are searched for the key's bytes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import textwrap

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from pilot.gen.istio.v1.auth import ca_pb2
from tests.e2e.test_ca_server import CREATE, channel, csr, key_pem
from tests.fakes.apiserver import FakeApiServer
from tests.support.certs import Issued, b64, issue, make_ca
from tests.support.control_plane import ControlPlane
from tests.support.wait import wait_for
from tests.unit.test_authn import Issuer

pytestmark = pytest.mark.timeout(90)

NS, SA = "istio-system", "istio-ingressgateway"
ROUTER = f"router~127.0.0.1~ingress-1.{NS}~{NS}.svc.cluster.local"
SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


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


def node() -> base_pb2.Node:
    md = struct_pb2.Struct()
    md.update({"NAMESPACE": NS, "LABELS": {"istio": "ingressgateway"}})
    return base_pb2.Node(id=ROUTER, metadata=md)


async def hold_sds_stream(cp: ControlPlane, issuer: Issuer, root: str):
    """A proven gateway's ADS stream that was served the credential; returns (channel, call)."""
    key, pem = csr()
    async with channel(cp, root) as ca:
        call = ca.unary_unary(CREATE, request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
                              response_deserializer=ca_pb2.IstioCertificateResponse.FromString)
        chain = (await call(ca_pb2.IstioCertificateRequest(csr=pem), timeout=10, metadata=[
            ("authorization", f"Bearer {issuer.token(namespace=NS, sa=SA)}")])).cert_chain
    ch = channel(cp, root, (key_pem(key), "".join(chain).encode()))
    call = ch.stream_stream(ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
    await call.write(discovery_pb2.DiscoveryRequest(node=node(), type_url=SECRET,
                                                    resource_names=["kubernetes://cred"]))
    resp = await asyncio.wait_for(call.read(), 10)
    assert len(resp.resources) == 1, "the proven gateway must be served the key (else the scan proves nothing)"
    return ch, call


async def scan(cp: ControlPlane, forms: dict[str, str]) -> list[str]:
    """Every /debug path (with the gateway's id where one is taken), /metrics, the log: where a form appears."""
    index = await cp.debug("/debug")
    found = []
    bodies = {}
    for path in index["endpoints"]:
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
        finally:
            call.cancel()
            await ch.close()
    finally:
        await cp.stop()
        await fake.stop()
