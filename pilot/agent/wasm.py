"""Remote Wasm modules for Envoy (istio-agent's pkg/wasm): ECDS resources naming a module by URL
(`vm_config.code.remote`, what istiod builds for an http(s) WasmPlugin url) are fetched by the
agent, checked against their sha256, cached on disk, and handed to Envoy as a local file.

Pull policy comes, as from istiod, in the VM's environment (`ISTIO_META_WASM_IMAGE_PULL_POLICY`,
removed before Envoy sees it): `Always` fetches each time the resource arrives, anything else
reuses a cached file (keyed by URL and sha256). A module that cannot be fetched or does not match
its sha256 turns the filter, as istio-agent does, into an RBAC filter of the same name: allow-all
for failStrategy FAIL_OPEN, deny-all (403) otherwise.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import aiohttp
from envoy.config.core.v3 import extension_pb2
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.wasm.v3 import wasm_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.any_pb2 import Any as AnyProto

from pilot import logging as plog

log = plog.get("wasm")

PULL_POLICY_ENV = "ISTIO_META_WASM_IMAGE_PULL_POLICY"
RESOURCE_VERSION_ENV = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"
MAX_MODULE_BYTES = 256 << 20  # istio-agent's limit
DEFAULT_TIMEOUT_S = 30.0
WASM_HTTP_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"


class FetchError(Exception):
    pass


class ModuleCache:
    def __init__(self, directory: str) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.fetches = 0  # downloads made (a cache hit makes none)

    def path_for(self, url: str, sha256: str) -> Path:
        return self.directory / (hashlib.sha256(f"{url}\n{sha256}".encode()).hexdigest() + ".wasm")

    async def get(self, url: str, sha256: str, *, always: bool, timeout: float) -> str:
        path = self.path_for(url, sha256)
        if not always and path.exists():
            return str(path)
        data = await self._download(url, timeout)
        if sha256:
            got = hashlib.sha256(data).hexdigest()
            if got != sha256:
                raise FetchError(f"module downloaded from {url} has sha256 {got}, expected {sha256}")
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # Envoy never reads a half-written module
        return str(path)

    async def _download(self, url: str, timeout: float) -> bytes:
        self.fetches += 1
        try:
            async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                        session.get(url) as resp):
                if resp.status != 200:
                    raise FetchError(f"GET {url}: HTTP {resp.status}")
                data = await resp.content.read(MAX_MODULE_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise FetchError(f"GET {url}: {type(e).__name__}: {e}") from None
        if len(data) > MAX_MODULE_BYTES:
            raise FetchError(f"GET {url}: module larger than {MAX_MODULE_BYTES} bytes")
        return data


def _rbac(deny: bool) -> AnyProto:
    # RBAC without rules lets everything through; rules with action ALLOW and no policy match nothing.
    msg = rbac_pb2.RBAC(rules=rbac_config_pb2.RBAC(action=rbac_config_pb2.RBAC.ALLOW)) if deny else rbac_pb2.RBAC()
    out = AnyProto()
    out.Pack(msg)
    return out


async def convert(resource: AnyProto, cache: ModuleCache) -> bool:
    """Rewrite one ECDS resource in place; True when it changed."""
    tec = extension_pb2.TypedExtensionConfig()
    if not resource.Unpack(tec) or tec.typed_config.type_url != WASM_HTTP_TYPE:
        return False
    filt = http_wasm_pb2.Wasm()
    tec.typed_config.Unpack(filt)
    vm = filt.config.vm_config
    if not vm.code.HasField("remote"):
        return False
    remote = vm.code.remote
    env = vm.environment_variables.key_values
    always = env.get(PULL_POLICY_ENV) == "Always"
    for k in (PULL_POLICY_ENV, RESOURCE_VERSION_ENV):
        env.pop(k, None)
    timeout = (remote.http_uri.timeout.ToTimedelta().total_seconds() if remote.http_uri.HasField("timeout")
               else DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S
    try:
        path = await cache.get(remote.http_uri.uri, remote.sha256, always=always, timeout=timeout)
    except (FetchError, OSError) as e:
        fail_open = filt.config.failure_policy == wasm_pb2.FAIL_OPEN or filt.config.fail_open
        log.error("cannot fetch Wasm module; applying the plugin's failStrategy", resource=tec.name,
                  url=remote.http_uri.uri, error=str(e), fail_strategy="FAIL_OPEN" if fail_open else "FAIL_CLOSE")
        tec.typed_config.CopyFrom(_rbac(deny=not fail_open))
    else:
        vm.code.ClearField("remote")
        vm.code.local.filename = path
        tec.typed_config.Pack(filt)
    resource.Pack(tec)
    return True


async def rewrite_response(data: bytes, delta: bool, cache: ModuleCache) -> bytes:
    """An ECDS (Delta)DiscoveryResponse with remote modules made local; the same bytes when none."""
    if delta:
        d = discovery_pb2.DeltaDiscoveryResponse.FromString(data)
        changed = [await convert(r.resource, cache) for r in d.resources]
        return d.SerializeToString() if any(changed) else data
    s = discovery_pb2.DiscoveryResponse.FromString(data)
    changed = [await convert(r, cache) for r in s.resources]
    return s.SerializeToString() if any(changed) else data
