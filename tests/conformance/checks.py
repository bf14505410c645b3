"""The two kinds of expectation the upstream tests make, as this runner reads them from
cases.yaml: object status (conditions on a Gateway, its listeners, a route's parents) and
requests through the gateway with the response (and the request the backend saw) they must get.

Both are eventually consistent, as upstream's are: a status check polls until it holds
(upstream's GatewayMustHaveCondition etc.), a request must be answered as expected
RequiredConsecutiveSuccesses (3) times in a row within MaxTimeToConsistency (30 s).

The request checks (HTTP, gRPC, TCP, traffic shares) are here; the status checks are in
status_checks.py and what both share in check_support.py, both re-exported so the runner reads
every check from this module.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from tests.conformance.check_support import (
    CONSECUTIVE,
    CONSISTENCY_TIMEOUT,
    GW_GROUP,
    INFRA_NS,
    MESH_NS,
    STATUS_TIMEOUT,
    CheckFailed,
    poll,
    split_name,
)
from tests.conformance.cluster import Cluster
from tests.conformance.status_checks import check_accepted, check_status

# The runner reads every check from here (status ones re-exported from status_checks.py).
__all__ = ["CONSECUTIVE", "CONSISTENCY_TIMEOUT", "GW_GROUP", "INFRA_NS", "MESH_NS", "STATUS_TIMEOUT",
           "CheckFailed", "check_accepted", "check_distribution", "check_grpc", "check_grpc_distribution",
           "check_mirror_share", "check_request", "check_status", "check_tcp", "compare", "poll",
           "split_name"]


# --- requests -----------------------------------------------------------------------------------

def _client_tls(req: dict, handshake: dict) -> ssl.SSLContext:
    """The client's TLS: the server is not verified; with `_clientCert` (files of a Secret) the
    certificate is presented when the server asks for one, and handshake["certRequested"] says
    whether it did (upstream's GetClientCertificateHook: the certificate must have been asked for,
    whether the request then succeeds or fails)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if req.get("_clientCert"):
        ctx.load_cert_chain(*req["_clientCert"])
        handshake["certRequested"] = False

        def on_message(_conn, direction, _version, _content_type, msg_type, _data) -> None:
            if direction == "read" and msg_type == ssl._TLSMessageType.CERTIFICATE_REQUEST:
                handshake["certRequested"] = True

        # CPython's handshake message hook (ssl's debugging callback; no public way to see a
        # CertificateRequest)
        ctx._msg_callback = on_message  # type: ignore[attr-defined]
    return ctx


async def _round_trip(port: int, req: dict, tls: bool,
                      handshake: dict | None = None) -> tuple[int, dict[str, list[str]], Any]:
    host = req["host"]
    headers = {"Host": host, **{k: str(v) for k, v in (req.get("headers") or {}).items()}}
    if req.get("backendSetResponseHeaders"):
        headers["X-Echo-Set-Header"] = ",".join(f"{k}:{v}" for k, v in req["backendSetResponseHeaders"].items())
    ctx = _client_tls(req, {} if handshake is None else handshake) if tls else None
    scheme = "https" if tls else "http"
    timeout = aiohttp.ClientTimeout(total=req.get("timeout", 10))
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as s, s.request(
            req.get("method", "GET"), f"{scheme}://127.0.0.1:{port}{req.get('path', '/')}", headers=headers,
            allow_redirects=False, ssl=ctx if tls else False,
            server_hostname=req.get("sni", host.split(":")[0]) if tls else None) as r:
        text = await r.text()
        rh: dict[str, list[str]] = {}
        for k, v in r.headers.items():
            rh.setdefault(k.lower(), []).append(v)
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        return r.status, rh, body


