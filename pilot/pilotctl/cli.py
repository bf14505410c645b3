"""pilotctl's command line: argument parsing, which source answers each command, and output.

    pilotctl [--addr HOST:PORT ...] proxy-status|ps [PROXY] [-o short|json|yaml]
    pilotctl [--addr ...] proxy-config|pc clusters|listeners|routes|endpoints|secrets|all|bootstrap PROXY
    pilotctl [--addr ...] explain PROXY TYPE NAME
    pilotctl jwt init|rule|token DIR ...
    pilotctl tag set|generate|list|remove ...   (pilot/pilotctl/tag.py: the cluster, not the debug port)
    pilotctl x workload entry configure -f WG.yaml -o DIR --clusterID C   (pilot/pilotctl/workload.py)
    pilotctl completion bash|zsh|fish

Sources: the control plane replicas' debug endpoints (`--addr`, repeatable: a proxy is found on
whichever replica it is connected to) say what they send; the proxy's own Envoy admin (`--admin`,
else the local one its node metadata names: PROXY_CONFIG proxyAdminPort on 127.0.0.1, checked to
be that proxy's by /server_info) says what it holds: outlier ejections, the secrets it has, its
bootstrap, and the other half of `ps PROXY`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import argcomplete
import yaml

from pilot.pilotctl import devjwt, tables
from pilot.pilotctl import tag as tagctl
from pilot.pilotctl import workload as workloadctl
from pilot.pilotctl.client import CtlError, EnvoyAdmin, Replica, Replicas, check_addr
from pilot.pilotctl.dump import bootstrap_of, resources_of
from pilot.pilotctl.status import diff_text, proxy_diff, status_rows, status_table

DEFAULT_ADDR = "localhost:15014"
TYPES = {"clusters": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
         "listeners": "type.googleapis.com/envoy.config.listener.v3.Listener",
         "routes": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
         "endpoints": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
         "secrets": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"}
ALIASES = {"cds": "clusters", "lds": "listeners", "rds": "routes", "eds": "endpoints", "sds": "secrets",
           "cluster": "clusters", "listener": "listeners", "route": "routes", "endpoint": "endpoints",
           "secret": "secrets", "c": "clusters", "l": "listeners", "r": "routes", "ep": "endpoints",
           "s": "secrets", "b": "bootstrap", "a": "all"}
PC_KINDS = (*TYPES, "all", "bootstrap")


class Warnings:
    """Notes for stderr that do not stop the answer (a replica down, proxy state unavailable)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed = False  # part of the answer is missing: exit non-zero


def render(data: Any, output: str, short: Callable[[Any], str]) -> str:
    if output == "json":
        return json.dumps(data, indent=2)
    if output == "yaml":
        return yaml.safe_dump(data, sort_keys=False).rstrip()
    return short(data)


