"""Pulling a Wasm module out of an OCI image (istio-agent's pkg/wasm/imagefetcher.go), with a
client of the OCI distribution API written for that one job: resolve a tag or digest to a
manifest, follow the registry's token challenge, download the layers and take the module out.

The three image formats istio-agent accepts, tried in its order:
- Docker image (manifest `application/vnd.docker.distribution.manifest.v2+json`): the last layer,
  `application/vnd.docker.image.rootfs.diff.tar.gzip`, holds a file named `plugin.wasm`;
- OCI image likewise, its last layer `application/vnd.oci.image.layer.v1.tar+gzip`;
- the Wasm artifact: two layers, one of them the module itself
  (`application/vnd.module.wasm.content.layer.v1+wasm`).

Transport as istio-agent's (go-containerregistry): HTTPS first, plain HTTP when the server answers
HTTPS with HTTP; TLS verification skipped only for the hosts in WASM_INSECURE_REGISTRIES (`*`:
all). Authentication: anonymous, or the pull secret's docker config credentials for the
registry, sent as Basic to a Basic challenge or to the Bearer challenge's token service. As
istio-agent, a token service (`realm`) on a loopback, private or link-local address or on
`localhost` is refused (a registry must not make the agent, with credentials, call inside the
node); unlike istio-agent, one on the registry's own host is allowed, since that reaches nothing
the agent was not already told to contact. Every blob is checked against its digest, and a
manifest pulled by digest against that digest. Credentials never appear in errors or logs.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import ipaddress
import json
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

import aiohttp

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
WASM_LAYER = "application/vnd.module.wasm.content.layer.v1+wasm"
MODULE_FILE = "plugin.wasm"
DEFAULT_REGISTRY = "index.docker.io"
MAX_MANIFEST_BYTES = 4 << 20
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_REPO = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")


class OciError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Reference:
    registry: str  # host[:port]
    repository: str
    tag: str  # "" when pulled by digest
    digest: str  # "sha256:HEX" or ""

    @property
    def name(self) -> str:
        """The image without tag or digest: what a module is cached under (istio-agent's moduleKey)."""
        return f"{self.registry}/{self.repository}"

    @property
    def identifier(self) -> str:
        return self.digest or self.tag

    def __str__(self) -> str:
        return f"{self.name}@{self.digest}" if self.digest else f"{self.name}:{self.tag}"


def parse_reference(text: str) -> Reference:
    """`REGISTRY/REPO[:TAG][@sha256:HEX]` as docker and go-containerregistry read it: a first part
    without `.` or `:` (and not `localhost`) is a Docker Hub repository; no tag means `latest`."""
    rest, _, digest = text.partition("@")
    if digest and not _DIGEST.match(digest):
        raise OciError(f"image {text!r}: digest must be sha256: and 64 lowercase hex digits")
    slash = rest.find("/")
    first = rest[:slash] if slash >= 0 else ""
    if slash >= 0 and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest[slash + 1:]
    else:
        registry, path = DEFAULT_REGISTRY, rest
    tag = ""
    colon = path.rfind(":")
    if colon > path.rfind("/"):
        path, tag = path[:colon], path[colon + 1:]
        if not _TAG.match(tag):
            raise OciError(f"image {text!r}: bad tag {tag!r}")
    if registry == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    if not path or not _REPO.match(path):
        raise OciError(f"image {text!r}: bad repository name {path!r}")
    if registry in ("docker.io", "registry-1.docker.io"):
        registry = DEFAULT_REGISTRY
    return Reference(registry, path, tag or ("" if digest else "latest"), digest)


def credentials_for(docker_config: bytes, registry: str) -> tuple[str, str] | None:
    """(username, password) for `registry` from a `.dockerconfigjson` document, None when it holds
    none for that registry (then the pull is anonymous, as istio-agent's keychain does)."""
    try:
        doc = json.loads(docker_config)
    except ValueError:
        raise OciError("the image pull secret is not a docker config JSON document") from None
    auths = doc.get("auths") if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        return None
    wanted = {registry} | ({"docker.io", "index.docker.io", "registry-1.docker.io"}
                           if registry == DEFAULT_REGISTRY else set())
    for key, entry in auths.items():
        host = urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]
        if host not in wanted or not isinstance(entry, dict):
            continue
        user, password = entry.get("username") or "", entry.get("password") or ""
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except ValueError:
                raise OciError(f"the image pull secret's auth for {registry} is not base64 user:password") from None
        if user or password:
            return user, password
    return None


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",service="..."` -> ("bearer", {realm, service, ...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


