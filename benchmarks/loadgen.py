"""The load generator: N simulated sidecars multiplexed over a few gRPC channels, in a process of
its own, driven by the orchestrator over JSON lines (see benchmarks/ipc.py).

    python -m benchmarks.loadgen --target 127.0.0.1:15010 [--channels 10] [--delta] [--namespaces 10]

Commands: connect {start, count}; synced {timeout}; converge {type, changes: [[X, name|null]...],
timeout}; watching {type, name}; capture {type, path}; stats; disconnect. It is a real xDS
client: every byte it reads came over the wire from the server under test.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import resource
import sys
from pathlib import Path

import grpc
import psutil
from envoy.service.discovery.v3 import discovery_pb2

from benchmarks import ipc, responses
from benchmarks.mesh import namespace
from benchmarks.proxy import Received, SimProxy
from benchmarks.responses import TYPE_URL
from benchmarks.watches import ChangeWatch, SyncWatch

CHANNEL_OPTIONS = [
    # Without a local pool, channels with equal arguments share one TCP connection.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]

RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 500)]


def _cpu_s() -> float:
    """Our own CPU time: if it nears the wall time, the generator, not the server, is the limit."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class LoadGenerator:
    def __init__(self, target: str, channels: int, delta: bool, namespaces: int, reconnect: bool = False) -> None:
        self.target = target
        self.reconnect = reconnect
        self.delta = delta
        self.namespaces = max(1, namespaces)
        # Reconnecting proxies redial within 100-500 ms, not after gRPC's 1 s .. 120 s backoff.
        options = CHANNEL_OPTIONS + (RECONNECT_OPTIONS if reconnect else [])
        self.channels = [grpc.aio.insecure_channel(target, options=options)
                         for _ in range(max(1, channels))]
        self.proxies: list[SimProxy] = []
        self.tasks: list[asyncio.Task] = []
        self.watches: set = set()
        self.responses: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    # --- proxies ------------------------------------------------------------------------------
    def _on_ack(self, proxy: SimProxy, ev: Received) -> None:
        self.responses[ev.type] = self.responses.get(ev.type, 0) + 1
        self.bytes[ev.type] = self.bytes.get(ev.type, 0) + ev.size
        for w in list(self.watches):
            w.offer(proxy, ev)

    async def _run(self, proxy: SimProxy, channel: grpc.aio.Channel) -> None:
        try:
            await proxy.run(channel)
        except Exception as e:  # noqa: BLE001 - one broken proxy is reported, not fatal
            proxy.error = f"{type(e).__name__}: {e}"
            proxy.closed = True
        finally:
            for w in list(self.watches):
                w.fail(proxy)

    async def connect(self, msg: dict) -> dict:
        start, count = int(msg.get("start", len(self.proxies))), int(msg["count"])
        every = bool(msg.get("capture_all"))  # keep every proxy's last responses (for `sharing`)
        new = [SimProxy(i, namespace(i % self.namespaces), self.delta, self._on_ack, capture=every or i == 0)
               for i in range(start, start + count)]
        for p in new:
            p.reconnect = self.reconnect
        self.proxies.extend(new)
        loop = asyncio.get_running_loop()
        for p in new:
            self.tasks.append(loop.create_task(self._run(p, self.channels[p.index % len(self.channels)])))
        return {"connected": len(new), "total": len(self.proxies)}

    # --- questions ----------------------------------------------------------------------------
    async def _wait(self, watch, timeout: float) -> None:
        self.watches.add(watch)
        try:
            await asyncio.wait_for(watch.done.wait(), timeout)
        except TimeoutError:
            pass  # the result says who is missing
        finally:
            self.watches.discard(watch)

    async def synced(self, msg: dict) -> dict:
        watch = SyncWatch(self.proxies)
        await self._wait(watch, float(msg.get("timeout", 60)))
        return watch.result()

    async def converge(self, msg: dict) -> dict:
        """Wait until every proxy has received and ACKed, for each change, a response of the type
        received at or after the change's wall time X (carrying the named resource, if any)."""
        changes = [(float(x), name) for x, name in msg["changes"]]
        watch = ChangeWatch(msg["type"], changes, self.proxies)
        await self._wait(watch, float(msg.get("timeout", 60)))
        return watch.result()

    async def watching(self, msg: dict) -> dict:
        type_url = TYPE_URL[msg["type"]]
        return {"watching": sum(p.watches(type_url, msg["name"]) for p in self.proxies)}

    async def capture(self, msg: dict) -> dict:
        """Save the last raw response of a type that proxy 0 received (the floor server replays it)."""
        raw = self.proxies[0].last_raw.get(TYPE_URL[msg["type"]]) if self.proxies else None
        if raw is None:
            raise ValueError(f"proxy 0 has received no {msg['type']} response")
        Path(msg["path"]).write_bytes(raw)
        return {"bytes": len(raw)}

    async def sharing(self, msg: dict) -> dict:
        """Per type, over the last SotW response of every capturing proxy: the resources and
        bytes the proxies hold, and how many of those bytes are distinct (a resource's serialised
        Any is identical for every proxy given it when the server shares it)."""
        out = {}
        for short in msg.get("types", ("cds", "lds", "rds")):
            type_url = TYPE_URL[short]
            held = held_bytes = 0
            distinct: dict[bytes, int] = {}
            for p in self.proxies:
                raw = p.last_raw.get(type_url)
                if raw is None or self.delta:
                    continue
                for r in discovery_pb2.DiscoveryResponse.FromString(raw).resources:
                    b = r.SerializeToString()
                    held += 1
                    held_bytes += len(b)
                    distinct[hashlib.blake2b(b, digest_size=16).digest()] = len(b)
            unique = sum(distinct.values())
            out[short] = {"resources_held": held, "bytes_held": held_bytes, "distinct_resources": len(distinct),
                          "distinct_bytes": unique,
                          "shared_fraction": round(1 - unique / held_bytes, 4) if held_bytes else None}
        return out

    async def stats(self, msg: dict) -> dict:
        return {"proxies": len(self.proxies), "open": sum(not p.closed for p in self.proxies),
                "reconnects": sum(p.reconnects for p in self.proxies),
                "responses": dict(self.responses), "bytes": dict(self.bytes),
                "errors": sorted({p.error for p in self.proxies if p.error})[:10],
                "contents": dict(responses.stats),
                "cpu_s": _cpu_s(), "rss_mb": round(psutil.Process().memory_info().rss / (1 << 20), 1),
                "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}

    async def quiet(self, msg: dict) -> dict:
        """Responses received so far, and proxies still waiting for a name they subscribed to:
        with the server's count of responses written, this tells when a push is over."""
        return {"responses": sum(self.responses.values()), "open": sum(not p.closed for p in self.proxies),
                "waiting": sum(p.waiting() for p in self.proxies)}

    async def ledger(self, msg: dict) -> dict:
        """Proxy 0's delta ledger (benchmarks/ledger.py) since the last reset; `reset` starts anew."""
        led = self.proxies[0].ledger if self.proxies else None
        if led is None:
            raise ValueError("no delta ledger: delta proxies only")
        out = led.report()
        if msg.get("reset"):
            led.reset()
        return out

    async def disconnect(self, msg: dict | None = None) -> dict:
        for p in self.proxies:
            p.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
        return {"closed": len(self.proxies)}

    async def close(self) -> None:
        await self.disconnect()
        for ch in self.channels:
            await ch.close()


async def amain(args: argparse.Namespace) -> None:
    lg = LoadGenerator(args.target, args.channels, args.delta, args.namespaces, args.reconnect)
    handlers = {"connect": lg.connect, "synced": lg.synced, "converge": lg.converge, "watching": lg.watching,
                "capture": lg.capture, "stats": lg.stats, "disconnect": lg.disconnect, "sharing": lg.sharing,
                "quiet": lg.quiet, "ledger": lg.ledger}
    try:
        await ipc.serve_commands({"ready": True, "target": args.target}, handlers)
    finally:
        await lg.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="xDS server host:port (127.0.0.1 only)")
    parser.add_argument("--channels", type=int, default=10, help="gRPC channels the proxies share")
    parser.add_argument("--delta", action="store_true", help="use delta xDS instead of state of the world")
    parser.add_argument("--namespaces", type=int, default=10, help="namespaces the proxies are spread over")
    parser.add_argument("--reconnect", action="store_true", help="proxies open a new stream when one ends")
    args = parser.parse_args(argv)
    if not args.target.startswith("127.0.0.1:"):
        parser.error("--target must be 127.0.0.1:PORT")
    asyncio.run(amain(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
