"""Remote Wasm modules for Envoy (istio-agent's pkg/wasm): ECDS resources naming a module by URL
(`vm_config.code.remote`, what istiod builds for an http(s) or oci WasmPlugin url) are fetched by
the agent, checked, cached on disk, and handed to Envoy as a local file.

What the control plane says travels, as from istiod, in the VM's environment, and every
`ISTIO_META_*` key is removed before Envoy sees it: the pull policy
(`ISTIO_META_WASM_IMAGE_PULL_POLICY`), the plugin's resource version
(`ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION`) and, for an OCI image with `imagePullSecret`, the
Secret's docker config (`ISTIO_META_WASM_IMAGE_PULL_SECRET`; present but empty when the control
plane would not give it to this proxy: then the fetch fails).

Caching as istio-agent's: a module is stored under its image name (or URL) and checksum, the
checksum being the module's sha256 for http(s) and the image's manifest digest for OCI. A pinned
module (`sha256` given, or an image named by digest) is reused whatever the policy. Otherwise the
checksum last fetched for the URL is reused, except with `Always` (or no policy and an image
tagged `:latest`) when the plugin's resource version changed since (as istio-agent: not on every
ECDS response, which would stall the proxied stream on each push and reconnect). A module that
cannot be fetched or does not match turns the filter, as istio-agent does, into an RBAC filter of
the same name: allow-all for failStrategy FAIL_OPEN, deny-all (403) otherwise.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.abc import ResolveResult
from envoy.config.core.v3 import extension_pb2
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.wasm.v3 import wasm_pb2 as http_wasm_pb2
from envoy.extensions.wasm.v3 import wasm_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.any_pb2 import Any as AnyProto

from pilot import logging as plog
from pilot.agent import oci
from pilot.networking.wasm import (  # what the control plane writes
    PULL_POLICY_ENV,
    PULL_SECRET_ENV,
    RESOURCE_VERSION_ENV,
    WASM_HTTP_TYPE,
)

log = plog.get("wasm")

MAX_MODULE_BYTES = 256 << 20  # istio-agent's limit
DEFAULT_TIMEOUT_S = 30.0
OCI_PREFIX = "oci://"
META_PREFIX = "ISTIO_META_"  # istio-agent strips every such key from the VM environment
WASM_MAGIC = b"\x00asm"
# Never a module host (istio-agent blocks these at dial time): link-local, which holds cloud
# instance metadata services, and the metadata addresses outside it.
_METADATA = frozenset(ipaddress.ip_address(a) for a in ("100.100.100.200", "fd00:ec2::254"))


class FetchError(Exception):
    pass


def _blocked(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    return ip.is_link_local or ip in _METADATA


class _GuardedConnector(aiohttp.TCPConnector):
    """Refuses link-local and cloud metadata addresses for every connection (redirects, token
    services), whether named by IP or by a host name that resolves to one."""

    async def _resolve_host(self, host: str, port: int, traces: Any = None) -> list[ResolveResult]:
        found = await super()._resolve_host(host, port, traces)
        bad = [r["host"] for r in found if _blocked(r["host"])]
        if bad:
            raise aiohttp.ClientConnectionError(f"connection to {host} blocked: {bad[0]} is link-local "
                                                "or a cloud metadata address")
        return found


class WasmMetrics:
    """istio-agent's Wasm metrics (pkg/wasm/monitoring.go), shown on the status port's merged
    /stats/prometheus under their istio-agent names."""

    def __init__(self) -> None:
        self.cache_entries = 0
        self.lookups: Counter[str] = Counter()  # hit=true|false
        self.fetches: Counter[str] = Counter()  # result
        self.conversions: Counter[str] = Counter()  # result
        self.conversion_ms_sum = 0.0
        self.conversion_count = 0

    def render(self) -> str:
        lines = ["# HELP istio_agent_wasm_cache_entries number of Wasm remote fetch cache entries.",
                 "# TYPE istio_agent_wasm_cache_entries gauge",
                 f"istio_agent_wasm_cache_entries {self.cache_entries}"]

        def counter(name: str, help_: str, label: str, values: Counter[str]) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} counter"])
            lines.extend(f'{name}{{{label}="{k}"}} {v}' for k, v in sorted(values.items()))

        counter("istio_agent_wasm_cache_lookup_count", "number of Wasm remote fetch cache lookups.", "hit",
                self.lookups)
        counter("istio_agent_wasm_remote_fetch_count", "number of Wasm remote fetches and results.", "result",
                self.fetches)
        counter("istio_agent_wasm_config_conversion_count", "number of Wasm config conversions and results.",
                "result", self.conversions)
        lines.extend([("# HELP istio_agent_wasm_config_conversion_duration Total time in milliseconds "
                       "istio-agent spends on converting remote load in Wasm config."),
                      "# TYPE istio_agent_wasm_config_conversion_duration summary",
                      f"istio_agent_wasm_config_conversion_duration_sum {self.conversion_ms_sum:.3f}",
                      f"istio_agent_wasm_config_conversion_duration_count {self.conversion_count}"])
        return "\n".join(lines) + "\n"


def insecure_registries(text: str) -> frozenset[str]:
    """WASM_INSECURE_REGISTRIES: comma-separated hosts (host[:port]) whose TLS is not verified; `*`: all."""
    return frozenset(h.strip() for h in text.split(",") if h.strip())


class ModuleCache:
    def __init__(self, directory: str, insecure: Iterable[str] = ()) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.insecure = frozenset(insecure)
        self.metrics = WasmMetrics()
        self._checksums: dict[str, str] = {}  # URL -> checksum last fetched for it (not for pinned ones)
        self._versions: dict[tuple[str, str], str] = {}  # (URL, resource) -> resource version last seen
        self._entries: set[Path] = set()

    @property
    def fetches(self) -> int:
        """Downloads attempted (a cache hit makes none)."""
        return sum(self.metrics.fetches.values())

    def _allow_insecure(self, host: str) -> bool:
        return "*" in self.insecure or host in self.insecure

    def path_for(self, name: str, checksum: str) -> Path:
        """istio-agent's layout: a directory per module name, a file per checksum."""
        return self.directory / hashlib.sha256(name.encode()).hexdigest() / f"{checksum}.wasm"

    async def get(self, url: str, sha256: str, *, always: bool, timeout: float, resource_name: str = "",
                  resource_version: str = "", pull_secret: bytes | None = None) -> str:
        """The module's local file. `always`: the checksum remembered for an unpinned URL holds only
        while the plugin's `resource_version` is the one it was fetched for (none given: never)."""
        is_oci = url.startswith(OCI_PREFIX)
        ref = None
        if is_oci:
            try:
                ref = oci.parse_reference(url[len(OCI_PREFIX):])
            except oci.OciError as e:
                raise FetchError(str(e)) from None
        name = OCI_PREFIX + ref.name if ref is not None else url
        pinned = ref is not None and bool(ref.digest)
        checksum = sha256 or (ref.digest.removeprefix("sha256:") if ref is not None else "")
        seen = self._versions.get((url, resource_name))
        if not checksum and (not always or (resource_version and seen == resource_version)):
            checksum = self._checksums.get(url, "")
        if checksum:
            path = self.path_for(name, checksum)
            hit = path.exists()
            self.metrics.lookups["true" if hit else "false"] += 1
            if hit:
                self._remember(url, resource_name, resource_version, path, pinned)
                return str(path)
        else:
            self.metrics.lookups["false"] += 1
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout),
                                         connector=_GuardedConnector()) as session:
            if ref is None:
                data: bytes | None = await self._download(session, url)
                got = hashlib.sha256(data or b"").hexdigest()
                image = None
            else:
                try:
                    image = await oci.resolve(session, ref, insecure=self._allow_insecure(ref.registry),
                                              docker_config=pull_secret, max_bytes=MAX_MODULE_BYTES)
                except (oci.OciError, aiohttp.ClientError, TimeoutError) as e:
                    self.metrics.fetches["manifest_failure"] += 1
                    raise FetchError(f"could not fetch Wasm OCI image {ref}: "
                                     f"{_reason(e)}") from None
                got, data = image.digest, None
            if sha256 and got != sha256:
                self.metrics.fetches["checksum_mismatched"] += 1
                what = "image digest" if ref is not None else "sha256"
                raise FetchError(f"module from {url} has {what} {got}, expected {sha256}")
            path = self.path_for(name, got)
            if not path.exists():
                if image is not None:
                    try:
                        data = await image.module()
                    except (oci.OciError, aiohttp.ClientError, TimeoutError) as e:
                        self.metrics.fetches["download_failure"] += 1
                        raise FetchError(f"could not fetch the Wasm module of {ref or url}: "
                                         f"{_reason(e)}") from None
                if data is None or len(data) < 8 or not data.startswith(WASM_MAGIC):
                    self.metrics.fetches["fetch_failure"] += 1
                    raise FetchError(f"fetched Wasm binary from {url} is invalid (no Wasm header)")
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_bytes(data)
                os.replace(tmp, path)  # Envoy never reads a half-written module
            self.metrics.fetches["success"] += 1
        self._remember(url, resource_name, resource_version, path, pinned)
        return str(path)

    def _remember(self, url: str, resource_name: str, resource_version: str, path: Path, pinned: bool) -> None:
        if not pinned:  # istio-agent: a digest URL needs no URL -> checksum entry
            self._checksums[url] = path.stem
        self._versions[(url, resource_name)] = resource_version
        self._entries.add(path)
        self.metrics.cache_entries = len(self._entries)

    async def _download(self, session: aiohttp.ClientSession, url: str) -> bytes:
        host = url.split("://", 1)[-1].split("/", 1)[0]
        try:
            async with session.get(url, ssl=not self._allow_insecure(host)) as resp:
                if resp.status != 200:
                    raise FetchError(f"GET {url}: HTTP {resp.status}")
                data = await resp.content.read(MAX_MODULE_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError) as e:
            self.metrics.fetches["download_failure"] += 1
            raise FetchError(f"GET {url}: {_reason(e)}") from None
        except FetchError:
            self.metrics.fetches["download_failure"] += 1
            raise
        if len(data) > MAX_MODULE_BYTES:
            self.metrics.fetches["download_failure"] += 1
            raise FetchError(f"GET {url}: module larger than {MAX_MODULE_BYTES} bytes")
        return data


