"""Proxyless gRPC routing: VirtualService matches, weights, subsets, faults and retries reach
grpcio's own xDS client (in a subprocess), which must ACK them and route its RPCs accordingly.

Two backends (`v1`, `v2`) are the Pods of one Service; a DestinationRule makes them subsets.
Every reply names the backend that answered.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.support.control_plane import ControlPlane
from tests.support.grpc_client_proc import GrpcXdsClientProcess
from tests.support.grpc_echo import GrpcEchoBackend
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(90)

PORT = 7070
HOST = "echo.default.svc.cluster.local"
TARGET = f"xds:///{HOST}:{PORT}"
TYPES = ("cluster", "listener", "route", "endpoint")


def mesh_yaml(v1: int, v2: int) -> str:
    slices = []
    for version, (ip, port) in {"v1": ("127.0.0.1", v1), "v2": ("127.0.0.2", v2)}.items():
        slices.append(f"""\
            apiVersion: v1
            kind: Pod
            metadata: {{name: echo-{version}, namespace: default, labels: {{app: echo, version: {version}}}}}
            status: {{podIP: {ip}}}
            ---
            apiVersion: discovery.k8s.io/v1
            kind: EndpointSlice
            metadata:
              name: echo-{version}
              namespace: default
              labels: {{kubernetes.io/service-name: echo}}
            addressType: IPv4
            ports: [{{name: grpc, port: {port}}}]
            endpoints:
            - addresses: ["127.0.0.1"]
              targetRef: {{kind: Pod, name: echo-{version}, namespace: default}}
            """)
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: echo, namespace: default}}
        spec:
          ports: [{{name: grpc, port: {PORT}}}]
        ---
        apiVersion: networking.istio.io/v1
        kind: DestinationRule
        metadata: {{name: echo, namespace: default}}
        spec:
          host: echo
          subsets:
          - {{name: v1, labels: {{version: v1}}}}
          - {{name: v2, labels: {{version: v2}}}}
        ---
        """) + "---\n".join(textwrap.dedent(s) for s in slices)


def virtual_service(http: str) -> str:
    return ("apiVersion: networking.istio.io/v1\nkind: VirtualService\n"
            "metadata: {name: echo, namespace: default}\nspec:\n  hosts: [echo]\n  http:\n"
            + textwrap.indent(textwrap.dedent(http), "  "))


@pytest.fixture
async def backends():
    made = {"v1": GrpcEchoBackend("v1"), "v2": GrpcEchoBackend("v2", fail_every_other=True)}
    for b in made.values():
        await b.start()
    try:
        yield made
    finally:
        for b in made.values():
            await b.stop()


async def _all_acked(cp: ControlPlane, client: GrpcXdsClientProcess) -> dict:
    row = await cp.wait_synced(client.bootstrap["node"]["id"])
    assert all(row[f"{t}_nack"] is None for t in TYPES), row
    return row


async def _replies(client: GrpcXdsClientProcess, count: int, since: int, timeout: float = 30) -> list[dict]:
    """The next `count` attempts after line `since` (successes and failures)."""
    await client.wait_for_line(lambda _line: True, timeout=timeout, since=since + count - 1,
                               message=f"{count} attempts")
    return client.lines[since:since + count]


