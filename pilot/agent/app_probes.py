"""The kubelet's probes of the application, run by the agent (istio-agent's app probers): the
injector rewrites each app probe to `GET :15020/app-health/CONTAINER/KIND` and hands the original
to the agent in ISTIO_KUBE_APP_PROBERS (JSON: path -> {httpGet|tcpSocket|grpc, timeoutSeconds}).
With merged metrics, ISTIO_PROMETHEUS_ANNOTATIONS names the app's own metrics endpoint, which
`/stats/prometheus` appends to Envoy's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc

KUBE_APP_PROBERS = "ISTIO_KUBE_APP_PROBERS"
PROMETHEUS_ANNOTATIONS = "ISTIO_PROMETHEUS_ANNOTATIONS"
DEFAULT_TIMEOUT = 1.0  # the kubelet's default timeoutSeconds


class ProberConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Prober:
    kind: str  # httpGet, tcpSocket, grpc
    action: Mapping[str, Any]
    timeout: float


def prober(where: str, p: Mapping[str, Any]) -> Prober:
    """One probe's action and timeout, in the Kubernetes Probe's JSON shape; shared by the
    injector's app probers and the VM readiness probe (pilot/agent/health.py). `where` names the
    probe in errors."""
    kinds = [k for k in ("httpGet", "tcpSocket", "grpc") if isinstance(p.get(k), Mapping)]
    if len(kinds) != 1:
        raise ProberConfigError(f"{where}: needs exactly one of httpGet, tcpSocket, grpc")
    action = p[kinds[0]]
    port = action.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535:
        raise ProberConfigError(f"{where}.{kinds[0]}.port: must be a number 1-65535, got {port!r}")
    timeout = p.get("timeoutSeconds")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0):
        raise ProberConfigError(f"{where}.timeoutSeconds: must be a whole number of seconds, got {timeout!r}")
    return Prober(kinds[0], action, float(timeout or DEFAULT_TIMEOUT))  # 0 is unset, as the kubelet


def parse_probers(text: str) -> dict[str, Prober]:
    """ISTIO_KUBE_APP_PROBERS; a bad value is a start-up error naming the entry."""
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ProberConfigError(f"{KUBE_APP_PROBERS}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ProberConfigError(f"{KUBE_APP_PROBERS}: must be a JSON object of path -> prober")
    out = {}
    for path, p in doc.items():
        if not isinstance(p, dict) or not path.startswith("/app-health/"):
            raise ProberConfigError(f"{KUBE_APP_PROBERS}[{path!r}]: must be /app-health/... -> prober object")
        out[path] = prober(f"{KUBE_APP_PROBERS}[{path!r}]", p)
    return out


def parse_prometheus(text: str) -> dict[str, str] | None:
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ProberConfigError(f"{PROMETHEUS_ANNOTATIONS}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ProberConfigError(f"{PROMETHEUS_ANNOTATIONS}: must be a JSON object")
    if not str(doc.get("port") or ""):
        return None
    return {"port": str(doc["port"]), "path": str(doc.get("path") or "/metrics")}


def _health_request(service: str) -> bytes:
    data = service.encode()
    return (b"\x0a" + bytes([len(data)]) + data) if data else b""  # HealthCheckRequest.service (field 1)


async def run(prober: Prober, host: str, session: aiohttp.ClientSession) -> tuple[int, str]:
    """(HTTP status for the kubelet, body). 200 when the app answered healthy."""
    a = prober.action
    target_host = a.get("host") or host
    port = int(a["port"])
    try:
        if prober.kind == "httpGet":
            scheme = (a.get("scheme") or "HTTP").lower()
            path = a.get("path") or "/"
            if not path.startswith("/"):
                path = "/" + path
            headers = {h["name"]: h.get("value", "") for h in a.get("httpHeaders") or [] if h.get("name")}
            hostport = f"[{target_host}]:{port}" if ":" in target_host else f"{target_host}:{port}"
            async with session.get(
                f"{scheme}://{hostport}{path}",
                headers=headers,
                ssl=False,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=prober.timeout),
            ) as r:
                await r.read()
                # The kubelet counts 200-399 as success; pass the app's own failure code through.
                return (200, "OK\n") if 200 <= r.status < 400 else (r.status, f"app answered {r.status}\n")
        if prober.kind == "tcpSocket":
            _, writer = await asyncio.wait_for(asyncio.open_connection(target_host, port), prober.timeout)
            writer.close()
            return 200, "OK\n"
        async with grpc.aio.insecure_channel(f"{target_host}:{port}") as channel:
            check: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None
            )
            reply = await check(_health_request(str(a.get("service") or "")), timeout=prober.timeout)
            # HealthCheckResponse.status (field 1): 1 is SERVING.
            if reply == b"\x08\x01":
                return 200, "SERVING\n"
            return 500, f"not serving: {reply!r}\n"
    except (OSError, TimeoutError, aiohttp.ClientError, grpc.RpcError) as e:
        return 500, f"probe failed: {type(e).__name__}: {e}\n"