def compare(req: dict, exp: dict, status: int, headers: dict[str, list[str]], body: Any, scheme: str) -> str | None:
    """upstream CompareRoundTrip, over our data's names."""
    want_status = exp.get("status", 200)
    want_status = want_status if isinstance(want_status, list) else [want_status]
    if status not in want_status:
        return f"status {status}, want {want_status} (body {str(body)[:200]})"
    if status in (200, 204):
        if not isinstance(body, dict):
            # upstream's round tripper: a response that is not the echo's JSON (a CORS preflight
            # Envoy answers itself) captures nothing but the method it was sent with
            body = {"host": "", "path": "", "method": req.get("method", "GET"), "namespace": "", "pod": "",
                    "headers": {}}
        # Without an expected request, the backend must see the request as sent (upstream's default).
        er = dict(exp["request"]) if "request" in exp else {k: v for k, v in req.items() if k in ("host", "headers")
                                                             and not (k == "host" and req.get("_host_default"))}
        er.setdefault("path", req.get("path", "/"))
        er.setdefault("method", req.get("method", "GET"))
        if "host" in er and er["host"] != body["host"]:
            return f"backend saw host {body['host']}, want {er['host']}"
        if er["path"] != body["path"]:
            return f"backend saw path {body['path']}, want {er['path']}"
        if er["method"] != body["method"]:
            return f"backend saw method {body['method']}, want {er['method']}"
        if "sni" in er and er["sni"] != (body.get("tls") or {}).get("serverName"):
            return f"backend saw SNI {(body.get('tls') or {}).get('serverName')!r}, want {er['sni']!r}"
        if exp.get("namespace", INFRA_NS) != body["namespace"]:
            return f"namespace {body['namespace']}, want {exp.get('namespace', INFRA_NS)}"
        seen = {k.lower(): v for k, v in body.get("headers", {}).items()}
        want_headers = er.get("headers") or {}
        for name, value in want_headers.items():
            if ",".join(seen.get(name.lower(), [])) != str(value) and name.lower() not in ("host",):
                return f"backend saw {name}: {seen.get(name.lower())}, want {value}"
        for name in er.get("absentHeaders", []):
            if name.lower() in seen:
                return f"backend saw {name}: {seen[name.lower()]}, want it absent"
        # upstream IgnoreWhitespace: implementations may or may not put a space after each comma
        squash = (lambda v: v.replace(" ", "")) if exp.get("ignoreWhitespace") else (lambda v: v)
        for name, options in (exp.get("validHeaders") or {}).items():  # upstream ValidHeaderValues
            if name.lower() not in headers:
                return f"response {name} absent, want one of {options}"
            got = squash(",".join(headers[name.lower()]))
            if got not in [squash(str(o)) for o in options]:
                return f"response {name}: {got}, want one of {options}"
        for name, value in (exp.get("headers") or {}).items():
            if name.lower() not in headers or squash(",".join(headers[name.lower()])) != squash(str(value)):
                return f"response {name}: {headers.get(name.lower())}, want {value}"
        for name in exp.get("absentHeaders", []):
            if name.lower() in headers:
                return f"response {name}: {headers[name.lower()]}, want it absent"
        if not body["pod"].startswith(exp.get("backend", "")):
            return f"answered by {body['pod']}, want {exp.get('backend')}"
    elif 300 <= status < 400 and "redirect" in exp:
        loc = (headers.get("location") or [""])[0]
        u = urlsplit(loc)
        want = exp["redirect"]
        got_scheme, got_host, got_port = u.scheme, u.hostname or "", str(u.port or "")
        if "host" in want and want["host"] != got_host:
            return f"redirect host {got_host!r}, want {want['host']!r} ({loc})"
        w_scheme = want.get("scheme", scheme)
        if w_scheme != got_scheme:
            return f"redirect scheme {got_scheme!r}, want {w_scheme!r} ({loc})"
        if "port" in want:
            if str(want["port"]) != got_port:
                return f"redirect port {got_port!r}, want {want['port']!r} ({loc})"
        elif got_port not in ("", {"http": "80", "https": "443"}.get(got_scheme, "")):
            return f"redirect port {got_port!r}, want the scheme's default or none ({loc})"
        w_path = want.get("path", req.get("path", "/").split("?")[0])
        if w_path != u.path:
            return f"redirect path {u.path!r}, want {w_path!r} ({loc})"
    return None


