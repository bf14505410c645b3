"""`pilot-discovery discovery` refuses bad flags with a clear message before it starts, never
shares its xDS port with a second instance, honours per-scope log levels, and says why it cannot
start without a traceback."""

from __future__ import annotations

import asyncio
import os
import sys

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from tests.support.control_plane import REPO_ROOT, ControlPlane
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)

SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


async def run(*args: str, cwd, timeout: float = 30) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pilot.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        cwd=str(cwd),
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, out.decode(errors="replace")


LOCAL = ["--httpAddr", "127.0.0.1:0", "--monitoringAddr", "127.0.0.1:0", "--secureGRPCAddr", ""]


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--grpcAddr", "127.0.0.1:99999", "port '99999' is not a number from 0 to 65535"),
        ("--httpAddr", "15010", "is not host:port"),
        ("--monitoringAddr", "bad host:15014", "is neither an IP address nor a host name"),
        ("--secureGRPCAddr", "[::1:15012", "unclosed '['"),
        ("--log_output_level", "default:loud", "unknown log level 'loud'"),
        ("--log_output_level", "ads:verbose,default:info", "unknown log level 'verbose'"),
    ],
)
async def test_bad_flags_are_refused_before_starting(tmp_path, flag, value, why):
    code, out = await run("discovery", "--configDir", str(tmp_path), flag, value, cwd=tmp_path)
    assert code == 2, out
    assert flag in out and why in out, out
    assert "Traceback" not in out


async def test_help_shows_defaults(tmp_path):
    code, out = await run("discovery", "--help", cwd=tmp_path)
    assert code == 0
    text = " ".join(out.split())  # argparse wraps lines
    for default in (
        "(default: :15010)",
        "(default: :15012)",
        "(default: :8080)",
        "(default: :15014)",
        "(default: :15017)",
        "(default: cluster.local)",
        "(default: default:info)",
        "(default: ./etc/istio/config/mesh)",
    ):
        assert default in text, default
    assert "(default: None)" not in text


async def test_no_config_source_is_one_clear_message(tmp_path):
    code, out = await run("discovery", "--grpcAddr", "127.0.0.1:0", *LOCAL, cwd=tmp_path)
    assert code != 0
    assert "no config source: pass --configDir DIR" in out, out
    assert "Task exception was never retrieved" not in out and "Traceback" not in out, out


async def test_a_second_instance_cannot_share_the_xds_port(tmp_path):
    async with ControlPlane(tmp_path) as cp:
        port = cp.xds_port
        code, out = await run(
            "discovery",
            "--configDir",
            str(cp.config_dir),
            "--grpcAddr",
            f"127.0.0.1:{port}",
            *LOCAL,
            cwd=tmp_path,
        )
        assert code != 0, "a second server bound the same xDS port (SO_REUSEPORT)"
        assert f"--grpcAddr 127.0.0.1:{port}: cannot listen" in out, out
        assert "Traceback" not in out, out
        # The first one still owns the port and answers.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.stream_stream(
                SOTW,
                request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
            )()
            await call.write(
                discovery_pb2.DiscoveryRequest(
                    type_url=CDS,
                    node=base_pb2.Node(id="sidecar~10.0.0.1~a-1.default~default.svc.cluster.local"),
                )
            )
            assert (await asyncio.wait_for(call.read(), 10)).type_url == CDS
            call.cancel()


async def test_per_scope_log_levels(tmp_path):
    cp = ControlPlane(tmp_path, extra_args=["--log_output_level", "ads:debug,default:warn"])
    async with cp, grpc.aio.insecure_channel(f"127.0.0.1:{cp.xds_port}") as ch:
        call = ch.stream_stream(
            SOTW,
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
        )()
        await call.write(
            discovery_pb2.DiscoveryRequest(
                type_url=CDS, node=base_pb2.Node(id="sidecar~10.0.0.1~a-1.default~default.svc.cluster.local")
            )
        )
        await asyncio.wait_for(call.read(), 10)
        call.cancel()

        def logged() -> str | None:
            text = cp.log_path.read_text()
            return text if "[debug" in text and "scope=ads" in text else None

        text = await wait_for(logged, 10, message=f"ads debug line\n{cp.log_tail()}")
        lines = text.splitlines()
        assert any("[debug" in ln and "request" in ln and "scope=ads" in ln for ln in lines)
        assert any("[info" in ln and "connected" in ln and "scope=ads" in ln for ln in lines)
        # Other scopes are at warn: no info from bootstrap ("ready") or the file source.
        assert not [ln for ln in lines if ("[info" in ln or "[debug" in ln) and "scope=ads" not in ln], text
