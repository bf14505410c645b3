"""What one delta proxy was sent, resource by resource, against what it needed (the `delta_bytes`
scenario): a resource whose bytes equal what the proxy already holds was sent for nothing.

Kept for proxy 0 only (it holds a digest per resource and the route configurations' bytes). For
a changed route configuration it also works out what a split would have sent: the virtual hosts
whose bytes changed, as VHDS resources (`Resource{name: "ROUTE/DOMAIN", resource: VirtualHost}`)
or as route configurations of their own (per-service route names).
"""

from __future__ import annotations

import hashlib

from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from benchmarks.responses import RDS, SHORT

_VHOST_TYPE = "type.googleapis.com/envoy.config.route.v3.VirtualHost"


def _digest(b: bytes) -> bytes:
    return hashlib.blake2b(b, digest_size=16).digest()


def _vhosts(rc: route_pb2.RouteConfiguration) -> dict[str, bytes]:
    return {vh.name: vh.SerializeToString() for vh in rc.virtual_hosts}


def _field_size(n: int) -> int:
    """Bytes of a length-delimited field of n bytes with a one-byte tag."""
    size, rest = 1, n
    while rest >= 0x80:
        rest >>= 7
        size += 1
    return 1 + size + n


def _zero() -> dict[str, int]:
    return {"responses": 0, "bytes": 0, "resources": 0, "resource_bytes": 0, "changed": 0,
            "changed_bytes": 0, "unchanged": 0, "unchanged_bytes": 0, "unchanged_entry_bytes": 0, "removed": 0}


class DeltaLedger:
    def __init__(self) -> None:
        self.held: dict[str, dict[str, bytes]] = {}  # type -> name -> digest
        self.routes: dict[str, bytes] = {}  # route config name -> its bytes (for the split figures)
        self.reset()

    def reset(self) -> None:
        self.by_type: dict[str, dict[str, int]] = {}
        self.split = {"route_configs_changed": 0, "route_config_bytes": 0, "vhosts_changed": 0,
                      "vhosts_removed": 0, "vhds_bytes": 0, "per_service_route_bytes": 0}

    def record(self, resp: discovery_pb2.DeltaDiscoveryResponse, size: int) -> None:
        short = SHORT.get(resp.type_url, resp.type_url)
        t = self.by_type.setdefault(short, _zero())
        held = self.held.setdefault(short, {})
        t["responses"] += 1
        t["bytes"] += size
        for name in resp.removed_resources:
            t["removed"] += 1
            held.pop(name, None)
            self.routes.pop(name, None)
        for r in resp.resources:
            value = r.resource.value
            d = _digest(value)
            t["resources"] += 1
            t["resource_bytes"] += len(value)
            if held.get(r.name) == d:
                t["unchanged"] += 1
                t["unchanged_bytes"] += len(value)
                t["unchanged_entry_bytes"] += _field_size(r.ByteSize())  # the whole entry in the response
                continue
            t["changed"] += 1
            t["changed_bytes"] += len(value)
            held[r.name] = d
            if resp.type_url == RDS:
                self._split(r.name, value)

    def _split(self, name: str, value: bytes) -> None:
        """What a split route configuration would have sent instead of this one."""
        previous = self.routes.get(name)
        self.routes[name] = value
        if previous is None:
            return  # a new route configuration: nothing to split against (the initial sync)
        old = _vhosts(route_pb2.RouteConfiguration.FromString(previous))
        rc = route_pb2.RouteConfiguration.FromString(value)
        new = _vhosts(rc)
        # A per-service route configuration keeps every setting of the shared one but its other
        # virtual hosts (and takes the service's name, of about the same length).
        del rc.virtual_hosts[:]
        base = rc.ByteSize()
        s = self.split
        s["route_configs_changed"] += 1
        s["route_config_bytes"] += len(value)
        for gone in old.keys() - new.keys():  # VHDS says so by name in removed_resources
            s["vhosts_removed"] += 1
            vh_msg = route_components_pb2.VirtualHost.FromString(old[gone])
            s["vhds_bytes"] += _field_size(len(f"{name}/{vh_msg.domains[0] if vh_msg.domains else gone}"))
        for vh_name, vh in new.items():
            if old.get(vh_name) == vh:
                continue
            s["vhosts_changed"] += 1
            vh_msg = route_components_pb2.VirtualHost.FromString(vh)
            # VHDS names a virtual host ROUTE_CONFIG/DOMAIN; the proxy asks by the domain it saw.
            domain = vh_msg.domains[0] if vh_msg.domains else vh_name
            s["vhds_bytes"] += discovery_pb2.Resource(
                name=f"{name}/{domain}", version="0", resource=any_pb2.Any(type_url=_VHOST_TYPE, value=vh)
            ).ByteSize()
            s["per_service_route_bytes"] += base + _field_size(len(vh))

    def report(self) -> dict:
        return {"by_type": self.by_type, "split": dict(self.split)}