async def check_request(cluster: Cluster, default_gateway: str, item: dict,
                        timeout: float = CONSISTENCY_TIMEOUT) -> None:
    req = dict(item.get("request") or {})
    exp = item.get("response") or {}
    if "client" in item:  # a mesh test: from a pod's sidecar to a Service by name
        cns, cdep = split_name(item["client"], MESH_NS)
        host = req.setdefault("host", "echo")
        port = int(host.rsplit(":", 1)[1]) if ":" in host else 80
        exp = {"namespace": MESH_NS, **exp}
        await cluster.client_for(cns, cdep)
        await _consistently(req, exp, port, False, "http", timeout)
        return
    gns, gname = split_name(item.get("gateway", default_gateway))
    gw = cluster.objects.get(("Gateway", gns, gname))
    if gw is None:
        raise CheckFailed(f"no Gateway {gns}/{gname} applied")
    listeners = gw["spec"]["listeners"]
    listener = next((x for x in listeners if x["name"] == item["listener"]), None) if "listener" in item \
        else listeners[0]
    port = item.get("port", listener["port"])
    tls = listener["protocol"] in ("HTTPS", "TLS")
    if "clientCert" in req:  # a TLS Secret's certificate and key, presented when asked for
        req["_clientCert"] = cluster.tls_files(*split_name(req.pop("clientCert")))
    scheme = "https" if tls else "http"
    if "host" not in req:
        # upstream sends the Gateway's address as Host (without the scheme's default port)
        addr = f"{gname}-istio.{gns}.svc.cluster.local"
        req["host"] = addr if port == (443 if tls else 80) else f"{addr}:{port}"
        req["_host_default"] = True
    await cluster.router_for(gns, gname)
    await _consistently(req, exp, port, tls, scheme, timeout)
    await _mirrors(cluster, req, exp)


