"""The agent's OCI pull (pilot/agent/oci.py through ModuleCache) against a real registry on
loopback (tests/support/oci_registry.py): the three image formats, digests, the token challenge
with and without the pull secret's credentials, and istio-agent's caching rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from pilot.agent import oci
from pilot.agent.wasm import FetchError, ModuleCache
from tests.support.oci_registry import Registry, artifact_image, docker_config, docker_image, oci_image
from tests.support.wasm_module import add_response_header_module

MODULE = add_response_header_module("x-oci", "yes")


@pytest.mark.parametrize("build", [artifact_image, docker_image, oci_image], ids=["artifact", "docker", "oci"])
async def test_each_image_format_yields_the_module_and_is_cached_by_digest(tmp_path, build):
    async with Registry() as reg:
        image = reg.push("wasm/header", "v1", build(MODULE))
        cache = ModuleCache(str(tmp_path))
        url = f"oci://{reg.host}/wasm/header:v1"
        path = await cache.get(url, "", always=False, timeout=10)
        assert Path(path).read_bytes() == MODULE
        assert Path(path).name == f"{image.hex}.wasm"  # istio-agent's layout: image name dir / digest
        assert reg.served["token"] == 1 and reg.served["manifest"] == 1
        # IfNotPresent: the tag's digest is remembered; nothing is asked of the registry again.
        assert await cache.get(url, "", always=False, timeout=10) == path
        assert reg.served["manifest"] == 1
        # Pinned by the image digest (sha256, as istio-agent compares it): a hit, even with Always.
        assert await cache.get(url, image.hex, always=True, timeout=10, resource_version="9") == path
        by_digest = f"oci://{reg.host}/wasm/header@{image.digest}"
        assert await cache.get(by_digest, "", always=True, timeout=10) == path
        assert reg.served["manifest"] == 1


async def test_a_wrong_digest_fails_before_any_layer_is_downloaded(tmp_path):
    async with Registry() as reg:
        image = reg.push("wasm/header", "v1", artifact_image(MODULE))
        cache = ModuleCache(str(tmp_path))
        with pytest.raises(FetchError, match="image digest"):
            await cache.get(f"oci://{reg.host}/wasm/header:v1", "ab" * 32, always=False, timeout=10)
        assert reg.served["blob"] == 0
        # A registry (or someone in between) answering a digest with another image's manifest.
        other = docker_image(b"\x00asm\x01\x00\x00\x00")
        reg.repos["wasm/header"][other.digest] = image
        with pytest.raises(FetchError, match="not the sha256:"):
            await cache.get(f"oci://{reg.host}/wasm/header@{other.digest}", "", always=False, timeout=10)
        assert 'result="checksum_mismatched"} 1' in cache.metrics.render()


async def test_latest_without_policy_and_always_pull_again_when_the_plugin_changes(tmp_path):
    async with Registry() as reg:
        reg.push("wasm/header", "latest", artifact_image(MODULE))
        cache = ModuleCache(str(tmp_path))
        url = f"oci://{reg.host}/wasm/header:latest"
        first = await cache.get(url, "", always=True, timeout=10, resource_name="ns.p", resource_version="1")
        assert await cache.get(url, "", always=True, timeout=10, resource_name="ns.p", resource_version="1") == first
        assert reg.served["manifest"] == 1
        newer = reg.push("wasm/header", "latest", docker_image(add_response_header_module("x-oci", "v2")))
        second = await cache.get(url, "", always=True, timeout=10, resource_name="ns.p", resource_version="2")
        assert second != first and Path(second).name == f"{newer.hex}.wasm"
        assert reg.served["manifest"] == 2


async def test_a_registry_that_wants_credentials_gets_the_pull_secrets_and_refuses_without(tmp_path):
    async with Registry(users={"puller": "s3cret"}) as reg:
        reg.push("private/header", "v1", oci_image(MODULE))
        cache = ModuleCache(str(tmp_path))
        url = f"oci://{reg.host}/private/header:v1"
        with pytest.raises(FetchError, match="HTTP 401") as e:
            await cache.get(url, "", always=False, timeout=10)
        wrong = docker_config(reg.host, "puller", "guess")
        with pytest.raises(FetchError) as e:
            await cache.get(url, "", always=False, timeout=10, pull_secret=wrong.encode())
        assert "guess" not in str(e.value) and "puller" not in str(e.value)  # no credential in errors
        good = docker_config(f"https://{reg.host}", "puller", "s3cret")  # docker's URL form of the key
        path = await cache.get(url, "", always=False, timeout=10, pull_secret=good.encode())
        assert Path(path).read_bytes() == MODULE
        assert reg.served["token_refused"] == 2 and reg.served["token"] == 1


async def test_https_registries_are_verified_unless_listed_as_insecure(tmp_path):
    import ssl

    from tests.support.certs import issue, make_ca

    leaf = issue(make_ca("registry test CA"), ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "tls.key").write_bytes(leaf.key_pem)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    async with Registry(ssl_context=server) as reg:
        reg.push("wasm/header", "v1", artifact_image(MODULE))
        url = f"oci://{reg.host}/wasm/header:v1"
        # A certificate the agent cannot verify is a failure, never a reason to try plain HTTP.
        with pytest.raises(FetchError, match="TLS verification"):
            await ModuleCache(str(tmp_path / "a")).get(url, "", always=False, timeout=10)
        assert reg.served["manifest"] == 0
        for insecure in ([reg.host], ["*"]):  # WASM_INSECURE_REGISTRIES
            path = await ModuleCache(str(tmp_path / insecure[0][:1]), insecure).get(url, "", always=False,
                                                                                    timeout=10)
            assert Path(path).read_bytes() == MODULE


@pytest.mark.parametrize(("realm", "problem"), [
    ("http://169.254.169.254/latest/meta-data/", "private, loopback or link-local"),
    ("http://10.0.0.1/token", "private"),
    ("http://localhost:8080/token", "localhost"),
    ("file:///etc/passwd", "scheme"),
    ("https://auth.example.com/token", None),
    ("http://127.0.0.1:5000/token", None),  # the registry's own host
])
def test_token_realms_inside_the_node_are_refused_as_istio_agent_does(realm, problem):
    got = oci.realm_problem(realm, "127.0.0.1")
    assert (got is None) if problem is None else (got is not None and problem in got)


@pytest.mark.parametrize(("text", "want"), [
    ("ghcr.io/org/plugin:1.0", ("ghcr.io", "org/plugin", "1.0", "")),
    ("127.0.0.1:5000/wasm/x", ("127.0.0.1:5000", "wasm/x", "latest", "")),
    ("docker.io/tetrate/plugin@sha256:" + "a" * 64, ("index.docker.io", "tetrate/plugin", "", "sha256:" + "a" * 64)),
    ("alpine", ("index.docker.io", "library/alpine", "latest", "")),
    ("localhost/x:2", ("localhost", "x", "2", "")),
])
def test_image_references_are_read_as_docker_reads_them(text, want):
    r = oci.parse_reference(text)
    assert (r.registry, r.repository, r.tag, r.digest) == want


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/plugin.wasm", "oci://169.254.169.254/wasm/x:1",
                                 "http://[fe80::1]/plugin.wasm", "oci://100.100.100.200/wasm/x:1"])
async def test_link_local_and_cloud_metadata_addresses_are_never_dialled(tmp_path, url):
    cache = ModuleCache(str(tmp_path))
    with pytest.raises(FetchError, match="link-local or a cloud metadata address"):
        await cache.get(url, "", always=False, timeout=5)
