"""`pilot-discovery`: argument parsing only. Flag names are istiod's; kebab-case aliases work too."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from pilot import __version__
from pilot.durations import parse_duration


@dataclass(frozen=True)
class Options:
    config_dir: str | None
    kubeconfig: str | None
    mesh_config: str
    grpc_addr: str
    secure_grpc_addr: str
    http_addr: str
    monitoring_addr: str
    https_addr: str
    domain: str
    keepalive_max_server_connection_age: float | None
    log_output_level: str
    log_as_json: bool
    ports_file: str | None


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _flag(parser: argparse.ArgumentParser, name: str, kebab: str | None = None, **kw) -> None:
    names = [f"--{name}"]
    if kebab and kebab != name:
        names.append(f"--{kebab}")
    parser.add_argument(*names, **kw)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pilot-discovery", description="Service-mesh control plane (istiod-compatible).")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("discovery", help="Run the control plane.")
    _flag(d, "configDir", "config-dir", dest="config_dir", default=None,
          help="Directory of Kubernetes-style YAML to serve (file mode).")
    _flag(d, "kubeconfig", None, dest="kubeconfig", default=None, help="Path to a kubeconfig (Kubernetes mode).")
    _flag(d, "meshConfig", "mesh-config", dest="mesh_config", default="./etc/istio/config/mesh",
          help="MeshConfig file; the istio ConfigMap's mesh key overrides it when present.")
    _flag(d, "grpcAddr", "grpc-addr", dest="grpc_addr", default=":15010", help="Plaintext xDS address.")
    _flag(d, "secureGRPCAddr", "secure-grpc-addr", dest="secure_grpc_addr", default=":15012",
          help="TLS xDS and CA address (empty disables).")
    _flag(d, "httpAddr", "http-addr", dest="http_addr", default=":8080", help="/ready and debug address.")
    _flag(d, "monitoringAddr", "monitoring-addr", dest="monitoring_addr", default=":15014",
          help="/metrics and debug address.")
    _flag(d, "httpsAddr", "https-addr", dest="https_addr", default=":15017", help="Webhook address.")
    _flag(d, "domain", None, dest="domain", default="cluster.local", help="DNS domain suffix.")
    _flag(d, "keepaliveMaxServerConnectionAge", "keepalive-max-server-connection-age",
          dest="keepalive_max_server_connection_age", type=_duration, default=None,
          help="Close xDS streams after this age so proxies rebalance across replicas.")
    _flag(d, "log_output_level", "log-output-level", dest="log_output_level", default="default:info",
          help="scope:level,... (debug, info, warn, error, none).")
    _flag(d, "log_as_json", "log-as-json", dest="log_as_json", action="store_true", help="JSON log lines.")
    _flag(d, "portsFile", "ports-file", dest="ports_file", default=None,
          help="Write the bound ports as JSON here once listening (useful with port 0).")
    sub.add_parser("version", help="Print the version.")
    return parser


def parse(argv: list[str]) -> tuple[str, Options | None]:
    ns = build_parser().parse_args(argv)
    if ns.command == "version":
        return "version", None
    fields = {k: getattr(ns, k) for k in Options.__dataclass_fields__}
    return "discovery", Options(**fields)


def main(argv: list[str] | None = None) -> int:
    command, opts = parse(sys.argv[1:] if argv is None else argv)
    if command == "version":
        print(f"pilot-discovery version {__version__}")
        return 0
    from pilot.bootstrap import run

    return run(opts)


if __name__ == "__main__":
    sys.exit(main())