def realm_problem(realm: str, registry_host: str) -> str | None:
    """Why the agent will not ask `realm` for a token (istio-agent's validateRealmURL), or None."""
    u = urlsplit(realm)
    if u.scheme not in ("http", "https"):
        return f"token realm scheme {u.scheme!r} not allowed"
    host = u.hostname or ""
    if not host:
        return "token realm has no host"
    if host == registry_host:
        return None  # the registry's own host: nothing new is reached
    if host in ("localhost", "metadata.google.internal"):
        return f"token realm targets {host}"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.is_private or ip.is_loopback or ip.is_link_local:
        return "token realm targets a private, loopback or link-local address"
    return None


@dataclass
class Registry:
    """One pull's conversation with a registry (scheme and token found once, reused for blobs)."""

    session: aiohttp.ClientSession
    ref: Reference
    insecure: bool  # skip TLS verification (WASM_INSECURE_REGISTRIES)
    credentials: tuple[str, str] | None = field(repr=False)  # never shown
    max_bytes: int
    scheme: str = "https"
    _auth: str | None = field(default=None, repr=False)  # the Authorization header value once one is known
    _checked: bool = False

    @property
    def _ssl(self) -> bool:
        return not self.insecure

    def _url(self, path: str) -> str:
        return f"{self.scheme}://{self.ref.registry}{path}"

    async def _send(self, path: str, accept: str = "") -> aiohttp.ClientResponse:
        headers = {"Accept": accept} if accept else {}
        if self._auth:
            headers["Authorization"] = self._auth
        try:
            return await self.session.get(self._url(path), headers=headers, ssl=self._ssl)
        except aiohttp.ClientConnectorCertificateError as e:
            raise OciError(f"TLS verification of {self.ref.registry} failed: {e.certificate_error}") from None
        except aiohttp.ClientSSLError as e:
            if self.scheme == "https" and _spoke_http(e):
                # As istio-agent (after helm): a registry that answers HTTPS with HTTP is spoken to in HTTP.
                self.scheme = "http"
                return await self._send(path, accept)
            raise OciError(f"TLS to {self.ref.registry} failed: {e}") from None

    async def get(self, path: str, accept: str = "") -> tuple[bytes, Mapping[str, str]]:
        resp = await self._send(path, accept)
        try:
            if resp.status == 401 and not self._checked:
                self._checked = True
                await self._authenticate(resp.headers.get("WWW-Authenticate", ""))
                resp.release()
                resp = await self._send(path, accept)
            if resp.status != 200:
                raise OciError(f"GET {self._url(path)}: HTTP {resp.status}"
                               + (" (credentials refused or missing)" if resp.status in (401, 403) else ""))
            data = await resp.content.read(self.max_bytes + 1)
            if len(data) > self.max_bytes:
                raise OciError(f"GET {self._url(path)}: larger than {self.max_bytes} bytes")
            return data, resp.headers
        finally:
            resp.release()

    async def _authenticate(self, header: str) -> None:
        scheme, params = _challenge(header)
        if scheme == "basic":
            if self.credentials is None:
                raise OciError(f"{self.ref.registry} asks for credentials and the plugin has no pull secret for it")
            self._auth = aiohttp.encode_basic_auth(*self.credentials)
            return
        if scheme != "bearer" or "realm" not in params:
            raise OciError(f"{self.ref.registry}: unsupported authentication challenge {scheme!r}")
        realm = params["realm"]
        problem = realm_problem(realm, urlsplit(f"//{self.ref.registry}").hostname or "")
        if problem:
            raise OciError(f"{self.ref.registry}: {problem}")
        query = {"scope": params.get("scope") or f"repository:{self.ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        headers = {"Authorization": aiohttp.encode_basic_auth(*self.credentials)} if self.credentials else {}
        url = f"{realm}{'&' if '?' in realm else '?'}{urlencode(query)}"
        try:
            async with self.session.get(url, headers=headers, ssl=self._ssl) as r:
                if r.status != 200:
                    raise OciError(f"token service of {self.ref.registry}: HTTP {r.status}"
                                   + (" (credentials refused)" if r.status in (401, 403) else ""))
                body = await r.content.read(1 << 20)
        except aiohttp.ClientError as e:
            raise OciError(f"token service of {self.ref.registry}: {type(e).__name__}") from None
        try:
            doc = json.loads(body)
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise OciError(f"token service of {self.ref.registry} answered no token")
        self._auth = f"Bearer {token}"


def _spoke_http(e: aiohttp.ClientSSLError) -> bool:
    text = str(e)
    # What OpenSSL says when the answer to a ClientHello is not TLS (Go: "server gave HTTP response").
    return any(s in text for s in ("WRONG_VERSION_NUMBER", "wrong version number", "record layer failure"))


@dataclass(frozen=True)
class Image:
    digest: str  # hex sha256 of the manifest: what `sha256` pins for an OCI module, as istio-agent
    manifest: dict
    registry: Registry

    async def module(self) -> bytes:
        layers = self.manifest.get("layers")
        if not isinstance(layers, list) or not layers:
            raise OciError("the image has no layers")
        media = self.manifest.get("mediaType", "")
        last = layers[-1] if isinstance(layers[-1], dict) else {}
        if media == DOCKER_MANIFEST:
            if last.get("mediaType") != DOCKER_LAYER:
                raise OciError(f"Docker image: last layer is {last.get('mediaType')!r}, expected {DOCKER_LAYER}")
            return _from_tar_gz(await self._blob(last))
        if last.get("mediaType") == OCI_LAYER:
            return _from_tar_gz(await self._blob(last))
        wasm = [layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == WASM_LAYER]
        if len(layers) != 2 or not wasm:
            raise OciError("the image is in none of the Wasm image formats: not a Docker or OCI image whose last "
                           f"layer holds {MODULE_FILE}, nor a Wasm artifact (two layers, one {WASM_LAYER})")
        return await self._blob(wasm[0])

    async def _blob(self, descriptor: dict) -> bytes:
        digest = descriptor.get("digest", "")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise OciError(f"layer digest {digest!r} is not a sha256 digest")
        data, _ = await self.registry.get(f"/v2/{self.registry.ref.repository}/blobs/{digest}")
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise OciError(f"layer {digest} does not match its digest")
        return data


def _from_tar_gz(data: bytes) -> bytes:
    try:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data)), mode="r:") as tar:
            for member in tar:
                if member.isfile() and member.name.rsplit("/", 1)[-1] == MODULE_FILE:
                    f = tar.extractfile(member)
                    if f is not None:
                        return f.read()
    except (OSError, EOFError, tarfile.TarError) as e:
        raise OciError(f"layer is not a gzipped tar: {e}") from None
    raise OciError(f"{MODULE_FILE} not found in the image's last layer")


