"""Remote Wasm modules for Envoy (istio-agent's pkg/wasm): ECDS resources naming a module by URL
(`vm_config.code.remote`, what istiod builds for an http(s) WasmPlugin url) are fetched by the
agent, checked against their sha256, cached on disk, and handed to Envoy as a local file.

Pull policy comes, as from istiod, in the VM's environment (`ISTIO_META_WASM_IMAGE_PULL_POLICY`
and the plugin's `ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION`, removed before Envoy sees them):
`Always` fetches again when the plugin's resource version changes (as istio-agent: not on every
ECDS response, which would stall the proxied stream on each push and reconnect), anything else
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
from pilot.networking.wasm import (  # what the control plane writes
    PULL_POLICY_ENV,
    RESOURCE_VERSION_ENV,
    WASM_HTTP_TYPE,
)

log = plog.get("wasm")

MAX_MODULE_BYTES = 256 << 20  # istio-agent's limit
DEFAULT_TIMEOUT_S = 30.0


class FetchError(Exception):
    pass


class ModuleCache:
    def __init__(self, directory: str) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.fetches = 0  # downloads made (a cache hit makes none)
        self._fetched_at: dict[Path, str] = {}  # module -> resource version it was last fetched for

    def path_for(self, url: str, sha256: str) -> Path:
        return self.directory / (hashlib.sha256(f"{url}\n{sha256}".encode()).hexdigest() + ".wasm")

    async def get(self, url: str, sha256: str, *, always: bool, timeout: float, resource_version: str = "") -> str:
        """The module's local file; with `always`, fetched again unless it was fetched for this
        `resource_version` (none given: every time)."""
        path = self.path_for(url, sha256)
        fresh = not always or (resource_version and self._fetched_at.get(path) == resource_version)
        if fresh and path.exists():
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
        self._fetched_at[path] = resource_version
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
    resource_version = env.get(RESOURCE_VERSION_ENV, "")
    for k in (PULL_POLICY_ENV, RESOURCE_VERSION_ENV):
        env.pop(k, None)
    timeout = (remote.http_uri.timeout.ToTimedelta().total_seconds() if remote.http_uri.HasField("timeout")
               else DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S
    try:
        path = await cache.get(remote.http_uri.uri, remote.sha256, always=always, timeout=timeout,
                               resource_version=resource_version)
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