# --- the proxy and its Envoy ---------------------------------------------------------------
class Target:
    """One proxy: the replica it is connected to, its node id, and its Envoy admin if reachable."""

    def __init__(self, args, replicas: Replicas, proxy: str, include_eds: bool = False) -> None:
        self.replica, self.dump = replicas.locate(proxy, include_eds)
        row = self._row(self.replica, proxy)
        self.node_id = row["proxy"] if row else proxy
        self.admin: EnvoyAdmin | None = None
        self.admin_problem = ""
        self.agent: EnvoyAdmin | None = None  # pilot-agent's status port (same GET-JSON client)
        self._find_admin(args, replicas)

    @staticmethod
    def _row(replica: Replica, proxy: str) -> dict | None:
        # The server's rule (pilot.xds.generators.debug.find_connection): the id contains it.
        for r in replica.get("/debug/syncz"):
            if proxy in r.get("connection_id", "") or proxy == r.get("proxy"):
                return r
        return None

    def _find_admin(self, args, replicas: Replicas) -> None:
        if args.admin:
            admin = EnvoyAdmin(check_addr(args.admin), args.timeout)
            held = admin.node_id()
            if held != self.node_id:
                raise CtlError(f"the Envoy admin at {args.admin} is node {held!r}, not {self.node_id!r}")
            self.admin = admin
            return
        client = replicas.client(self.replica, self.node_id) or {}
        proxy_config = client.get("metadata", {}).get("PROXY_CONFIG")
        if not isinstance(proxy_config, dict):  # not run by an agent: nothing names its ports
            proxy_config = None
        self.agent = self._local_agent(proxy_config, args.timeout)
        # ProxyConfig's default admin port is 15000 (what pilot-agent and istio-agent use).
        port = _port_number(proxy_config.get("proxyAdminPort", 15000)) if proxy_config is not None else None
        if port is None:
            self.admin_problem = "its node metadata names no admin port (PROXY_CONFIG proxyAdminPort): pass --admin"
            return
        admin = EnvoyAdmin(f"127.0.0.1:{port}", args.timeout)
        try:
            held = admin.node_id()
        except CtlError as e:
            self.admin_problem = f"{e} (pass --admin HOST:PORT)"
            return
        if held != self.node_id:
            self.admin_problem = f"127.0.0.1:{port} is another proxy's admin ({held}): pass --admin"
            return
        self.admin = admin

    def _local_agent(self, proxy_config: dict | None, timeout: float) -> EnvoyAdmin | None:
        """The proxy's pilot-agent on this host (its status port, 15020 by default), if it says it
        serves this node."""
        port = _port_number(proxy_config.get("statusPort", 15020)) if proxy_config is not None else None
        if port is None:
            return None
        agent = EnvoyAdmin(f"127.0.0.1:{port}", timeout)
        try:
            held = agent.get("/debug/secrets")
        except CtlError:
            return None
        return agent if held.get("node") == self.node_id else None

    def need_admin(self, what: str) -> EnvoyAdmin:
        if self.admin is None:
            raise CtlError(f"{what} is the proxy's own state, read from its Envoy admin, which is not "
                           f"reachable: {self.admin_problem}")
        return self.admin


def _port_number(value) -> int | None:
    """A port from node metadata: a Struct number arrives as a float, an env-given one as text."""
    try:
        port = int(float(value))
    except (TypeError, ValueError):
        return None
    return port if 0 < port < 65536 and float(value) == port else None


# --- commands ------------------------------------------------------------------------------
def cmd_proxy_status(args, replicas: Replicas, warn: Warnings) -> str:
    if args.proxy:
        target = Target(args, replicas, args.proxy)
        envoy = target.need_admin("the proxy side of `ps PROXY`").config_dump()
        diff = proxy_diff(target.dump, envoy)
        return render(diff, args.output, diff_text)
    rows = status_rows(replicas)
    for addr, why in replicas.down.items():
        warn.lines.append(f"warning: control plane {addr} not read, its proxies are missing: {why}")
        warn.failed = True
    return render(rows, args.output, status_table)


def _filters(args) -> tables.Filters:
    return tables.Filters(**{k: getattr(args, k) for k in
                             ("fqdn", "port", "subset", "direction", "address", "type", "name", "cluster", "status")
                             if getattr(args, k, None) not in (None, "")})


def _kind_data(kind: str, target: Target, args, warn: Warnings) -> tuple[Any, Callable[[Any], str]]:
    """(data for -o json|yaml, its table) of one kind."""
    f = _filters(args)
    # With an explicit --admin the tables show what the proxy holds, as istioctl's; otherwise
    # what its control plane sends.
    dump = target.admin.config_dump() if args.admin and target.admin and kind != "endpoints" else target.dump
    if kind == "clusters":
        res = [r for r in resources_of(dump, kind) if f.cluster_ok(r["name"])]
        return [r["resource"] for r in res], lambda _: tables.clusters_table(tables.cluster_rows(res, f))
    if kind == "listeners":
        res = resources_of(dump, kind)
        rows = tables.listener_rows(res, f)
        names = {r["name"] for r in rows}
        return [r["resource"] for r in res if r["name"] in names], lambda _: tables.listeners_table(rows)
    if kind == "routes":
        res = [r for r in resources_of(dump, kind) if not f.name or r["name"] == f.name]
        return [r["resource"] for r in res], lambda _: tables.routes_table(tables.route_rows(res, f))
    if kind == "endpoints":
        if target.admin is not None:
            rows = tables.endpoint_rows_from_envoy(target.admin.clusters(), f)
        else:
            warn.lines.append(f"note: OUTLIER CHECK needs the proxy's Envoy admin; {target.admin_problem}")
            rows = tables.endpoint_rows_from_eds(resources_of(dump, kind), f)
        return rows, lambda _: tables.endpoints_table(rows, target.admin is not None)
    if kind == "secrets":
        if target.admin is not None:
            res = resources_of(target.admin.config_dump(), kind)
            if target.agent is not None:  # what the agent holds but Envoy has not asked for
                have = {r["name"] for r in res}
                res += [{**r, "state": "agent"} for r in resources_of(target.agent.get("/debug/secrets"), kind)
                        if r["name"] not in have]
            rows = tables.secret_rows(res, proxy_side=True)
        else:
            warn.lines.append("note: showing the secrets the control plane serves; the proxy's own (from its "
                              f"agent) need its Envoy admin: {target.admin_problem}")
            res = resources_of(dump, kind)
            rows = tables.secret_rows(res, proxy_side=False)
        return rows, lambda _: tables.secrets_table(rows)
    raise CtlError(f"unknown kind {kind!r}")


