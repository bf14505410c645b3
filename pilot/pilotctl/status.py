"""proxy-status: every replica's proxies and their sync state (istioctl's table with its ISTIOD
column), and for one proxy the diff between what its replica would send and what its Envoy holds
(istioctl proxy-status PROXY)."""

from __future__ import annotations

import difflib
import json

from pilot.pilotctl.client import Replicas
from pilot.pilotctl.dump import resources_of
from pilot.pilotctl.tables import table
from pilot.xds.sync_state import sync_state

SYNC_FIELDS = {"cds": "cluster", "lds": "listener", "eds": "endpoint", "rds": "route"}


def row_state(row: dict, field: str) -> str:
    """pilot.xds.sync_state from the replica's record of the stream: the nonce it last sent for
    the type, the nonce the proxy last ACKed, and the last NACK."""
    nack = row.get(f"{field}_nack")
    return sync_state(row.get(f"{field}_sent"), row.get(f"{field}_acked"), nack.get("nonce") if nack else None)


def short_proxy(proxy_id: str) -> str:
    parts = proxy_id.split("~")
    return parts[2] if len(parts) == 4 else proxy_id


def status_rows(replicas: Replicas) -> list[dict]:
    rows = []
    for replica, syncz in replicas.each("/debug/syncz"):
        for r in syncz:
            acked = sorted({r[f"{f}_version_acked"] for f in ("cluster", "listener") if r.get(f"{f}_version_acked")})
            rows.append({"name": short_proxy(r["proxy"]), "proxy": r["proxy"], "cluster": r.get("cluster_id", ""),
                         **{short: row_state(r, f) for short, f in SYNC_FIELDS.items()},
                         "istiod": r.get("istiod") or replica.addr, "istiod_addr": replica.addr,
                         "version": r.get("istio_version") or "",
                         "push_version": acked[-1] if acked else ""})
    return sorted(rows, key=lambda r: (r["name"], r["istiod"]))


def status_table(rows: list[dict]) -> str:
    return table(["NAME", "CLUSTER", "CDS", "LDS", "EDS", "RDS", "ISTIOD", "VERSION"],
                 [[r["name"], r["cluster"], r["cds"], r["lds"], r["eds"], r["rds"], r["istiod"], r["version"] or "-"]
                  for r in rows])


# --- one proxy: control plane vs Envoy ------------------------------------------------------
_DIFF_KINDS = (("clusters", "Clusters"), ("listeners", "Listeners"), ("routes", "Routes"))


def _by_name(dump: dict, kind: str) -> dict[str, dict]:
    # Only what xDS delivers: a proxy's static bootstrap resources (xds-grpc...) are not the
    # control plane's to send.
    return {r["name"]: r["resource"] for r in resources_of(dump, kind) if r["state"].startswith("dynamic")}


def proxy_diff(control_plane: dict, envoy: dict) -> dict:
    """{kind: {match, only_control_plane, only_envoy, differ, diff}} for clusters, listeners and
    routes: resource by resource, the JSON the replica would send now against the JSON Envoy holds."""
    out = {}
    for kind, _ in _DIFF_KINDS:
        ours, theirs = _by_name(control_plane, kind), _by_name(envoy, kind)
        differ = sorted(n for n in ours.keys() & theirs.keys() if ours[n] != theirs[n])
        only_ours, only_theirs = sorted(ours.keys() - theirs.keys()), sorted(theirs.keys() - ours.keys())
        a = json.dumps({n: ours[n] for n in sorted(ours)}, indent=2, sort_keys=True).splitlines()
        b = json.dumps({n: theirs[n] for n in sorted(theirs)}, indent=2, sort_keys=True).splitlines()
        diff = "\n".join(difflib.unified_diff(a, b, f"Istiod {kind}", f"Envoy {kind}", lineterm="")) \
            if (differ or only_ours or only_theirs) else ""
        out[kind] = {"match": not (differ or only_ours or only_theirs), "only_control_plane": only_ours,
                     "only_envoy": only_theirs, "differ": differ, "diff": diff}
    return out


def diff_text(diff: dict) -> str:
    lines = []
    for kind, title in _DIFF_KINDS:
        d = diff[kind]
        if d["match"]:
            lines.append(f"{title} Match")
            continue
        lines.append(f"{title} Don't Match")
        lines.append(d["diff"])
    return "\n".join(lines)