async def _consistently(req: dict, exp: dict, port: int, tls: bool, scheme: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    streak, problem = 0, "never tried"
    while time.monotonic() < deadline and streak < CONSECUTIVE:
        handshake: dict = {}
        try:
            status, headers, body = await _round_trip(port, req, tls, handshake)
            problem = "connection accepted, want it rejected" if exp.get("rejected") \
                else compare(req, exp, status, headers, body, scheme)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            # upstream MakeTLSConnectionAndExpectEventuallyConnectionRejection: the handshake fails
            problem = None if exp.get("rejected") else f"{type(e).__name__}: {e}"
        if problem is None and handshake.get("certRequested") is False:
            problem = "the server did not ask for the client certificate"
        if problem is None:
            streak += 1
        else:
            streak = 0
            await asyncio.sleep(0.2)
    if streak < CONSECUTIVE:
        raise CheckFailed(f"{req.get('method', 'GET')} {req['host']}{req.get('path', '/')} via :{port}: {problem}")


async def _mirrors(cluster: Cluster, req: dict, exp: dict) -> None:
    for mirror in exp.get("mirroredTo", []):  # mirrors are sent alongside: poll (upstream reads echo logs)
        mns, mname = split_name(mirror)
        path = req.get("path", "/")

        async def mirrored(mns=mns, mname=mname, path=path) -> str | None:
            echo = cluster.echoes.get((mns, mname))
            seen = echo is not None and any(r["path"] == path for r in echo.requests)
            return None if seen else f"no mirrored {path} at {mns}/{mname}"

        await poll(mirrored, 10.0, "mirror")


async def check_distribution(cluster: Cluster, default_gateway: str, spec: dict) -> None:
    """upstream weight.TestWeightedDistribution: 500 requests, 10 at a time, each answered 200; the
    share of each backend within 0.05 of its weight (retried up to MaxTestRetries times). With
    `backendHeader`: each request's backend saw that header naming itself (upstream
    HTTPRouteRequestHeaderModifierBackendWeights)."""
    if "client" in spec:  # from a mesh pod's sidecar (upstream MeshHTTPRouteWeight)
        port = 80
        req = {"host": spec.get("host", "echo"), "path": spec.get("path", "/")}
        await cluster.client_for(*split_name(spec["client"], MESH_NS))
        gname = spec["client"]
    else:
        gns, gname = split_name(spec.get("gateway", default_gateway))
        port = cluster.objects[("Gateway", gns, gname)]["spec"]["listeners"][0]["port"]
        req = {"host": f"{gname}-istio.{gns}.svc.cluster.local", "path": spec.get("path", "/")}
        await cluster.router_for(gns, gname)
    total, weights = spec.get("requests", 500), spec.get("weights")
    problem = "never tried"
    for _ in range(spec.get("retries", 10)):
        sem = asyncio.Semaphore(10)

        async def one(sem: asyncio.Semaphore = sem) -> str:
            async with sem:
                status, _headers, body = await _round_trip(port, req, False)
            if status != 200 or not isinstance(body, dict):
                raise CheckFailed(f"status {status}")
            if "backendHeader" in spec:
                seen = {k.lower(): v for k, v in body["headers"].items()}.get(spec["backendHeader"].lower(), [])
                if len(seen) != 1 or not body["pod"].startswith(seen[0]):
                    raise CheckFailed(f"{spec['backendHeader']}: {seen} sent to {body['pod']}")
            return body["pod"]

        try:
            pods = await asyncio.gather(*(one() for _ in range(total)))
        except (CheckFailed, aiohttp.ClientError, OSError, TimeoutError) as e:
            problem = str(e)
            continue
        if weights is None:
            return
        counts = {b: sum(p.startswith(b) for p in pods) / total for b in weights}
        off = {b: got for b, got in counts.items() if abs(got - weights[b]) > 0.05}
        if not off:
            return
        problem = f"shares {counts}, want {weights} (+/-0.05)"
    raise CheckFailed(f"distribution through {gname}: {problem}")


async def check_grpc(cluster: Cluster, default_gateway: str, item: dict, timeout: float = CONSISTENCY_TIMEOUT) -> None:
    """upstream grpc.MakeRequestAndExpectEventuallyConsistentResponse: an RPC to GrpcEcho's
    `method` (Echo, EchoTwo, EchoThree) with `metadata` and `authority` through the gateway; the
    status `code` (OK unless given) and, when OK, the method the backend saw and who answered."""
    import grpc

    from tests.conformance.echo import GRPC_SERVICE, EchoRequest, EchoResponse

    gns, gname = split_name(item.get("gateway", default_gateway))
    gw = cluster.objects[("Gateway", gns, gname)]
    listeners = gw["spec"]["listeners"]
    listener = next(x for x in listeners if x["name"] == item["listener"]) if "listener" in item else listeners[0]
    port = listener["port"]
    authority = item.get("authority", f"{gname}-istio.{gns}.svc.cluster.local" + ("" if port == 80 else f":{port}"))
    method = f"/{GRPC_SERVICE}/{item.get('method', 'Echo')}"
    want_code = getattr(grpc.StatusCode, item.get("code", "OK"))
    await cluster.router_for(gns, gname)

    async def once() -> str | None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("grpc.default_authority", authority)]) as channel:
            call = channel.unary_unary(method, request_serializer=EchoRequest.SerializeToString,
                                       response_deserializer=EchoResponse.FromString)
            md = tuple((k.lower(), str(v)) for k, v in (item.get("metadata") or {}).items())
            try:
                resp = await call(EchoRequest(), metadata=md, timeout=5)
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as e:
                resp, code = None, e.code()
        if code != want_code:
            return f"status {code.name}, want {want_code.name}"
        if resp is not None:
            a = resp.assertions
            if a.fully_qualified_method != method:
                return f"backend saw {a.fully_qualified_method}, want {method}"
            if item.get("namespace", INFRA_NS) != a.context.namespace:
                return f"namespace {a.context.namespace}"
            if not a.context.pod.startswith(item.get("backend", "")):
                return f"answered by {a.context.pod}, want {item.get('backend')}"
        return None

    deadline = time.monotonic() + timeout
    streak, problem = 0, "never tried"
    while time.monotonic() < deadline and streak < CONSECUTIVE:
        problem = await once()
        if problem is None:
            streak += 1
        else:
            streak = 0
            await asyncio.sleep(0.2)
    if streak < CONSECUTIVE:
        raise CheckFailed(f"gRPC {method} ({authority}) via :{port}: {problem}")