def cmd_proxy_config(args, replicas: Replicas, warn: Warnings) -> str:
    kind = ALIASES.get(args.kind, args.kind)
    target = Target(args, replicas, args.proxy, include_eds=kind in ("endpoints", "all"))
    if kind == "bootstrap":
        boot = bootstrap_of(target.need_admin("the bootstrap").config_dump())
        return render(boot, args.output if args.output != "short" else "yaml", lambda b: b)
    if kind == "all":
        kinds = ("clusters", "listeners", "routes", "endpoints", "secrets")
        parts = {k: _kind_data(k, target, args, warn) for k in kinds}
        if args.output != "short":
            return render({k: d for k, (d, _) in parts.items()}, args.output, str)
        return "\n\n".join(short(data) for data, short in parts.values())
    data, short = _kind_data(kind, target, args, warn)
    return render(data, args.output, short)


def cmd_explain(args, replicas: Replicas, warn: Warnings) -> str:
    import urllib.parse

    kind = ALIASES.get(args.type.lower(), args.type.lower())
    if kind not in TYPES:
        raise CtlError(f"unknown type {args.type!r} (want one of {', '.join(TYPES)}, or cds, eds, lds, rds, sds)")
    replica, _ = replicas.locate(args.proxy)
    q = urllib.parse.urlencode({"proxyID": args.proxy, "type": TYPES[kind], "name": args.name})
    data = replica.get("/debug/explain?" + q)
    return render(data, args.output if args.output != "short" else "yaml", str)


def cmd_jwt(args, _replicas, _warn) -> str:
    if args.jwt_command == "init":
        return devjwt.init(args.dir)
    if args.jwt_command == "rule":
        return devjwt.rule(args.dir)
    return devjwt.token(args.dir, args.namespace, args.sa, args.lifetime)


def cmd_completion(args, _replicas, _warn) -> str:
    return argcomplete.shellcode(["pilotctl"], shell=args.shell)


# --- parsing -------------------------------------------------------------------------------
def _proxy_completer(prefix: str, parsed_args, **_kwargs) -> list[str]:
    """Connected proxies' POD.NAMESPACE names from the replicas (nothing when none answers)."""
    try:
        rows = status_rows(Replicas.of(parsed_args.addr or [DEFAULT_ADDR], 2.0))
    except CtlError:
        return []
    return [r["name"] for r in rows if r["name"].startswith(prefix)]


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number from 1 to 65535")
    return int(text)


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=["short", "json", "yaml"], default="short",
                   help="output format (default: %(default)s)")


