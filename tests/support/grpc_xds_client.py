"""Proxyless gRPC client loop, meant to run as its own process.

    GRPC_XDS_BOOTSTRAP=bootstrap.json python -m tests.support.grpc_xds_client \\
        xds:///echo.default.svc.cluster.local:8080

grpcio's xDS client is process-wide (one bootstrap, one ADS stream, cached
resources), so each test runs its client in a fresh process. The process
calls ``/test.Echo/Echo`` repeatedly and prints one JSON line per attempt:
``{"n": 3, "ok": true, "reply": "echo-v1:hello"}`` or
``{"n": 4, "ok": false, "error": "UNAVAILABLE: ..."}``. A test observes
routing changes by watching the replies change. The loop ends on a ``quit``
line or EOF on stdin, or after ``--max-seconds``, so an orphaned client
cannot outlive its test for long.

Keep this module free of test-only imports: it is executed with ``-m``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

METHOD = "/test.Echo/Echo"


def _watch_stdin(stop: threading.Event) -> None:
    try:
        for line in sys.stdin:
            if line.strip() == "quit":
                break
    finally:
        stop.set()


def _emit(record: dict) -> None:
    # One line per attempt, flushed, so the parent can react while we run.
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.grpc_xds_client",
        description="Call /test.Echo/Echo on TARGET in a loop and print one JSON line per attempt. "
        "The xDS bootstrap is read from $GRPC_XDS_BOOTSTRAP.",
    )
    parser.add_argument("target", help="e.g. xds:///echo.default.svc.cluster.local:8080")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="exit after this long (default 60)")
    parser.add_argument("--call-timeout", type=float, default=2.0, help="per-call deadline in seconds")
    parser.add_argument("--interval", type=float, default=0.1, help="pause between attempts in seconds")
    parser.add_argument("--payload", default="hello", help="request body (UTF-8)")
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                        help="request metadata (headers) sent with every call; repeatable")
    parser.add_argument("--xds-creds", action="store_true",
                        help="use grpc.xds_channel_credentials (TLS as the clusters say; plaintext fallback)")
    args = parser.parse_args(argv)

    if args.target.startswith("xds:") and not (
        os.environ.get("GRPC_XDS_BOOTSTRAP") or os.environ.get("GRPC_XDS_BOOTSTRAP_CONFIG")
    ):
        parser.error("GRPC_XDS_BOOTSTRAP is not set")

    # Imported late so --help works fast and never touches grpc.
    import grpc
    import grpc.experimental

    stop = threading.Event()
    threading.Thread(target=_watch_stdin, args=(stop,), daemon=True).start()
    deadline = time.monotonic() + args.max_seconds
    payload = args.payload.encode()
    metadata = tuple(tuple(kv.split("=", 1)) for kv in args.metadata)

    if args.xds_creds:
        creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
        channel_cm = grpc.secure_channel(args.target, creds)
    else:
        channel_cm = grpc.insecure_channel(args.target)
    with channel_cm as channel:
        # No (de)serializers: bytes in, bytes out, no generated code needed.
        echo = channel.unary_unary(METHOD)
        n = 0
        while not stop.is_set() and time.monotonic() < deadline:
            n += 1
            try:
                reply = echo(payload, timeout=args.call_timeout, metadata=metadata or None)
                _emit({"n": n, "ok": True, "reply": reply.decode(errors="replace")})
            except grpc.RpcError as err:
                _emit({"n": n, "ok": False, "error": f"{err.code().name}: {err.details()}"})
            # Pacing, not synchronisation; returns early when asked to quit.
            stop.wait(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