async def test_header_match_and_weights_pick_subsets(tmp_path, backends):
    """A header match sends `x-track: beta` to subset v2; the rest split 75/25 over v1/v2.
    Header routing first (a client with the header sees only v2), then the weights."""
    backends["v2"].fail_every_other = False
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mesh_yaml(backends["v1"].port, backends["v2"].port))
    cp.write("vs.yaml", virtual_service("""\
        - match: [{headers: {x-track: {exact: beta}}}]
          route: [{destination: {host: echo, subset: v2}}]
        - route:
          - {destination: {host: echo, subset: v1}, weight: 75}
          - {destination: {host: echo, subset: v2}, weight: 25}
        """))
    async with cp:
        beta = GrpcXdsClientProcess(TARGET, cp.xds_port, tmp_path, max_seconds=60, call_timeout=2.0,
                                    node_id="sidecar~127.0.0.1~beta-1.default~default.svc.cluster.local",
                                    call_metadata={"x-track": "beta"})
        plain = GrpcXdsClientProcess(TARGET, cp.xds_port, tmp_path, max_seconds=60, call_timeout=2.0,
                                     node_id="sidecar~127.0.0.1~plain-1.default~default.svc.cluster.local")
        await beta.start()
        await plain.start()
        try:
            await beta.wait_for_reply("v2:", timeout=20, since=0)
            await _all_acked(cp, beta)
            mark = len(beta.lines)
            seen = await _replies(beta, 20, mark)
            assert all(line.get("reply", "").startswith("v2:") for line in seen), beta.describe(25)

            await plain.wait_for_reply("", timeout=20, since=0)
            row = await _all_acked(cp, plain)
            # The subset clusters are what the client asked for (it follows the weighted route).
            adsz = await cp.debug("/debug/adsz")
            watches = next(c["watches"] for c in adsz["clients"] if c["connectionId"] == row["connection_id"])
            assert sorted(watches["type.googleapis.com/envoy.config.cluster.v3.Cluster"]) == [
                f"outbound|{PORT}|v1|{HOST}", f"outbound|{PORT}|v2|{HOST}"]
            mark = len(plain.lines)
            seen = await _replies(plain, 120, mark, timeout=60)
            names = [line["reply"].split(":")[0] for line in seen if line.get("ok")]
            assert len(names) == len(seen), plain.describe(10)
            share = names.count("v2") / len(names)
            # 25% expected; bounds are > 4 standard deviations wide for 120 calls.
            assert 0.08 <= share <= 0.45, (share, names)
        finally:
            await beta.stop()
            await plain.stop()


async def test_fault_abort_on_a_path_and_a_timeout_cutting_a_delay(tmp_path, backends):
    """An abort fault on the exact method path returns its gRPC status without reaching the
    backend; then a 4 s delay under a 1 s VirtualService timeout ends each call with
    DEADLINE_EXCEEDED well before the client's own 8 s deadline (grpc applies the route's
    max_stream_duration)."""
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mesh_yaml(backends["v1"].port, backends["v2"].port))
    cp.write("vs.yaml", virtual_service("""\
        - match: [{uri: {exact: /test.Echo/Echo}}]
          fault: {abort: {grpcStatus: PERMISSION_DENIED, percentage: {value: 100}}}
          route: [{destination: {host: echo, subset: v1}}]
        - route: [{destination: {host: echo, subset: v2}}]
        """))
    async with cp:
        client = GrpcXdsClientProcess(TARGET, cp.xds_port, tmp_path, max_seconds=75, call_timeout=8.0)
        await client.start()
        try:
            await client.wait_for_error("PERMISSION_DENIED", timeout=20, since=0)
            await _all_acked(cp, client)
            calls = backends["v1"].call_count
            mark = len(client.lines)
            seen = await _replies(client, 10, mark)
            assert all(not line["ok"] and line["error"].startswith("PERMISSION_DENIED") for line in seen), \
                client.describe(12)
            assert backends["v1"].call_count == calls  # aborted in the client: nothing reached the backend

            cp.write("vs.yaml", virtual_service("""\
                - fault: {delay: {fixedDelay: 4s, percentage: {value: 100}}}
                  timeout: 1s
                  route: [{destination: {host: echo, subset: v1}}]
                """))
            mark = len(client.lines)
            await client.wait_for_error("DEADLINE_EXCEEDED", timeout=30, since=mark)
            await _all_acked(cp, client)
            assert not [r for r in client.replies(mark) if r.startswith("v1:")], client.describe(12)

            cp.remove("vs.yaml")  # back to the default route
            await client.wait_for_reply("", timeout=30, since=len(client.lines))
        finally:
            await client.stop()


async def test_retry_recovers_from_a_backend_that_fails_once(tmp_path, backends):
    """v2 fails every other call with UNAVAILABLE. Retries on `unavailable` make every RPC
    succeed (its first attempt fails, the retry answers); `attempts: 0` exposes the failures."""
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mesh_yaml(backends["v1"].port, backends["v2"].port))
    cp.write("vs.yaml", virtual_service("""\
        - route: [{destination: {host: echo, subset: v2}}]
          retries: {attempts: 0}
        """))
    async with cp:
        client = GrpcXdsClientProcess(TARGET, cp.xds_port, tmp_path, max_seconds=60, call_timeout=2.0)
        await client.start()
        try:
            await client.wait_for_reply("v2:", timeout=20, since=0)
            await _all_acked(cp, client)
            seen = await _replies(client, 10, len(client.lines))
            assert sum(1 for line in seen if not line["ok"] and "UNAVAILABLE" in line["error"]) >= 4, \
                client.describe(12)

            cp.write("vs.yaml", virtual_service("""\
                - route: [{destination: {host: echo, subset: v2}}]
                  retries: {attempts: 2, retryOn: unavailable}
                """))

            # Without retries calls alternate between failure and success, so a run of ten
            # successes shows the new route arrived and its retries answer each first failure.
            mark = len(client.lines)

            def run_of_ten() -> bool:
                tail = client.lines[mark:][-10:]
                return len(tail) == 10 and all(line["ok"] and line["reply"].startswith("v2:") for line in tail)

            await wait_for(run_of_ten, timeout=30, message=f"ten successes in a row\n{client.describe(12)}")
            calls, done = backends["v2"].call_count, len(client.lines)
            seen = await _replies(client, 10, done)
            assert all(line["ok"] for line in seen), client.describe(12)
            assert backends["v2"].call_count >= calls + 19  # each RPC took two attempts
            await _all_acked(cp, client)
        finally:
            await client.stop()


