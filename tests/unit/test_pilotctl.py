"""pilotctl's pure parts: reading config dumps made from real generated resources, the diff of
`ps PROXY`, secret columns from real certificates, and the test issuer's tokens accepted by the
control plane's own JWT authenticator."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from envoy.admin.v3 import config_dump_pb2, config_dump_shared_pb2
from envoy.config.cluster.v3 import cluster_pb2
from google.protobuf import any_pb2, json_format

from pilot.pilotctl import devjwt, tables
from pilot.pilotctl.client import CtlError, check_addr
from pilot.pilotctl.dump import istio_config, resources_of
from pilot.pilotctl.status import diff_text, proxy_diff, row_state
from pilot.security.authn import Credentials, JwtAuthenticator, parse_jwt_rules

from .helpers import World, proxy, service

REVIEWS = "reviews.default.svc.cluster.local"


def _dump(clusters: list[cluster_pb2.Cluster]) -> dict:
    """A ConfigDump as Envoy's admin renders it (snake_case JSON)."""
    section = config_dump_shared_pb2.ClustersConfigDump(dynamic_active_clusters=[
        config_dump_shared_pb2.ClustersConfigDump.DynamicCluster(version_info="1", cluster=_any(c)) for c in clusters])
    dump = config_dump_pb2.ConfigDump(configs=[_any(section)])
    return json_format.MessageToDict(dump, preserving_proto_field_name=True)


def _any(msg) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)
    return a


def _generated_clusters() -> list[cluster_pb2.Cluster]:
    w = World()
    w.apply(service("reviews"), {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                                 "metadata": {"name": "reviews", "namespace": "default"},
                                 "spec": {"host": REVIEWS, "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}})
    return [r.message(cluster_pb2.Cluster) for r in w.cds(proxy()).values()]


def test_cluster_table_reads_the_destination_rule_from_metadata():
    res = resources_of(_dump(_generated_clusters()), "clusters")
    rows = {r["name"]: r for r in tables.cluster_rows(res, tables.Filters())}
    assert rows[f"outbound|9080|v1|{REVIEWS}"]["destination_rule"] == "reviews.default"
    assert rows[f"outbound|9080|v1|{REVIEWS}"]["subset"] == "v1"
    assert rows["BlackHoleCluster"]["destination_rule"] == ""
    only_v1 = tables.cluster_rows(res, tables.Filters(subset="v1", port=9080, direction="outbound"))
    assert [r["name"] for r in only_v1] == [f"outbound|9080|v1|{REVIEWS}"]
    assert tables.cluster_rows(res, tables.Filters(fqdn="ratings")) == []


def test_config_paths_render_as_istioctl_does():
    def md(path: str) -> dict:
        return {"metadata": {"filterMetadata": {"istio": {"config": path}}}}
    assert istio_config(md("/apis/networking.istio.io/v1/namespaces/ns/virtual-service/vs")) == "vs.ns"
    assert istio_config(md("/apis/gateway.networking.k8s.io/v1/namespaces/ns/http-route/r")) == "http-route/r.ns"
    assert istio_config(md("something else")) == "<unknown>"
    assert istio_config({}) == ""


def test_proxy_diff_names_what_differs():
    clusters = _generated_clusters()
    same = proxy_diff(_dump(clusters), _dump(clusters))
    assert all(d["match"] for d in same.values())
    assert diff_text(same).splitlines() == ["Clusters Match", "Listeners Match", "Routes Match"]
    changed = [cluster_pb2.Cluster()] + clusters[1:]
    changed[0].CopyFrom(clusters[0])
    changed[0].connect_timeout.seconds = 99
    d = proxy_diff(_dump(clusters), _dump(changed[:-1]))["clusters"]
    assert not d["match"] and d["differ"] == [clusters[0].name] and d["only_control_plane"] == [clusters[-1].name]
    assert '"99s"' in d["diff"] and d["diff"].startswith("--- Istiod clusters\n+++ Envoy clusters")


def test_sync_states():
    assert row_state({}, "cluster") == "NOT SENT"
    assert row_state({"cluster_sent": "n1", "cluster_acked": "n1"}, "cluster") == "SYNCED"
    assert row_state({"cluster_sent": "n2", "cluster_acked": "n1"}, "cluster") == "STALE"
    assert row_state({"cluster_sent": "n2", "cluster_acked": "n1", "cluster_nack": {"nonce": "n2"}},
                      "cluster") == "NACKED"


def _cert(not_before: dt.datetime, not_after: dt.datetime) -> tuple[bytes, int]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "t")])
    serial = x509.random_serial_number()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(serial).not_valid_before(not_before).not_valid_after(not_after).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), serial


def test_secret_columns_come_from_the_certificates():
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    leaf, leaf_serial = _cert(now - dt.timedelta(hours=1), now + dt.timedelta(hours=1))
    old_root, _ = _cert(now - dt.timedelta(days=10), now - dt.timedelta(days=1))
    res = [{"name": "default", "state": "dynamic_active_secrets", "resource": {
                "tlsCertificate": {"certificateChain": {"inlineBytes": base64.b64encode(leaf).decode()}}}},
           {"name": "ROOTCA", "state": "dynamic_warming_secrets", "resource": {
                "validationContext": {"trustedCa": {"inlineBytes": base64.b64encode(old_root).decode()}}}}]
    rows = {r["name"]: r for r in tables.secret_rows(res, proxy_side=True, now=now)}
    assert rows["default"]["type"] == "Cert Chain" and rows["default"]["status"] == "ACTIVE"
    assert rows["default"]["valid_cert"] == "true" and rows["default"]["serial_number"] == format(leaf_serial, "x")
    assert rows["default"]["not_after"] == "2026-01-01T01:00:00Z"
    assert rows["ROOTCA"]["type"] == "CA" and rows["ROOTCA"]["status"] == "WARMING"
    assert rows["ROOTCA"]["valid_cert"] == "false"  # expired
    assert "STATUS" not in tables.secrets_table(tables.secret_rows(res, proxy_side=False, now=now))


def test_test_issuer_tokens_pass_the_control_planes_authenticator(tmp_path):
    devjwt.init(str(tmp_path))
    rule = parse_jwt_rules(devjwt.rule(str(tmp_path)))[0]
    token = devjwt.token(str(tmp_path), "shop", "cart")
    caller = asyncio.run(JwtAuthenticator(rule).authenticate(Credentials(bearer_token=token)))
    assert (caller.namespace, caller.service_account) == ("shop", "cart")
    assert "exists" in devjwt.init(str(tmp_path))  # a second init keeps the key
    with pytest.raises(CtlError, match="pilotctl jwt init"):
        devjwt.token(str(tmp_path / "missing"), "shop", "cart")


@pytest.mark.parametrize(("addr", "why"), [("nohost", "is not HOST:PORT"), (":15014", "is not HOST:PORT"),
                                           ("h:0", "from 1 to 65535"), ("h:port", "from 1 to 65535")])
def test_bad_addresses(addr, why):
    with pytest.raises(CtlError, match=why):
        check_addr(addr)