async def resolve(session: aiohttp.ClientSession, ref: Reference, *, insecure: bool,
                  docker_config: bytes | None, max_bytes: int) -> Image:
    """The image's manifest and digest (no layer downloaded yet: a cached module needs none)."""
    creds = credentials_for(docker_config, ref.registry) if docker_config is not None else None
    registry = Registry(session, ref, insecure, creds, max_bytes)
    accept = ", ".join((OCI_MANIFEST, DOCKER_MANIFEST, *INDEX_TYPES))
    try:
        data, headers = await registry.get(f"/v2/{ref.repository}/manifests/{ref.identifier}", accept)
    except aiohttp.ClientError as e:
        raise OciError(f"{ref.registry}: {type(e).__name__}: {e}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise OciError("manifest too large")
    digest = hashlib.sha256(data).hexdigest()
    if ref.digest and "sha256:" + digest != ref.digest:
        raise OciError(f"manifest of {ref.name} has digest sha256:{digest}, not the {ref.digest} asked for")
    said = headers.get("Docker-Content-Digest", "")
    if said and said != "sha256:" + digest and said.startswith("sha256:"):
        raise OciError(f"manifest of {ref.name} does not match the digest the registry gave ({said})")
    try:
        manifest = json.loads(data)
    except ValueError:
        raise OciError(f"manifest of {ref.name} is not JSON") from None
    if not isinstance(manifest, dict):
        raise OciError(f"manifest of {ref.name} is not a JSON object")
    media = manifest.get("mediaType") or headers.get("Content-Type", "").split(";")[0]
    if media in INDEX_TYPES or "manifests" in manifest:
        raise OciError(f"{ref} is an image index; name a single image (by its digest)")
    return Image(digest, manifest, registry)
