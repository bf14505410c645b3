"""The README's walkthrough, verbatim where possible: examples/mesh served by the control plane, the
example backends on their fixed ports and examples/envoy-sidecar.yaml (admin port and xDS port
adjusted), then `curl -H 'Host: reviews.default.svc.cluster.local' 127.0.0.1:9080/`.

The ports are the example's own (Envoy binds 9080 and 9300, backends 19081-19083), so the test
skips when any of them is taken rather than fight over them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import socket

import pytest
import yaml

from tests.e2e.mesh_config import parse_counters
from tests.support.backends import HttpBackend, http_get
from tests.support.control_plane import REPO_ROOT, ControlPlane
from tests.support.envoy import Envoy
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(60)

EXAMPLES = REPO_ROOT / "examples"
SERVICE_PORT = 9080  # reviews and ratings (HTTP)
DB_PORT = 9300  # database (TCP)


def _load_example_backends():
    spec = importlib.util.spec_from_file_location("example_backends", EXAMPLES / "backends.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BACKENDS = _load_example_backends()


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR as Envoy and aiohttp set it, so a TIME_WAIT leftover does not count as taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def sidecar_bootstrap(xds_port: int) -> dict:
    bootstrap = yaml.safe_load((EXAMPLES / "envoy-sidecar.yaml").read_text())
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = 0
    xds = bootstrap["static_resources"]["clusters"][0]
    assert xds["name"] == "xds-grpc"
    xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"][
        "port_value"] = xds_port
    return bootstrap


async def test_readme_walkthrough(tmp_path):
    http_ports = dict(BACKENDS.HTTP_BACKENDS)  # {"reviews": 19081, "ratings": 19082}
    db_name, db_port = BACKENDS.TCP_ECHO
    taken = [p for p in (SERVICE_PORT, DB_PORT, db_port, *http_ports.values()) if not port_is_free(p)]
    if taken:
        pytest.skip(f"the example mesh needs ports that are in use: {taken}")

    backends = [await HttpBackend(name, port).start() for name, port in http_ports.items()]
    db = await asyncio.start_server(BACKENDS.tcp_echo, "127.0.0.1", db_port)
    cp = ControlPlane(tmp_path, mesh_config=(EXAMPLES / "mesh.yaml").read_text())
    shutil.copytree(EXAMPLES / "mesh", cp.config_dir, dirs_exist_ok=True)
    envoy = Envoy()
    try:
        await cp.start()
        bootstrap = sidecar_bootstrap(cp.xds_port)
        node_id = bootstrap["node"]["id"]
        await envoy.start(bootstrap, tmp_path)
        await envoy.wait_ready()

        async def curl(host: str) -> str | None:
            status, body = await http_get(f"http://127.0.0.1:{SERVICE_PORT}/", headers={"Host": host}, timeout=3)
            return json.loads(body)["name"] if status == 200 else None

        # curl -H 'Host: reviews.default.svc.cluster.local' 127.0.0.1:9080/
        assert await wait_for(lambda: curl("reviews.default.svc.cluster.local"), 10,
                              message=f"reviews via Envoy\n{envoy.log_tail(20)}") == "reviews"
        # curl -H 'Host: ratings' 127.0.0.1:9080/   (short names work from the same namespace)
        assert await curl("ratings") == "ratings"
        assert await curl("ratings.default.svc.cluster.local") == "ratings"

        # The TCP service: bytes go through Envoy's 9300 listener to the echo backend.
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", DB_PORT), 5)
        try:
            writer.write(b"ping\n")
            await writer.drain()
            assert await asyncio.wait_for(reader.readexactly(len(f"{db_name}: ping\n")), 5) == \
                f"{db_name}: ping\n".encode()
        finally:
            writer.close()

        # "Edit examples/mesh/reviews.yaml (point the EndpointSlice at port 19082) and the next curl
        # goes to the new backend, with only EDS pushed."
        await cp.wait_synced(node_id)
        before = parse_counters(await cp.metrics(), "pilot_xds_pushes")
        reviews = cp.config_dir / "reviews.yaml"
        text = reviews.read_text()
        assert f"port: {http_ports['reviews']}" in text
        cp.write("reviews.yaml", text.replace(f"port: {http_ports['reviews']}", f"port: {http_ports['ratings']}"))
        assert await wait_for(lambda: _is(curl("reviews.default.svc.cluster.local"), "ratings"), 10,
                              message="reviews moved to the ratings backend")
        await cp.wait_synced(node_id)
        after = parse_counters(await cp.metrics(), "pilot_xds_pushes")
        assert after.get("eds", 0) > before.get("eds", 0)
        assert {t: after.get(t) for t in ("cds", "lds", "rds")} == {t: before.get(t) for t in ("cds", "lds", "rds")}
    finally:
        await envoy.stop()
        await cp.stop()
        db.close()
        await db.wait_closed()
        for b in backends:
            await b.stop()


async def _is(awaitable, expected) -> bool:
    return (await awaitable) == expected
