"""Resource names, exactly as istiod spells them (users grep for these in config dumps)."""

from __future__ import annotations

BLACKHOLE_CLUSTER = "BlackHoleCluster"
PASSTHROUGH_CLUSTER = "PassthroughCluster"
VIRTUAL_OUTBOUND_LISTENER = "virtualOutbound"
VIRTUAL_OUTBOUND_PORT = 15001


def outbound_cluster_name(port: int, hostname: str, subset: str = "") -> str:
    return f"outbound|{port}|{subset}|{hostname}"


def parse_cluster_name(name: str) -> tuple[str, int, str, str] | None:
    """`outbound|80||host` -> ("outbound", 80, "", "host"); None for anything else."""
    parts = name.split("|")
    if len(parts) != 4 or parts[0] not in ("outbound", "inbound"):
        return None
    try:
        port = int(parts[1])
    except ValueError:
        return None
    return parts[0], port, parts[2], parts[3]


# A router's cluster for mesh mTLS arriving at an AUTO_PASSTHROUGH server, named as the SNI
# sidecars send (istiod's BuildDNSSrvSubsetKey): `outbound_.PORT_.SUBSET_.HOST`.
SNI_DNAT_PREFIX = "outbound_."


def sni_dnat_cluster_name(port: int, hostname: str, subset: str = "") -> str:
    return f"outbound_.{port}_.{subset}_.{hostname}"


def parse_sni_dnat_name(name: str) -> tuple[str, int, str, str] | None:
    """`outbound_.80_._.host` -> ("outbound", 80, "", "host"); None for anything else."""
    parts = name.split("_.", 3)
    if len(parts) != 4 or parts[0] != "outbound":
        return None
    try:
        port = int(parts[1])
    except ValueError:
        return None
    return "outbound", port, parts[2], parts[3]


def route_config_name(port: int) -> str:
    return str(port)


def listener_name(address: str, port: int) -> str:
    return f"{address}_{port}"


def grpc_listener_name(hostname: str, port: int) -> str:
    return f"{hostname}:{port}"