def _reason(e: BaseException) -> str:
    return str(e) if isinstance(e, oci.OciError) else f"{type(e).__name__}: {e}"


def _rbac(deny: bool) -> AnyProto:
    # RBAC without rules lets everything through; rules with action ALLOW and no policy match nothing.
    msg = rbac_pb2.RBAC(rules=rbac_config_pb2.RBAC(action=rbac_config_pb2.RBAC.ALLOW)) if deny else rbac_pb2.RBAC()
    out = AnyProto()
    out.Pack(msg)
    return out


def _always(policy: str, url: str) -> bool:
    """istio-agent's pull policy: Always; unset means IfNotPresent except an OCI image tagged `:latest`."""
    if policy in ("Always", "IfNotPresent"):
        return policy == "Always"
    return url.startswith(OCI_PREFIX) and url.endswith(":latest")


async def convert(resource: AnyProto, cache: ModuleCache) -> bool:
    """Rewrite one ECDS resource in place; True when it changed."""
    tec = extension_pb2.TypedExtensionConfig()
    if not resource.Unpack(tec) or tec.typed_config.type_url != WASM_HTTP_TYPE:
        return False
    filt = http_wasm_pb2.Wasm()
    tec.typed_config.Unpack(filt)
    vm = filt.config.vm_config
    if not vm.code.HasField("remote"):
        cache.metrics.conversions["no_remote_load"] += 1
        return False
    started = time.perf_counter()
    remote = vm.code.remote
    env = vm.environment_variables.key_values
    policy = env.get(PULL_POLICY_ENV, "")
    resource_version = env.get(RESOURCE_VERSION_ENV, "")
    secret = env.get(PULL_SECRET_ENV)
    for k in [k for k in env if k.startswith(META_PREFIX)]:
        del env[k]  # never shown to Envoy or the module (the pull secret above all)
    if not env and not vm.environment_variables.host_env_keys:
        vm.ClearField("environment_variables")
    timeout = (remote.http_uri.timeout.ToTimedelta().total_seconds() if remote.http_uri.HasField("timeout")
               else DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S
    url = remote.http_uri.uri
    try:
        if secret == "":
            raise FetchError("missing image pulling secret (the control plane gives it only to proxies of the "
                             "WasmPlugin's namespace that proved their identity)")
        path = await cache.get(url, "" if remote.sha256 == "nil" else remote.sha256,
                               always=_always(policy, url), timeout=timeout, resource_name=tec.name,
                               resource_version=resource_version,
                               pull_secret=None if secret is None else secret.encode())
    except (FetchError, OSError) as e:
        fail_open = filt.config.failure_policy == wasm_pb2.FAIL_OPEN or filt.config.fail_open
        log.error("cannot fetch Wasm module; applying the plugin's failStrategy", resource=tec.name,
                  url=url, error=str(e), fail_strategy="FAIL_OPEN" if fail_open else "FAIL_CLOSE")
        cache.metrics.conversions["fetch_failure"] += 1
        tec.typed_config.CopyFrom(_rbac(deny=not fail_open))
    else:
        vm.code.ClearField("remote")
        vm.code.local.filename = path
        tec.typed_config.Pack(filt)
        cache.metrics.conversions["success"] += 1
    cache.metrics.conversion_ms_sum += (time.perf_counter() - started) * 1000
    cache.metrics.conversion_count += 1
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
