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

Fetching as istio-agent's: no connection (redirects and token services included) to a link-local
or cloud metadata address, nor to BLOCKED_CIDRS_IN_WASM_FETCH; an http(s) GET that fails to connect
or answers a retryable 5xx is tried again, with exponential backoff, up to
WASM_HTTP_REQUEST_MAX_RETRIES attempts, each bounded by WASM_HTTP_REQUEST_TIMEOUT and all by the
remote's timeout. A module not used for WASM_MODULE_EXPIRY is deleted, with the tag/URL checksums
pointing at it, by a purge every WASM_PURGE_INTERVAL.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
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
from pilot.agent.config import Network
from pilot.networking.wasm import (  # what the control plane writes
    PULL_POLICY_ENV,
    PULL_SECRET_ENV,
    RESOURCE_VERSION_ENV,
    WASM_HTTP_TYPE,
)

log = plog.get("wasm")

MAX_MODULE_BYTES = 256 << 20  # istio-agent's limit
DEFAULT_TIMEOUT_S = 30.0
# istio-agent's defaults (pkg/wasm/options.go) and its HTTP fetcher's backoff (cenkalti/backoff's
# exponential defaults with a 500ms first interval).
DEFAULT_HTTP_REQUEST_TIMEOUT_S = 15.0
DEFAULT_HTTP_ATTEMPTS = 5  # WASM_HTTP_REQUEST_MAX_RETRIES: the count of attempts, the first included
DEFAULT_MODULE_EXPIRY_S = 24 * 3600.0
DEFAULT_PURGE_INTERVAL_S = 3600.0
INITIAL_BACKOFF_S = 0.5
BACKOFF_MULTIPLIER = 1.5
BACKOFF_RANDOMIZATION = 0.5
MAX_BACKOFF_S = 60.0
OCI_PREFIX = "oci://"
META_PREFIX = "ISTIO_META_"  # istio-agent strips every such key from the VM environment
WASM_MAGIC = b"\x00asm"
# Never a module host (istio-agent blocks these at dial time): link-local, which holds cloud
# instance metadata services, and the metadata addresses outside it.
_METADATA = frozenset(ipaddress.ip_address(a) for a in ("100.100.100.200", "fd00:ec2::254"))


class FetchError(Exception):
    pass


