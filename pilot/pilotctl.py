"""`pilotctl`: istioctl-style views of the control plane, read from its debug HTTP endpoints.

    pilotctl proxy-status
    pilotctl proxy-config clusters|listeners|routes|endpoints|secrets PROXY [-o json|yaml]
    pilotctl explain PROXY TYPE NAME
    pilotctl tag set|generate|list|remove ...   (pilot/tagctl.py; reads the cluster, not the debug port)
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

import yaml

from pilot import tagctl

TYPES = {"clusters": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
         "listeners": "type.googleapis.com/envoy.config.listener.v3.Listener",
         "routes": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
         "endpoints": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
         "secrets": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"}
SHORT_TYPES = {"cds": "clusters", "lds": "listeners", "rds": "routes", "eds": "endpoints", "sds": "secrets",
               "cluster": "clusters", "listener": "listeners", "route": "routes", "endpoint": "endpoints"}


class CtlError(Exception):
    pass


def fetch(addr: str, path: str, timeout: float = 10.0):
    url = f"http://{addr}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            body = json.loads(body).get("error", body)
        except (ValueError, AttributeError):
            pass
        raise CtlError(f"{url}: HTTP {e.code}: {body}") from None
    except (urllib.error.URLError, OSError) as e:
        raise CtlError(f"cannot reach the control plane at {addr}: {e}") from None


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(str(r[i])) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["   ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["   ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


# --- proxy-status ---------------------------------------------------------------------------
def sync_state(row: dict, field: str) -> str:
    sent, acked = row.get(f"{field}_sent"), row.get(f"{field}_acked")
    if not sent:
        return "NOT SENT"
    if row.get(f"{field}_nack") and row[f"{field}_nack"]["nonce"] == sent:
        return "NACKED"
    return "SYNCED" if sent == acked else "STALE"


def proxy_status(addr: str) -> str:
    rows = []
    for r in sorted(fetch(addr, "/debug/syncz"), key=lambda r: r["proxy"]):
        versions = {r.get(f"{f}_version_acked") for f in ("cluster", "listener") if r.get(f"{f}_version_acked")}
        rows.append([_short_proxy(r["proxy"]), r.get("cluster_id", ""), sync_state(r, "cluster"),
                     sync_state(r, "listener"), sync_state(r, "endpoint"), sync_state(r, "route"),
                     r.get("istio_version") or "-", max(versions) if versions else "-"])
    return table(["NAME", "CLUSTER", "CDS", "LDS", "EDS", "RDS", "VERSION", "PUSH VERSION"], rows)


def _short_proxy(proxy_id: str) -> str:
    parts = proxy_id.split("~")
    return parts[2] if len(parts) == 4 else proxy_id


# --- proxy-config ---------------------------------------------------------------------------
# Where each kind sits in Envoy's /config_dump shape (the control plane's dump has it too):
# section message, repeated field, the resource's field in an entry, and how the resource is named.
_SECTIONS = {"clusters": ("ClustersConfigDump", "dynamic_active_clusters", ("cluster",), "name"),
             "listeners": ("ListenersConfigDump", "dynamic_listeners", ("active_state", "listener"), "name"),
             "routes": ("RoutesConfigDump", "dynamic_route_configs", ("route_config",), "name"),
             "endpoints": ("EndpointsConfigDump", "dynamic_endpoint_configs", ("endpoint_config",),
                           "cluster_name"),
             "secrets": ("SecretsConfigDump", "dynamic_active_secrets", ("secret",), "name")}


def _camel(value):
    """snake_case proto JSON (Envoy's dump) -> the camelCase the tables read. Map keys that are
    not proto field names (dots, dashes, capitals) stay as they are."""
    if isinstance(value, list):
        return [_camel(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for k, v in value.items():
        if "_" in k and k.replace("_", "").isalnum() and k.islower():
            head, *rest = k.split("_")
            k = head + "".join(p[:1].upper() + p[1:] for p in rest)
        out[k] = _camel(v)
    return out


def resources_of(dump: dict, kind: str) -> list[dict]:
    """[{name, resource}] of one kind from a /config_dump (Envoy's admin.v3.ConfigDump JSON)."""
    section, field, path, name_field = _SECTIONS[kind]
    out = []
    for cfg in dump.get("configs", []):
        if cfg.get("@type", "").rpartition(".")[2] != section:
            continue
        for entry in cfg.get(field, []):
            res = entry
            for step in path:
                res = res.get(step, {})
            if not res:
                continue
            res = {k: v for k, v in res.items() if k != "@type"}
            out.append({"name": res.get(name_field) or entry.get("name", ""), "resource": _camel(res)})
    return out


def clusters_table(resources: list[dict]) -> str:
    rows = []
    for r in resources:
        name = r["name"]
        parts = name.split("|")
        if len(parts) == 4:
            direction, port, subset, host = parts
            rows.append([host or "", port, subset or "-", direction, r["resource"].get("type", "EDS"), "-"])
        else:
            rows.append([name, "-", "-", "-", r["resource"].get("type", "STATIC"), "-"])
    return table(["SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"], rows)


def listeners_table(resources: list[dict]) -> str:
    rows = []
    for r in resources:
        res = r["resource"]
        sa = res.get("address", {}).get("socketAddress", {})
        for chain in res.get("filterChains", []) or [{}]:
            dest = "-"
            for f in chain.get("filters", []):
                tc = f.get("typedConfig", {})
                if "rds" in tc:
                    dest = f"Route: {tc['rds'].get('routeConfigName', '')}"
                elif "cluster" in tc:
                    dest = f"Cluster: {tc['cluster']}"
            match = chain.get("filterChainMatch", {})
            rows.append([sa.get("address", "-"), str(sa.get("portValue", "-")), json.dumps(match) if match else "ALL",
                         dest])
        if "apiListener" in res:
            rows.append(["-", "-", "API listener", f"Route: {r['name']}"])
    return table(["ADDRESSES", "PORT", "MATCH", "DESTINATION"], rows)


def routes_table(resources: list[dict]) -> str:
    rows = []
    for r in resources:
        for vh in r["resource"].get("virtualHosts", []):
            domains = vh.get("domains", [])
            shown = domains[0] + (f" + {len(domains) - 1} more..." if len(domains) > 1 else "")
            for route in vh.get("routes", []):
                match = route.get("match", {})
                m = match.get("prefix") and f"{match['prefix']}*" or match.get("path") or "/*"
                rows.append([r["name"], vh.get("name", ""), shown, m, "-"])
    return table(["NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"], rows)


def endpoints_table(resources: list[dict]) -> str:
    rows = []
    for r in resources:
        for group in r["resource"].get("endpoints", []):
            for lb in group.get("lbEndpoints", []):
                sa = lb.get("endpoint", {}).get("address", {}).get("socketAddress", {})
                rows.append([f"{sa.get('address')}:{sa.get('portValue')}", lb.get("healthStatus", "HEALTHY"),
                             "OK", r["name"]])
    return table(["ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"], rows)


def secrets_table(resources: list[dict]) -> str:
    return table(["RESOURCE NAME", "TYPE", "STATUS"], [[r["name"], "Secret", "ACTIVE"] for r in resources])


TABLES = {"clusters": clusters_table, "listeners": listeners_table, "routes": routes_table,
          "endpoints": endpoints_table, "secrets": secrets_table}


def proxy_config(addr: str, kind: str, proxy: str, output: str) -> str:
    query = {"proxyID": proxy, **({"include_eds": "true"} if kind == "endpoints" else {})}
    dump = fetch(addr, "/debug/config_dump?" + urllib.parse.urlencode(query))
    resources = resources_of(dump, kind)
    if output == "json":
        return json.dumps([r["resource"] for r in resources], indent=2)
    if output == "yaml":
        return yaml.safe_dump([r["resource"] for r in resources], sort_keys=False)
    return TABLES[kind](resources)


def explain(addr: str, proxy: str, type_: str, name: str) -> str:
    kind = SHORT_TYPES.get(type_.lower(), type_.lower())
    if kind not in TYPES:
        raise CtlError(f"unknown type {type_!r} (want one of {', '.join(TYPES)})")
    q = urllib.parse.urlencode({"proxyID": proxy, "type": TYPES[kind], "name": name})
    data = fetch(addr, "/debug/explain?" + q)
    return yaml.safe_dump(data, sort_keys=False)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pilotctl", description="Inspect what the control plane sends proxies.")
    p.add_argument("--addr", default="localhost:15014", help="control plane debug address (host:port)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("proxy-status", aliases=["ps"], help="sync state of every connected proxy")
    pc = sub.add_parser("proxy-config", aliases=["pc"], help="config a proxy was sent")
    pc.add_argument("kind", choices=sorted(TABLES))
    pc.add_argument("proxy", help="proxy id, POD.NAMESPACE, or connection id")
    pc.add_argument("-o", "--output", choices=["short", "json", "yaml"], default="short")
    ex = sub.add_parser("explain", help="which config a resource was built from, and why it last changed")
    ex.add_argument("proxy")
    ex.add_argument("type", help="clusters|listeners|routes|endpoints (or cds, lds, rds, eds)")
    ex.add_argument("name")
    tagctl.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "tag":
        return tagctl.main(args)
    try:
        if args.command in ("proxy-status", "ps"):
            out = proxy_status(args.addr)
        elif args.command in ("proxy-config", "pc"):
            out = proxy_config(args.addr, args.kind, args.proxy, args.output)
        else:
            out = explain(args.addr, args.proxy, args.type, args.name)
    except CtlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
