"""ACK and NACK handling of the DiscoveryServer: what a proxy said of the config it was sent.

An ACK settles the response (convergence time, the push's record) and clears the proxy's reject
gauges; a NACK is counted, logged once, blamed on the resources Envoy names and, when
EnvoyFilters patched those, the likeliest culprit is left out and the config generated again
(`_reject_envoy_filters`). A base of DiscoveryServer (pilot/xds/discovery.py): its methods are the
server's, called from the streams (pilot/xds/ads.py).
"""

from __future__ import annotations

import time

from pilot import logging as plog
from pilot.metrics import Metrics
from pilot.model.proxy import shown
from pilot.model.push_request import CONFIG_UPDATE, PushRequest
from pilot.model.store import ConfigKey, Store
from pilot.xds import typeurls
from pilot.xds.connection import Connection, Nack, WatchedResource
from pilot.xds.debounce import Debouncer
from pilot.xds.envoy_filter_status import EnvoyFilterStatus
from pilot.xds.pushstatus import PushHistory

log = plog.get("ads")

MAX_NACK_MESSAGE = 4096  # Envoy embeds text dumps; keep enough to read, not a hostile client's megabytes


def _printable(text: str) -> str:
    """A client's text for a log line: control characters escaped (newlines kept readable)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in text)


class AckNack:
    """Records ACKs and NACKs on the stream state, the metrics and the push history."""

    # DiscoveryServer's attributes these use (declared for the type checker; set in its __init__)
    store: Store
    metrics: Metrics
    history: PushHistory
    debouncer: Debouncer
    envoy_filter_status: EnvoyFilterStatus
    rejected_envoy_filters: dict[tuple[ConfigKey, int], dict]

    def record_ack(self, conn: Connection, w: WatchedResource, nonce: str, version: str) -> None:
        w.nonce_acked, w.version_acked, w.last_acked_at = nonce, version or w.version_sent, time.time()
        _, started = w.answered(nonce)
        if not conn.delta:
            # A SotW ACK is for the latest response only (older nonces are stale, never
            # answered): nothing sent before it can be ACKed or NACKed any more.
            w.awaiting = None
        if started is not None:
            start, push_version = started
            converged = time.monotonic() - start
            self.metrics.proxy_convergence_time.observe(converged)
            record = self.history.get(push_version)
            if record is not None:
                record.acks += 1
                record.convergence_max_s = max(record.convergence_max_s, converged)
        if w.last_nack is not None:
            self._clear_reject_gauge(conn, w)

    def record_nack(self, conn: Connection, w: WatchedResource, nonce: str, version: str,
                    code: int, message: str) -> None:
        if w.last_nack is not None and w.last_nack.nonce == nonce:
            return  # the same rejection repeated: counted and logged once
        message = message[:MAX_NACK_MESSAGE]
        sent, started = w.answered(nonce)
        record = self.history.get(started[1]) if started else None
        if record is not None:
            record.nacks += 1
        # Envoy names the resource it choked on; blame only those when it does.
        named = tuple(r for r in sent if r.name in message) or sent
        names_ = tuple(r.name for r in named)
        origins = tuple(dict.fromkeys(o for r in named for o in r.origins))
        self._clear_reject_gauge(conn, w)
        w.last_nack = Nack(version, nonce, message, code, time.time(), names_, origins)
        w.nacks += 1
        short = typeurls.SHORT.get(w.type_url, "other")
        self.metrics.total_xds_rejects.labels(short).inc()
        if short in self.metrics.type_rejects:
            self.metrics.type_rejects[short].labels(conn.proxy.id, message[:100]).set(1)
        for origin in origins:
            self.metrics.rejected_config.labels(short, origin).inc()
        log.warning("proxy rejected config", proxy=conn.proxy.id, type=short, nonce=nonce,
                    accepted_version=shown(version), error=_printable(message), resources=list(names_)[:10],
                    config=list(origins)[:10])
        # Only a resource Envoy names is blamed on its EnvoyFilters: a NACK for another reason
        # must not switch off a filter that merely patched something else in the same response.
        if any(r.name in message for r in named):
            self._reject_envoy_filters(conn, short, origins, message)

    def _reject_envoy_filters(self, conn: Connection, short: str, origins: tuple[str, ...], message: str) -> None:
        """A NACKed resource that EnvoyFilters patched: the most recently changed of them (the
        likeliest culprit; should the NACK persist, the next one goes, so this ends) is left out
        and the config generated again without it. istiod would leave the proxy NACKing; here
        the rest of its config moves on. Shown in /debug/push_status until the object changes."""
        entries = []
        for origin in origins:
            kind, _, rest = origin.partition("/")
            ns, _, name = rest.partition("/")
            if kind == "EnvoyFilter":
                entry = self.store.get(ConfigKey("EnvoyFilter", ns, name))
                if entry is not None and (entry.key, entry.revision) not in self.rejected_envoy_filters:
                    entries.append(entry)
        if not entries:
            return
        entry = max(entries, key=lambda e: e.revision)
        origin = f"EnvoyFilter/{entry.key.namespace}/{entry.key.name}"
        self.rejected_envoy_filters[(entry.key, entry.revision)] = {
            "envoyFilter": origin, "revision": entry.revision, "proxy": conn.proxy.id, "type": short,
            "error": message[:1000], "at": time.time()}
        self.envoy_filter_status.errored(entry)
        log.error("EnvoyFilter produced config a proxy rejected; generating without it until it changes",
                  envoy_filter=origin, proxy=conn.proxy.id, type=short, error=_printable(message[:300]))
        req = PushRequest(full=True, config_keys={entry.key})
        req.reasons[CONFIG_UPDATE] += 1
        self.debouncer.enqueue(req)

    def _clear_reject_gauge(self, conn: Connection, w: WatchedResource) -> None:
        """The proxy no longer rejects what it last rejected (it ACKed since, or left)."""
        if w.last_nack is None or w.last_nack.cleared:
            return
        w.last_nack.cleared = True
        short = typeurls.SHORT.get(w.type_url, "other")
        gauge = self.metrics.type_rejects.get(short)
        if gauge is not None:
            try:
                gauge.remove(conn.proxy.id, w.last_nack.message[:100])
            except KeyError:
                pass
        for origin in w.last_nack.origins:
            self.metrics.rejected_config.labels(short, origin).dec()
