"""Reading Envoy's /config_dump JSON (admin.v3.ConfigDump), which the control plane's
/debug/config_dump?proxyID= also answers in: the resources of each kind, and the `istio`
metadata the generated clusters and routes carry (pilot.networking.metadata)."""

from __future__ import annotations

# Where each kind sits in the dump: section message, the repeated fields holding it (dynamic
# first, then static: only a proxy's own dump has static ones), the path to the resource in an
# entry, and how the resource is named.
_SECTIONS = {
    "clusters": ("ClustersConfigDump", ("dynamic_active_clusters", "static_clusters"), ("cluster",), "name"),
    "listeners": ("ListenersConfigDump", ("dynamic_listeners", "static_listeners"),
                  (("active_state", "listener"), ("listener",)), "name"),
    "routes": ("RoutesConfigDump", ("dynamic_route_configs", "static_route_configs"), ("route_config",), "name"),
    "endpoints": ("EndpointsConfigDump", ("dynamic_endpoint_configs", "static_endpoint_configs"),
                  ("endpoint_config",), "cluster_name"),
    "secrets": ("SecretsConfigDump", ("dynamic_active_secrets", "dynamic_warming_secrets", "static_secrets"),
                ("secret",), "name"),
}
KINDS = tuple(_SECTIONS)


def _camel(value):
    """snake_case proto JSON (Envoy's dump) -> the camelCase proto JSON the tables read. Map keys
    that are not proto field names (dots, dashes, capitals) stay as they are."""
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


def _section(dump: dict, name: str) -> list[dict]:
    return [c for c in dump.get("configs", []) if c.get("@type", "").rpartition(".")[2] == name]


def resources_of(dump: dict, kind: str) -> list[dict]:
    """[{name, resource, state, version, last_updated}] of one kind. `resource` is camelCase
    proto JSON; `state` is the field it came from (dynamic_warming_secrets, static_clusters...)."""
    section, fields, path, name_field = _SECTIONS[kind]
    paths = path if isinstance(path[0], tuple) else (path,)
    out = []
    for cfg in _section(dump, section):
        for fname in fields:
            for entry in cfg.get(fname, []):
                res = None
                for p in paths:
                    res = entry
                    for step in p:
                        res = res.get(step, {}) if isinstance(res, dict) else {}
                    if res:
                        break
                if not res:
                    continue
                holder = entry.get("active_state", entry)
                res = {k: v for k, v in res.items() if k != "@type"}
                out.append({"name": res.get(name_field) or entry.get("name", ""), "resource": _camel(res),
                            "state": fname, "version": holder.get("version_info", ""),
                            "last_updated": holder.get("last_updated", "")})
    return out


def bootstrap_of(dump: dict) -> dict:
    for cfg in _section(dump, "BootstrapConfigDump"):
        return _camel({k: v for k, v in cfg.get("bootstrap", {}).items()})
    return {}


def istio_config(resource: dict) -> str:
    """istioctl's describeManagement: the `config` an `istio` metadata entry names, as NAME.NAMESPACE
    for Istio objects; Gateway API objects (which istioctl shows as <unknown>) as kind/NAME.NAMESPACE."""
    path = resource.get("metadata", {}).get("filterMetadata", {}).get("istio", {}).get("config", "")
    if not path:
        return ""
    pieces = path.split("/")
    if len(pieces) != 8 or pieces[1] != "apis" or pieces[4] != "namespaces":
        return "<unknown>"
    name, namespace = pieces[7], pieces[5]
    if pieces[2] == "networking.istio.io":
        return f"{name}.{namespace}"
    return f"{pieces[6]}/{name}.{namespace}"
