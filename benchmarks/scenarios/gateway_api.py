"""`gateway_api`: translation time of the Gateway API objects, in process (no server, no proxies):
10 Gateways x 4 listeners (HTTP 80 and 8080, HTTPS 443 and 8443 with a certificate) and 1,000
HTTPRoutes over 10 namespaces, each with a hostname, a path, a header match and two weighted
backends of 100 Services.

Two figures, each the median CPU time of several runs (wall time and minimums beside it):
`first_s`, a translation from nothing (what the first push after a restart pays), and
`unchanged_s`, one handed the previous result with nothing changed (what a push for an unrelated
change pays: the memo reuses every route's rules and every generated object). Object parsing is
not timed: the Store is built once.
"""

from __future__ import annotations

import base64
import datetime as dt
import statistics
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from benchmarks.options import Options
from benchmarks.report import environment
from pilot.config.validation import parse_object
from pilot.model.gateway_api import translate
from pilot.model.store import Store

GATEWAYS, ROUTES, SERVICES, NAMESPACES = 10, 1000, 100, 10
API = "gateway.networking.k8s.io/v1"
FIRST_RUNS, UNCHANGED_RUNS = 5, 9


def _certificate() -> dict[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "*.example.com")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return {"tls.crt": base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode(),
            "tls.key": base64.b64encode(pem_key).decode()}


def build_store() -> Store:
    store = Store()
    docs: list[dict] = [{"apiVersion": API, "kind": "GatewayClass", "metadata": {"name": "istio"},
                         "spec": {"controllerName": "istio.io/gateway-controller"}},
                        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cert", "namespace": "infra"},
                         "type": "kubernetes.io/tls", "data": _certificate()}]
    for i in range(SERVICES):
        docs.append({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": f"svc-{i}", "namespace": f"ns-{i % NAMESPACES}"},
                     "spec": {"ports": [{"name": "http", "port": 80}]}})
    tls = {"certificateRefs": [{"name": "cert"}]}
    for g in range(GATEWAYS):
        listeners = [{"name": "http", "port": 80, "protocol": "HTTP"},
                     {"name": "http-alt", "port": 8080, "protocol": "HTTP"},
                     {"name": "https", "port": 443, "protocol": "HTTPS", "tls": tls},
                     {"name": "https-alt", "port": 8443, "protocol": "HTTPS", "tls": tls}]
        for ls in listeners:
            ls["allowedRoutes"] = {"namespaces": {"from": "All"}}
        docs.append({"apiVersion": API, "kind": "Gateway",
                     "metadata": {"name": f"gw-{g}", "namespace": "infra", "generation": 1},
                     "spec": {"gatewayClassName": "istio", "listeners": listeners}})
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"gw-{g}-istio", "namespace": "infra"},
                     "spec": {"ports": [{"name": f"p{p}", "port": p} for p in (80, 8080, 443, 8443)]}})
    for r in range(ROUTES):
        ns = f"ns-{r % NAMESPACES}"
        local = [i for i in range(SERVICES) if i % NAMESPACES == r % NAMESPACES]
        a, b = local[r % len(local)], local[(r + 1) % len(local)]
        docs.append({"apiVersion": API, "kind": "HTTPRoute",
                     "metadata": {"name": f"route-{r}", "namespace": ns, "generation": 1,
                                  "creationTimestamp": f"2024-01-01T00:{r // 60 % 60:02d}:{r % 60:02d}Z"},
                     "spec": {"parentRefs": [{"name": f"gw-{r % GATEWAYS}", "namespace": "infra"}],
                              "hostnames": [f"r{r}.example.com"],
                              "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/api"},
                                                      "headers": [{"name": "x-version", "value": "v2"}]}],
                                         "backendRefs": [{"name": f"svc-{a}", "port": 80, "weight": 90},
                                                         {"name": f"svc-{b}", "port": 80, "weight": 10}]},
                                        {"backendRefs": [{"name": f"svc-{a}", "port": 80}]}]}})
    for d in docs:
        store.apply(parse_object(d))
    return store


def _timed(fn) -> tuple[float, float, object]:
    """(CPU seconds, wall seconds, result): the translation is single-threaded, so its CPU time
    is the figure a busy machine disturbs least; the wall time is kept beside it."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - t0, out


def _figures(runs: list[tuple[float, float]]) -> dict:
    cpu, wall = [c for c, _ in runs], [w for _, w in runs]
    return {"cpu_s": round(statistics.median(cpu), 4), "cpu_min_s": round(min(cpu), 4),
            "wall_s": round(statistics.median(wall), 4), "wall_min_s": round(min(wall), 4),
            "runs_cpu_s": [round(t, 4) for t in cpu], "runs_wall_s": [round(t, 4) for t in wall]}


async def run(opts: Options) -> dict:
    store = build_store()
    result = None
    firsts = []
    for _ in range(FIRST_RUNS):
        c, w, result = _timed(lambda: translate(store, "cluster.local"))
        firsts.append((c, w))
    unchanged = []
    for _ in range(UNCHANGED_RUNS):
        c, w, result = _timed(lambda prev=result: translate(store, "cluster.local", prev))
        unchanged.append((c, w))
    first, same = _figures(firsts), _figures(unchanged)
    note = (f"{GATEWAYS} Gateways x 4 listeners, {ROUTES} HTTPRoutes: first {first['cpu_s']:.3f} s CPU "
            f"({first['wall_s']:.3f} s wall), unchanged {same['cpu_s'] * 1000:.1f} ms CPU "
            f"({same['wall_s'] * 1000:.1f} ms wall), medians ({len(result.virtual_services)} VirtualServices)")
    return {"scenario": "gateway_api", "params": opts.public(), "environment": environment(),
            # in process: no proxies to converge (the harness's completeness check holds trivially)
            "proxies": 0, "proxies_acked": 0,
            "gateways": GATEWAYS, "listeners": GATEWAYS * 4, "routes": ROUTES,
            "virtual_services": len(result.virtual_services), "first_s": first["cpu_s"],
            "unchanged_s": same["cpu_s"], "first": first, "unchanged": same, "note": note}
