"""`pilot-agent`: argument parsing only. `pilot-agent proxy [sidecar|router]` as istio-agent."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from pilot import __version__
from pilot import logging as plog

LOG_LEVELS = ("trace", "debug", "info", "warning", "warn", "error", "critical", "off")


def _flag(parser: argparse.ArgumentParser, name: str, kebab: str | None = None, **kw) -> None:
    names = [f"--{name}"] + ([f"--{kebab}"] if kebab and kebab != name else [])
    parser.add_argument(*names, dest=name, **kw)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pilot-agent", description="The proxy-side helper of the mesh "
                                     "(istio-agent compatible): certificates over SDS, bootstrap, Envoy.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("proxy", help="Run Envoy with a workload certificate and config from istiod.")
    p.add_argument("type", nargs="?", default="sidecar", choices=("sidecar", "router"),
                   help="Proxy type in the node id (default sidecar).")
    _flag(p, "concurrency", None, type=int, default=None, help="Envoy worker threads (ProxyConfig.concurrency; 0: one per core).")
    _flag(p, "proxyLogLevel", "proxy-log-level", default="warning", choices=LOG_LEVELS, help="Envoy log level.")
    _flag(p, "proxyComponentLogLevel", "proxy-component-log-level", default="misc:error",
          help="Envoy per-component log levels (component:level,...).")
    _flag(p, "domain", None, default=None, help="DNS domain of the node id (default POD_NAMESPACE.svc.cluster.local).")
    _flag(p, "serviceCluster", "service-cluster", default=None, help="Node cluster (ProxyConfig.serviceCluster).")
    _flag(p, "discoveryAddress", "discovery-address", default=None,
          help="istiod's secure xDS address (ProxyConfig.discoveryAddress, default istiod.istio-system.svc:15012).")
    _flag(p, "proxyAdminPort", "proxy-admin-port", type=int, default=None,
          help="Envoy admin port on 127.0.0.1 (ProxyConfig.proxyAdminPort, default 15000; 0: ephemeral).")
    _flag(p, "statusPort", "status-port", type=int, default=None,
          help="/healthz/ready port (ProxyConfig.statusPort, default 15020; 0: ephemeral).")
    _flag(p, "portsFile", "ports-file", default=None,
          help="Write the bound status and admin ports here as JSON (useful with port 0).")
    _flag(p, "log_output_level", "log-output-level", default="default:info", help="scope:level,... of the agent's log.")
    _flag(p, "log_as_json", "log-as-json", action="store_true", help="JSON log lines.")
    w = sub.add_parser("wait", help="Wait until the proxy is ready (the holdApplicationUntilProxyStarts "
                                    "postStart hook), as istio-agent's `pilot-agent wait`.")
    _flag(w, "timeoutSeconds", "timeout-seconds", type=int, default=60, help="Give up after this long.")
    _flag(w, "periodMillis", "period-millis", type=int, default=500, help="Time between checks.")
    _flag(w, "requestTimeoutMillis", "request-timeout-millis", type=int, default=500,
          help="Per-check timeout.")
    _flag(w, "url", None, default="http://localhost:15020/healthz/ready", help="The readiness URL.")
    sub.add_parser("version", help="Print the version.")
    return parser


def wait(url: str, timeout: float, period: float, request_timeout: float) -> int:
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=request_timeout) as r:
                if r.status == 200:
                    print("pilot-agent wait: proxy is ready")
                    return 0
                last = f"status {r.status}"
        except urllib.error.HTTPError as e:
            last = f"status {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        if time.monotonic() + period > deadline:
            print(f"pilot-agent wait: proxy not ready after {timeout:g}s: {last}", file=sys.stderr)
            return 1
        time.sleep(period)


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if ns.command == "version":
        print(f"pilot-agent version {__version__}")
        return 0
    if ns.command == "wait":
        return wait(ns.url, ns.timeoutSeconds, ns.periodMillis / 1000, ns.requestTimeoutMillis / 1000)
    try:
        plog.configure(plog.parse_levels(ns.log_output_level), ns.log_as_json)
    except ValueError as e:
        print(f"pilot-agent: --log_output_level: {e}", file=sys.stderr)
        return 2
    from pilot.agent import config
    from pilot.agent.agent import run

    overrides = {k: getattr(ns, k) for k in ("concurrency", "proxyLogLevel", "proxyComponentLogLevel", "domain",
                                             "serviceCluster", "discoveryAddress", "proxyAdminPort",
                                             "statusPort", "portsFile")}
    try:
        cfg, warnings = config.load(proxy_type=ns.type, env=dict(os.environ), overrides=overrides,
                                    find_envoy=config.find_envoy)
    except config.ConfigError as e:
        plog.get("agent").error("invalid configuration", error=str(e))
        print(f"pilot-agent: {e}", file=sys.stderr)
        return 2
    return asyncio.run(run(cfg, warnings))


if __name__ == "__main__":
    sys.exit(main())
