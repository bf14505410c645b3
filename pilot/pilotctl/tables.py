"""istioctl proxy-config's tables and filters, each column computed from the resource (or the
proxy's own state) it describes."""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass

from cryptography import x509

from pilot.pilotctl.dump import istio_config


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(str(r[i])) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["   ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["   ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


# --- filters (istioctl's semantics: substring matches on the name, as its Verify functions) ----
@dataclass(frozen=True)
class Filters:
    fqdn: str = ""
    port: int = 0
    subset: str = ""
    direction: str = ""
    address: str = ""
    type: str = ""
    name: str = ""
    cluster: str = ""
    status: str = ""

    def cluster_ok(self, name: str) -> bool:
        return ((not self.fqdn or self.fqdn in name) and (not self.direction or self.direction in name)
                and (not self.subset or self.subset in name) and (not self.port or f"|{self.port}|" in name))


# --- clusters ------------------------------------------------------------------------------
def cluster_rows(resources: list[dict], f: Filters) -> list[dict]:
    out = []
    for r in resources:
        name = r["name"]
        if not f.cluster_ok(name):
            continue
        parts = name.split("|")
        res = r["resource"]
        row = {"name": name, "fqdn": name, "port": "-", "subset": "-", "direction": "-",
               "type": res.get("type", "EDS" if "edsClusterConfig" in res else "STATIC"),
               "destination_rule": istio_config(res)}
        if len(parts) == 4:
            direction, port, subset, host = parts
            row.update(fqdn=host, port=port, subset=subset or "-", direction=direction)
        out.append(row)
    return out


def clusters_table(rows: list[dict]) -> str:
    return table(["SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"],
                 [[r["fqdn"], r["port"], r["subset"], r["direction"], r["type"], r["destination_rule"]]
                  for r in rows])


# --- listeners -----------------------------------------------------------------------------
def _chain_type(chain: dict) -> tuple[str, str]:
    """(TYPE as istioctl's --type filter names it, DESTINATION) of a filter chain."""
    for flt in chain.get("filters", []):
        tc = flt.get("typedConfig", {})
        if "rds" in tc:
            return "HTTP", f"Route: {tc['rds'].get('routeConfigName', '')}"
        if "routeConfig" in tc:
            return "HTTP", "Inline Route: " + tc["routeConfig"].get("name", "")
        if "cluster" in tc:
            return "TCP", f"Cluster: {tc['cluster']}"
        if "weightedClusters" in tc:
            return "TCP", "Clusters: " + ",".join(c.get("name", "") for c in tc["weightedClusters"].get("clusters", []))
    return "", "-"


def listener_rows(resources: list[dict], f: Filters) -> list[dict]:
    out = []
    for r in resources:
        res = r["resource"]
        sa = res.get("address", {}).get("socketAddress", {})
        address, port = sa.get("address", "-"), sa.get("portValue", 0)
        if (f.address and f.address != address) or (f.port and f.port != port):
            continue
        if "apiListener" in res:
            if not f.type or f.type.upper() == "HTTP":
                out.append({"name": r["name"], "address": "-", "port": "-", "type": "HTTP", "match": "API listener",
                            "destination": f"Route: {r['name']}"})
            continue
        for chain in res.get("filterChains", []) or [{}]:
            kind, dest = _chain_type(chain)
            if f.type and f.type.upper() != kind:
                continue
            match = chain.get("filterChainMatch", {})
            out.append({"name": r["name"], "address": address, "port": str(port), "type": kind,
                        "match": _describe_match(match), "destination": dest})
    return out


def _describe_match(match: dict) -> str:
    if not match:
        return "ALL"
    parts = []
    if "transportProtocol" in match:
        parts.append(f"Trans: {match['transportProtocol']}")
    if "applicationProtocols" in match:
        parts.append("App: " + ",".join(match["applicationProtocols"]))
    if "serverNames" in match:
        parts.append("SNI: " + ",".join(match["serverNames"]))
    if "destinationPort" in match:
        parts.append(f"Port: {match['destinationPort']}")
    if "prefixRanges" in match:
        parts.append("Addr: " + ",".join(f"{p.get('addressPrefix')}/{p.get('prefixLen', 32)}"
                                         for p in match["prefixRanges"]))
    return "; ".join(parts) or json.dumps(match)


def listeners_table(rows: list[dict]) -> str:
    return table(["ADDRESSES", "PORT", "MATCH", "DESTINATION"],
                 [[r["address"], r["port"], r["match"], r["destination"]] for r in rows])


# --- routes --------------------------------------------------------------------------------
def route_rows(resources: list[dict], f: Filters) -> list[dict]:
    out = []
    for r in resources:
        if f.name and f.name != r["name"]:
            continue
        for vh in r["resource"].get("virtualHosts", []):
            domains = vh.get("domains", [])
            shown = domains[0] + (f" + {len(domains) - 1} more..." if len(domains) > 1 else "") if domains else ""
            for route in vh.get("routes", []):
                out.append({"name": r["name"], "vhost": vh.get("name", ""), "domains": shown,
                            "match": _route_match(route.get("match", {})), "virtual_service": istio_config(route)})
            if not vh.get("routes"):
                out.append({"name": r["name"], "vhost": vh.get("name", ""), "domains": shown, "match": "/*",
                            "virtual_service": "404"})
    return out


def _route_match(match: dict) -> str:
    if "prefix" in match:
        return f"{match['prefix']}*"
    if "path" in match:
        return match["path"]
    if "pathSeparatedPrefix" in match:
        return f"{match['pathSeparatedPrefix']}/*"
    if "safeRegex" in match:
        return "regex " + match["safeRegex"].get("regex", "")
    return "/*"


def routes_table(rows: list[dict]) -> str:
    return table(["NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"],
                 [[r["name"], r["vhost"], r["domains"], r["match"], r["virtual_service"]] for r in rows])


# --- endpoints -----------------------------------------------------------------------------
def endpoint_rows_from_eds(resources: list[dict], f: Filters) -> list[dict]:
    """What the control plane sends: each lbEndpoint's EDS health status (no outlier state:
    only the proxy knows whom it ejected)."""
    out = []
    for r in resources:
        for group in r["resource"].get("endpoints", []):
            for lb in group.get("lbEndpoints", []):
                sa = lb.get("endpoint", {}).get("address", {}).get("socketAddress", {})
                out.append({"endpoint": f"{sa.get('address')}:{sa.get('portValue')}",
                            "status": lb.get("healthStatus", "UNKNOWN"), "cluster": r["name"]})
    return [row for row in out if _endpoint_ok(row, f)]


def endpoint_rows_from_envoy(clusters: dict, f: Filters) -> list[dict]:
    """What the proxy holds (Envoy /clusters?format=json): istioctl's STATUS is the host's EDS
    health status, OUTLIER CHECK whether outlier detection ejected it."""
    out = []
    for c in clusters.get("cluster_statuses", []):
        for h in c.get("host_statuses", []):
            sa = h.get("address", {}).get("socket_address", {})
            pipe = h.get("address", {}).get("pipe", {}).get("path")
            health = h.get("health_status", {})
            out.append({"endpoint": pipe and f"unix://{pipe}" or f"{sa.get('address')}:{sa.get('port_value')}",
                        "status": health.get("eds_health_status", "UNKNOWN"),
                        "outlier_check": "FAILED" if health.get("failed_outlier_check") else "OK",
                        "cluster": c.get("name", "")})
    return [row for row in out if _endpoint_ok(row, f)]


def _endpoint_ok(row: dict, f: Filters) -> bool:
    host, _, port = row["endpoint"].rpartition(":")
    return ((not f.address or f.address == host) and (not f.port or str(f.port) == port)
            and (not f.cluster or f.cluster == row["cluster"]) and (not f.status or f.status.upper() == row["status"]))


def endpoints_table(rows: list[dict], proxy_side: bool) -> str:
    if proxy_side:
        return table(["ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"],
                     [[r["endpoint"], r["status"], r["outlier_check"], r["cluster"]] for r in rows])
    return table(["ENDPOINT", "STATUS", "CLUSTER"], [[r["endpoint"], r["status"], r["cluster"]] for r in rows])


# --- secrets -------------------------------------------------------------------------------
# Which list of Envoy's dump holds it; "agent": pilot-agent holds it for SDS, Envoy has not asked.
_SECRET_STATE = {"dynamic_active_secrets": "ACTIVE", "dynamic_warming_secrets": "WARMING", "static_secrets": "STATIC",
                 "agent": "AGENT"}


def _pem(data_source: dict) -> bytes:
    if "inlineBytes" in data_source:
        return base64.b64decode(data_source["inlineBytes"])
    return data_source.get("inlineString", "").encode()


def secret_rows(resources: list[dict], proxy_side: bool, now: dt.datetime | None = None) -> list[dict]:
    """istioctl's secret columns from the certificates themselves: TYPE (a chain or a CA bundle),
    VALID CERT (now within the leaf's validity), SERIAL NUMBER, NOT AFTER, NOT BEFORE; STATUS (which
    list of the proxy's dump holds it) only when read from the proxy."""
    now = now or dt.datetime.now(dt.UTC)
    out = []
    for r in resources:
        res = r["resource"]
        if "tlsCertificate" in res:
            kind, pem = "Cert Chain", _pem(res["tlsCertificate"].get("certificateChain", {}))
        elif "validationContext" in res:
            kind, pem = "CA", _pem(res["validationContext"].get("trustedCa", {}))
        else:
            kind, pem = "Other", b""
        row = {"name": r["name"], "type": kind, "valid_cert": "false", "serial_number": "-",
               "not_after": "-", "not_before": "-", "version": r.get("version", ""),
               "last_updated": r.get("last_updated", "")}
        if proxy_side:
            row["status"] = _SECRET_STATE.get(r.get("state", ""), r.get("state", ""))
        try:
            certs = x509.load_pem_x509_certificates(pem) if pem else []
        except ValueError:
            certs = []
        if certs:
            leaf = certs[0]
            row.update(valid_cert=str(leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc).lower(),
                       serial_number=format(leaf.serial_number, "x"),
                       not_after=leaf.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       not_before=leaf.not_valid_before_utc.strftime("%Y-%m-%dT%H:%M:%SZ"))
        out.append(row)
    return out


def secrets_table(rows: list[dict]) -> str:
    with_status = bool(rows) and "status" in rows[0]
    headers = ["RESOURCE NAME", "TYPE", *(["STATUS"] if with_status else []), "VALID CERT", "SERIAL NUMBER",
               "NOT AFTER", "NOT BEFORE"]
    return table(headers, [[r["name"], r["type"], *([r["status"]] if with_status else []), r["valid_cert"],
                            r["serial_number"], r["not_after"], r["not_before"]] for r in rows])
