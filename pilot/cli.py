"""`pilot-discovery`: argument parsing only. Flag names are istiod's; kebab-case aliases work too."""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import sys
from dataclasses import dataclass

from pilot.durations import parse_duration
from pilot.logging import parse_levels


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


_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


def _address(text: str) -> str:
    """Go's `host:port` (`:15010` is every interface, port 0 picks a free one); empty disables.
    Checked here so a typo fails at once, with the flag's name, instead of at bind time."""
    if text == "":
        return text
    host, sep, port = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port (e.g. :15010 or 127.0.0.1:15010)")
    if not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: port {port!r} is not a number from 0 to 65535")
    if host.startswith("["):
        if not host.endswith("]"):
            raise argparse.ArgumentTypeError(f"{text!r}: unclosed '[' around the IPv6 address")
        host = host[1:-1]
    if host and not _HOSTNAME.match(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {host!r} is neither an IP address nor a host name"
                                             ) from None
    return text


def _log_levels(text: str) -> str:
    try:
        parse_levels(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _flag(parser: argparse.ArgumentParser, name: str, kebab: str | None = None, **kw) -> None:
    names = [f"--{name}"]
    if kebab and kebab != name:
        names.append(f"--{kebab}")
    parser.add_argument(*names, **kw)


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, except for flags that are off or unset by default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS):
            return action.help or ""
        return super()._get_help_string(action) or ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pilot-discovery",
                                     description="Service-mesh control plane (istiod-compatible).")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("discovery", help="Run the control plane.", formatter_class=_Help)
    addr = {"type": _address, "metavar": "ADDR"}
    _flag(d, "configDir", "config-dir", dest="config_dir", default=None, metavar="DIR",
          help="Directory of Kubernetes-style YAML to serve (file mode).")
    _flag(d, "kubeconfig", None, dest="kubeconfig", default=None, metavar="PATH",
          help="Path to a kubeconfig (Kubernetes mode).")
    _flag(d, "meshConfig", "mesh-config", dest="mesh_config", default="./etc/istio/config/mesh",
          metavar="PATH",
          help="MeshConfig file; the istio ConfigMap's mesh key overrides it when present.")
    _flag(d, "grpcAddr", "grpc-addr", dest="grpc_addr", default=":15010", **addr,
          help="Plaintext xDS address, host:port (empty disables).")
    _flag(d, "secureGRPCAddr", "secure-grpc-addr", dest="secure_grpc_addr", default=":15012", **addr,
          help="TLS xDS and CA address (empty disables).")
    _flag(d, "httpAddr", "http-addr", dest="http_addr", default=":8080", **addr,
          help="/ready and debug address (empty disables).")
    _flag(d, "monitoringAddr", "monitoring-addr", dest="monitoring_addr", default=":15014", **addr,
          help="/metrics and debug address (empty disables).")
    _flag(d, "httpsAddr", "https-addr", dest="https_addr", default=":15017", **addr, help="Webhook address.")
    _flag(d, "domain", None, dest="domain", default="cluster.local", help="DNS domain suffix.")
    _flag(d, "keepaliveMaxServerConnectionAge", "keepalive-max-server-connection-age",
          dest="keepalive_max_server_connection_age", type=_duration, default=None, metavar="DURATION",
          help="Close xDS streams after this age (e.g. 30m) so proxies rebalance across replicas; "
               "unset: never.")
    _flag(d, "log_output_level", "log-output-level", dest="log_output_level", default="default:info",
          type=_log_levels, metavar="SCOPE:LEVEL,...",
          help="Levels (debug, info, warn, error, none) for the default scope and per scope, "
               "e.g. ads:debug,default:info.")
    _flag(d, "log_as_json", "log-as-json", dest="log_as_json", action="store_true", help="JSON log lines.")
    _flag(d, "portsFile", "ports-file", dest="ports_file", default=None, metavar="PATH",
          help="Write the bound ports as JSON here once listening (useful with port 0).")
    v = sub.add_parser("version", help="Prints out build version information.")
    v.add_argument("-s", "--short", action="store_true", help="Only the version number.")
    v.add_argument("-o", "--output", choices=("yaml", "json"), default=None, help="One of 'yaml' or 'json'.")
    return parser


def version_text(short: bool = False, output: str | None = None) -> str:
    """What istiod's `pilot-discovery version` prints (pkg/version's cobra command)."""
    from pilot.version import build_info

    b = build_info()
    if output == "json":
        return json.dumps({"clientVersion": b}, indent=2)
    if output == "yaml":
        import yaml

        return yaml.safe_dump({"clientVersion": b}, sort_keys=False).rstrip()
    if short:
        return f"client version: {b['version']}"
    go = {"Version": b["version"], "GitRevision": b["revision"], "GolangVersion": b["golang_version"],
          "BuildStatus": b["status"], "GitTag": b["tag"]}
    fields = ", ".join(f"{k}:{json.dumps(v)}" for k, v in go.items())
    return "client version: version.BuildInfo{" + fields + "}"


def parse(argv: list[str]) -> tuple[str, Options | None]:
    ns = build_parser().parse_args(argv)
    if ns.command == "version":
        return "version", None
    fields = {k: getattr(ns, k) for k in Options.__dataclass_fields__}
    return "discovery", Options(**fields)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command, opts = parse(argv)
    if command == "version":
        ns = build_parser().parse_args(argv)
        print(version_text(ns.short, ns.output))
        return 0
    from pilot.bootstrap import run

    assert opts is not None  # parse() gives options for every command but version
    return run(opts)


if __name__ == "__main__":
    sys.exit(main())
