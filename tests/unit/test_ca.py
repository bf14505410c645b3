"""The CA (pilot/security/ca.py) signing workload and server certificates, SPIFFE identities and
the CA service's generated protos.

Certificates are checked with `cryptography` directly: extensions, SANs, lifetimes, and every
signature along the returned chain.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pilot import features
from pilot.security import spiffe
from pilot.security.ca import (
    CA_CERT_FILE,
    MAX_CSR_BYTES,
    CAError,
    CAOptions,
    CertificateAuthority,
    CSRError,
    IdentityError,
    TTLError,
    generate_root,
)

from .ca_fixtures import *

pytestmark = pytest.mark.timeout(60)

# --------------------------------------------------------------------------------- protos


def test_generated_ca_protos_import_as_package_and_round_trip():
    from pilot.gen.istio.v1.auth import ca_pb2, ca_pb2_grpc

    req = ca_pb2.IstioCertificateRequest(csr="-----BEGIN CERTIFICATE REQUEST-----", validity_duration=3600)
    req.metadata.update({"ClusterID": "Kubernetes", "WorkloadName": "productpage-v1"})
    back = ca_pb2.IstioCertificateRequest.FromString(req.SerializeToString())
    assert back == req and back.metadata["ClusterID"] == "Kubernetes"
    fields = {f.name: f.number for f in ca_pb2.IstioCertificateRequest.DESCRIPTOR.fields}
    assert fields == {"csr": 1, "validity_duration": 3, "metadata": 4}
    resp = ca_pb2.IstioCertificateResponse(cert_chain=["leaf", "root"])
    assert list(ca_pb2.IstioCertificateResponse.FromString(resp.SerializeToString()).cert_chain) == ["leaf", "root"]
    service = ca_pb2.DESCRIPTOR.services_by_name["IstioCertificateService"]
    assert service.full_name == "istio.v1.auth.IstioCertificateService"
    assert service.methods_by_name["CreateCertificate"].input_type.full_name == "istio.v1.auth.IstioCertificateRequest"
    assert hasattr(ca_pb2_grpc, "IstioCertificateServiceStub")
    assert hasattr(ca_pb2_grpc, "add_IstioCertificateServiceServicer_to_server")
    # Imported once, under pilot.gen only: no second top-level `istio` package.
    import sys
    assert "istio" not in sys.modules
    assert ca_pb2_grpc.istio_dot_v1_dot_auth_dot_ca__pb2 is ca_pb2


# --------------------------------------------------------------------------------- SPIFFE


def test_spiffe_build_and_parse():
    uri = spiffe.build("cluster.local", "default", "bookinfo-productpage")
    assert uri == ID
    ident = spiffe.parse(uri)
    assert (ident.trust_domain, ident.namespace, ident.service_account) == (
        "cluster.local", "default", "bookinfo-productpage")
    assert str(ident) == uri
    assert spiffe.validate_spiffe_id("spiffe://example.org/some/path") == "spiffe://example.org/some/path"
    assert spiffe.validate_spiffe_id("spiffe://example.org") == "spiffe://example.org"


@pytest.mark.parametrize(("uri", "message"), [
    ("https://cluster.local/ns/a/sa/b", "must start with 'spiffe://'"),
    ("spiffe:///ns/a/sa/b", "trust domain is empty"),
    ("spiffe://Cluster.Local/ns/a/sa/b", "lowercase"),
    ("spiffe://cluster.local:8080/ns/a/sa/b", "port"),
    ("spiffe://cluster.local/ns/a/sa/b?x=1", "query or fragment"),
    ("spiffe://cluster.local/ns//sa/b", "empty path segment"),
    ("spiffe://cluster.local/ns/../sa/b", "'.' or '..'"),
    ("spiffe://cluster.local/ns/a/sa/b/", "may not end with '/'"),
    ("spiffe://cluster.local/ns/a/sa/b c", "may only hold"),
    ("spiffe://cluster.local/ns/a/serviceaccount/b", "not an Istio workload identity"),
    ("spiffe://cluster.local/ns/a", "not an Istio workload identity"),
])
def test_spiffe_parse_errors(uri, message):
    with pytest.raises(spiffe.SpiffeIdError, match=message.replace("?", r"\?").replace(".", r"\.")):
        spiffe.parse(uri)


def test_spiffe_build_rejects_bad_parts():
    with pytest.raises(spiffe.SpiffeIdError, match="namespace"):
        spiffe.build("cluster.local", "", "sa")
    with pytest.raises(spiffe.SpiffeIdError, match="service account"):
        spiffe.build("cluster.local", "ns", "a/b")
    with pytest.raises(spiffe.SpiffeIdError, match="trust domain"):
        spiffe.build("Bad_Domain!", "ns", "sa")


# --------------------------------------------------------------------------------- workload leaves


@pytest.mark.parametrize("csr_type", ["RSA", "EC"])
def test_leaf_has_only_the_callers_spiffe_id(rsa_ca, csr_type):
    csr = make_csr(csr_type, subject="admin", ask_ca=True, sans=[
        x509.DNSName("evil.example.com"),
        x509.UniformResourceIdentifier("spiffe://cluster.local/ns/istio-system/sa/istiod"),
        x509.RFC822Name("root@example.com")])
    chain = certs(rsa_ca.sign(csr, [ID]))
    leaf = chain[0]
    assert len(chain) == 2
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical  # empty subject
    assert list(san.value) == [x509.UniformResourceIdentifier(ID)]
    assert leaf.subject == x509.Name([])
    bc = leaf.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and not bc.value.ca
    ku = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and ku.key_encipherment and not ku.key_cert_sign
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert leaf.issuer == chain[1].subject
    verify_chain(chain)
    assert x509.load_pem_x509_certificate(rsa_ca.root_cert_pem.encode()) == chain[-1]


def test_leaf_verifies_with_a_real_path_validator(ec_ca):
    from cryptography.x509.verification import PolicyBuilder, Store

    chain = certs(ec_ca.sign(make_csr("EC"), [ID]))
    verifier = (PolicyBuilder().store(Store([x509.load_pem_x509_certificate(ec_ca.root_cert_pem.encode())]))
                .build_client_verifier())
    verified = verifier.verify(chain[0], chain[1:-1])
    assert verified.subjects == [x509.UniformResourceIdentifier(ID)]


def test_several_identities_deduplicated(ec_ca):
    other = "spiffe://cluster.local/ns/default/sa/other"
    leaf = certs(ec_ca.sign(make_csr(), [ID, other, ID]))[0]
    assert uri_sans(leaf) == [ID, other]


@pytest.mark.parametrize(("identities", "message"), [
    ([], "no identity"),
    (["https://example.com"], "must start with 'spiffe://'"),
    (["spiffe://cluster.local/ns/a/sa/b", "spiffe://x/ns/../sa/b"], r"'\.' or '\.\.'"),
])
def test_invalid_identities_rejected(ec_ca, identities, message):
    with pytest.raises(IdentityError, match=message) as e:
        ec_ca.sign(make_csr(), identities)
    assert e.value.code == "INVALID_ARGUMENT"


def _lifetime(leaf: x509.Certificate, start: dt.datetime) -> dt.timedelta:
    return leaf.not_valid_after_utc - start


def test_ttl_default_explicit_and_too_long(ec_ca):
    csr = make_csr()
    for requested in (None, 0, -5):
        start = dt.datetime.now(dt.UTC)
        life = _lifetime(certs(ec_ca.sign(csr, [ID], requested))[0], start)
        assert abs(life - dt.timedelta(hours=24)).total_seconds() < 5, requested  # DEFAULT_WORKLOAD_CERT_TTL
    start = dt.datetime.now(dt.UTC)
    leaf = certs(ec_ca.sign(csr, [ID], 2 * HOUR))[0]
    assert abs(_lifetime(leaf, start) - dt.timedelta(hours=2)).total_seconds() < 5
    assert leaf.not_valid_before_utc <= start  # backdated for clock skew, never in the future
    # Exactly the maximum is fine; one second more is refused.
    assert certs(ec_ca.sign(csr, [ID], 90 * DAY))[0]
    with pytest.raises(TTLError, match="requested certificate TTL 2160h1s") as e:
        ec_ca.sign(csr, [ID], 90 * DAY + 1)
    assert "exceeds the maximum 2160h (MAX_WORKLOAD_CERT_TTL)" in e.value.message
    assert e.value.code == "INVALID_ARGUMENT" and isinstance(e.value, CAError)


def test_ttl_options_from_env():
    opts = CAOptions.from_env({"DEFAULT_WORKLOAD_CERT_TTL": "1h", "MAX_WORKLOAD_CERT_TTL": "48h",
                               "CA_KEY_TYPE": "ec", "ROOT_CA_DIR": "/etc/cacerts"})
    assert (opts.default_cert_ttl, opts.max_cert_ttl, opts.key_type, opts.root_ca_dir) == (
        3600.0, 48 * 3600.0, "EC", "/etc/cacerts")
    assert CAOptions.from_env({}).key_type == "RSA" and CAOptions.from_env({}).root_cert_ttl == 87600 * 3600.0
    assert "CA_KEY_TYPE" in features.KNOBS
    with pytest.raises(ValueError, match="CA_KEY_TYPE='DSA': must be RSA or EC"):
        CAOptions.from_env({"CA_KEY_TYPE": "DSA"})
    ca = ca_from(root_files("EC"), default_cert_ttl=3600.0, max_cert_ttl=7200.0)
    start = dt.datetime.now(dt.UTC)
    assert abs(_lifetime(certs(ca.sign(make_csr(), [ID]))[0], start) - dt.timedelta(hours=1)).total_seconds() < 5
    with pytest.raises(TTLError, match="exceeds the maximum 2h"):
        ca.sign(make_csr(), [ID], 3 * HOUR)


def test_leaf_never_outlives_the_signing_chain(tmp_path):
    # A root with 2 hours left: a 10 hour request ends when the root does.
    files = generate_root(org="cluster.local", key_type="EC", ttl_seconds=2 * HOUR)
    ca = ca_from(files)
    root = x509.load_pem_x509_certificate(files[CA_CERT_FILE].encode())
    assert certs(ca.sign(make_csr(), [ID], 10 * HOUR))[0].not_valid_after_utc == root.not_valid_after_utc
    assert certs(ca.sign(make_csr(), [ID]))[0].not_valid_after_utc == root.not_valid_after_utc  # 24h default
    # Plugged-in: the intermediate expiring first is the bound.
    d = tmp_path / "cacerts"
    write_dir(d, make_intermediate(root_files("EC"), days=1 / 24))
    plugged = CertificateAuthority.from_plugged_in_dir(d, CAOptions(root_ca_dir=str(d)))
    chain = certs(plugged.sign(make_csr(), [ID], 5 * HOUR))
    assert chain[0].not_valid_after_utc == chain[1].not_valid_after_utc
    assert plugged.cert_chain_expiry == chain[1].not_valid_after_utc


def test_malformed_and_oversized_csrs_rejected(ec_ca):
    good = make_csr().decode()
    cases = [
        ("", "the CSR is empty"),
        ("hello", "the CSR is not PEM"),
        (good.replace("-----BEGIN CERTIFICATE REQUEST-----", "-----BEGIN CERTIFICATE-----")
         .replace("-----END CERTIFICATE REQUEST-----", "-----END CERTIFICATE-----"), "the CSR is not PEM"),
        ("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
         "cannot be parsed as PKCS#10"),
        (good + "x" * MAX_CSR_BYTES, f"the CSR is {len(good) + MAX_CSR_BYTES} bytes; the limit is 16384"),
        (make_csr("RSA1024").decode(), "RSA key of 1024 bits; 2048 to 8192 are accepted"),
    ]
    for csr, message in cases:
        with pytest.raises(CSRError) as e:
            ec_ca.sign(csr, [ID])
        assert message in e.value.message, (message, e.value.message)
        assert e.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize("csr_type", ["RSA", "EC"])
def test_csr_with_bad_signature_rejected(ec_ca, csr_type):
    csr = x509.load_pem_x509_csr(make_csr(csr_type))
    der = bytearray(csr.public_bytes(serialization.Encoding.DER))
    der[-1] ^= 0x01  # the last byte belongs to the signature
    bad = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CSRError, match="the CSR signature is invalid"):
        ec_ca.sign(bad, [ID])


def test_csr_signed_by_another_key_rejected(ec_ca):
    # A CSR carrying key A signed by key B: proof of possession fails.
    a, b = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    csr_a = x509.load_pem_x509_csr(make_csr(key=a))
    csr_b = x509.load_pem_x509_csr(make_csr(key=b))
    # Splice: A's CertificationRequestInfo with B's signature over B's info.
    der_a, der_b = csr_a.public_bytes(serialization.Encoding.DER), csr_b.public_bytes(serialization.Encoding.DER)
    info_a, info_b = csr_a.tbs_certrequest_bytes, csr_b.tbs_certrequest_bytes
    spliced = der_b.replace(info_b, info_a)
    assert len(info_a) == len(info_b) and spliced != der_b and der_a  # P-256 infos have equal length
    pem = x509.load_der_x509_csr(spliced).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CSRError, match="signature is invalid"):
        ec_ca.sign(pem, [ID])


def test_expired_chain_refused():
    files = generate_root(org="cluster.local", key_type="EC", ttl_seconds=5)  # room for a loaded machine
    ca = ca_from(files)
    not_after = x509.load_pem_x509_certificate(files[CA_CERT_FILE].encode()).not_valid_after_utc
    # Waiting for the clock to pass a certificate's expiry is the condition itself, not a guess.
    time.sleep(max(0.0, (not_after - dt.datetime.now(dt.UTC)).total_seconds()) + 1.1)
    with pytest.raises(CAError, match="the CA certificate chain expired"):
        ca.sign(make_csr(), [ID])


# --------------------------------------------------------------------------------- server cert


@pytest.mark.parametrize("key_type", ["RSA", "EC"])
def test_server_cert_for_istiod(rsa_ca, key_type):
    names = [f"istiod.{NS}.svc", f"istiod.{NS}.svc.cluster.local", "istiod"]
    sc = rsa_ca.sign_server_cert(names, 12 * HOUR, key_type=key_type)
    chain = certs(sc.cert_chain)
    leaf = chain[0]
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == names
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == names[0]
    key = serialization.load_pem_private_key(sc.key_pem.encode(), None)
    assert key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) \
        == leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert isinstance(key, rsa.RSAPrivateKey if key_type == "RSA" else ec.EllipticCurvePrivateKey)
    assert sc.not_after == leaf.not_valid_after_utc
    verify_chain(chain)

    from cryptography.x509.verification import PolicyBuilder, Store
    verifier = (PolicyBuilder().store(Store([chain[-1]])).build_server_verifier(x509.DNSName(names[0])))
    verifier.verify(leaf, [])


# --------------------------------------------------------------------------------- throughput


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_signing_throughput():
    """Signatures per second and CPU per signature, by CA key and CSR key type."""
    per_case = float(os.environ.get("CA_BENCH_SECONDS", "3"))
    figures: dict[str, dict[str, float]] = {}
    for ca_type in ("RSA", "EC"):
        ca = ca_from(root_files(ca_type))
        for csr_type in ("RSA", "EC"):
            csrs = [make_csr(csr_type) for _ in range(20)]
            ca.sign(csrs[0], [ID])  # warm up
            n = 0
            wall0, cpu0 = time.perf_counter(), time.process_time()
            while time.perf_counter() - wall0 < per_case:
                ca.sign(csrs[n % len(csrs)], [ID])
                n += 1
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            figures[f"ca_{ca_type.lower()}_csr_{csr_type.lower()}"] = {
                "signatures": n, "per_second": round(n / wall, 1),
                "cpu_ms_per_signature": round(cpu / n * 1000, 3)}
    print("FIGURES " + json.dumps({"ca_sign": figures}))
    assert all(f["per_second"] > 50 for f in figures.values())
