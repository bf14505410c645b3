"""Tests of tests/support: each helper is exercised against real processes."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests.support.backends import HttpBackend, http_get
from tests.support.envoy import Envoy, envoy_validate
from tests.support.grpc_client_proc import REPO_ROOT, GrpcXdsClientProcess, grpc_bootstrap
from tests.support.grpc_echo import METHOD, GrpcEchoBackend, echo_call
from tests.support.node import namespace_from_node_id, sidecar_node_id
from tests.support.ports import free_port, free_ports
from tests.support.wait import StopWaiting, wait_for, wait_for_sync

pytestmark = pytest.mark.timeout(30)

NODE_ID = "sidecar~127.0.0.1~app-1.default~default.svc.cluster.local"


def static_proxy_config(listener_port: int, backend_port: int) -> dict:
    """Envoy with no xDS: listener "http" -> cluster "backend", plus "spare" on port 0."""

    def listener(name: str, port: int) -> dict:
        return {
            "name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [
                {
                    "filters": [
                        {
                            "name": "envoy.filters.network.http_connection_manager",
                            "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                "http_connection_manager.v3.HttpConnectionManager",
                                "stat_prefix": name,
                                "route_config": {
                                    "name": "local",
                                    "virtual_hosts": [
                                        {
                                            "name": "all",
                                            "domains": ["*"],
                                            "routes": [
                                                {"match": {"prefix": "/"}, "route": {"cluster": "backend"}}
                                            ],
                                        }
                                    ],
                                },
                                "http_filters": [
                                    {
                                        "name": "envoy.filters.http.router",
                                        "typed_config": {
                                            "@type": "type.googleapis.com/"
                                            "envoy.extensions.filters.http.router.v3.Router"
                                        },
                                    }
                                ],
                            },
                        }
                    ]
                }
            ],
        }

    return {
        "node": {"id": NODE_ID, "cluster": "app.default"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [listener("http", listener_port), listener("spare", 0)],
            "clusters": [
                {
                    "name": "backend",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "backend",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {
                                                    "address": "127.0.0.1",
                                                    "port_value": backend_port,
                                                }
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                }
            ],
        },
    }


# ----- wait ----------------------------------------------------------------


async def test_wait_for_sync_and_async_predicates():
    calls = []

    def sync_pred():
        calls.append(1)
        return len(calls) >= 3 and "done"

    async def async_pred():
        return {"value": 42}

    assert await wait_for(sync_pred, timeout=2, interval=0.001) == "done"
    assert await wait_for(async_pred, timeout=1) == {"value": 42}


async def test_wait_for_timeout_reports_message_and_last_value():
    with pytest.raises(AssertionError, match=r"never true.*last value: 0"):
        await wait_for(lambda: 0, timeout=0.1, interval=0.01, message="never true")

    def boom():
        raise ValueError("not yet")

    with pytest.raises(AssertionError, match=r"last exception: ValueError\('not yet'\)"):
        await wait_for(boom, timeout=0.1, interval=0.01)


async def test_wait_for_stop_waiting_aborts_immediately():
    def dead():
        raise StopWaiting("process exited")

    with pytest.raises(StopWaiting):
        await wait_for(dead, timeout=60)


def test_wait_for_sync():
    state = iter([None, "", "ok"])
    assert wait_for_sync(lambda: next(state), timeout=2, interval=0.001) == "ok"
    with pytest.raises(AssertionError, match="nope"):
        wait_for_sync(lambda: False, timeout=0.05, interval=0.01, message="nope")


# ----- ports and node ids --------------------------------------------------


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports + [free_port()]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_node_ids():
    node_id = sidecar_node_id("app-1", "prod")
    assert node_id == "sidecar~127.0.0.1~app-1.prod~prod.svc.cluster.local"
    assert namespace_from_node_id(node_id) == "prod"
    assert namespace_from_node_id("weird") == "default"


# ----- HTTP backend --------------------------------------------------------


async def test_http_backend_identifies_itself():
    async with HttpBackend("backend-a") as backend:
        status, text = await http_get(f"{backend.url}/some/path?x=1", headers={"Host": "foo.example"})
        assert status == 200
        body = json.loads(text)
        assert body["name"] == "backend-a"
        assert body["path"] == "/some/path"
        assert body["query"] == "x=1"
        assert body["host"] == "foo.example"
        assert backend.request_count == 1

        backend.status = 503
        status, _ = await http_get(backend.url)
        assert status == 503
        assert backend.request_count == 2


# ----- Envoy -----------------------------------------------------------------


def test_bootstrap_matches_notes():
    boot = Envoy.bootstrap(NODE_ID, 15010)
    assert boot["node"] == {
        "id": NODE_ID,
        "cluster": "app.default",
        "metadata": {"NAMESPACE": "default", "INTERCEPTION_MODE": "NONE"},
    }
    assert boot["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"
    xds = boot["static_resources"]["clusters"][0]
    assert xds["name"] == "xds-grpc"
    sock = xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert sock == {"address": "127.0.0.1", "port_value": 15010}
    delta = Envoy.bootstrap(NODE_ID, 1, delta=True, metadata={"X": "y"}, cluster="c")
    assert delta["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    assert delta["node"]["metadata"] == {"X": "y"} and delta["node"]["cluster"] == "c"


def test_envoy_validate_accepts_ads_bootstraps(tmp_path):
    for delta in (False, True):
        ok, output = envoy_validate(Envoy.bootstrap(NODE_ID, 15010, delta=delta), tmp_path)
        assert ok, output


def test_envoy_validate_static_config(tmp_path):
    ok, output = envoy_validate(static_proxy_config(8080, 9090), tmp_path)
    assert ok, output

    bad = static_proxy_config(70000, 9090)
    ok, output = envoy_validate(bad, tmp_path)
    assert not ok
    assert "65535" in output, output


async def test_envoy_static_proxy_end_to_end(tmp_path):
    listener_port = free_port()
    async with HttpBackend("static-backend") as backend:
        async with Envoy(static_proxy_config(listener_port, backend.port), tmp_path) as envoy:
            await envoy.wait_ready(timeout=10)

            status, text = await http_get(
                f"http://127.0.0.1:{listener_port}/through/envoy", headers={"Host": "svc.example"}
            )
            assert status == 200, text
            body = json.loads(text)
            assert body["name"] == "static-backend"
            assert body["path"] == "/through/envoy"
            assert body["host"] == "svc.example"
            assert "x-request-id" in {k.lower() for k in body["headers"]}
            assert backend.request_count == 1

            ports = await envoy.listener_ports()
            assert ports["http"] == listener_port
            assert ports["spare"] > 0

            clusters = await envoy.clusters()
            names = [c["name"] for c in clusters["cluster_statuses"]]
            assert "backend" in names

            dump = await envoy.config_dump()
            types = [c["@type"].rsplit(".", 1)[-1] for c in dump["configs"]]
            assert "ListenersConfigDump" in types
            static = await envoy.config_dump(resource="static_listeners", mask="listener.name")
            assert sorted(c["listener"]["name"] for c in static["configs"]) == ["http", "spare"]

            # Counters update asynchronously relative to the response.
            stats = await envoy.stats()
            assert "server.live" in stats
            await wait_for(
                lambda: _stat_at_least(envoy, "cluster.backend.upstream_rq_total", 1),
                message="cluster.backend.upstream_rq_total >= 1",
            )

            status, text = await envoy.admin_get("/ready")
            assert (status, text.strip()) == (200, "LIVE")
        assert not envoy.running


async def _stat_at_least(envoy: Envoy, name: str, minimum: int) -> bool:
    return (await envoy.stats()).get(name, 0) >= minimum


async def test_envoy_start_failure_shows_log(tmp_path):
    envoy = Envoy()
    with pytest.raises(AssertionError) as excinfo:
        await envoy.start(static_proxy_config(70000, 9090), tmp_path)
    message = str(excinfo.value)
    assert "exited with code" in message
    assert "65535" in message, message
    await envoy.stop()


async def test_two_envoys_run_side_by_side(tmp_path):
    # --use-dynamic-base-id is what makes this work.
    p1, p2 = free_ports(2)
    async with (
        HttpBackend("b") as backend,
        Envoy(static_proxy_config(p1, backend.port), tmp_path) as e1,
        Envoy(static_proxy_config(p2, backend.port), tmp_path) as e2,
    ):
        await asyncio.gather(e1.wait_ready(), e2.wait_ready())
        assert e1.admin_port != e2.admin_port
        assert (await e1.listener_ports())["http"] == p1
        assert (await e2.listener_ports())["http"] == p2


# ----- gRPC ------------------------------------------------------------------


async def test_grpc_echo_backend_raw_bytes():
    async with GrpcEchoBackend("echo-a") as backend:
        async with grpc.aio.insecure_channel(backend.address) as channel:
            reply = await channel.unary_unary(METHOD)(b"ping", timeout=2)
        assert reply == b"echo-a:ping"
        assert await echo_call(backend.address, b"again") == b"echo-a:again"
        assert backend.call_count == 2


async def test_echo_call_refuses_xds_targets():
    with pytest.raises(ValueError):
        await echo_call("xds:///echo.default.svc.cluster.local:8080")


def test_grpc_bootstrap_shape():
    boot = grpc_bootstrap(15010, NODE_ID)
    assert boot["xds_servers"] == [
        {
            "server_uri": "127.0.0.1:15010",
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }
    ]
    assert boot["node"]["id"] == NODE_ID
    assert boot["node"]["metadata"]["NAMESPACE"] == "default"


def test_grpc_xds_client_help():
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.grpc_xds_client", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--max-seconds" in result.stdout
    assert "GRPC_XDS_BOOTSTRAP" in result.stdout


async def test_client_process_against_plain_target(tmp_path):
    # No control plane exists here, but the client loop accepts any target,
    # so a direct address exercises the process plumbing end to end.
    async with GrpcEchoBackend("echo-direct") as backend:
        async with GrpcXdsClientProcess(
            backend.address, xds_port=1, tmpdir=tmp_path, call_timeout=0.5
        ) as client:
            assert await client.wait_for_reply("echo-direct:", timeout=10) == "echo-direct:hello"
            mark = len(client.lines)
            await backend.stop()
            error = await client.wait_for_error("UNAVAILABLE", timeout=10)
            assert error.startswith("UNAVAILABLE")
            assert client.replies(since=0) and len(client.lines) > mark
        assert not client.running
        assert client.proc.returncode == 0
        assert list(Path(tmp_path).glob("grpc-bootstrap-*.json"))


async def test_client_process_exits_on_max_seconds(tmp_path):
    client = GrpcXdsClientProcess(
        "127.0.0.1:1", xds_port=1, tmpdir=tmp_path, max_seconds=0.5, call_timeout=0.2
    )
    await client.start()
    try:
        await wait_for(lambda: not client.running, timeout=10, message="client did not honour --max-seconds")
        assert client.proc.returncode == 0
        with pytest.raises(AssertionError, match="client process exited"):
            await client.wait_for_reply("x", timeout=5)
    finally:
        await client.stop()