def _proxy_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    a = p.add_argument("proxy", nargs="?" if optional else None, default="",
                       help="proxy: POD.NAMESPACE, a full node id, or a connection id")
    a.completer = _proxy_completer  # type: ignore[attr-defined]
    p.add_argument("--admin", metavar="HOST:PORT", default="",
                   help="the proxy's Envoy admin address (default: 127.0.0.1 and the proxyAdminPort in its "
                        "node metadata, if that Envoy is this proxy)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pilotctl", description="Inspect what the control plane sends proxies, "
                                "and what they hold.")
    p.add_argument("--addr", action="append", metavar="HOST:PORT",
                   help=f"a control plane replica's debug address; repeat for several replicas "
                        f"(default: {DEFAULT_ADDR})")
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="also find the replicas as the running istiod pods of this cluster (their pod IPs "
                        "must be reachable; see pilot/pilotctl/discover.py)")
    p.add_argument("-i", "--istioNamespace", default="istio-system",
                   help="namespace of the istiod pods, with --kubeconfig (default: %(default)s)")
    p.add_argument("-l", "--selector", default="app=istiod",
                   help="label selector of the istiod pods, with --kubeconfig (default: %(default)s)")
    p.add_argument("--token-file", metavar="PATH",
                   help="a bearer token for replicas not on localhost (debug endpoints authenticate them)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default: %(default)s)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ps = sub.add_parser("proxy-status", aliases=["ps"], help="sync state of every proxy, or one proxy's diff")
    _proxy_args(ps, optional=True)
    _output(ps)
    ps.set_defaults(run=cmd_proxy_status)

    pc = sub.add_parser("proxy-config", aliases=["pc"], help="config a proxy is sent (or holds)")
    pc.add_argument("kind", choices=[*PC_KINDS, *ALIASES], metavar="KIND",
                    help="clusters|listeners|routes|endpoints|secrets|all|bootstrap")
    _proxy_args(pc)
    _output(pc)
    g = pc.add_argument_group("filters (istioctl's)")
    g.add_argument("--fqdn", help="clusters: name contains this FQDN")
    g.add_argument("--port", type=_port, help="clusters, listeners, endpoints: this port")
    g.add_argument("--subset", help="clusters: name contains this subset")
    g.add_argument("--direction", choices=["inbound", "outbound"], help="clusters: this direction")
    g.add_argument("--address", help="listeners, endpoints: this address")
    g.add_argument("--type", choices=["HTTP", "TCP", "http", "tcp"], help="listeners: filter chains of this type")
    g.add_argument("--name", help="routes: this route configuration")
    g.add_argument("--cluster", help="endpoints: this cluster")
    g.add_argument("--status", help="endpoints: this health status (HEALTHY, UNHEALTHY...)")
    pc.set_defaults(run=cmd_proxy_config)

    ex = sub.add_parser("explain", help="which config a resource was built from, and why it last changed")
    a = ex.add_argument("proxy")
    a.completer = _proxy_completer  # type: ignore[attr-defined]
    ex.add_argument("type", help="clusters|listeners|routes|endpoints|secrets (or cds, lds, rds, eds, sds)")
    ex.add_argument("name")
    _output(ex)
    ex.set_defaults(run=cmd_explain)

    jwt = sub.add_parser("jwt", help="a local test JWT issuer for file mode (tokens for pilot-agent)")
    jsub = jwt.add_subparsers(dest="jwt_command", required=True, metavar="ACTION")
    for name, text in (("init", "make a signing key and its JWKS in DIR"),
                       ("rule", "print the JWT_RULE that makes the control plane trust DIR's key")):
        jsub.add_parser(name, help=text).add_argument("dir")
    tok = jsub.add_parser("token", help="print a token for a workload, signed with DIR's key")
    tok.add_argument("dir")
    tok.add_argument("--namespace", required=True)
    tok.add_argument("--sa", required=True, help="service account")
    tok.add_argument("--lifetime", type=float, default=24 * 3600, help="seconds (default: %(default)s)")
    jwt.set_defaults(run=cmd_jwt)

    tagctl.add_parser(sub)
    workloadctl.add_parser(sub)

    comp = sub.add_parser("completion", help="shell completion script: eval \"$(pilotctl completion bash)\"")
    comp.add_argument("shell", choices=["bash", "zsh", "fish", "tcsh"])
    comp.set_defaults(run=cmd_completion)
    return p


def _replicas(args) -> Replicas:
    addrs = list(args.addr or [])
    if args.kubeconfig:
        from pilot.pilotctl.discover import discover

        addrs += discover(args.kubeconfig, args.istioNamespace, args.selector, args.timeout)
    token = ""
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip()
        except OSError as e:
            raise CtlError(f"cannot read --token-file {args.token_file}: {e.strerror}") from None
    return Replicas.of(addrs or [DEFAULT_ADDR], args.timeout, token)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    warn = Warnings()
    try:
        replicas = _replicas(args) if args.run not in (cmd_jwt, cmd_completion, tagctl.run, workloadctl.run) else Replicas([])
        out = args.run(args, replicas, warn)
    except CtlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    try:
        print(out)
        sys.stdout.flush()
    except BrokenPipeError:  # `pilotctl ... | head`: the reader has what it wanted
        sys.stdout = None  # nothing more to flush at exit
        return 0
    for line in warn.lines:
        print(line, file=sys.stderr)
    return 1 if warn.failed else 0
