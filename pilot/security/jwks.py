"""istiod's JWKS resolver: the control plane fetches the keys of every RequestAuthentication JWT
rule that has no inline `jwks` and hands them to Envoy inline (jwt_authn `local_jwks`), so proxies
never need a route to the issuer.

- The keys come from `jwksUri`, or, without one, from the issuer's OpenID discovery document
  (`ISSUER/.well-known/openid-configuration` -> `jwks_uri`), as in istiod.
- Fetching happens here, at the edge, in the background: a push never waits for the network. A
  rule whose keys are not fetched yet gets a JWKS no token matches (tokens of that issuer are
  answered 401, never let through unchecked); when keys arrive or change, a full push follows.
- Keys are refreshed every `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL` (istiod's 20m). A failed fetch
  keeps the last good keys, is logged, is retried with backoff, and shows in /debug/configz
  (through the index's problems) while no keys are known.
- A fetched document must be a JWKS with at least one RSA or EC signature key.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import MappingProxyType

import aiohttp

from pilot import logging as plog
from pilot.config.security import RequestAuthentication
from pilot.durations import parse_duration
from pilot.model.security_policies import JwksSnapshot, jwks_source
from pilot.model.store import Event, Store
from pilot.security.authn import parse_jwks

log = plog.get("jwks")

Fetcher = Callable[[str, float], Awaitable[str]]
DISCOVERY_PATH = "/.well-known/openid-configuration"
MAX_BODY = 1 << 20  # a JWKS is a few KB; refuse to hold a hostile megabyte response per issuer
RETRY_MIN, RETRY_MAX = 1.0, 60.0


async def http_get_text(url: str, timeout: float) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s, s.get(url) as r:
        if r.status != 200:
            raise ValueError(f"GET {url}: HTTP {r.status}")
        body = await r.content.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            raise ValueError(f"GET {url}: response larger than {MAX_BODY} bytes")
        return body.decode()


def is_uri(source: str) -> bool:
    return source.startswith(("http://", "https://")) and "/" in source.split("://", 1)[1]


@dataclass
class _State:
    keys: str | None = None  # the last good JWKS text
    fetched_at: float = float("-inf")
    next_attempt: float = 0.0
    failures: int = 0
    error: str = ""


class JwksResolver:
    def __init__(self, store: Store, on_change: Callable[[], None], *, refresh_interval: float = 1200.0,
                 timeout: float = 5.0, fetch: Fetcher = http_get_text,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.on_change = on_change
        self.refresh_interval = refresh_interval
        self.timeout = timeout
        self._fetch = fetch
        self._clock = clock
        self._states: dict[str, _State] = {}
        self._snapshot = JwksSnapshot()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        store.subscribe(self._on_events)

    # --- what the push context reads --------------------------------------------------------------
    def snapshot(self) -> JwksSnapshot:
        """Keys (JWKS text) by source (jwksUri or issuer), and the last error of sources failing."""
        return self._snapshot

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="jwks-resolver")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _on_events(self, events: list[Event]) -> None:
        if any(ev.key.kind == "RequestAuthentication" for ev in events):
            self._wake.set()

    def wanted(self) -> dict[str, float]:
        """Each source to fetch, with how long to wait for it: the rules' `timeout` (istiod's
        JWKS fetch timeout), the longest when several rules share the source, else the default."""
        out: dict[str, float] = {}
        for e in self.store.list(RequestAuthentication):
            for r in e.obj.spec.rules:
                if (src := jwks_source(r)) is not None:
                    t = parse_duration(r.timeout) if r.timeout else self.timeout
                    out[src] = max(out.get(src, 0.0), t)
        return out

    async def run(self) -> None:
        while True:
            await self.refresh()
            now = self._clock()
            delay = min((st.next_attempt for st in self._states.values()), default=now + self.refresh_interval) - now
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(delay, 0.05))
            except TimeoutError:
                pass

    async def refresh(self) -> bool:
        """Fetch every wanted source that is due; forget unwanted ones. True when the keys (or the
        set of failing sources) changed, after asking for a full push."""
        wanted = self.wanted()
        changed = any(s not in wanted and st.keys is not None for s, st in self._states.items())
        self._states = {s: st for s, st in self._states.items() if s in wanted}
        now = self._clock()
        due = [s for s in sorted(wanted) if self._states.setdefault(s, _State()).next_attempt <= now]
        if due:
            results = await asyncio.gather(*(self._fetch_one(s, wanted[s]) for s in due))
            changed = changed or any(results)
        errors = {s: st.error for s, st in sorted(self._states.items()) if st.error}
        if changed or set(errors) != set(self._snapshot.errors):
            self._snapshot = JwksSnapshot(
                MappingProxyType({s: st.keys for s, st in sorted(self._states.items()) if st.keys is not None}),
                MappingProxyType(errors))
            self.on_change()
            return True
        self._snapshot = JwksSnapshot(self._snapshot.keys, MappingProxyType(errors))
        return False

    async def _fetch_one(self, source: str, timeout: float) -> bool:
        st = self._states[source]
        try:
            uri = source if is_uri(source) else await self._discover(source, timeout)
            text = await self._fetch(uri, timeout)
            parse_jwks(text, f"JWKS at {uri}")
            canonical = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - network, HTTP, JSON, keys: keep the last good keys
            st.failures += 1
            st.error = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)
            retry = min(RETRY_MIN * 2 ** (st.failures - 1), RETRY_MAX)
            st.next_attempt = self._clock() + (retry if st.keys is None else min(retry, self.refresh_interval))
            log.warning("cannot fetch JWKS", source=source, error=st.error, retry_in_s=retry,
                        keeping_old_keys=st.keys is not None)
            return False
        st.failures, st.error = 0, ""
        st.fetched_at = self._clock()
        st.next_attempt = st.fetched_at + self.refresh_interval
        if canonical == st.keys:
            return False
        log.info("JWKS fetched", source=source, uri=uri, rotated=st.keys is not None)
        st.keys = canonical
        return True

    async def _discover(self, issuer: str, timeout: float) -> str:
        url = issuer.rstrip("/") + DISCOVERY_PATH
        doc = json.loads(await self._fetch(url, timeout))
        uri = doc.get("jwks_uri") if isinstance(doc, dict) else None
        if not isinstance(uri, str) or not uri:
            raise ValueError(f"{url} names no jwks_uri")
        return uri
