"""Where pilotctl's facts come from: the control plane replicas' debug HTTP endpoints (what they
would send a proxy, and its sync state) and the proxy's own Envoy admin API (what it holds).

Every failure becomes a CtlError with a sentence a person can act on; nothing here raises
anything else for a bad address, a replica that is down or an answer that is not JSON.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

# istiod's 404 text for a proxy connected to another replica (pilot/http/config_dump.py).
NOT_CONNECTED = "Proxy not connected to this Pilot instance"


class CtlError(Exception):
    """A failure to report as `error: ...` with exit status 1."""


class NotHere(CtlError):
    """The replica answered, but the proxy is not connected to it."""


def check_addr(addr: str) -> str:
    """HOST:PORT (or [IPv6]:PORT), refused with the reason before anything is sent."""
    host, sep, port = addr.rpartition(":")
    if host.startswith("[") != host.endswith("]"):
        raise CtlError(f"address {addr!r} is not HOST:PORT")
    if not sep or not host:
        raise CtlError(f"address {addr!r} is not HOST:PORT")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise CtlError(f"address {addr!r}: port {port!r} is not a number from 1 to 65535")
    return addr


def _get(base: str, what: str, path: str, timeout: float, token: str = "") -> tuple[int, bytes]:
    url = f"http://{base}{path}"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise CtlError(f"cannot reach {what} at {base}: {reason}") from None


def _json(base: str, what: str, path: str, body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise CtlError(f"{what} at {base} answered {path} with something that is not JSON") from None


@dataclass
class Replica:
    """One control plane replica's debug address (its monitoring port, 15014)."""

    addr: str
    timeout: float = 10.0
    token: str = ""  # for the debug endpoints off localhost (pilot/http/auth.py)

    def get(self, path: str) -> Any:
        status, body = _get(self.addr, "the control plane", path, self.timeout, self.token)
        text = body.decode(errors="replace").strip()
        if status == 404 and NOT_CONNECTED in text:
            raise NotHere(text)
        if status != 200:
            try:
                text = json.loads(text).get("error", text)
            except (ValueError, AttributeError):
                pass
            raise CtlError(f"the control plane at {self.addr} answered {path.split('?')[0]} with HTTP {status}: {text}")
        return _json(self.addr, "the control plane", path, body)

    def config_dump(self, proxy: str, include_eds: bool = False) -> dict:
        query = {"proxyID": proxy, **({"include_eds": "true"} if include_eds else {})}
        return self.get("/debug/config_dump?" + urllib.parse.urlencode(query))


@dataclass
class Replicas:
    """Every `--addr`: a proxy is connected to one of them; the proxy list is their union."""

    replicas: list[Replica]
    down: dict[str, str] = field(default_factory=dict)  # addr -> why it could not be read

    @classmethod
    def of(cls, addrs: list[str], timeout: float = 10.0, token: str = "") -> Replicas:
        return cls([Replica(check_addr(a), timeout, token) for a in dict.fromkeys(addrs)])

    def each(self, path: str) -> list[tuple[Replica, Any]]:
        """(replica, answer) of every replica that answered; the others are noted in `down`."""
        out = []
        for r in self.replicas:
            try:
                out.append((r, r.get(path)))
            except CtlError as e:
                self.down[r.addr] = str(e)
        if not out:
            raise CtlError("no control plane answered: " + "; ".join(self.down.values()))
        return out

    def locate(self, proxy: str, include_eds: bool = False) -> tuple[Replica, dict]:
        """The replica the proxy is connected to, and its config dump for the proxy."""
        if not proxy.strip():
            raise CtlError("a proxy is required: POD.NAMESPACE, a full node id, or a connection id")
        for r in self.replicas:
            try:
                return r, r.config_dump(proxy, include_eds)
            except NotHere:
                continue
            except CtlError as e:
                self.down[r.addr] = str(e)
        where = ", ".join(r.addr for r in self.replicas)
        msg = f"proxy {proxy!r} is not connected to the control plane at {where}"
        if self.down:
            msg += " (could not ask: " + "; ".join(self.down.values()) + ")"
        raise CtlError(msg)

    def client(self, replica: Replica, node_id: str) -> dict | None:
        """The proxy's /debug/adsz entry (node metadata) on its replica."""
        adsz = replica.get("/debug/adsz")
        for c in adsz.get("clients", []):
            if c.get("connectionId", "").startswith(node_id):
                return c
        return None


@dataclass
class EnvoyAdmin:
    """The proxy's Envoy admin API (istioctl reaches it through a port-forward to 15000)."""

    addr: str
    timeout: float = 10.0

    def get(self, path: str) -> Any:
        status, body = _get(self.addr, "the proxy's Envoy admin", path, self.timeout)
        if status != 200:
            raise CtlError(f"the proxy's Envoy admin at {self.addr} answered {path} with HTTP {status}: "
                           f"{body.decode(errors='replace').strip()}")
        return _json(self.addr, "the proxy's Envoy admin", path, body)

    def node_id(self) -> str:
        return self.get("/server_info").get("node", {}).get("id", "")

    def config_dump(self, include_eds: bool = False) -> dict:
        return self.get("/config_dump" + ("?include_eds" if include_eds else ""))

    def clusters(self) -> dict:
        return self.get("/clusters?format=json")