async def check_grpc_distribution(cluster: Cluster, default_gateway: str, spec: dict) -> None:
    """upstream GRPCRouteWeight: 500 Echo RPCs, 10 at a time, each OK; every backend's share
    within 0.05 of its weight (retried up to MaxTestRetries times)."""
    import grpc

    from tests.conformance.echo import GRPC_SERVICE, EchoRequest, EchoResponse

    if "client" in spec:  # from a mesh pod's sidecar to HOST:PORT (upstream MeshGRPCRouteWeight)
        authority = spec["host"]
        port = int(authority.rsplit(":", 1)[1])
        await cluster.client_for(*split_name(spec["client"], MESH_NS))
        gname = spec["client"]
    else:
        gns, gname = split_name(spec.get("gateway", default_gateway))
        port = cluster.objects[("Gateway", gns, gname)]["spec"]["listeners"][0]["port"]
        authority = f"{gname}-istio.{gns}.svc.cluster.local"
        await cluster.router_for(gns, gname)
    weights, total, problem = spec["weights"], 500, "never tried"

    async def first_rpc() -> str | None:  # upstream asserts one RPC succeeds before counting
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.default_authority", authority)]) as channel:
            call = channel.unary_unary(f"/{GRPC_SERVICE}/Echo", request_serializer=EchoRequest.SerializeToString,
                                       response_deserializer=EchoResponse.FromString)
            try:
                await call(EchoRequest(), timeout=5)
            except grpc.aio.AioRpcError as e:
                return f"status {e.code().name}: {e.details()}"
        return None

    await poll(first_rpc, CONSISTENCY_TIMEOUT, f"first gRPC call through {gname}")
    for _ in range(10):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.default_authority", authority)]) as channel:
            call = channel.unary_unary(f"/{GRPC_SERVICE}/Echo", request_serializer=EchoRequest.SerializeToString,
                                       response_deserializer=EchoResponse.FromString)
            sem = asyncio.Semaphore(10)

            async def one(i: int, sem: asyncio.Semaphore = sem, call=call) -> str:
                async with sem:  # a distinct x-jitter per RPC, as upstream's AddEntropy
                    resp = await call(EchoRequest(), metadata=(("x-jitter", str(i)),), timeout=5)
                return resp.assertions.context.pod

            try:
                pods = await asyncio.gather(*(one(i) for i in range(total)))
            except grpc.aio.AioRpcError as e:
                problem = f"status {e.code().name}"
                continue
        shares = {b: sum(p.startswith(b) for p in pods) / total for b in weights}
        if all(abs(shares[b] - w) <= 0.05 for b, w in weights.items()):
            return
        problem = f"shares {shares}, want {weights} (+/-0.05)"
    raise CheckFailed(f"gRPC distribution through {gname}: {problem}")


