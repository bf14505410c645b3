"""A tiny OCI distribution registry on loopback, for pulling Wasm images: `/v2/`, manifests by tag
and by digest, blobs, and a Bearer token service (`/token`) the registry's 401 challenge points
to, as Docker Hub, GHCR and distribution/distribution do. Anonymous tokens, or only for the
users it was given (checked as HTTP Basic on the token request). Counts what it serves.

Images are built the three ways istio-agent reads (tests/support/wasm_module.py gives the module):
the Wasm artifact (`application/vnd.module.wasm.content.layer.v1+wasm` plus its config layer), a
Docker image and an OCI image whose last layer is a tar.gz holding `plugin.wasm`."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import secrets
import ssl
import tarfile
from collections import Counter
from dataclasses import dataclass
from typing import Self

from aiohttp import web

from tests.support.backends import serve

WASM_LAYER = "application/vnd.module.wasm.content.layer.v1+wasm"
WASM_CONFIG_LAYER = "application/vnd.module.wasm.config.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Image:
    manifest: bytes
    media_type: str
    blobs: dict[str, bytes]

    @property
    def digest(self) -> str:
        return digest_of(self.manifest)

    @property
    def hex(self) -> str:
        return self.digest.removeprefix("sha256:")


def _descriptor(media_type: str, data: bytes) -> dict:
    return {"mediaType": media_type, "digest": digest_of(data), "size": len(data)}


def _image(media_type: str, config_type: str, config: bytes, layers: list[tuple[str, bytes]]) -> Image:
    manifest = {"schemaVersion": 2, "mediaType": media_type, "config": _descriptor(config_type, config),
                "layers": [_descriptor(t, d) for t, d in layers]}
    body = json.dumps(manifest, sort_keys=True).encode()
    return Image(body, media_type, {digest_of(d): d for d in [config, *(d for _, d in layers)]})


def _tar_gz(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(out.getvalue(), mtime=0)


def artifact_image(module: bytes) -> Image:
    """The OCI Wasm artifact: two layers, the module itself and its (JSON) config."""
    config = json.dumps({"type": "wasm"}).encode()
    return _image(OCI_MANIFEST, "application/vnd.oci.image.config.v1+json", b"{}",
                  [(WASM_LAYER, module), (WASM_CONFIG_LAYER, config)])


def docker_image(module: bytes) -> Image:
    """A Docker image (schema 2) whose last layer holds plugin.wasm."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers"}}).encode()
    return _image(DOCKER_MANIFEST, "application/vnd.docker.container.image.v1+json", config,
                  [("application/vnd.docker.image.rootfs.diff.tar.gzip", _tar_gz({"README": b"other layer"})),
                   ("application/vnd.docker.image.rootfs.diff.tar.gzip", _tar_gz({"plugin.wasm": module}))])


def oci_image(module: bytes) -> Image:
    """An OCI image whose last layer holds plugin.wasm."""
    config = json.dumps({"architecture": "amd64", "os": "linux"}).encode()
    return _image(OCI_MANIFEST, "application/vnd.oci.image.config.v1+json", config,
                  [("application/vnd.oci.image.layer.v1.tar+gzip", _tar_gz({"plugin.wasm": module}))])


def docker_config(registry: str, user: str, password: str) -> str:
    """A `.dockerconfigjson` document with one registry's credentials."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {registry: {"auth": auth}}})


class Registry:
    """`users` empty: anyone gets a token; otherwise only those users (Basic on /token)."""

    def __init__(self, users: dict[str, str] | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.users = dict(users or {})
        self.ssl_context = ssl_context  # serve HTTPS (its token service too)
        self.repos: dict[str, dict[str, Image]] = {}  # repository -> tag or digest -> image
        self.served: Counter[str] = Counter()  # "manifest", "blob", "token", "token_refused", "unauthorized"
        self._tokens: set[str] = set()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def push(self, repository: str, tag: str, image: Image) -> Image:
        tags = self.repos.setdefault(repository, {})
        tags[tag] = image
        tags[image.digest] = image
        return image

    def _authorized(self, req: web.Request) -> bool:
        header = req.headers.get("Authorization", "")
        return header.startswith("Bearer ") and header[7:] in self._tokens

    def _challenge(self, repository: str) -> web.Response:
        self.served["unauthorized"] += 1
        realm = f"{'https' if self.ssl_context else 'http'}://{self.host}/token"
        return web.Response(status=401, headers={"WWW-Authenticate": (
            f'Bearer realm="{realm}",service="test-registry",scope="repository:{repository}:pull"')},
            content_type="application/json", text='{"errors":[{"code":"UNAUTHORIZED"}]}')

    async def _ping(self, req: web.Request) -> web.Response:
        if not self._authorized(req):
            return self._challenge("")
        return web.json_response({})

    async def _token(self, req: web.Request) -> web.Response:
        if self.users:
            header = req.headers.get("Authorization", "")
            try:
                user, _, password = base64.b64decode(header.removeprefix("Basic ")).decode().partition(":")
            except ValueError:
                user, password = "", ""
            if not header.startswith("Basic ") or self.users.get(user) != password:
                self.served["token_refused"] += 1
                return web.json_response({"errors": [{"code": "UNAUTHORIZED"}]}, status=401)
        self.served["token"] += 1
        token = secrets.token_hex(16)
        self._tokens.add(token)
        return web.json_response({"token": token, "expires_in": 300})

    async def _manifest(self, req: web.Request) -> web.Response:
        repo, ref = req.match_info["repo"], req.match_info["ref"]
        if not self._authorized(req):
            return self._challenge(repo)
        image = self.repos.get(repo, {}).get(ref)
        if image is None:
            return web.json_response({"errors": [{"code": "MANIFEST_UNKNOWN"}]}, status=404)
        self.served["manifest"] += 1
        return web.Response(body=image.manifest, headers={"Content-Type": image.media_type,
                                                           "Docker-Content-Digest": image.digest})

    async def _blob(self, req: web.Request) -> web.Response:
        repo, digest = req.match_info["repo"], req.match_info["digest"]
        if not self._authorized(req):
            return self._challenge(repo)
        for image in self.repos.get(repo, {}).values():
            if digest in image.blobs:
                self.served["blob"] += 1
                return web.Response(body=image.blobs[digest], content_type="application/octet-stream")
        return web.json_response({"errors": [{"code": "BLOB_UNKNOWN"}]}, status=404)

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/v2/", self._ping)
        app.router.add_get("/token", self._token)
        app.router.add_get("/v2/{repo:.+}/manifests/{ref}", self._manifest)
        app.router.add_get("/v2/{repo:.+}/blobs/{digest}", self._blob)
        self._runner, self.port = await serve(app, ssl_context=self.ssl_context)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()