def _blocked(address: str, extra: tuple[Network, ...] = ()) -> str | None:
    """Why the module fetcher must not connect to `address` (None: it may)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if ip.is_link_local or ip in _METADATA:
        return "is link-local or a cloud metadata address"
    cidr = next((c for c in extra if ip.version == c.version and ip in c), None)
    return None if cidr is None else f"is in the blocked CIDR range {cidr} (BLOCKED_CIDRS_IN_WASM_FETCH)"


class _GuardedConnector(aiohttp.TCPConnector):
    """Refuses blocked addresses for every connection (redirects, token services), whether named
    by IP or by a host name that resolves to one."""

    def __init__(self, blocked: tuple[Network, ...] = ()) -> None:
        super().__init__()
        self._blocked_cidrs = blocked

    async def _resolve_host(self, host: str, port: int, traces: Any = None) -> list[ResolveResult]:
        found = await super()._resolve_host(host, port, traces)
        for r in found:
            why = _blocked(r["host"], self._blocked_cidrs)
            if why:
                raise aiohttp.ClientConnectionError(f"connection to {host} blocked: {r['host']} {why}")
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


def _retryable(status: int) -> bool:
    """istio-agent retries a 5xx, except those a second try cannot change."""
    return status >= 500 and status not in (501, 505, 511)


class ModuleCache:
    def __init__(self, directory: str, insecure: Iterable[str] = (), *, blocked: tuple[Network, ...] = (),
                 http_request_timeout: float = DEFAULT_HTTP_REQUEST_TIMEOUT_S,
                 http_attempts: int = DEFAULT_HTTP_ATTEMPTS, initial_backoff: float = INITIAL_BACKOFF_S,
                 module_expiry: float = DEFAULT_MODULE_EXPIRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.insecure = frozenset(insecure)
        self.blocked = blocked
        self.http_request_timeout = http_request_timeout
        self.http_attempts = max(1, http_attempts)
        self.initial_backoff = initial_backoff
        self.module_expiry = module_expiry
        self.clock = clock
        self.metrics = WasmMetrics()
        self._checksums: dict[str, str] = {}  # URL -> checksum last fetched for it (not for pinned ones)
        self._versions: dict[tuple[str, str], str] = {}  # (URL, resource) -> resource version last seen
        self._entries: dict[Path, float] = {}  # module file -> when last handed out (clock)
        self._urls: dict[Path, set[str]] = {}  # module file -> the URLs whose checksum names it

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
                                         connector=_GuardedConnector(self.blocked)) as session:
            if ref is None:
                data: bytes | None = await self._download(session, url, timeout)
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
            self._urls.setdefault(path, set()).add(url)
        self._versions[(url, resource_name)] = resource_version
        self._entries[path] = self.clock()
        self.metrics.cache_entries = len(self._entries)

    def purge(self) -> list[Path]:
        """Delete the modules not handed out for longer than the expiry (istio-agent's purge), and
        the URL checksums naming them, so the next use fetches again; the deleted files."""
        now = self.clock()
        gone = []
        for path, last in list(self._entries.items()):
            if now - last <= self.module_expiry:
                continue
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                log.error("cannot purge a stale Wasm module", path=str(path), error=str(e))
                continue
            del self._entries[path]
            for url in self._urls.pop(path, ()):
                if self._checksums.get(url) == path.stem:
                    del self._checksums[url]
            gone.append(path)
        self.metrics.cache_entries = len(self._entries)
        return gone

    async def purge_forever(self, interval: float) -> None:
        """WASM_PURGE_INTERVAL: the agent's background purge (cancelled at shutdown)."""
        while True:
            await asyncio.sleep(interval)
            for path in self.purge():
                log.info("removed a Wasm module unused for WASM_MODULE_EXPIRY", path=str(path))

    async def _download(self, session: aiohttp.ClientSession, url: str, timeout: float) -> bytes:
        """istio-agent's HTTP fetcher: up to `http_attempts` GETs, each within the per-request
        timeout, all within `timeout`; a connection failure or retryable 5xx waits (exponential
        backoff with jitter) and tries again, anything else fails at once."""
        host = url.split("://", 1)[-1].split("/", 1)[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        interval = self.initial_backoff
        attempts = 0
        while True:
            attempts += 1
            retry = False
            per_request = aiohttp.ClientTimeout(total=max(0.001, min(self.http_request_timeout,
                                                                     deadline - loop.time())))
            try:
                async with session.get(url, ssl=not self._allow_insecure(host), timeout=per_request) as resp:
                    if resp.status == 200:
                        data = await resp.content.read(MAX_MODULE_BYTES + 1)
                        break
                    reason = f"HTTP {resp.status}"
                    retry = _retryable(resp.status)
            except (aiohttp.ClientError, TimeoutError) as e:
                reason = _reason(e)
                retry = not (isinstance(e, aiohttp.ClientConnectionError) and "blocked:" in str(e))
            wait = min(MAX_BACKOFF_S, interval) * random.uniform(1 - BACKOFF_RANDOMIZATION, 1 + BACKOFF_RANDOMIZATION)
            interval *= BACKOFF_MULTIPLIER
            if not retry or attempts >= self.http_attempts or loop.time() + wait >= deadline:
                self.metrics.fetches["download_failure"] += 1
                raise FetchError(f"GET {url}: failed after {attempts} attempt(s), last error: {reason}")
            log.debug("Wasm module download failed; trying again", url=url, error=reason, wait_s=round(wait, 3))
            await asyncio.sleep(wait)
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