async def check_mirror_share(cluster: Cluster, default_gateway: str, spec: dict) -> None:
    """upstream HTTPRouteRequestPercentageMirror's distribution check: 500 requests to `path`
    (10 at a time); the mirror backend gets `percent` of them within 15% of that figure (up to 5
    tries). Mirrored requests arrive on their own time: counted once their number settles."""
    gns, gname = split_name(spec.get("gateway", default_gateway))
    port = cluster.objects[("Gateway", gns, gname)]["spec"]["listeners"][0]["port"]
    req = {"host": f"{gname}-istio.{gns}.svc.cluster.local", "path": spec["path"],
           "headers": spec.get("headers") or {}}
    mns, mname = split_name(spec["mirror"])
    echo = cluster.echoes[(mns, mname)]
    await cluster.router_for(gns, gname)
    total, want = 500, 500 * spec["percent"] / 100
    problem = "never tried"
    for _ in range(5):
        echo.requests.clear()
        sem = asyncio.Semaphore(10)

        async def one(sem: asyncio.Semaphore = sem) -> int:
            async with sem:
                return (await _round_trip(port, req, False))[0]

        statuses = await asyncio.gather(*(one() for _ in range(total)))
        if set(statuses) != {200}:
            problem = f"statuses {sorted(set(statuses))}"
            continue
        seen, stable_since = -1, time.monotonic()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            count = sum(r["path"] == spec["path"] for r in echo.requests)
            if count != seen:
                seen, stable_since = count, time.monotonic()
            elif time.monotonic() - stable_since > 1.0:
                break
            await asyncio.sleep(0.1)
        if want * 0.85 <= seen <= want * 1.15:
            return
        problem = f"{seen} of {total} mirrored to {mname}, want {want:.0f} (+/-15%)"
    raise CheckFailed(f"mirror share of {spec['path']}: {problem}")


async def check_tcp(cluster: Cluster, default_gateway: str, item: dict, timeout: float = CONSISTENCY_TIMEOUT) -> None:
    """upstream tcp.MakeTCPRequestAndExpectEventuallyValidResponse: a TLS connection with SNI
    `sni` through the gateway to the TCP echo, which must greet, answer PING, say whether its
    side is TLS (`backendIsTLS`), and name the pod (and, when `hostname` is given, the SNI it saw)."""
    gns, gname = split_name(item.get("gateway", default_gateway))
    listeners = cluster.objects[("Gateway", gns, gname)]["spec"]["listeners"]
    port = next(x for x in listeners if x["name"] == item["listener"])["port"] if "listener" in item \
        else listeners[0]["port"]
    await cluster.router_for(gns, gname)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE

    async def once() -> str | None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname=item["sni"]), 5)
        except (OSError, TimeoutError, ssl.SSLError) as e:
            return f"connect: {type(e).__name__}: {e}"
        try:
            async def ask(cmd: bytes | None) -> str:
                if cmd:
                    writer.write(cmd + b"\n")
                    await writer.drain()
                return (await asyncio.wait_for(reader.readline(), 5)).decode()
            if (w := await ask(None)) != "Gateway API Test TCP Server\n":
                return f"greeting {w!r}"
            if (w := await ask(b"PING")) != "PONG\n":
                return f"PING answered {w!r}"
            want_tls = "true" if item.get("backendIsTLS") else "false"
            if (w := (await ask(b"IS_TLS")).strip()) != want_tls:
                return f"backend TLS {w}, want {want_tls}"
            payload = json.loads(await ask(b"TEST"))
        except (OSError, TimeoutError, ValueError, ssl.SSLError) as e:
            return f"{type(e).__name__}: {e}"
        finally:
            writer.close()
        if payload.get("namespace") != item.get("namespace", INFRA_NS):
            return f"namespace {payload.get('namespace')}"
        if not payload.get("pod", "").startswith(item["backend"] + "-"):
            return f"answered by {payload.get('pod')}, want {item['backend']}"
        if item.get("hostname") and (payload.get("tls") or {}).get("serverName") != item["hostname"]:
            return f"backend saw SNI {(payload.get('tls') or {}).get('serverName')!r}, want {item['hostname']!r}"
        return None

    deadline = time.monotonic() + timeout
    problem = "never tried"
    while time.monotonic() < deadline:  # upstream's assert.Eventually: one success
        problem = await once()
        if problem is None:
            return
        await asyncio.sleep(0.5)
    raise CheckFailed(f"TCP over TLS to {gname} (SNI {item['sni']}): {problem}")