async def test_routes_grpc_cannot_act_on_are_accepted_and_the_rest_still_routes(tmp_path, backends):
    """What istiod sends a grpc client for a VirtualService using Envoy-only features must not
    make grpc NACK the route config: query-parameter matches (grpc skips the route), redirects
    and direct responses (RPCs matching them fail), mirrors, header rewrites, CORS (not sent),
    retries with backoff and per-try timeouts. The plain rule still routes."""
    backends["v2"].fail_every_other = False
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mesh_yaml(backends["v1"].port, backends["v2"].port))
    cp.write("vs.yaml", virtual_service("""\
        - match: [{queryParams: {canary: {exact: "yes"}}}]
          route: [{destination: {host: echo, subset: v2}}]
        - match: [{headers: {x-redirect: {exact: "yes"}}}]
          redirect: {uri: /elsewhere}
        - match: [{headers: {x-direct: {exact: "yes"}}}]
          directResponse: {status: 503}
        - route: [{destination: {host: echo, subset: v1}, headers: {request: {set: {x-from: mesh}}}}]
          mirror: {host: echo, subset: v2}
          corsPolicy: {allowOrigins: [{exact: "https://example.com"}]}
          retries: {attempts: 2, perTryTimeout: 1s, retryOn: "unavailable,5xx"}
          timeout: 5s
        """))
    async with cp:
        client = GrpcXdsClientProcess(TARGET, cp.xds_port, tmp_path, max_seconds=60, call_timeout=3.0)
        direct = GrpcXdsClientProcess(TARGET, cp.xds_port, tmp_path, max_seconds=60, call_timeout=3.0,
                                      node_id="sidecar~127.0.0.1~direct-1.default~default.svc.cluster.local",
                                      call_metadata={"x-direct": "yes"})
        await client.start()
        await direct.start()
        try:
            await client.wait_for_reply("v1:", timeout=20, since=0)
            await _all_acked(cp, client)
            seen = await _replies(client, 10, len(client.lines))
            assert all(line.get("reply", "").startswith("v1:") for line in seen), client.describe(12)
            # A call matching the direct response is not answered by any backend.
            error = await direct.wait_for_error("", timeout=20, since=0)
            assert error.startswith("UNAVAILABLE"), direct.describe(5)
            assert not direct.replies(), direct.describe(5)
        finally:
            await client.stop()
            await direct.stop()


async def test_consistent_hash_on_a_header_keeps_a_client_on_one_backend(tmp_path, backends):
    """A DestinationRule consistentHash on `x-user` makes the cluster RING_HASH and the route
    carry the header hash policy: every call with one user lands on one backend (without it
    the two backends alternate, round robin)."""
    backends["v2"].fail_every_other = False
    cp = ControlPlane(tmp_path)
    cp.write("mesh.yaml", mesh_yaml(backends["v1"].port, backends["v2"].port).replace(
        "  host: echo\n", "  host: echo\n  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}\n"))
    async with cp:
        client = GrpcXdsClientProcess(TARGET, cp.xds_port, tmp_path, max_seconds=60, call_timeout=2.0,
                                      call_metadata={"x-user": "alice"})
        await client.start()
        try:
            await client.wait_for_reply("", timeout=20, since=0)
            await _all_acked(cp, client)
            seen = await _replies(client, 30, len(client.lines))
            names = {line["reply"].split(":")[0] for line in seen if line.get("ok")}
            assert len(names) == 1 and all(line["ok"] for line in seen), client.describe(32)
        finally:
            await client.stop()
